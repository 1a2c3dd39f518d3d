"""Each image's token span (Eq. 6's R_k) in a tokenised prompt: by the characters its
placeholder expanded to (`OffsetSpans`), or, where the processor cannot say (transformers 4's),
between the markers the chat template writes around it (`marked_spans`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lad.errors import BackendError

# What a chat-template error tells to do (lad.backends.prompting).
FIX = "pass a chat template that does with --chat-template FILE (chat_template= in Python)"


def marked_spans(
    ids: list[int], image_token: int, markers: list[int], model: str
) -> list[tuple[int, int]]:
    """Each image's span in a prompt where the chat template writes an opening and a closing
    marker around every image placeholder (Qwen's <|vision_start|> ... <|vision_end|>): from
    each opening marker through its closing one, holding nothing but image tokens."""
    start, end = markers
    spans, opened = [], None
    for i, token in enumerate(ids):
        if token == start and opened is None:
            opened = i
        elif token == end and opened is not None:
            spans.append((opened, i + 1))
            opened = None
        elif opened is not None and token != image_token:
            opened = -1  # not an image's run: refused below
    inside = sum(e - s - 2 for s, e in spans if s >= 0)
    if opened is not None or any(s < 0 for s, _ in spans) or inside != ids.count(image_token):
        raise BackendError(
            f"{model}: its prompt's image tokens (id {image_token}) are not each between the "
            f"markers {markers} with nothing else there, so lad cannot tell which tokens are "
            "which image (Eq. 6)"
        )
    return spans


@dataclass(frozen=True)
class OffsetSpans:
    """One tokenised prompt, in which image spans are looked up by (expanded) character range."""

    tokenizer: Any
    ids: list[int]
    offsets: Any  # (T, 2) numpy array
    image_token: int
    markers: list[int]

    def span(self, k: int, chars: tuple[int, int], placeholder: str, model: str) -> tuple[int, int]:
        start, end = self.offsets[:, 0], self.offsets[:, 1]
        within = (start >= chars[0]) & (end <= chars[1]) & (end > start)
        inside = within.nonzero()[0].tolist()
        while inside and self._blank(inside[0]):
            inside.pop(0)
        while inside and self._blank(inside[-1]):
            inside.pop()
        if not any(self.ids[i] == self.image_token for i in inside):
            raise BackendError(
                f"{model}: image {k + 1}'s placeholder {placeholder!r} expanded to characters "
                f"{chars[0]}..{chars[1]} of the prompt, but no image token (id {self.image_token}, "
                f"the config's image_token_id) was found there, so lad cannot tell which tokens "
                f"are the image (Eq. 6); {FIX}"
            )
        lo, hi = inside[0], inside[-1] + 1
        if lo > 0 and self.ids[lo - 1] in self.markers:
            lo -= 1
        if hi < len(self.ids) and self.ids[hi] in self.markers:
            hi += 1
        return lo, hi

    def _blank(self, i: int) -> bool:
        """Plain whitespace (Gemma3's processor wraps each picture in blank lines)."""
        if self.ids[i] == self.image_token:
            return False
        return not self.tokenizer.decode([self.ids[i]], skip_special_tokens=False).strip()

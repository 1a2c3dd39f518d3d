"""Label schemes: the strings c_1 … c_N a model answers with (paper D.2, Fig. 8).

Two schemes name positions by ordinals: `words` ("first", "second", …) and `image-ordinals`
("the first image", "the second image", …, as MMIU's options do; paper Table 5).
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from lad.errors import LadError, check_choice

_ROMAN = ("I", "II", "III", "IV", "V", "VI", "VII", "VIII", "IX", "X", "XI", "XII")
_ORDINALS = (
    "first", "second", "third", "fourth", "fifth", "sixth",
    "seventh", "eighth", "ninth", "tenth", "eleventh", "twelfth",
)  # fmt: skip


@dataclass(frozen=True)
class LabelScheme:
    """How positions are named: `names` c_1, c_2, … as many as the scheme names. `noun` fills
    the prompt: "Respond with the index {noun} only"."""

    name: str
    noun: str
    names: tuple[str, ...]

    @property
    def max_candidates(self) -> int:
        return len(self.names)

    def labels(self, num_candidates: int) -> list[str]:
        """c_1 … c_N for this scheme."""
        if not 1 <= num_candidates <= self.max_candidates:
            raise LadError(
                f"--labels {self.name} names 1 to {self.max_candidates} candidates, but N = "
                f"{num_candidates} (--num-candidates, or the images given); "
                f"{schemes_for(num_candidates)}"
            )
        return list(self.names[:num_candidates])


LABEL_SCHEMES: dict[str, LabelScheme] = {
    s.name: s
    for s in (
        LabelScheme("digits", "number", tuple(str(i) for i in range(1, 13))),
        LabelScheme("upper", "letter", tuple(string.ascii_uppercase)),
        LabelScheme("lower", "letter", tuple(string.ascii_lowercase)),
        LabelScheme("roman", "numeral", _ROMAN),
        LabelScheme("words", "word", _ORDINALS),
        LabelScheme("image-ordinals", "phrase", tuple(f"the {word} image" for word in _ORDINALS)),
    )
}


# The most candidates any label scheme can name; items and converters refuse more.
MAX_CANDIDATES = max(s.max_candidates for s in LABEL_SCHEMES.values())


def schemes_for(num_candidates: int) -> str:
    """Which label schemes can name `num_candidates` candidates, as advice for a message."""
    able = [s.name for s in LABEL_SCHEMES.values() if 1 <= num_candidates <= s.max_candidates]
    if not able:
        return f"no label scheme names more than {MAX_CANDIDATES} candidates"
    return f"for N = {num_candidates} use --labels {' or '.join(able)}"


def get_scheme(name: str) -> LabelScheme:
    check_choice("labels", name, sorted(LABEL_SCHEMES))
    return LABEL_SCHEMES[name]

"""Resource limits: the sizes a command accepts by default, checked before any model work
(docs/errors.md, "Bounded resources"). Each can be raised with its environment variable by a user
who needs more; a value past a limit is refused in one line that names the variable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from lad.errors import DataError, LadError, RunError


@dataclass(frozen=True)
class Limit:
    what: str  # what is limited, as the message names it
    env: str  # the environment variable that raises the limit
    default: int
    unit: str
    error: type[LadError] = LadError  # what a bad value of the variable raises

    @property
    def value(self) -> int:
        """The limit in force: the environment variable's value, else the default."""
        text = os.environ.get(self.env)
        if text is None:
            return self.default
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise self.error(f"{self.env} must be a positive whole number. Got {text!r}.")
        return value

    def check(self, amount: int, where: str) -> None:
        """Refuse `amount` above the limit; `where` names the flag or file at fault."""
        if amount > self.value:
            raise LadError(
                f"{where}: {self.what} of {amount:,} {self.unit} is above lad's limit of "
                f"{self.value:,}; set {self.env}={amount} to allow it"
            )


# The processors lad supports never use more than 4096 pixels a side (lad.io.images downscales
# larger pictures to it); Qwen2.5-VL's own default pixel budget is 12,845,056.
IMAGE_SIZE = Limit("an image side", "LAD_MAX_IMAGE_SIZE", 4096, "pixels")
PIXEL_BUDGET = Limit("a pixel budget", "LAD_MAX_PIXEL_BUDGET", 4096 * 4096, "pixels")
PROMPT_TEMPLATE = Limit("a prompt template", "LAD_MAX_PROMPT_TEMPLATE", 64 * 1024, "bytes")
CHAT_TEMPLATE = Limit("a chat template", "LAD_MAX_CHAT_TEMPLATE", 1024 * 1024, "bytes")
QUERY = Limit("a query or question", "LAD_MAX_QUERY", 16 * 1024, "characters")
# PIL's DecompressionBombError threshold: a picture's pixels (lad.io.images).
IMAGE_PIXELS = Limit("a picture", "LAD_MAX_IMAGE_PIXELS", 2 * 89_478_485, "pixels", DataError)
CHAT_TEXT = Limit("a rendered chat prompt", "LAD_MAX_CHAT_TEXT", 1024 * 1024, "characters")
# Bootstrap intervals and the position test draw (resamples x questions) at once: lad's default
# is 1,000 resamples; 100,000 of 24 questions is 2.4M draws (about 60 MB at peak).
BOOTSTRAP = Limit("a bootstrap", "LAD_MAX_BOOTSTRAP", 100_000, "resamples")
# The settings that size a run's model work, past which it would run for days or allocate
# beyond any machine (--sc-samples 10^9 asks torch for 32 GB at once): the paper uses 5 orderings,
# 10 self-consistency paths and replies of a few tokens.
SHUFFLES = Limit("a shuffle count", "LAD_MAX_SHUFFLES", 1000, "orderings per item")
SC_SAMPLES = Limit("a self-consistency count", "LAD_MAX_SC_SAMPLES", 1000, "paths per prompt")
NEW_TOKENS = Limit("a reply", "LAD_MAX_NEW_TOKENS", 32_768, "tokens")
BATCH = Limit("a batch", "LAD_MAX_BATCH", 4096, "prompts")
# A generated benchmark (lad data shapes): its pictures are drawn and written one by one.
GENERATED_ITEMS = Limit("a generated benchmark", "LAD_MAX_GENERATED_ITEMS", 100_000, "items")


def check_image_flags(image_size: int | None, image_options: dict | None) -> None:
    """--image-size and the pixel budget (--min-pixels, --max-pixels): positive, within limits."""
    sizes = {**(image_options or {}), "image_size": image_size}
    for key in ("image_size", "min_pixels", "max_pixels"):
        if (value := sizes.get(key)) is None:
            continue
        flag = "--" + key.replace("_", "-")
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise RunError(f"{flag} must be a positive number of pixels. Got {value!r}.")
        (IMAGE_SIZE if key == "image_size" else PIXEL_BUDGET).check(value, f"{flag} {value}")

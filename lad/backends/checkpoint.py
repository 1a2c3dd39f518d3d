"""What lad reads of a checkpoint beyond its weights: where `demo` lives, and the repetition
penalty of its generation_config (docs/methods.md, "The official code's variants")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.errors import BackendError, RunError
from lad.io.files import read_json

# A penalty divides (or multiplies) logits: beyond these it overflows or erases a bfloat16 logit.
PENALTY_RANGE = (1e-4, 1e4)


def check_repetition_penalty(value: Any, flag: str = "--repetition-penalty") -> None:
    """None, "model" or a number in PENALTY_RANGE (1 is no penalty)."""
    low, high = PENALTY_RANGE
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (value is None or value == "model" or (number and low <= value <= high)):
        raise RunError(
            f"{flag} must be a number > 0 or 'model', from {low:g} to {high:g} (1: no penalty; "
            f"beyond them the penalised logits overflow). Got {value!r}."
        )


def resolve_repetition_penalty(value: float | str | None, model: str) -> float | None:
    """The penalty a record is made with: "model" reads the model's generation_config (its
    repetition_penalty, e.g. 1.05 for Qwen instruct checkpoints; the official code gets it from
    `generate`); 1 and none are None."""
    check_repetition_penalty(value)
    if value == "model":
        value = model_repetition_penalty(model)
    return None if value is None or value == 1 else float(value)


def model_repetition_penalty(model: str) -> float | None:
    """repetition_penalty of a checkpoint's generation_config (None where it sets none)."""
    path = Path(resolve_model(model))
    if path.is_dir():
        file = path / "generation_config.json"
        if not file.is_file():
            return None
        values = read_json(file, RunError, "generation config")
        penalty = values.get("repetition_penalty") if isinstance(values, dict) else None
    else:  # a hub id: transformers reads it, as generate would
        from transformers import GenerationConfig

        try:
            penalty = GenerationConfig.from_pretrained(str(path)).repetition_penalty
        except (OSError, ValueError) as e:
            raise RunError(
                f"--model {model}: cannot read its generation_config for --repetition-penalty "
                f"model ({e}); pass a number instead"
            ) from None
    check_repetition_penalty(penalty, f"{model}: generation_config's repetition_penalty")
    return None if penalty is None else float(penalty)


def resolve_model(model: str) -> str:
    """`demo` is the model shipped inside the package (docs/demo-model.md)."""
    if model == "demo":
        return str(demo_model_path())
    return model


# The shipped demo model (docs/demo-model.md), inside the package.
MODEL_DIR = Path(__file__).resolve().parent.parent / "demo" / "model"
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json")


def demo_model_path() -> Path:
    """The folder of the shipped demo model (save_pretrained output), checked to be complete."""
    missing = [name for name in _NEEDED if not (MODEL_DIR / name).is_file()]
    if missing:
        raise BackendError(
            f"the demo model's weights are missing from {MODEL_DIR} (no {', '.join(missing)}). "
            "Reinstall lad, or retrain them with: lad demo train --out "
            + str(MODEL_DIR)
            + " --replace-shipped-model"
        )
    return MODEL_DIR

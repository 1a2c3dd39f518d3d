"""What lad reads of a checkpoint beyond its weights: where `demo` lives, its config.json and
generation_config.json (`local_config`: each read once), and the repetition penalty of its
generation_config (docs/methods.md, "The official code's variants")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.errors import BackendError, LadError, RunError
from lad.io.files import note_input, read_json

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
        path = Path(resolve_model(model))
        if path.is_dir():
            values = local_config(path, RunError, "generation_config.json", "generation config")
            value = (values or {}).get("repetition_penalty")
        else:  # a hub id: transformers reads it, as generate would
            from transformers import GenerationConfig

            try:
                value = GenerationConfig.from_pretrained(str(path)).repetition_penalty
            except (OSError, ValueError) as e:
                raise RunError(
                    f"--model {model}: cannot read its generation_config for --repetition-penalty "
                    f"model ({e}); pass a number instead"
                ) from None
        check_repetition_penalty(value, f"{model}: generation_config's repetition_penalty")
    return None if value is None or value == 1 else float(value)


def resolve_model(model: str) -> str:
    """A shipped model's name (SHIPPED_MODELS: `demo`, `text-demo`) is its folder inside the
    package (docs/demo-model.md); anything else is a hub id or a local folder, as given."""
    if model in SHIPPED_MODELS:
        return str(shipped_model_path(model))
    return model


# The models shipped inside the package (docs/demo-model.md): name -> its folder under lad/demo/
# (a save_pretrained output, and whatever else it ships), the files it must hold beyond the
# weights, and how to remake it.
DEMO_DIR = Path(__file__).resolve().parent.parent / "demo"
SHIPPED_MODELS = {
    "demo": ("model", (), "lad demo train --out {dir} --replace-shipped-model"),
    "text-demo": (
        "text_model",
        ("items.jsonl", "items.calibration.jsonl"),  # its held-out items (lad data text-demo)
        "python benchmarks/text_demo.py --out runs/text-demo --ship",
    ),
}
MODEL_DIR = DEMO_DIR / SHIPPED_MODELS["demo"][0]
_NEEDED = ("config.json", "model.safetensors", "tokenizer.json")


def shipped_model_path(name: str) -> Path:
    """The folder of a shipped model (SHIPPED_MODELS), checked to hold every file it ships."""
    folder, extra, remake = SHIPPED_MODELS[name]
    path = DEMO_DIR / folder
    missing = [file for file in (*_NEEDED, *extra) if not (path / file).is_file()]
    if missing:
        raise BackendError(
            f"the {name} model's files are missing from {path} (no {', '.join(missing)}). "
            f"Reinstall lad, or retrain it with: {remake.format(dir=path)}"
        )
    return path


def demo_model_path() -> Path:
    return shipped_model_path("demo")


def load_error(model: str, e: Exception, weights: bool = False, note: str = "") -> BackendError:
    """One line for a model that fails to load, naming its weight files when those failed;
    `note` (remote_code_note) follows it."""
    what = repr(model)
    if weights and Path(model).is_dir():
        files = sorted(p.name for p in Path(model).iterdir() if p.suffix in _WEIGHT_SUFFIXES)
        what = f"{model!r} (its weights: {', '.join(files) or 'none found'})"
    detail = " ".join(str(e).split())
    detail = detail if len(detail) <= 300 else detail[:300] + " …"
    return BackendError(f"cannot load model {what}: {type(e).__name__}: {detail}{note}")


def remote_code_note(model: str) -> str:
    """For a local checkpoint of a remote-code row (Arch.remote_code): which transformers its
    code is written for, and how to get it; else ""."""
    from lad.backends.archs import ARCHS

    kind = (local_config(model) or {}).get("model_type")
    for arch in ARCHS:
        if arch.remote_code and kind in arch.model_types:
            version = arch.remote_code
            return (
                f" ({arch.name}'s own code is written for transformers {version}: run lad in an "
                f"environment with transformers=={version}, docs/backends.md, 'Remote code')"
            )
    return ""


_WEIGHT_SUFFIXES = (".bin", ".safetensors", ".pt", ".pth")


def check_remote_code(model: str, trust_remote_code: bool) -> None:
    """A local checkpoint whose model type transformers does not know runs code of its own
    folder (its config's auto_map): refused in one line unless `trust_remote_code`."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    config = None if trust_remote_code else local_config(model)
    model_type = config.get("model_type") if config else None
    if config and "auto_map" in config and model_type not in CONFIG_MAPPING_NAMES:
        raise BackendError(
            f"--model {model}: model_type {model_type!r} is not one transformers knows; its "
            "folder's own code would run (config.json auto_map): pass --trust-remote-code "
            "(trust_remote_code=True) if you trust that code"
        )


# Each checkpoint file parsed, by (path, inode, mtime, size): rewritten, it is read again.
_CONFIGS: dict[tuple[str, int, int, int], dict[str, Any] | None] = {}


def local_config(
    model: str | Path,
    error: type[LadError] = BackendError,
    name: str = "config.json",
    what: str = "model config",
) -> dict[str, Any] | None:
    """A local checkpoint's config.json (or its file `name`; `model`: a folder, resolve_model's),
    parsed once per process while the file is unchanged: what lad reads before transformers
    loads it (the layer count, the model type, remote code, the repetition penalty). None for a
    hub id (no such file) or a file holding no JSON object; a file that cannot be read is
    `error` naming it, at every call."""
    path = Path(model) / name
    if not path.is_file():
        return None
    st = path.stat()
    key = (str(path.resolve()), st.st_ino, st.st_mtime_ns, st.st_size)
    if key in _CONFIGS:
        note_input(path)  # an input of this command too, as read_json makes it
    else:
        fields = read_json(path, error, what)
        _CONFIGS[key] = fields if isinstance(fields, dict) else None
    return _CONFIGS[key]


def check_model_path(model: str) -> None:
    """A --model that names no local folder and cannot be a hub id is an error at once.

    Hub ids are `name` or `org/name` (huggingface_hub's rule); anything else (`./m`, `/abs/m`,
    `runs/x/model`) is meant as a folder, and looking it up on the hub would only retry for ~30 s.
    A hub id that is not in the local cache: HF_HUB_OFFLINE refuses it at once, else the hub is
    asked once (no retries), so a missing model or an unreachable hub is one line in seconds
    rather than transformers' retries (~30 s and a warning per retry).
    """
    from huggingface_hub import constants, model_info, try_to_load_from_cache
    from huggingface_hub.errors import GatedRepoError, HFValidationError, RepositoryNotFoundError
    from huggingface_hub.utils import validate_repo_id

    if Path(model).exists():
        return
    model = str(model)
    try:
        validate_repo_id(model)
    except HFValidationError:
        raise BackendError(f"--model {model}: no such model folder") from None
    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return
    if constants.HF_HUB_OFFLINE:
        raise BackendError(
            f"--model {model}: not a local folder and not in the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}), and HF_HUB_OFFLINE is set, so the hub is not asked; "
            f"download it first (hf download {model}) or give a local folder"
        )
    try:
        model_info(model, timeout=10)
    except GatedRepoError:
        return  # transformers says how to get access
    except RepositoryNotFoundError:
        raise BackendError(
            f"--model {model}: no such model on the Hugging Face hub (a private one needs "
            "`hf auth login`)"
        ) from None
    except Exception as e:  # no network, DNS, proxy, TLS: whatever the HTTP client raises
        raise BackendError(
            f"--model {model}: not a local folder, not in the Hugging Face cache, and the hub "
            f"({constants.ENDPOINT}) cannot be reached ({type(e).__name__}); check the "
            "connection, or give a local folder"
        ) from None


def read_chat_template(path: str | Path | None) -> str | None:
    """The --chat-template file's text (None: none given), within lad.io.limits.CHAT_TEMPLATE."""
    if path is None:
        return None
    from lad.io import files, limits

    if Path(path).is_file():
        limits.CHAT_TEMPLATE.check(Path(path).stat().st_size, f"--chat-template {path}")
    try:
        return files.read_text(path, BackendError, "Jinja chat template file")
    except BackendError as e:
        why = str(e).removeprefix(f"{path}: ")
        raise BackendError(f"--chat-template {path}: cannot read the Jinja file ({why})") from None

"""What `--model lad` takes in every harness (lmms-eval, lm-eval, Inspect): `ModelArgs`, the
arguments they share (a RecordSpec's model, a MethodOptions' K and τ), and `read_model_args`,
the one reading of a harness's model_args text (docs/harness.md)."""

from __future__ import annotations

import contextlib
import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import NoneType, UnionType
from typing import Any

from lad.backends.settings import LoadSettings
from lad.core.methods import MethodOptions
from lad.errors import LadError
from lad.run.debiaser import Debiaser
from lad.run.spec import RecordSpec

# The methods `--model lad` answers with: one pass per question, perm-avg N.
HARNESS_METHODS = ("vanilla", "pride", "lad", "attn-purified", "perm-avg")
NEEDS_CALIBRATION = ("pride", "lad", "attn-purified")
# The fields of MethodOptions a harness's model_args set, by their own names.
METHOD_ARGS = ("top_k", "tau")
_NONE = (None, "", "None", "none")
# What lmms-eval and lm-eval hand every model beside its model_args (their --max_batch_size),
# which `--model lad` has no use for.
HARNESS_SETTINGS = ("max_batch_size",)


@dataclass(frozen=True)
class ModelArgs:
    """The model_args of `--model lad` in every harness; each harness's class adds its own."""

    model: str = RecordSpec.model
    method: str = "lad"
    calibration: str | None = None  # a calibration.json, or a folder of them (one per N)
    device: str = LoadSettings.device
    dtype: str = LoadSettings.dtype
    batch_size: int = 1
    options: MethodOptions = field(default_factory=MethodOptions)  # model_args METHOD_ARGS
    check_calibration: bool = True  # False: a calibration file is checked for N and layers only
    trust_remote_code: bool = RecordSpec.trust_remote_code  # run the checkpoint's own code

    def debiaser(self, backend: Any = None, pictures: bool = True, **spec: Any) -> Debiaser:
        """The Debiaser of these args for records of their model and the RecordSpec fields
        `spec` (its labels also the options'); pictures=False: text options only (Debiaser)."""
        made = RecordSpec(self.model, trust_remote_code=self.trust_remote_code, **spec)
        return Debiaser(
            made,
            dataclasses.replace(self.options, labels=made.labels),
            batch_size=self.batch_size,
            device=self.device,
            dtype=self.dtype,
            backend=backend,
            check_calibration=self.check_calibration,
            pictures=pictures,
        )


def read_model_args(
    cls: type[ModelArgs],
    given: Mapping[str, Any],
    flag: str = "--model_args",
    model_as: str = "model",
    **apart: Any,
) -> Any:
    """`cls` of the model_args `given` and the fields `apart`. A model_arg `cls` does not take
    stops every harness's `--model lad` before the model loads, naming what it takes (`flag`: the
    harness's option for them; `model_as`: its name for the model, lm-eval's pretrained, "":
    Inspect's); a null (a harness's own setting left unset) or one of HARNESS_SETTINGS passes.
    Each value is read as its field's type (a harness hands over text: "4", "False"); a null or
    "", "None", "none" leaves a field at its default."""
    fields = [f.name for f in dataclasses.fields(cls)]  # in order, METHOD_ARGS for `options`
    names = [n for f in fields for n in (METHOD_ARGS if f == "options" else (f,))]
    takes = [model_as, *names[1:]] if model_as else names[1:]  # names[0]: ModelArgs.model
    passes = {*takes, *HARNESS_SETTINGS}
    unknown = sorted(k for k, v in given.items() if k not in passes and v is not None)
    if unknown:
        raise LadError(f"unknown {flag} {unknown}; --model lad takes {', '.join(takes)}")
    hints = typing.get_type_hints(cls) | typing.get_type_hints(MethodOptions)
    read = set(names) - set(apart)
    values = {k: _read(k, v, hints[k]) for k, v in given.items() if k in read and v not in _NONE}
    options = MethodOptions(**{k: values.pop(k) for k in METHOD_ARGS if k in values})
    return cls(**values, **apart, options=options)


def _read(key: str, value: Any, kind: Any) -> Any:
    if isinstance(kind, UnionType):  # X | None
        (kind,) = (k for k in typing.get_args(kind) if k is not NoneType)
    if kind is bool:
        return model_arg_bool(key, value)
    if kind in (int, float):
        with contextlib.suppress(TypeError, ValueError, OverflowError):
            # not a bool, nor a float cut to a whole number (top_k=2.7 is not 2)
            if not isinstance(value, bool) and (kind is float or float(value) == int(value)):
                return kind(value)
        what = "a whole number" if kind is int else "a number"
        raise LadError(f"The {key!r} model_arg must be {what}. Got {value!r}.")
    return str(value)


def model_arg_bool(name: str, value: Any) -> bool:
    """A true/false model_arg as a harness hands it over: a bool, or its text (True, false, 1,
    0, …)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise LadError(f"The {name!r} model_arg must be True or False. Got {value!r}.")


def check_model_args(args: ModelArgs, name: str, takes: str) -> None:
    """What every harness's `--model lad` checks before the model loads: the method, a
    calibration where it needs one (calibration=, or the other way, model_arg `name`, which
    takes `takes`), not both, the batch size, a calibration file that exists."""
    value, method, calibration = getattr(args, name), args.method, args.calibration
    if method not in HARNESS_METHODS:
        raise LadError(
            f"The 'method' model_arg must be one of {list(HARNESS_METHODS)}. "
            f"Got {method!r} instead."
        )
    if calibration is not None and value is not None:
        raise LadError(
            f"give calibration=<calibration.json> or {name}={takes.split()[0]}, not both"
        )
    if method in NEEDS_CALIBRATION and not (calibration or value):
        raise LadError(
            f"method={method} needs a calibration: calibration=<calibration.json from lad "
            f"calibrate> or {name}={takes}"
        )
    if args.batch_size < 1:
        raise LadError(f"batch_size must be >= 1. Got {args.batch_size}.")
    if calibration is not None and not Path(calibration).exists():
        raise LadError(f"calibration={calibration}: no such file or folder")

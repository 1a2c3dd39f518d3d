"""LoadSettings (lad.backends.settings): every way in (the CLI, Debiaser, lmms-eval's and
lm-eval's `--model lad`) builds the settings the engine loads, and `trust_remote_code` given
there arrives in them; a folder whose config asks for its own code (auto_map) is refused in one
line, before any weight, wherever trust_remote_code is off.

The harnesses are not installed here: their `--model lad` modules are imported over stand-ins
of the few names they take from the harness (base class, Instance, registry, logger), so that
what is tested is lad's own parsing of the model args and its construction of the scorer."""

from __future__ import annotations

import importlib
import importlib.util
import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from lad.backends.settings import LoadSettings
from lad.errors import BackendError

REFUSED = r"model_type 'made_up_vlm' .*pass --trust-remote-code \(trust_remote_code=True\)"


class Loaded(Exception):
    """Raised by the stand-in engine with the settings it was handed."""

    def __init__(self, settings: LoadSettings, kwargs: dict[str, Any]) -> None:
        super().__init__("loaded")
        self.settings, self.kwargs = settings, kwargs


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """The HF engine replaced by one that reports what it was asked to load."""

    def load(settings: Any, **kwargs: Any) -> Any:
        raise Loaded(settings, kwargs)

    monkeypatch.setattr("lad.backends.load_backend", load)


@pytest.fixture
def remote_folder(tmp_path: Path) -> Path:
    """A folder whose config names a model type transformers does not know and code of its own
    (config.json auto_map); nothing else: the refusal must come before any other file is read."""
    folder = tmp_path / "made-up-vlm"
    folder.mkdir()
    config = {"model_type": "made_up_vlm", "auto_map": {"AutoConfig": "configuration_x.XConfig"}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def _stand_ins() -> dict[str, types.ModuleType]:
    """The harness names lad.harness.model and lad.harness.lm_eval import, as plain stand-ins."""

    class Base:
        def __init__(self) -> None:
            pass

    def module(name: str, **names: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(names)
        return m

    logger = types.SimpleNamespace(warning=lambda *a, **k: None, info=lambda *a, **k: None)
    return {
        "lmms_eval": module("lmms_eval"),
        "lmms_eval.api": module("lmms_eval.api"),
        "lmms_eval.api.instance": module("lmms_eval.api.instance", Instance=object),
        "lmms_eval.api.model": module("lmms_eval.api.model", lmms=Base),
        "loguru": module("loguru", logger=logger),
        "lm_eval": module("lm_eval"),
        "lm_eval.models": module("lm_eval.models"),
        "lm_eval.api": module("lm_eval.api"),
        "lm_eval.api.instance": module("lm_eval.api.instance", Instance=object),
        "lm_eval.api.model": module("lm_eval.api.model", LM=Base),
        "lm_eval.api.registry": module(
            "lm_eval.api.registry", register_model=lambda *names: lambda cls: cls
        ),
    }


def _installed(name: str) -> bool:
    """Whether package `name` is really installed (not one of this module's stand-ins)."""
    if name in sys.modules:
        return getattr(sys.modules[name], "__spec__", None) is not None
    return importlib.util.find_spec(name) is not None


def _harness_class(monkeypatch: pytest.MonkeyPatch, module: str, harness: str, name: str) -> Any:
    """`module`'s `--model lad` class: the real one where `harness` is installed, else the module
    imported (under a private name) over the harness's stand-ins, which are gone afterwards."""
    if _installed(harness):
        return getattr(importlib.import_module(module), name)
    roots = {harness, "loguru"} if harness == "lmms_eval" else {harness}
    missing = {root for root in roots if not _installed(root)}
    for key, stand_in in _stand_ins().items():
        if key.split(".")[0] in missing:
            monkeypatch.setitem(sys.modules, key, stand_in)
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None
    loaded = importlib.util.module_from_spec(
        importlib.util.spec_from_file_location(f"_lad_test_{name}", spec.origin)  # type: ignore[arg-type]
    )
    loaded.__spec__.loader.exec_module(loaded)  # type: ignore[union-attr]
    return getattr(loaded, name)


@pytest.fixture
def lmms_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    return _harness_class(monkeypatch, "lad.harness.model", "lmms_eval", "LadModel")


@pytest.fixture
def lm_eval_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    return _harness_class(monkeypatch, "lad.harness.lm_eval", "lm_eval", "LadLM")


@pytest.mark.parametrize("given", [True, "True", "true", "1"])
def test_the_harnesses_model_args_reach_the_load(
    engine: None, lmms_model: Any, lm_eval_model: Any, given: Any, tmp_path: Path
) -> None:
    model = lmms_model(
        method="vanilla", model="demo", trust_remote_code=given, output=str(tmp_path / "o")
    )
    with pytest.raises(Loaded) as e:
        _ = model.scorer.backend
    settings = e.value.settings
    assert isinstance(settings, LoadSettings) and settings.trust_remote_code is True
    assert settings.pictures is True and settings.chat_template is None
    assert e.value.kwargs == {"quiet": True, "threads": None}

    lm = lm_eval_model(method="vanilla", pretrained="demo", trust_remote_code=given)
    with pytest.raises(Loaded) as e:
        _ = lm.scorer.base.backend
    settings = e.value.settings
    assert settings.trust_remote_code is True and settings.pictures is False  # text options
    assert Path(settings.chat_template).name == "plain.jinja"


def test_trust_remote_code_is_off_unless_given(
    engine: None, lmms_model: Any, lm_eval_model: Any, tmp_path: Path
) -> None:
    from lad import Debiaser

    for scorer in (
        lmms_model(method="vanilla", model="demo", output=str(tmp_path / "o")).scorer,
        lm_eval_model(method="vanilla", pretrained="demo", trust_remote_code="False").scorer.base,
    ):
        with pytest.raises(Loaded) as e:
            _ = scorer.backend
        assert e.value.settings.trust_remote_code is False
    with pytest.raises(Loaded) as e:
        _ = Debiaser("demo", trust_remote_code=True, image_size=224, device="cpu").backend
    assert e.value.settings == LoadSettings(
        str(e.value.settings.model), device="cpu", trust_remote_code=True, image_size=224
    )


def test_a_bad_model_arg_is_named(lmms_model: Any) -> None:
    from lad.errors import LadError

    with pytest.raises(LadError, match="'trust_remote_code' model_arg must be True or False"):
        lmms_model(method="vanilla", model="demo", trust_remote_code="maybe")


def test_remote_code_is_refused_in_one_line_everywhere(
    remote_folder: Path, lmms_model: Any, lm_eval_model: Any, tmp_path: Path
) -> None:
    """Library, Debiaser and both harnesses: one line naming --trust-remote-code and
    trust_remote_code=True; given it, the refusal is gone (the folder's missing code is then
    the error)."""
    from lad import Debiaser
    from lad.backends import load_backend

    folder = str(remote_folder)
    ways = [
        lambda: load_backend(folder, device="cpu"),
        lambda: Debiaser(folder, device="cpu").backend,
        lambda: (
            lmms_model(method="vanilla", model=folder, output=str(tmp_path / "o")).scorer.backend
        ),
        lambda: lm_eval_model(method="vanilla", pretrained=folder).scorer.base.backend,
    ]
    for way in ways:
        with pytest.raises(BackendError, match=REFUSED) as e:
            way()
        assert "\n" not in str(e.value)
    with pytest.raises(BackendError, match="cannot load model") as e:
        load_backend(folder, device="cpu", trust_remote_code=True)
    assert "trust-remote-code" not in str(e.value)


def test_remote_code_is_refused_in_one_line_by_the_cli(
    remote_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lad.cli import main
    from lad.data.shapes import build_shapes

    build_shapes(tmp_path / "bench", num_candidates=2, items=2, split="eval", image_size=16)
    data = tmp_path / "bench/items.jsonl"
    argv = ["calibrate", "--model", str(remote_folder), "--data", str(data), "--items", "1"]
    argv += ["--device", "cpu", "--quiet", "--out", str(tmp_path / "c.json")]
    assert main(argv) == 1
    err = capsys.readouterr().err
    (line,) = err.strip().splitlines()
    assert line.startswith("Error: ") and "Traceback" not in err
    assert "pass --trust-remote-code" in line and "made_up_vlm" in line

"""The embedded demo model end to end: `lad eval`'s pipeline on the shipped weights.

Asserts what docs/demo-model.md claims for the default `lad eval` run (N = 4, random shapes,
100 items × 5 shuffles): the trained primacy bias is real (vanilla picks position 1, RStd >= 15),
vanilla's logits are at chance while the attention is not, and LAD is above vanilla.
"""

from __future__ import annotations

import json

import pytest

from lad.demo import MODEL_DIR, demo_model_path
from lad.errors import BackendError


def test_demo_model_path_is_the_shipped_folder():
    path = demo_model_path()
    assert path == MODEL_DIR
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert total <= 20 * 2**20


def test_missing_weights_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr("lad.demo.MODEL_DIR", tmp_path / "model")
    with pytest.raises(BackendError, match=r"demo model's weights are missing .*lad.demo.train"):
        demo_model_path()


def test_training_help_names_the_command(capsys):
    from lad.demo.train import main

    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "python -m lad.demo.train --out lad/demo/model" in capsys.readouterr().out


def test_bad_training_argument_is_an_error(capsys, tmp_path):
    from lad.demo.train import main

    assert main(["--out", str(tmp_path / "m"), "--position-decay", "0"]) == 1
    assert "Error: --position-decay must be in (0, 1]. Got 0.0." in capsys.readouterr().err


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`lad eval`'s default run on the shipped model (about 15 s on 2 cores)."""
    from lad.config import EvalConfig
    from lad.evaluate import evaluate

    config = EvalConfig(
        model="demo", num_candidates=4, setting="random", num_shuffles=5, quiet=True
    )
    return evaluate(config, tmp_path_factory.mktemp("demo") / "run").metrics["methods"]


def test_demo_model_has_the_trained_primacy_bias(demo_run):
    vanilla = demo_run["vanilla"]
    assert vanilla["rstd"] >= 15.0
    # The bias is the trained one: position 1 is chosen far more than its fair share.
    assert vanilla["selection_by_position"][0] >= 80.0
    assert demo_run["lad"]["rstd"] < vanilla["rstd"]


def test_lad_is_not_below_vanilla_on_the_demo_model(demo_run):
    assert demo_run["lad"]["acc"] >= demo_run["vanilla"]["acc"]
    # The card's divergence: logits at chance (25 %), purified attention above it.
    assert demo_run["vanilla"]["acc"] < 30.0
    assert demo_run["attn-purified"]["acc"] >= 30.0 and demo_run["lad"]["acc"] >= 30.0

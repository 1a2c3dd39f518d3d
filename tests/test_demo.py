"""The embedded demo model end to end: `lad eval`'s pipeline on the shipped weights.

Asserts what docs/demo-model.md claims for the default `lad eval` run (N = 4, random shapes,
100 items × 5 shuffles): the model is competent when position does not mislead it, its logits
are position-biased, and LAD recovers most of it from one forward pass.
"""

from __future__ import annotations

import json

import pytest

from lad.demo import MODEL_DIR, demo_model_path
from lad.errors import BackendError, LadError


def test_demo_model_path_is_the_shipped_folder():
    path = demo_model_path()
    assert path == MODEL_DIR
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "qwen2_vl"
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    assert total <= 20 * 2**20


def test_missing_weights_are_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr("lad.backends.checkpoint.DEMO_DIR", tmp_path)
    with pytest.raises(BackendError, match=r"demo model.s files are missing .*lad demo train"):
        demo_model_path()


def train_main(argv: list[str]) -> int:
    from lad.cli import main

    return main(["demo", "train", *argv])


def test_training_help_names_the_command(capsys):
    with pytest.raises(SystemExit) as exc:
        train_main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "lad demo train --out runs/demo-model" in out
    assert "lad demo train --out lad/demo/model --replace-shipped-model" in out


def test_bad_training_argument_is_an_error(capsys, tmp_path):
    assert train_main(["--out", str(tmp_path / "m"), "--position-decay", "0"]) == 1
    assert "Error: --position-decay must be in (0, 1]. Got 0.0." in capsys.readouterr().err


def test_bad_stage_is_an_error(tmp_path):
    from lad.demo.recipe import Stage, TrainConfig
    from lad.demo.train import train

    with pytest.raises(LadError, match=r"--drift must be one of first, previous\. Got 'last'"):
        TrainConfig(stages=(Stage("bias", 10, 4, drift="last"),)).check()
    with pytest.raises(LadError, match="stage bias: train must be one of all, head"):
        train(TrainConfig(stages=(Stage("bias", 10, 4, train="lm"),)), tmp_path / "m")
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--stage-steps", "10,x,5"], "--stage-steps must be 3 integers separated by commas"),
        (["--keep-label", "1.5"], "--keep-label must be in [0, 1]. Got 1.5."),
        (["--init", "SELF"], "is the same file as --init"),
        (["--out", "NOTMODEL"], "exists and is not a model folder"),
        (["--figure", "curve.txt"], "--figure curve.txt: give a .png path"),
        (["--figure", "NOTMODEL/keep.txt/curve.png"], "is a file, so no folder can be made"),
    ],
)
def test_training_refuses_bad_input_before_any_work(argv, message, capsys, tmp_path):
    notmodel = tmp_path / "notes"
    notmodel.mkdir()
    (notmodel / "keep.txt").write_text("mine")
    out = tmp_path / "m"
    out.mkdir()
    (out / "config.json").write_text("{}")
    argv = [a.replace("SELF", str(out)).replace("NOTMODEL", str(notmodel)) for a in argv]
    if "--out" not in argv:
        argv = ["--out", str(out), *argv]
    assert train_main(argv) == 1
    assert message in capsys.readouterr().err
    assert (notmodel / "keep.txt").read_text() == "mine"  # nothing clobbered
    assert (out / "config.json").read_text() == "{}"


def test_training_curve_goes_into_a_new_folder(tmp_path):
    figure = tmp_path / "new" / "curve.png"
    argv = ["--out", str(tmp_path / "m"), "--stage-steps", "0,0,0", "--train-items", "4"]
    assert train_main([*argv, "--figure", str(figure)]) == 0
    assert figure.read_bytes().startswith(b"\x89PNG")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """`lad eval`'s default run on the shipped model, less the blank method, which no test here
    reads (its extra pass over every prompt was a third of the run; the other methods' metrics
    do not depend on which methods run beside them)."""
    from lad.evaluate import evaluate
    from lad.run.config import DEFAULT_METHODS, eval_config

    methods = tuple(m for m in DEFAULT_METHODS if m != "blank")
    config = eval_config(
        model="demo",
        num_candidates=4,
        setting="random",
        num_shuffles=5,
        quiet=True,
        methods=methods,
    )
    return evaluate(config, tmp_path_factory.mktemp("demo") / "run").metrics["methods"]


def test_demo_model_is_competent_when_position_does_not_mislead(demo_run):
    assert demo_run["perm-avg"]["acc"] >= 75.0
    assert demo_run["attn-purified"]["acc"] >= 75.0


def test_demo_model_logits_are_position_biased(demo_run):
    vanilla = demo_run["vanilla"]
    recall = vanilla["recall_by_position"]
    assert vanilla["rstd"] >= 20.0
    assert max(recall) >= 85.0 and min(recall) <= 45.0
    assert vanilla["acc"] <= demo_run["attn-purified"]["acc"] - 20.0


def test_lad_recovers_the_answer_from_one_forward_pass(demo_run):
    lad, vanilla = demo_run["lad"], demo_run["vanilla"]
    assert lad["forward_passes_per_item"] == 1.0
    assert lad["acc"] >= vanilla["acc"] + 20.0
    assert lad["acc"] >= 0.9 * demo_run["attn-purified"]["acc"]
    assert lad["rstd"] <= 8.0


def test_the_audit_finds_vanilla_position_dependence_and_bounds_lad(demo_run):
    """Issue 33's done-when: vanilla's position dependence is significant, LAD's RStd comes with
    an interval, and order explains most of vanilla's errors."""
    vanilla, lad = demo_run["vanilla"], demo_run["lad"]
    assert vanilla["position_test"]["p_value"] < 0.01
    lo, hi = lad["ci"]["rstd"]
    assert lo <= lad["rstd"] <= hi < vanilla["ci"]["rstd"][0]
    assert vanilla["flip_rate"] > lad["flip_rate"] + 30.0
    assert vanilla["errors_due_to_order"] >= 80.0
    assert vanilla["circular_acc"] <= vanilla["acc"] <= vanilla["any_order_acc"]


def test_lad_beats_a_fixed_prior_because_the_bias_is_conditional(demo_run):
    assert demo_run["lad"]["acc"] >= demo_run["pride"]["acc"] + 10.0


@pytest.mark.parametrize(
    ("num_candidates", "setting", "margin"), [(8, "random", 15.0), (4, "adversarial", 0.0)]
)
def test_lad_beats_vanilla_beyond_the_default(num_candidates, setting, margin, tmp_path):
    """`lad eval -n 8` and `lad eval --setting adversarial`, scoring the two methods compared
    (vanilla's and LAD's metrics are the same as in a run of every default method, without the
    extra stages of perm-avg, N shifts per item, and blank, every prompt again)."""
    from lad.evaluate import evaluate
    from lad.run.config import eval_config

    config = eval_config(
        model="demo",
        num_candidates=num_candidates,
        setting=setting,
        num_shuffles=5,
        quiet=True,
        methods=("vanilla", "lad"),
    )
    methods = evaluate(config, tmp_path / "run").metrics["methods"]
    assert methods["lad"]["acc"] >= methods["vanilla"]["acc"] + margin


def test_a_head_only_stage_leaves_every_attention_map_unchanged(tmp_path):
    """The bias stage trains the output mapping only, so the grounded attention survives it."""
    import torch
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from lad.demo import batches as B
    from lad.demo import train as T
    from lad.demo.recipe import Stage, TrainConfig

    T._initial_model(TrainConfig(), tmp_path / "init")
    stage = Stage("bias", 3, 3, keep_label=0.5, drift="previous", train="head", match_only=True)
    config = TrainConfig(stages=(stage,), batch_size=2, train_items=8, monitor_items=2, lr=0.05)
    T.train(config, tmp_path / "out", init=tmp_path / "init", log=lambda _: None)

    def forward(path):
        model = AutoModelForImageTextToText.from_pretrained(path, attn_implementation="eager")
        processor = AutoProcessor.from_pretrained(path)
        items = B.load_items(
            processor, path.parent / f"data-{path.name}", "eval", ("random",), 1, config
        )
        tokens = B.Tokens(processor, items[0].pixels[0].shape[0] // 4)
        example = B.Example("match", items[0].query, items[0].pixels[:3], "", [])
        batch, _, _ = B.collate(tokens, [example], with_targets=False)
        with torch.no_grad():
            return model(**batch, output_attentions=True)

    before, after = forward(tmp_path / "init"), forward(tmp_path / "out")
    for a, b in zip(before.attentions, after.attentions, strict=True):
        assert torch.equal(a, b)
    assert not torch.allclose(before.logits, after.logits)


def test_fast_batches_equal_the_processor(tmp_path):
    """Training batches are built without the processor (pictures preprocessed once, prompts
    tokenised once); they must equal what the processor gives for the same texts and images."""
    import torch
    from PIL import Image
    from transformers import AutoProcessor

    from lad.backends.prompting import chat_text
    from lad.demo import batches as B
    from lad.demo import train as T
    from lad.demo.recipe import TrainConfig

    T._initial_model(TrainConfig(), tmp_path / "m")
    processor = AutoProcessor.from_pretrained(tmp_path / "m")
    colours = [(220, 30, 30), (30, 70, 220), (30, 160, 50)]
    images = [Image.new("RGB", (64, 64), c) for c in colours]
    pixels = [B.pixels_of(processor, im) for im in images]
    examples = [
        B.Example("match", "a red circle", pixels[:3], "2", []),
        B.Example("refer", B.REFER_PROMPT.format(k=1), pixels[:2], "a blue square", []),
    ]
    tokens = B.Tokens(processor, pixels[0].shape[0] // 4)
    batch, labels, last = B.collate(tokens, examples)
    prompts = [
        B.prompt_text(processor, "a red circle", 3),
        chat_text(processor, B.REFER_PROMPT.format(k=1), 2),
    ]
    eos = processor.tokenizer.eos_token
    processor.tokenizer.padding_side = "right"
    expected = processor(
        text=[prompts[0] + "2" + eos, prompts[1] + "a blue square" + eos],
        images=[images[:3], images[:2]],
        return_tensors="pt",
        padding=True,
    )
    for key in ("input_ids", "attention_mask", "mm_token_type_ids", "image_grid_thw"):
        assert torch.equal(batch[key], expected[key]), key
    assert torch.allclose(batch["pixel_values"], expected["pixel_values"])
    # The labels are the target and end-of-turn tokens only, right after each prompt.
    plain = processor(text=prompts, images=[images[:3], images[:2]], padding=True)
    for b, n in enumerate(torch.tensor(plain["attention_mask"]).sum(1).tolist()):
        assert int(last[b]) == n - 1
        kept = labels[b][labels[b] != -100]
        assert torch.equal(kept, expected["input_ids"][b, n : n + len(kept)])

"""Official parity from the command line (docs/methods.md, "The official code's variants"), on a
tiny Qwen2.5-VL: --preset official, the image resolution flags, --orders, calibration on
evaluation items."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from lad.backends import load_backend
from lad.cli import main
from lad.core.labels import get_scheme
from lad.core.methods import MethodOptions
from lad.core.predictions import read_predictions
from lad.core.records import read_records
from lad.data.items import Item, read_items
from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import BackendError, DataError, RunError
from lad.evaluate import evaluate
from lad.run.config import EvalConfig, eval_config
from lad.testing.tiny import build_tiny_model

N = 3
# The official code's variants as docs/methods.md states them, typed out independently of
# lad.run.presets: Eq. 1 over logits, Eq. 13 in log space, Eq. 11 on the mean raw attention, top-K
# inside layers 21..35, 336×336 pictures, calibration on the first evaluation items, the label
# logits under the repetition penalty of the model's generation_config (generate's scores).
OFFICIAL = {
    "obs_mean": "logit",
    "mixture": "log",
    "attn_mean": "raw",
    "layer_range": (21, 35),
    "image_size": 336,
    "calibrate_on": "evaluation",
    "prompt_template": (
        "Given {n} images indexed from {first} to {last}, identify the image that best matches the "
        "provided caption. Respond with the index {noun} only and nothing else.\nCaption: "
        "{caption}\nAnswer: "
    ),
    "repetition_penalty": "model",
}


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("qwen25") / "model"
    return str(build_tiny_model("qwen2_5_vl", path, words=shapes_vocabulary()))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    kw = {"num_candidates": N, "setting": "random", "seed": 3, "image_size": 32}
    return build_shapes(tmp_path_factory.mktemp("shapes") / "eval", items=4, split="eval", **kw)


def _parsed_config(monkeypatch, argv: list[str]) -> EvalConfig:
    """The EvalConfig `lad eval argv` would run, without running it (for a hub model of the
    official code's size: the demo model's 4 layers would refuse the preset's 21..35)."""
    seen = []
    argv = ["--model", "Qwen/Qwen2.5-VL-3B-Instruct", *argv]

    def capture(config, out, after_checks=None, data=None):
        seen.append(config)
        after_checks()  # what evaluate does once its checks passed
        raise SystemExit(0)

    monkeypatch.setattr("lad.evaluate.evaluate", capture)
    with pytest.raises(SystemExit):
        main(["eval", *argv])
    return seen[0]


def test_preset_official_sets_the_documented_variants(monkeypatch, capsys):
    config = _parsed_config(monkeypatch, ["--preset", "official"])
    assert {name: getattr(config, name) for name in OFFICIAL} == OFFICIAL
    assert config.options == MethodOptions(
        obs_mean="logit", mixture="log", attn_mean="raw", layer_range=(21, 35)
    )
    assert "Warning: calibrating on the first 5 evaluation items" in capsys.readouterr().err
    paper = _parsed_config(monkeypatch, [])
    assert paper.options == MethodOptions()
    assert (paper.image_size, paper.calibrate_on) == (None, "held-out")


def test_stated_flags_win_over_the_preset(monkeypatch, capsys):
    argv = [
        "--preset",
        "official",
        "--layer-range",
        "0,1",
        "--mixture",
        "prob",
        "--image-size",
        "56",
    ]
    config = _parsed_config(monkeypatch, argv)
    assert (config.layer_range, config.mixture, config.image_size) == ((0, 1), "prob", 56)
    assert (config.obs_mean, config.attn_mean) == ("logit", "raw")
    capsys.readouterr()
    # A stated calibration source is a held-out one: no warning, no conflict.
    config = _parsed_config(monkeypatch, ["--preset", "official", "--calibration-data", "c.jsonl"])
    assert config.calibrate_on == "held-out" and "Warning" not in capsys.readouterr().err


def test_the_preset_asks_text_candidates_with_lads_text_template(monkeypatch, capsys):
    """The official code has no items of text candidates: its caption prompt (no {options}) and
    336-pixel resize do not apply to them (both were refused, once the model had loaded); its
    other settings do."""
    from lad.backends.checkpoint import shipped_model_path

    text = shipped_model_path("text-demo") / "items.jsonl"
    config = _parsed_config(monkeypatch, ["--preset", "official", "--data", str(text)])
    assert (config.image_size, config.prompt_template) == (None, None)
    assert (config.obs_mean, config.calibrate_on) == ("logit", "evaluation")


def test_predict_calibrate_and_score_take_the_preset_too():
    from lad.cli import build_parser

    parser = build_parser()
    predict = parser.parse_args(["predict", "--calibration", "c.json", "--query", "q", "a.png",
                                 "--preset", "official", "--image-size", "448"])  # fmt: skip
    calibrate = parser.parse_args(["calibrate", "--data", "d.jsonl", "--out", "c.json",
                                   "--preset", "official", "--obs-mean", "logit"])  # fmt: skip
    score = parser.parse_args(["score", "--records", "r.jsonl", "--method", "lad", "--out", "p",
                               "--preset", "official", "--attn-mean", "log"])  # fmt: skip
    assert (predict.preset, predict.image_size) == ("official", 448)
    assert (calibrate.preset, calibrate.obs_mean) == ("official", "logit")
    assert (score.preset, score.attn_mean) == ("official", "log")


def _eval(qwen: str, data: Path, out: Path, *extra: str) -> int:
    argv = ["eval", "--model", qwen, "--data", str(data), "-n", str(N), "--calibration-items", "2"]
    argv += ["--batch-size", "2", "--device", "cpu", "--quiet", "--out", str(out)]
    return main([*argv, "--methods", "vanilla,pride,lad,attn,attn-purified", *extra])


@pytest.fixture(scope="module")
def official_run(qwen, data, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("runs") / "official"
    # The tiny model has 2 decoder layers; the preset's 21..35 would start past them.
    assert _eval(qwen, data, out, "--num-shuffles", "2", "--preset", "official",
                 "--layer-range", "0,1") == 0  # fmt: skip
    return out


def test_official_run_records_its_arguments_and_scores_as_lad_score_with_the_variants(
    official_run, tmp_path
):
    arguments = json.loads((official_run / "run.json").read_text())["arguments"]
    assert arguments["image_size"] == 336 and arguments["calibrate_on"] == "evaluation"
    records = read_records(official_run / "records.jsonl")
    # 336×336 pictures: 12×12 merged patches of 28 px each, plus <|vision_start|>/<|vision_end|>.
    assert {tuple(e["image_tokens"]) for e in records.extra} == {(146,) * N}
    out = tmp_path / "preds.jsonl"
    assert main(["score", "--records", str(official_run / "records.jsonl"),
                 "--calibration-records", str(official_run / "calibration.jsonl"),
                 "--method", "lad", "--method", "pride", "--obs-mean", "logit", "--mixture", "log",
                 "--attn-mean", "raw", "--layer-range", "0,1", "--out", str(out)]) == 0  # fmt: skip
    by_hand = {(p.item, p.ordering, p.method): p for p in read_predictions(out)}
    stored = [p for p in read_predictions(official_run / "predictions.jsonl") if p.method in
              ("lad", "pride")]  # fmt: skip
    assert len(stored) == len(by_hand) == 2 * len(records)
    for p in stored:
        twin = by_hand[(p.item, p.ordering, p.method)]
        assert p.prediction == twin.prediction
        np.testing.assert_allclose(p.scores, twin.scores, rtol=0, atol=1e-9)
    calibration = json.loads((official_run / "calibration.json").read_text())
    assert calibration["obs_mean"] == "logit"
    assert arguments["prompt_template"] == OFFICIAL["prompt_template"]
    # What the calibration records were made with besides the prompt: 336×336 pictures, the
    # checkpoint's own chat template, no processor options.
    assert calibration["preprocessing"] == {
        "chat_template_sha256": None,
        "image_size": 336,
        "image_options": {},
    }


def test_the_official_prompt_is_the_papers_with_a_space_after_answer(qwen, data):
    from lad.core.prompts import PromptTemplate

    backend = load_backend(qwen, device="cpu", dtype="float32")
    item = read_items(data)[0]
    request = [(item, 0, list(range(N)))]
    paper = backend.build_prompts(request, "vanilla", get_scheme("digits"))[0][0]
    official = PromptTemplate(OFFICIAL["prompt_template"])
    text = backend.build_prompts(request, official, get_scheme("digits"))[0][0]
    assert paper.count("\nAnswer:<|im_end|>") == 1
    assert text == paper.replace("\nAnswer:<|im_end|>", "\nAnswer: <|im_end|>")


def test_calibration_on_evaluation_items_uses_the_first_ones_and_scores_them(official_run, data):
    first = [it.id for it in read_items(data)]
    calibrated = list(dict.fromkeys(read_records(official_run / "calibration.jsonl").items))
    evaluated = list(dict.fromkeys(read_records(official_run / "records.jsonl").items))
    assert calibrated == first[:2] and evaluated == first


def test_calibration_on_evaluation_items_is_refused_with_another_calibration_source(qwen, data):
    with pytest.raises(RunError, match=r"--calibrate-on evaluation .* --calibration-data"):
        eval_config(model=qwen, data=str(data), calibrate_on="evaluation", calibration_data="x")


def test_a_layer_range_past_the_model_is_refused_before_any_record(qwen, data, tmp_path, capsys):
    out = tmp_path / "run"
    assert _eval(qwen, data, out, "--preset", "official") == 1
    assert capsys.readouterr().err.startswith(
        "Error: --preset official: Eq. 9 would search attention layers 21..35, but "
    )
    assert not (out / "calibration.jsonl").exists()


# ------------------------------------------------------------------ image resolution


def _picture(folder: Path, name: str, width: int, height: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(width * height)
    path = folder / name
    Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8")).save(path)
    return path


def _image_pad_counts(backend, images: list[Path]) -> list[int]:
    """<|image_pad|> tokens per image, counted in the encoded prompt (one image per prompt)."""
    pad = backend.model.config.image_token_id
    counts = []
    for image in images:
        item = Item("q", "red ball", [image, image], 0)
        texts, pictures = backend.build_prompts(
            [(item, 0, [0, 1])], "vanilla", get_scheme("digits")
        )
        inputs, _ = backend.encode([(item, 0, [0, 1])], texts, pictures)
        counts.append(int((inputs["input_ids"] == pad).sum()) // 2)
    return counts


def test_image_size_336_gives_144_tokens_per_image(qwen, tmp_path):
    images = [_picture(tmp_path, "a.png", 224, 224), _picture(tmp_path, "b.png", 640, 480)]
    as_is = load_backend(qwen, device="cpu", dtype="float32")
    resized = load_backend(qwen, device="cpu", dtype="float32", image_size=336)
    # As is: 224 px is 8×8 tokens of 28 px. 640×480 exceeds lad's budget of 256·28² pixels:
    # scaled by √(640·480 / 200704) and floored to multiples of 28, 504×364 px, 18×13 tokens.
    assert _image_pad_counts(as_is, images) == [64, 234]
    assert _image_pad_counts(resized, images) == [144, 144]


def test_pixel_budget_flags_set_the_qwen_processor_size(qwen, tmp_path):
    big = _picture(tmp_path, "big.png", 640, 480)
    small = _picture(tmp_path, "small.png", 56, 56)
    options = {"max_pixels": 28 * 28 * 16, "min_pixels": 28 * 28 * 9}
    backend = load_backend(qwen, device="cpu", dtype="float32", image_options=options)
    assert backend.image_options["size"] == {"shortest_edge": 7056, "longest_edge": 12544}
    big_tokens, small_tokens = _image_pad_counts(backend, [big, small])
    assert 9 <= big_tokens <= 16 and small_tokens == 9


def test_pixel_budget_on_an_architecture_without_one_is_refused(tmp_path):
    llava = build_tiny_model("llava", tmp_path / "llava")
    with pytest.raises(BackendError, match=r"--min-pixels/--max-pixels .* LLaVA-1\.5 has none"):
        load_backend(str(llava), device="cpu", image_options={"max_pixels": 1000})


def test_image_flags_reach_run_json(monkeypatch):
    argv = ["--image-size", "448", "--max-pixels", "200000", "--image-option", "max_patches=6",
            "--image-option", "do_image_splitting=false"]  # fmt: skip
    config = _parsed_config(monkeypatch, argv)
    assert config.image_size == 448
    assert config.image_options == {
        "max_patches": 6,
        "do_image_splitting": False,
        "max_pixels": 200000,
    }
    assert {"image_size", "image_options"} <= set(config.identity())


# ------------------------------------------------------------------ explicit orders


def _write_orders(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_orders_file_evaluates_exactly_those_orderings(qwen, data, tmp_path):
    items = [it.id for it in read_items(data)]
    rng = np.random.default_rng(7)
    rows = [
        {"item": item, "order": rng.permutation(N).tolist()} for _ in range(3) for item in items
    ]  # interleaved: an item's orderings are numbered in file order
    orders = _write_orders(tmp_path / "orders.jsonl", rows)
    cal = build_shapes(tmp_path / "cal", num_candidates=N, items=2, split="calibration", seed=3,
                       image_size=32)  # fmt: skip
    out = tmp_path / "run"
    assert _eval(qwen, data, out, "--orders", str(orders), "--calibration-data", str(cal)) == 0
    records = read_records(out / "records.jsonl")
    made = [(str(i), int(t), o.tolist()) for i, t, o in
            zip(records.items, records.ordering, records.order, strict=True)]  # fmt: skip
    expected = [
        (item, t, [r["order"] for r in rows if r["item"] == item][t])
        for item in items
        for t in range(3)
    ]
    assert made == expected
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["num_shuffles"] == 3
    # A records file is an orders file: it reproduces the run's orderings exactly.
    again = tmp_path / "again"
    argv = ("--orders", str(out / "records.jsonl"), "--calibration-data", str(cal))
    assert _eval(qwen, data, again, *argv) == 0
    assert (again / "records.jsonl").read_bytes() == (out / "records.jsonl").read_bytes()


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"item": "x", "order": [0, 0, 1]}], r"orders.jsonl:1: 'order' \[0, 0, 1\] is not a perm"),
        ([{"order": [0, 1, 2]}], r"orders.jsonl:1: missing key 'item'"),
        (
            [{"item": "x", "order": [0, 1, 2], "ordering": 0}, {"item": "x", "order": [1, 0, 2]}],
            r"orders.jsonl:2: give an 'ordering' on every line or on none",
        ),
        ([{"item": "x", "order": [0, 1, 2], "ordering": 1}], r"item 'x' has orderings \[1\]"),
    ],
)
def test_bad_orders_files_are_named(data, tmp_path, rows, message):
    orders = _write_orders(tmp_path / "orders.jsonl", rows)
    config = eval_config(model="unused", data=str(data), num_candidates=N, orders=str(orders),
                        calibrate_on="evaluation", calibration_items=1)  # fmt: skip
    with pytest.raises(DataError, match=message):
        evaluate(config, tmp_path / "run")


def test_orders_must_cover_every_evaluation_item_the_same_number_of_times(data, tmp_path):
    ids = [it.id for it in read_items(data)]
    common = {"model": "unused", "data": str(data), "num_candidates": N,
              "calibrate_on": "evaluation", "calibration_items": 1}  # fmt: skip
    rows = [{"item": i, "order": [0, 1, 2]} for i in ids[1:]]
    config = eval_config(**common, orders=str(_write_orders(tmp_path / "a.jsonl", rows)))
    with pytest.raises(
        DataError, match=rf"no orders for 1 evaluation item\(s\), e.g. \['{ids[0]}'\]"
    ):
        evaluate(config, tmp_path / "a")
    rows = [{"item": i, "order": [0, 1, 2]} for i in ids] + [{"item": ids[2], "order": [2, 1, 0]}]
    config = eval_config(**common, orders=str(_write_orders(tmp_path / "b.jsonl", rows)))
    with pytest.raises(DataError, match=r"different numbers of orderings \(\[1, 2\]"):
        evaluate(config, tmp_path / "b")


def test_predict_with_the_preset_and_the_official_runs_calibration(
    official_run, qwen, data, capsys, tmp_path
):
    images = [str(p) for p in read_items(data)[0].images]
    calibration = str(official_run / "calibration.json")
    argv = ["predict", "--model", qwen, "--device", "cpu", "--calibration", calibration]
    argv += ["--query", "a red circle", "--json", *images]
    assert main([*argv, "--preset", "official", "--layer-range", "0,1"]) == 0
    official = json.loads(capsys.readouterr().out)
    assert len(official["posterior"]) == N and set(official["layers"]) <= {0, 1}
    # Without the preset the prompt lacks its final space: the fingerprint refuses the calibration.
    assert main([*argv, "--image-size", "336"]) == 1
    err = capsys.readouterr().err
    assert "the calibration's prompt is the official code's prompt (--preset official), but " in err
    assert "this query's is the paper's caption prompt" in err
    # The official prompt as a template file: Eq. 1's average is then the calibration's own, and
    # stating another is refused.
    template = tmp_path / "official.txt"
    template.write_text(OFFICIAL["prompt_template"] + "\n")
    argv += ["--prompt-template", str(template)]
    # The official prompt but native resolution: the calibration's 336×336 records are refused,
    # unless told to apply it anyway.
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == (
        f"Error: {calibration}: the calibration was fitted on records made with --image-size 336, "
        "but these records are made with no --image-size (pictures as they are); recalibrate with "
        "the same --image-size, or skip this check on purpose (--no-calibration-check)\n"
    )
    assert main([*argv, "--no-calibration-check"]) == 0
    capsys.readouterr()
    argv += ["--image-size", "336"]
    assert main(argv) == 0
    capsys.readouterr()
    assert main([*argv, "--obs-mean", "prob"]) == 1
    assert "was fitted with obs_mean 'logit' (Eq. 1), not 'prob'" in capsys.readouterr().err


def test_a_given_calibration_of_another_eq1_average_is_refused_before_model_work(
    official_run, qwen, data, tmp_path
):
    from lad.errors import CalibrationError

    config = eval_config(model=qwen, data=str(data), num_candidates=N, calibration_items=2,
                        calibration=str(official_run / "calibration.json"))  # fmt: skip
    with pytest.raises(
        CalibrationError, match=r"fitted with obs_mean 'logit' \(Eq. 1\), not 'prob'"
    ):
        evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_given_calibration_made_at_336_is_refused_at_native_resolution_before_model_work(
    official_run, qwen, data, tmp_path, monkeypatch
):
    from lad.core.prompts import PromptTemplate
    from lad.errors import CalibrationError
    from lad.run.debiaser import Debiaser

    def no_model(*a, **k):
        raise AssertionError("the refusal must come before the model loads")

    monkeypatch.setattr("lad.backends.load_backend", no_model)
    calibration = str(official_run / "calibration.json")
    template = OFFICIAL["prompt_template"]
    config = eval_config(model=qwen, data=str(data), num_candidates=N, obs_mean="logit",
                        prompt_template=template, calibration=calibration)  # fmt: skip
    refusal = r"made with --image-size 336, but these records are made with no --image-size"
    with pytest.raises(CalibrationError, match=refusal):
        evaluate(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
    debiaser = Debiaser(qwen, device="cpu", prompt_template=PromptTemplate(template))
    debiaser.load(calibration)
    images = read_items(data)[0].images
    with pytest.raises(CalibrationError, match=rf"{calibration}: the calibration .*{refusal}"):
        debiaser.predict("a red circle", images)


def test_a_rerun_with_other_eq1_and_scoring_variants_rescores_without_the_model(
    official_run, qwen, data, tmp_path, monkeypatch, capsys
):
    import shutil

    run = tmp_path / "copy"
    shutil.copytree(official_run, run)

    def no_model(*a, **k):
        raise AssertionError("rescoring must not load the model")

    monkeypatch.setattr("lad.backends.load_backend", no_model)
    common = ["--num-shuffles", "2", "--preset", "official"]
    paper_scoring = ["--obs-mean", "prob", "--mixture", "prob", "--attn-mean", "log"]
    assert _eval(qwen, data, run, *common, *paper_scoring, "--layer-range", "1,1") == 0
    assert json.loads((run / "calibration.json").read_text())["obs_mean"] == "prob"
    assert {p.prediction for p in read_predictions(run / "predictions.jsonl")} <= set(range(N))
    # Without the preset the records would differ (picture size, prompt, calibration items).
    capsys.readouterr()
    assert _eval(qwen, data, run, "--num-shuffles", "2") == 1
    assert "was made with --prompt-template" in capsys.readouterr().err

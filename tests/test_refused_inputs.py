"""Every input lad refuses, one test per case (docs/errors.md).

Each case is a command a user could type. It must end in exactly one `Error: ...` line naming
the culprit (file, line, item or flag), exit code 1, no traceback, and it must come before any
model work: the model loader is replaced by one that fails the test.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from lad.backends.checkpoint import shipped_model_path
from lad.cli import main
from lad.core.records import write_records
from lad.data.shapes import build_shapes
from tests.synthetic import SyntheticModel


@pytest.fixture(autouse=True)
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a refused input must be caught before the model loads")

    monkeypatch.setattr("lad.backends.load_backend", refuse)


@pytest.fixture
def stored(tmp_path) -> Path:
    """records.jsonl, calibration.jsonl and a predictions file of a synthetic model."""
    model = SyntheticModel(num_candidates=4, num_layers=6)
    write_records(tmp_path / "records.jsonl", model.eval_records(6, num_shuffles=2))
    write_records(tmp_path / "calibration.jsonl", model.calibration_records(3))
    assert main(["score", *_score_inputs(tmp_path), "--out", str(tmp_path / "pred.jsonl")]) == 0
    return tmp_path


@pytest.fixture(scope="module")
def shapes(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("shapes")
    return build_shapes(root, num_candidates=3, items=4, split="eval", image_size=16)


def _score_inputs(d: Path) -> list[str]:
    return [
        "--records",
        str(d / "records.jsonl"),
        "--calibration-records",
        str(d / "calibration.jsonl"),
        "--method",
        "lad",
    ]


def refused(capsys, argv: list[str], pattern: str) -> str:
    """Run `lad ARGV`: exit 1 and one `Error:` line matching `pattern`; return that line."""
    capsys.readouterr()
    assert main([str(a) for a in argv]) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), err
    assert re.search(pattern, lines[0]), lines[0]
    return lines[0]


# ---------------------------------------------------------------- outputs over inputs (point 2)


def test_score_out_over_its_records(stored, capsys):
    before = (stored / "records.jsonl").read_bytes()
    refused(
        capsys,
        ["score", *_score_inputs(stored), "--out", stored / "records.jsonl"],
        r"--out .*records\.jsonl is the same file as --records",
    )
    assert (stored / "records.jsonl").read_bytes() == before


def test_score_out_over_its_records_spelled_otherwise(stored, capsys, monkeypatch):
    monkeypatch.chdir(stored)
    inputs = ["--records", "records.jsonl", "--calibration-records", "calibration.jsonl"]
    refused(
        capsys,
        ["score", *inputs, "--method", "vanilla", "--out", "./sub/../records.jsonl"],
        r"is the same file as --records records\.jsonl",
    )
    (stored / "link.jsonl").symlink_to(stored / "calibration.jsonl")
    refused(
        capsys,
        ["score", *inputs, "--method", "vanilla", "--out", "link.jsonl"],
        r"--out link\.jsonl is the same file as --calibration-records",
    )


def test_score_save_calibration_over_an_input_or_the_out(stored, capsys):
    refused(
        capsys,
        [
            "score",
            *_score_inputs(stored),
            "--save-calibration",
            stored / "calibration.jsonl",
            "--out",
            stored / "p.jsonl",
        ],
        r"--save-calibration .* is the same file as --calibration-records",
    )
    refused(
        capsys,
        [
            "score",
            *_score_inputs(stored),
            "--save-calibration",
            stored / "p.jsonl",
            "--out",
            stored / "p.jsonl",
        ],
        r"--save-calibration .*p\.jsonl is the same file as --out",
    )


def test_metrics_out_over_its_predictions(stored, capsys):
    refused(
        capsys,
        [
            "metrics",
            "--records",
            stored / "records.jsonl",
            "--predictions",
            stored / "pred.jsonl",
            "--out",
            stored / "pred.jsonl",
        ],
        r"--out .*pred\.jsonl is the same file as --predictions",
    )


def test_calibrate_out_over_its_items(shapes, capsys, tmp_path):
    copy = tmp_path / "items.jsonl"
    copy.write_bytes(shapes.read_bytes())
    for line in copy.read_text().splitlines():  # images resolve against the copy's folder
        for image in json.loads(line)["images"]:
            (tmp_path / image).parent.mkdir(exist_ok=True)
            (tmp_path / image).write_bytes((shapes.parent / image).read_bytes())
    before = copy.read_bytes()
    refused(
        capsys,
        ["calibrate", "--data", copy, "--out", copy],
        r"--out .*items\.jsonl is the same file as --data",
    )
    image = tmp_path / json.loads(before.splitlines()[0])["images"][0]
    refused(
        capsys,
        ["calibrate", "--data", copy, "--out", image],
        r"--out .*\.png is the same file as image",
    )
    assert copy.read_bytes() == before


def test_calibrate_records_file_over_its_items(shapes, capsys, tmp_path):
    # --out X.json writes X.records.jsonl beside it: that must not be the items file either.
    target = shapes.with_name("cal.records.jsonl")
    target.write_bytes(shapes.read_bytes())
    refused(
        capsys,
        ["calibrate", "--data", target, "--out", shapes.with_name("cal.json")],
        r"its records file .*cal\.records\.jsonl is the same file as --data",
    )


def test_data_import_out_over_the_official_file(tmp_path, capsys):
    official = tmp_path / "official.jsonl"
    official.write_text("[]")
    refused(
        capsys,
        ["data", "import", official, "--images", tmp_path, "--out", official],
        r"--out .*official\.jsonl is the same file as the file argument .*official\.jsonl",
    )


def test_data_coco_out_over_its_captions(tmp_path, capsys):
    captions = tmp_path / "captions.jsonl"
    captions.write_text("{}")
    refused(
        capsys,
        ["data", "coco", "--images", tmp_path, "--captions", captions, "--out", captions],
        r"--out .*captions\.jsonl is the same file as --captions",
    )


# ---------------------------------------------------------------- lad eval: arguments (point 5)

N = 3
TEXT_DEMO = shipped_model_path("text-demo")  # its config.json and items; loading it fails a test


@pytest.fixture
def model(tmp_path) -> Path:
    """A model folder as far as the checks read it (config.json: 2 decoder layers). Loading it
    would fail the test (see `no_model`)."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"text_config": {"num_hidden_layers": 2}}))
    return folder


@pytest.fixture
def calibration(tmp_path, model) -> Path:
    """A calibration.json made for `model`, N = 3 digits, the vanilla prompt, 2 layers."""
    return _calibration(tmp_path / "calibration.json", model=str(model))


def _calibration(path: Path, **changes) -> Path:
    import numpy as np

    from lad.core.calibrate import Calibration
    from lad.core.labels import get_scheme
    from lad.core.prompts import prompt_sha256

    scheme = get_scheme("digits")
    log_bias = np.log(np.full((N, N), 1 / N))
    cal = Calibration.from_arrays(log_bias, np.full((2, N), 0.2))
    obj = cal.to_dict() | {
        "labels": scheme.labels(N),
        "prompt_sha256": prompt_sha256("vanilla", scheme, N),
    }
    path.write_text(json.dumps(obj | changes))
    return path


def _eval(model: Path, shapes: Path, out: Path, *extra) -> list:
    return ["eval", "--model", model, "--data", shapes, "-n", N, "--calibration-items", 1,
            "--quiet", "--out", out, *extra]  # fmt: skip


@pytest.fixture
def would_load(monkeypatch):
    """Loading the model is where these runs would start work: report it as an error."""
    from lad.errors import BackendError

    def loading(*args, **kwargs):
        raise BackendError("the checks passed; the model would load now")

    monkeypatch.setattr("lad.backends.load_backend", loading)


def test_eval_picture_settings_for_text_candidates(tmp_path, capsys):
    """A caption prompt (no {options}) for text candidates, a picture option for a text-only
    model: refused before the model loads (they were refused once it had, run.json written)."""
    from lad.core.prompts import OFFICIAL

    (tmp_path / "caption.txt").write_text(OFFICIAL.text)
    out = tmp_path / "r"
    argv = ["eval", "--model", "text-demo", "--data", TEXT_DEMO / "items.jsonl", "--out", out]
    refused(
        capsys,
        [*argv, "--prompt-template", tmp_path / "caption.txt"],
        r"^Error: --prompt-template does not write \{options\}, where the items' text candidates",
    )
    refused(capsys, [*argv, "--image-size", 336], r"text-only causal LM: it takes no image options")
    assert not out.exists()


def test_calibrate_preset_official_on_text_candidates(tmp_path, capsys, would_load):
    """The preset's caption prompt and image size are for pictures: text candidates are asked
    with lad's text template (lad calibrate refused them, naming a --prompt-template not given)."""
    data = TEXT_DEMO / "items.calibration.jsonl"
    argv = ["calibrate", "--model", "text-demo", "--data", data, "--preset", "official"]
    refused(capsys, [*argv, "--out", tmp_path / "c.json"], r"the model would load now$")


def test_eval_calibration_file_missing(model, shapes, tmp_path, capsys):
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", tmp_path / "none.json"),
        r"none\.json: no such calibration file",
    )


def test_eval_calibration_not_json(model, shapes, tmp_path, capsys):
    bad = tmp_path / "cal.json"
    bad.write_text('{"format": "lad-calibration/1",\n oops}')
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", bad),
        r"cal\.json: not valid JSON \(.*, line 2\)",
    )


def test_eval_calibration_for_another_n(model, shapes, tmp_path, capsys):
    path = _calibration(tmp_path / "c.json", model=str(model), num_candidates=4)
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", path),
        r"c\.json: 'log_obs' must have shape \(4, 4\)",
    )
    path = _calibration(tmp_path / "c3.json", model=str(model))
    four = build_shapes(tmp_path / "n4", num_candidates=4, items=3, split="eval", image_size=16)
    argv = _eval(model, four, tmp_path / "r", "--calibration", path)
    argv[argv.index("-n") + 1] = 4
    refused(capsys, argv, r"c3\.json: the calibration is for N = 3 candidates but .* N = 4")


def test_eval_calibration_for_other_labels(model, shapes, calibration, tmp_path, capsys):
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", calibration, "--labels", "upper"),
        r"calibration\.json: the calibration's labels is \['1', '2', '3'\] but .*\['A', 'B', 'C'\]",
    )


def test_eval_calibration_for_another_model(model, shapes, tmp_path, capsys):
    path = _calibration(tmp_path / "c.json", model="someone/else")
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", path),
        r"c\.json: the calibration's model is 'someone/else'",
    )


def test_eval_calibration_for_another_prompt(model, shapes, tmp_path, capsys):
    path = _calibration(tmp_path / "c.json", model=str(model), prompt_sha256="0" * 64)
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", path),
        r"c\.json: the calibration's prompt is a prompt template of one's own \(--prompt-template; "
        r"fingerprint 000000000000…\), but the records' is the paper's caption prompt",
    )


def test_eval_same_model_spelled_otherwise_is_not_another_model(
    model, shapes, tmp_path, capsys, monkeypatch, would_load
):
    monkeypatch.chdir(tmp_path)
    path = _calibration(tmp_path / "c.json", model="./model/")
    refused(
        capsys,
        _eval("model", shapes, tmp_path / "r", "--calibration", path),
        r"the model would load now",
    )


def test_eval_top_k_zero(model, shapes, tmp_path, capsys):
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--top-k", 0),
        r"^Error: --top-k must be >= 1\. Got 0\.$",
    )


def test_eval_items_above_what_the_data_holds(model, shapes, tmp_path, capsys):
    """A stated --items is what the run evaluates: 4 items less 1 held out are not 9 (it was
    cut to 3 while run.json said 9, and a rerun with --items 3 was then refused)."""
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--items", 9),
        r"items\.jsonl: holds 3 evaluation items left after holding out the calibration items "
        r"but --items asks for 9; pass --items 3, or leave it out for all of them$",
    )
    assert not (tmp_path / "r").exists()


def test_eval_top_k_above_the_models_layers(model, shapes, tmp_path, capsys):
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--top-k", 3),
        r"^Error: --top-k 3 is more than the 2 layers of .*model$",
    )


def test_eval_top_k_above_the_calibrations_layers(shapes, calibration, tmp_path, capsys):
    no_config = tmp_path / "bare-model"
    no_config.mkdir()
    path = _calibration(tmp_path / "c.json", model=str(no_config))
    refused(
        capsys,
        _eval(no_config, shapes, tmp_path / "r", "--calibration", path, "--top-k", 5),
        r"^Error: --top-k 5 is more than the 2 layers of the calibration .*c\.json$",
    )


@pytest.mark.parametrize(
    "flag, value, message",
    [
        # (tau = inf is allowed: the limit of Eq. 12, argmax of the purified attention)
        ("--tau", "nan", "--tau must be a number >= 0. Got nan."),
        ("--tau", "-1", "--tau must be a number >= 0. Got -1."),
        # inf passed the flag (a number >= 0) and came back as the library's 'blank_alpha'
        ("--blank-alpha", "inf", "--blank-alpha must be a finite number >= 0 or entropy. Got inf."),
        ("--blank-alpha", "-1", "--blank-alpha must be a number >= 0. Got -1."),
    ],
)
def test_eval_number_out_of_range_names_the_flag(
    model, shapes, tmp_path, capsys, flag, value, message
):
    refused(
        capsys, _eval(model, shapes, tmp_path / "r", flag, value), f"^Error: {re.escape(message)}$"
    )


def test_eval_methods_empty(model, shapes, tmp_path, capsys):
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--methods", ""),
        r"^Error: --methods must name methods of vanilla, .*\. Got none\.$",
    )
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--methods", " , "),
        r"^Error: --methods must name methods of .*\. Got none\.$",
    )


@pytest.mark.parametrize("items", ["0", "-1"])
def test_eval_items_below_one(model, shapes, tmp_path, capsys, items):
    refused(capsys, _eval(model, shapes, tmp_path / "r", "--items", items), r"--items must be >= 1")


def test_data_shapes_picture_side_above_the_maximum(tmp_path, capsys):
    refused(
        capsys,
        ["data", "shapes", "--picture-side", 100_000, "--out", tmp_path / "s"],
        r"--picture-side must be between 16 and 1024 pixels\. Got 100000",
    )


def test_eval_device_that_is_not_there_leaves_no_run_json(model, shapes, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    out = tmp_path / "r"
    refused(capsys, _eval(model, shapes, out, "--device", "cuda"), r"--device cuda: no CUDA")
    assert not (out / "run.json").exists()
    refused(capsys, _eval(model, shapes, out, "--device", "gpu"), r"--device must be auto, cpu")


def test_a_run_json_without_records_does_not_block_the_corrected_command(
    model, shapes, tmp_path, capsys, would_load
):
    out = tmp_path / "r"
    refused(capsys, _eval(model, shapes, out, "--seed", 1), r"the model would load now")
    assert json.loads((out / "run.json").read_text())["arguments"]["seed"] == 1
    refused(capsys, _eval(model, shapes, out, "--seed", 2), r"the model would load now")
    assert json.loads((out / "run.json").read_text())["arguments"]["seed"] == 2


# ---------------------------------------------------------------- calibration.json (point 6)


@pytest.mark.parametrize("field", ["model", "labels", "prompt_sha256"])
def test_eval_calibration_that_does_not_know_its_model_labels_or_prompt(
    model, shapes, tmp_path, capsys, field, would_load
):
    for value, name in ((None, "null"), ("", "empty")):
        path = _calibration(tmp_path / f"{name}.json", **{"model": str(model), field: value})
        shown = field
        refused(
            capsys,
            _eval(model, shapes, tmp_path / "r", "--calibration", path),
            rf"{name}\.json: its {shown} is missing, .* --no-calibration-check",
        )
        flag = "--no-calibration-check"
        argv = _eval(model, shapes, tmp_path / "r", "--calibration", path, flag)
        refused(capsys, argv, r"the model would load now")
    path = _calibration(tmp_path / "gone.json", model=str(model))
    obj = json.loads(path.read_text())
    del obj[field]
    path.write_text(json.dumps(obj))
    refused(capsys, _eval(model, shapes, tmp_path / "r", "--calibration", path), r"is missing")


@pytest.mark.parametrize(
    ("change", "pattern"),
    [
        ({"log_obs": [[0.5, -1, -1]] * 3}, r"'log_obs' .* log-probabilities and must be <= 0"),
        ({"pride_log_prior": [0.1, -2, -2]}, r"must be <= 0"),
        ({"log_obs": [[-2.0, -2.0, -2.0]] * 3}, r"each row of exp\('log_obs'\) must sum to 1"),
        ({"gamma": 0.5}, r"'gamma' must be a number from 1 to e\^700"),
        ({"gamma": float("inf")}, r"'gamma' must be a number from 1"),
        ({"log_bias": [[-5.0, -0.1, -3.0]] * 3}, r"'log_bias' must equal log_obs"),
        ({"attention_prior": [[1.5, 0, 0], [0.2] * 3]}, r"'attention_prior' is attention mass"),
        ({"attention_prior": [[-0.1, 0, 0], [0.2] * 3]}, r"'attention_prior' is attention mass"),
        ({"attention_prior": [[float("nan")] * 3, [0.2] * 3]}, r"NaN or infinite"),
    ],
)
def test_eval_calibration_with_implausible_values(model, shapes, tmp_path, capsys, change, pattern):
    path = _calibration(tmp_path / "odd.json", model=str(model), **change)
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", path),
        rf"odd\.json: .*{pattern}",
    )


# A calibration fitted on records whose chat or pictures were prepared otherwise (its
# "preprocessing": the chat template's SHA-256, --image-size, the processor's image options).


def _preprocessed(path: Path, model: Path, **changes) -> Path:
    made = {"chat_template_sha256": None, "image_size": None, "image_options": {}} | changes
    return _calibration(path, model=str(model), preprocessing=made)


def test_eval_calibration_made_at_another_image_size(model, shapes, tmp_path, capsys, would_load):
    path = _preprocessed(tmp_path / "c336.json", model, image_size=336)
    run = _eval(model, shapes, tmp_path / "r", "--calibration", path)
    refused(
        capsys,
        run,
        r"c336\.json: the calibration was fitted on records made with --image-size 336, but "
        r"these records are made with no --image-size \(pictures as they are\); recalibrate "
        r"with the same --image-size, or skip this check on purpose \(--no-calibration-check\)",
    )
    refused(capsys, [*run, "--image-size", 448], r"--image-size 336, but .* --image-size 448")
    refused(capsys, [*run, "--image-size", 336], r"the model would load now")
    refused(capsys, [*run, "--no-calibration-check"], r"the model would load now")
    native = _preprocessed(tmp_path / "native.json", model)
    argv = _eval(model, shapes, tmp_path / "r", "--calibration", native, "--image-size", 336)
    refused(capsys, argv, r"native\.json: .* made with no --image-size .* with --image-size 336")


def test_eval_calibration_made_with_other_image_options(
    model, shapes, tmp_path, capsys, would_load
):
    path = _preprocessed(tmp_path / "c.json", model, image_options={"max_pixels": 200704})
    run = _eval(model, shapes, tmp_path / "r", "--calibration", path)
    refused(
        capsys,
        run,
        r'c\.json: .* made with image options \{"max_pixels": 200704\}, but these records are '
        r"made with no image options .* the same --max-pixels / --min-pixels / --image-option",
    )
    refused(capsys, [*run, "--max-pixels", 200704], r"the model would load now")
    refused(capsys, [*run, "--image-option", "max_pixels=200704"], r"the model would load now")


def test_eval_calibration_made_with_another_chat_template(
    model, shapes, tmp_path, capsys, would_load
):
    import hashlib

    text = "{% for m in messages %}{{ m['content'] }}{% endfor %}\n"
    sha = hashlib.sha256(text.encode()).hexdigest()
    path = _preprocessed(tmp_path / "c.json", model, chat_template_sha256=sha)
    template = tmp_path / "t.jinja"
    template.write_text(text)
    run = _eval(model, shapes, tmp_path / "r", "--calibration", path)
    with_template = [*run, "--chat-template", template]
    refused(capsys, with_template, r"the model would load now")
    refused(
        capsys,
        run,
        rf"c\.json: the calibration was fitted on records made with --chat-template of SHA-256 "
        rf"{sha[:12]}\.\.\., but these records are made with the checkpoint's own chat template; "
        r"recalibrate with the same --chat-template, or skip this check on purpose",
    )
    template.write_text(text.replace("}}{%", "}} {%"))  # the same file, its text changed
    changed = hashlib.sha256(template.read_bytes()).hexdigest()
    refused(
        capsys,
        with_template,
        rf"--chat-template of SHA-256 {sha[:12]}\.\.\., but .* --chat-template of SHA-256 "
        rf"{changed[:12]}\.\.\.; recalibrate with the same --chat-template",
    )
    refused(capsys, [*with_template, "--no-calibration-check"], r"the model would load now")


def test_calibration_without_preprocessing_is_accepted_unchecked(
    model, shapes, calibration, tmp_path, capsys, would_load
):
    # A file written before lad recorded "preprocessing" (the `calibration` fixture has none).
    assert "preprocessing" not in json.loads(calibration.read_text())
    run = _eval(model, shapes, tmp_path / "r", "--calibration", calibration, "--image-size", 336)
    refused(capsys, run, r"the model would load now")
    images = [shapes.parent / p for p in json.loads(shapes.read_text().splitlines()[0])["images"]]
    argv = ["predict", "--model", model, "--calibration", calibration, "--query", "a red circle"]
    refused(capsys, [*argv, "--image-size", 336, *images], r"the model would load now")


def test_predict_with_a_calibration_made_at_another_image_size(
    model, shapes, tmp_path, capsys, would_load
):
    path = _preprocessed(tmp_path / "c336.json", model, image_size=336)
    images = [shapes.parent / p for p in json.loads(shapes.read_text().splitlines()[0])["images"]]
    argv = ["predict", "--model", model, "--calibration", path, "--query", "a red circle"]
    refused(
        capsys,
        [*argv, *images],
        r"c336\.json: the calibration was fitted on records made with --image-size 336, but "
        r"these records are made with no --image-size .*\(--no-calibration-check\)",
    )
    refused(capsys, [*argv, "--image-size", 336, *images], r"the model would load now")
    refused(capsys, [*argv, "--no-calibration-check", *images], r"the model would load now")


def test_score_tau_whose_scores_overflow(stored, capsys):
    refused(
        capsys,
        [
            "score",
            *_score_inputs(stored),
            "--method",
            "attn-purified",
            "--tau",
            "1e308",
            "--out",
            stored / "p.jsonl",
        ],
        r"method '(lad|attn-purified)': its scores overflow .* tau = 1e\+308 .* smaller --tau",
    )
    assert not (stored / "p.jsonl").exists()


def test_score_top_k_above_the_records_layers(stored, capsys):
    refused(
        capsys,
        ["score", *_score_inputs(stored), "--top-k", 7, "--out", stored / "p.jsonl"],
        r"^Error: --top-k 7 is more than the 6 layers of the records$",
    )


# ---------------------------------------------------------------- damaged or odd files (point 7)


def _items_with(tmp_path: Path, shapes: Path, image: Path | None = None, **changes) -> Path:
    """A copy of the shapes items (absolute image paths), the first item's first image replaced
    by `image` and its fields by `changes`."""
    lines = []
    for k, line in enumerate(shapes.read_text().splitlines()):
        obj = json.loads(line)
        obj["images"] = [str(shapes.parent / p) for p in obj["images"]]
        if k == 0:
            if image is not None:
                obj["images"][0] = str(image)
            obj.update(changes)
        lines.append(json.dumps(obj))
    path = tmp_path / "items.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_eval_image_with_an_extreme_aspect_ratio(model, shapes, tmp_path, capsys):
    from PIL import Image

    strip = tmp_path / "strip.png"
    Image.new("RGB", (3000, 20)).save(strip)
    items = _items_with(tmp_path, shapes, strip)
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"strip\.png: 3000 × 20 pixels; lad refuses aspect ratios above 100:1",
    )


def test_eval_decompression_bomb(model, shapes, tmp_path, capsys):
    from PIL import Image

    bomb = tmp_path / "bomb.png"
    Image.new("1", (14_000, 14_000)).save(bomb)
    items = _items_with(tmp_path, shapes, bomb)
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"bomb\.png: 14000 × 14000 = 196,000,000 pixels .* LAD_MAX_IMAGE_PIXELS=196000000",
    )


def test_eval_items_file_not_utf8(model, shapes, tmp_path, capsys):
    items = _items_with(tmp_path, shapes)
    lines = items.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b"a ", b"\xe9 ", 1)  # Latin-1 'é'
    items.write_bytes(b"".join(lines))
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"items\.jsonl: not UTF-8 text \(byte 0xe9, line 2\)",
    )


def test_eval_calibration_file_not_utf8(model, shapes, calibration, tmp_path, capsys):
    calibration.write_bytes(calibration.read_bytes().replace(b'"format"', b'"form\xffat"'))
    refused(
        capsys,
        _eval(model, shapes, tmp_path / "r", "--calibration", calibration),
        r"calibration\.json: not UTF-8 text \(byte 0xff, line 1\)",
    )


def test_eval_lone_surrogate_in_an_id(model, shapes, tmp_path, capsys):
    items = _items_with(tmp_path, shapes)
    lines = items.read_text().splitlines()
    obj = json.loads(lines[2])
    lines[2] = lines[2].replace(json.dumps(obj["id"]), '"bad-\\ud800"')
    items.write_text("\n".join(lines) + "\n")
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"items\.jsonl:3: 'id' holds a lone surrogate escape",
    )


def test_eval_out_is_an_existing_file(model, shapes, tmp_path, capsys):
    (tmp_path / "taken").write_text("mine")
    refused(capsys, _eval(model, shapes, tmp_path / "taken"), r"--out .*taken is a file")
    assert (tmp_path / "taken").read_text() == "mine"


def test_score_and_metrics_out_is_a_folder(stored, capsys):
    refused(
        capsys,
        ["score", *_score_inputs(stored), "--out", stored],
        r"--out .* is a folder; give the path of the file to write",
    )
    argv = [
        "metrics",
        "--records",
        stored / "records.jsonl",
        "--predictions",
        stored / "pred.jsonl",
    ]
    refused(capsys, [*argv, "--out", stored], r"--out .* is a folder")


def test_score_on_an_empty_records_file(stored, capsys):
    (stored / "empty.jsonl").write_text("")
    refused(
        capsys,
        [
            "score",
            "--records",
            stored / "empty.jsonl",
            "--method",
            "vanilla",
            "--out",
            stored / "p.jsonl",
        ],
        r"empty\.jsonl: holds no records",
    )


def _finished(stored: Path) -> Path:
    """`stored` with metrics.json and run.json, as `lad report` reads a run directory."""
    argv = [
        "metrics",
        "--records",
        stored / "records.jsonl",
        "--predictions",
        stored / "pred.jsonl",
    ]
    assert main([str(a) for a in [*argv, "--out", stored / "metrics.json"]]) == 0
    run = {"format": "lad-run/1", "arguments": {"labels": "digits"}}
    (stored / "run.json").write_text(json.dumps(run))
    return stored


@pytest.mark.parametrize(
    ("name", "content", "pattern"),
    [
        ("metrics.json", b'{"num_candidates": 4,', r"metrics\.json: not valid JSON \(.*line 1\)"),
        ("metrics.json", b"\xff\xfe{}", r"metrics\.json: not UTF-8 text \(byte 0xff, line 1\)"),
        ("metrics.json", b"[1, 2]", r"metrics\.json: damaged \(not a JSON object\)"),
        ("metrics.json", b'{"num_candidates": 4}', r"metrics\.json: damaged \('num_items'"),
        ("run.json", b'{"format": "lad-run/1"}', r"run\.json: damaged \('arguments'"),
        ("run.json", b'{"arguments": {"labels": "klingon"}}', r"run\.json: .*'klingon'"),
        ("calibration.json", b'{"format": "lad-calibration/1"}', r"calibration\.json: missing"),
        ("calibration.json", b"nope", r"calibration\.json: not valid JSON"),
    ],
)
def test_report_on_a_damaged_run(stored, capsys, name, content, pattern):
    run = _finished(stored)
    assert main(["report", str(run)]) == 0
    (run / name).write_bytes(content)
    refused(capsys, ["report", run], pattern)


def test_report_on_metrics_with_wrong_shapes(stored, capsys):
    run = _finished(stored)
    metrics = json.loads((run / "metrics.json").read_text())
    metrics["methods"]["lad"]["confusion"] = [[1, 2]]
    (run / "metrics.json").write_text(json.dumps(metrics))
    refused(capsys, ["report", run], r"method 'lad': 'confusion' must be an N × N matrix")
    metrics["methods"]["lad"]["acc"] = "high"
    (run / "metrics.json").write_text(json.dumps(metrics))
    refused(capsys, ["report", run], r"method 'lad' needs numbers")


@pytest.mark.parametrize(
    ("content", "pattern"),
    [
        (b"{not json", r"run\.json: not valid JSON"),
        (b"[]", r"run\.json: not a lad run \(format 'list'\)"),
        (b'{"format": "lad-run/1", "arguments": 3}', r"run\.json: damaged"),
        (b'{"format": "other/1", "arguments": {}}', r"not a lad run \(format 'other/1'\)"),
    ],
)
def test_eval_on_a_damaged_run_json(model, shapes, tmp_path, capsys, content, pattern):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "run.json").write_bytes(content)
    refused(capsys, _eval(model, shapes, tmp_path / "r"), pattern)


# ---------------------------------------------------------------- messages that misled (point 8)


def test_eval_answer_of_the_wrong_type_says_an_integer(model, shapes, tmp_path, capsys):
    items = _items_with(tmp_path, shapes, answer="1")
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"items\.jsonl:1: 'answer' must be an integer, got '1'",
    )


def test_eval_folder_given_as_an_image(model, shapes, tmp_path, capsys):
    folder = tmp_path / "a-folder.png"
    folder.mkdir()
    items = _items_with(tmp_path, shapes, folder)
    refused(
        capsys,
        _eval(model, items, tmp_path / "r"),
        r"items\.jsonl:1: image .*a-folder\.png is a folder, not an image file",
    )


def test_predict_with_one_image(model, calibration, shapes, capsys):
    image = json.loads(shapes.read_text().splitlines()[0])["images"][0]
    argv = ["predict", "--model", model, "--calibration", calibration, "--query", "a red circle"]
    refused(capsys, [*argv, shapes.parent / image], r"query 1: needs at least 2 images, got 1")


def test_predict_with_a_calibration_that_does_not_know_its_model(
    model, shapes, tmp_path, capsys, would_load
):
    path = _calibration(tmp_path / "bare.json", model="")
    images = [shapes.parent / p for p in json.loads(shapes.read_text().splitlines()[0])["images"]]
    argv = ["predict", "--model", model, "--calibration", path, "--query", "a red circle"]
    refused(capsys, [*argv, *images], r"bare\.json: its model is missing")
    refused(capsys, [*argv, "--no-calibration-check", *images], r"the model would load now")


def test_unknown_flag_shows_the_commands_usage(capsys):
    with pytest.raises(SystemExit) as exit:
        main(["eval", "--no-such-flag"])
    assert exit.value.code == 2
    err = capsys.readouterr().err
    assert (
        "usage: lad eval" in err
        and "lad eval: error: unrecognized arguments: --no-such-flag" in err
    )
    with pytest.raises(SystemExit):
        main(["data", "shapes", "--out", "x", "--no-such-flag"])
    assert "usage: lad data shapes" in capsys.readouterr().err


def test_help_states_each_default_once(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: auto)" in text and "(default: 4)" in text
    assert not re.search(r"\(default:? [^)]*\) \(default", text), text
    assert "(default: None)" not in text and "(default: False)" not in text


def test_calibrate_out_is_a_folder(shapes, tmp_path, capsys):
    refused(
        capsys,
        ["calibrate", "--data", shapes, "--out", f"{tmp_path}/cal/"],
        r"--out .*cal/ is a folder; give the path of the file to write",
    )
    assert not (tmp_path / "cal").exists()
    refused(capsys, ["calibrate", "--data", shapes, "--out", tmp_path], r"is a folder")


def test_metrics_on_an_empty_predictions_file(stored, capsys):
    (stored / "none.jsonl").write_text("\n")
    refused(
        capsys,
        ["metrics", "--records", stored / "records.jsonl", "--predictions", stored / "none.jsonl"],
        r"none\.jsonl: holds no predictions",
    )


def test_eval_calibration_inside_its_own_run_directory(model, shapes, tmp_path, capsys):
    out = tmp_path / "r"
    out.mkdir()
    inside = _calibration(out / "calibration.json", model=str(model))
    before = inside.read_bytes()
    refused(
        capsys,
        _eval(model, shapes, out, "--calibration", inside),
        r"--out .*r/calibration\.json .* is the same file as --calibration",
    )
    assert inside.read_bytes() == before


def test_predict_top_k_and_tau_checked_before_the_model(model, calibration, shapes, capsys):
    images = [shapes.parent / p for p in json.loads(shapes.read_text().splitlines()[0])["images"]]
    argv = ["predict", "--model", model, "--calibration", calibration, "--query", "a red circle"]
    refused(
        capsys,
        [*argv, "--top-k", 3, *images],
        r"^Error: --top-k 3 is more than the 2 layers of the calibration .*",
    )
    refused(
        capsys,
        [*argv, "--tau", "nan", *images],
        r"^Error: --tau must be a number >= 0\. Got nan\.$",
    )


def test_calibrate_items_below_one(shapes, tmp_path, capsys):
    argv = ["calibrate", "--data", shapes, "--out", tmp_path / "c.json", "--items", 0]
    refused(capsys, argv, r"--items must be >= 1\. Got 0")


def test_calibrate_items_above_what_the_data_holds(shapes, tmp_path, capsys, would_load):
    """As lad eval's: a stated --items is what lad calibrate fits on (it fitted on the 4 the
    file holds); its default, 5, takes all of a smaller file."""
    argv = ["calibrate", "--data", shapes, "--out", tmp_path / "c.json"]
    refused(
        capsys,
        [*argv, "--items", 9],
        r"items\.jsonl: holds 4 items but --items asks for 9; pass --items 4, or leave it out for "
        r"up to 5$",
    )
    refused(capsys, argv, r"the model would load now$")


def test_report_out_is_a_file(stored, capsys):
    run = _finished(stored)
    (stored / "page").write_text("mine")
    refused(capsys, ["report", run, "--out", stored / "page"], r"--out .*page is a file")

"""Multi-image questions of one's own (paper Table 5): items with a `question`, user prompt
templates and their fingerprint, the image-ordinals label scheme scored exactly, and
`lad predict --question` / `Debiaser.predict(question=...)` end to end, on tiny models."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lad import Debiaser
from lad.backends import load_backend
from lad.cli import main
from lad.core.labels import get_scheme
from lad.core.prompts import (
    QUESTION,
    TEMPLATES,
    PromptTemplate,
    prompt_sha256,
    render_item,
    render_prompt,
    vanilla_template,
)
from lad.data.items import Item, read_items, write_items
from lad.data.shapes import build_shapes
from lad.errors import CalibrationError, DataError, LadError
from lad.evaluate import evaluate
from lad.run.config import eval_config
from lad.testing.tiny import build_tiny_model

FORGED = "Which image is most likely to be a fake photograph?"
DIGITS = get_scheme("digits")
ORDINALS = get_scheme("image-ordinals")


def _pictures(folder: Path, n: int, seed: int = 0) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n):
        path = folder / f"p{seed}_{i}.png"
        Image.fromarray((rng.random((30 + 3 * i, 40, 3)) * 255).astype("uint8")).save(path)
        paths.append(path)
    return paths


@pytest.fixture(scope="module")
def qwen(tmp_path_factory) -> str:
    return str(build_tiny_model("qwen2_vl", tmp_path_factory.mktemp("qwen") / "m"))


@pytest.fixture(scope="module")
def questions(tmp_path_factory) -> tuple[Path, Path]:
    """Question items as `lad data mmiu` writes them: (evaluation file, calibration file)."""
    root = tmp_path_factory.mktemp("questions")
    images = _pictures(root / "img", 12)
    make = [
        Item(f"q{k}", FORGED, images[k : k + 4], k % 4, {"task": "t"}, question=FORGED)
        for k in range(6)
    ]
    write_items(root / "eval.jsonl", make[:4])
    write_items(root / "cal.jsonl", make[4:])
    return root / "eval.jsonl", root / "cal.jsonl"


@pytest.fixture
def asked(monkeypatch) -> list[str]:
    """Every prompt text the backend renders from here on (the text inside the chat template)."""
    import lad.backends.hf

    texts: list[str] = []
    real = lad.backends.hf.render_item

    def spy(*args):
        texts.append(real(*args))
        return texts[-1]

    monkeypatch.setattr(lad.backends.hf, "render_item", spy)
    return texts


# ----------------------------------------------------------------------------- templates


def test_the_papers_prompt_and_its_fingerprint_are_unchanged():
    text = render_prompt("vanilla", "a red circle", DIGITS, 4)
    assert text == (
        "Given 4 images indexed from 1 to 4, identify the image that best matches the provided "
        "caption. Respond with the index number only and nothing else.\nCaption: a red circle"
        "\nAnswer:"
    )
    # calibration.json files written before templates existed keep matching.
    old = text.replace("a red circle", "{caption}")
    key = f"vanilla\ndigits\n1|2|3|4\n{old}"
    expected = hashlib.sha256(key.encode()).hexdigest()
    assert prompt_sha256("vanilla", DIGITS, 4) == expected
    assert prompt_sha256(PromptTemplate(TEMPLATES["vanilla"]), DIGITS, 4) == expected
    assert prompt_sha256(QUESTION, DIGITS, 4) != expected
    assert prompt_sha256(PromptTemplate("{query}?"), DIGITS, 4) != expected


def test_a_question_item_is_asked_its_question():
    item = Item("x", "caption", [Path("a"), Path("b")], 0, question=FORGED)
    assert render_item("vanilla", item, ORDINALS, 2) == (
        "Given 2 images indexed from the first image to the second image, answer the question "
        "about them by choosing one image. Respond with the index phrase only and nothing else."
        f"\nQuestion: {FORGED}\nAnswer:"
    )
    plain = Item("y", "a dog", [Path("a"), Path("b")], 0)
    assert render_item("vanilla", plain, DIGITS, 2) == render_prompt("vanilla", "a dog", DIGITS, 2)
    assert vanilla_template([item]) == QUESTION
    with pytest.raises(DataError, match=r"items mix their own questions \(e.g. 'x'\) with "):
        vanilla_template([item, plain])


TEMPLATE = (
    "{n} pictures, named {labels}. {query}\n"
    "Name one {noun} from {first} to {last} ({single}); {{braces}} stay.\nAnswer:"
)


def test_a_custom_template_round_trips_into_the_models_prompt(qwen, tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text(TEMPLATE + "\n")  # the file's final newline is not part of the prompt
    template = PromptTemplate.from_file(path)
    assert template.text == TEMPLATE
    images = _pictures(tmp_path / "img", 3)
    backend = load_backend(qwen, device="cpu")
    for item, scheme, text in [
        (Item("c", "a red circle", images, 0), DIGITS, "a red circle"),
        (Item("q", "x", images, 2, question=FORGED), get_scheme("upper"), FORGED),
    ]:
        labels = scheme.labels(3)
        expected = (
            f"3 pictures, named {', '.join(labels)}. {text}\nName one {scheme.noun} from "
            f"{labels[0]} to {labels[2]} ({'integer' if scheme is DIGITS else scheme.noun}); "
            "{braces} stay.\nAnswer:"
        )
        texts, shown = backend.build_prompts([(item, 0, [2, 0, 1])], template, scheme)
        messages = [
            {
                "role": "user",
                "content": [*[{"type": "image"}] * 3, {"type": "text", "text": expected}],
            }
        ]
        chat = backend.processor.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=False
        )
        assert texts == [chat]
        assert [im.size for im in shown[0]] == [(40, 36), (40, 30), (40, 33)]  # order [2, 0, 1]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("Which? {querry}", r"unknown placeholder \{querry\}; the placeholders are \{query\}"),
        ("{n:>3} {query}", r"unknown placeholder \{n:>3\}"),
        ("Pick one of {first} to {last}.", r"never shows the item's question or caption"),
        ("{query} {", r"Single '\{' encountered"),
        ("  \n", r"is empty"),
    ],
)
def test_bad_templates_are_refused_before_any_model_work(text, message, tmp_path, capsys):
    with pytest.raises(LadError, match=message):
        PromptTemplate(text)
    path = tmp_path / "bad.txt"
    path.write_text(text)
    args = ["eval", "--model", str(tmp_path / "no-model"), "--prompt-template", str(path)]
    assert main([*args, "--out", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("method", "reply", "expected"),
    [
        ("instruction", "The third image.", 2),
        ("instruction", "**the Second Image**", 1),
        ("instruction", "the second image is the fake one", 1),
        ("instruction", "second", -1),  # not a label of this scheme
        ("instruction", "the first image or the second image", -1),
        ("cot", "The first looks real.</think> the fourth image", 3),
        ("self-consistency", "So the answer is the first image, since ...", 0),
    ],
)
def test_image_ordinal_replies_parse(method, reply, expected):
    from lad.core.methods import METHODS

    assert METHODS[method].parse(reply, ORDINALS.labels(4)) == expected


# ----------------------------------------------------------------------------- exact scoring


def _reply_tokens(processor, messages: list[dict], label: str) -> tuple[list[int], int]:
    """The label's tokens as the model's own chat template writes the reply, from the end of the
    generation prompt through the label's last token, and the end-of-turn token after them."""
    tok = processor.tokenizer
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    reply = [*messages, {"role": "assistant", "content": [{"type": "text", "text": label}]}]
    full = processor.apply_chat_template(reply, tokenize=False)
    assert full.startswith(prompt)
    head = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = tok(full, add_special_tokens=False)["input_ids"]
    assert ids[: len(head)] == head
    rest = ids[len(head) :]
    special = set(tok.all_special_ids)
    end = next(i for i, t in enumerate(rest) if t in special)
    return rest[:end], rest[end]


def _brute_force(backend, images: list, text: str, labels: list[str]) -> np.ndarray:
    """log P(c_k|x) with one full forward (no cache) per label prefix and a softmax restricted to
    the tokens that may follow it (docs/backends.md, "Exact labels"). Only the model, its
    processor and the architecture's image options (tiling) are taken from the backend."""
    from PIL import Image

    model, processor = backend.model, backend.processor
    n = len(images)
    content = [*[{"type": "image"}] * n, {"type": "text", "text": text}]
    messages = [{"role": "user", "content": content}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    pictures = [Image.open(p).convert("RGB") for p in images]
    options = backend.image_options
    inputs = dict(processor(text=[prompt], images=[pictures], return_tensors="pt", **options))
    t = inputs["input_ids"].shape[1]
    replies = [_reply_tokens(processor, messages, label) for label in labels]
    seqs = [tuple(tokens) for tokens, _ in replies]
    assert len(set(seqs)) == n and all(seqs)
    end = replies[0][1]

    def following(prefix: tuple[int, ...]) -> list[int]:
        nxt = {s[len(prefix)] for s in seqs if len(s) > len(prefix) and s[: len(prefix)] == prefix}
        return sorted(nxt | ({end} if nxt and prefix in seqs else set()))

    def next_logits(prefix: tuple[int, ...]) -> torch.Tensor:
        extended = dict(inputs)
        extra = torch.tensor([prefix], dtype=torch.long)
        extended["input_ids"] = torch.cat([inputs["input_ids"], extra], dim=1)
        extended["attention_mask"] = torch.ones_like(extended["input_ids"])
        for key in ("mm_token_type_ids", "token_type_ids"):
            if key in inputs and inputs[key].shape[1] == t:
                extended[key] = torch.cat([inputs[key], torch.zeros_like(extra)], dim=1)
        with torch.no_grad():
            return model(**extended).logits[0, -1].double()

    out = []
    for seq in seqs:
        steps = [*seq, end] if len(following(seq)) > 0 else list(seq)
        total = 0.0
        for i, token in enumerate(steps):
            valid = following(seq[:i])
            if len(valid) > 1:
                total += float(next_logits(seq[:i])[valid].log_softmax(-1)[valid.index(token)])
        out.append(total)
    return np.array(out)


@pytest.mark.parametrize(("arch", "n"), [("qwen2_vl", 5), ("qwen2_vl", 12), ("idefics3", 5)])
def test_image_ordinals_score_exactly(qwen, tmp_path, arch, n):
    model = qwen if arch == "qwen2_vl" else build_tiny_model(arch, tmp_path / arch)
    backend = load_backend(str(model), device="cpu", dtype="float32")
    images = _pictures(tmp_path / "img", n, seed=n)
    order = np.random.default_rng(n).permutation(n).tolist()
    item = Item("f", "caption", images, 0, question=FORGED)
    record = next(backend.records([(item, 0, order)], scheme=ORDINALS))
    labels = ORDINALS.labels(n)
    assert labels[:2] == ["the first image", "the second image"] and len(set(labels)) == n
    text = (
        f"Given {n} images indexed from the first image to the {labels[-1][4:-6]} image, answer "
        "the question about them by choosing one image. Respond with the index phrase only and "
        f"nothing else.\nQuestion: {FORGED}\nAnswer:"
    )
    shown = [images[i] for i in order]
    reference = _brute_force(backend, shown, text, labels)
    np.testing.assert_allclose(record.logprobs, reference, atol=1e-5)
    assert np.exp(record.logprobs).sum() == pytest.approx(1.0, abs=1e-9)


# ----------------------------------------------------------------------------- runs


def _shapes(root: Path) -> tuple[str, str]:
    kw = {"num_candidates": 3, "setting": "random", "seed": 1, "image_size": 32}
    return (
        str(build_shapes(root / "eval", items=2, split="eval", **kw)),
        str(build_shapes(root / "cal", items=1, split="calibration", **kw)),
    )


def test_a_calibration_from_another_template_is_refused(qwen, tmp_path, capsys, asked):
    data, cal_data = _shapes(tmp_path)
    common = {
        "model": qwen,
        "data": data,
        "num_candidates": 3,
        "calibration_items": 1,
        "num_shuffles": 1,
        "methods": ("vanilla", "lad"),
        "device": "cpu",
        "quiet": True,
    }
    evaluate(eval_config(**common, calibration_data=cal_data), tmp_path / "paper")
    paper_cal = str(tmp_path / "paper" / "calibration.json")
    asked.clear()
    mine = "Which picture shows {query}? Choose {first} to {last}.\nAnswer:"
    given = {**common, "calibration": paper_cal, "prompt_template": mine}
    with pytest.raises(
        CalibrationError,
        match=r"calibration.json: the calibration's prompt is the paper's caption prompt .*, but "
        r"the records' is a prompt template of one's own",
    ):
        evaluate(eval_config(**given), tmp_path / "mine")
    assert not (tmp_path / "mine" / "records.jsonl").exists()  # refused before any model work
    assert asked == []
    result = evaluate(eval_config(**given, check_calibration=False), tmp_path / "mine")
    assert result is not None and "lad" in result.metrics["methods"]
    queries = [it.query for it in read_items(data)]
    assert sorted(asked) == sorted(
        f"Which picture shows {q}? Choose 1 to 3.\nAnswer:" for q in queries
    )
    stored = json.loads((tmp_path / "mine" / "run.json").read_text())["arguments"]
    assert stored["prompt_template"] == mine

    # The same through the CLI, and a calibration fitted under the template is accepted.
    path = tmp_path / "mine.txt"
    path.write_text(mine)
    args = ["eval", "--model", qwen, "--data", data, "-n", "3", "--num-shuffles", "1"]
    args += ["--device", "cpu", "--quiet", "--methods", "vanilla,lad"]
    args += ["--prompt-template", str(path)]
    assert main([*args, "--calibration", paper_cal, "--out", str(tmp_path / "cli")]) == 1
    err = capsys.readouterr().err
    assert "the calibration's prompt is the paper's caption prompt" in err
    assert "but the records' is a prompt template of one's own (--prompt-template" in err
    ok = ["--calibration", paper_cal, "--no-calibration-check", "--out", str(tmp_path / "cli")]
    assert main([*args, *ok]) == 0
    own = ["--calibration-data", cal_data, "--calibration-items", "1"]
    assert main([*args, *own, "--out", str(tmp_path / "own")]) == 0
    fitted = json.loads((tmp_path / "own" / "calibration.json").read_text())
    assert fitted["prompt_sha256"] == prompt_sha256(PromptTemplate(mine), DIGITS, 3)
    again = ["--calibration", str(tmp_path / "own" / "calibration.json")]
    assert main([*args, *again, "--out", str(tmp_path / "again")]) == 0


def test_eval_on_question_items_with_image_ordinals(qwen, questions, tmp_path, asked, monkeypatch):
    import lad.outputs.report

    axes = []
    heatmap = lad.outputs.report._heatmap

    def spy(ax, matrix, labels, *args, **kw):
        axes.append(list(labels))
        return heatmap(ax, matrix, labels, *args, **kw)

    monkeypatch.setattr(lad.outputs.report, "_heatmap", spy)
    args = ["eval", "--model", qwen, "--data", str(questions[0]), "--calibration-data"]
    args += [str(questions[1]), "-n", "4", "--labels", "image-ordinals", "--num-shuffles", "2"]
    args += ["--methods", "vanilla,attn-purified,lad,instruction", "--max-new-tokens", "2"]
    args += ["--device", "cpu", "--quiet", "--out", str(tmp_path / "run")]
    assert main(args) == 0
    assert asked and all(f"\nQuestion: {FORGED}\nAnswer:" in text for text in asked)
    assert any("randomly shuffled" in text for text in asked)  # instruction's question variant
    run = tmp_path / "run"
    stored = json.loads((run / "run.json").read_text())["arguments"]
    assert stored["prompt_template"] == QUESTION.text
    calibration = json.loads((run / "calibration.json").read_text())
    assert calibration["labels"] == ORDINALS.labels(4)
    assert calibration["prompt_sha256"] == prompt_sha256(QUESTION, ORDINALS, 4)
    assert axes and all(a == ORDINALS.labels(4) for a in axes)
    metrics = json.loads((run / "metrics.json").read_text())["methods"]
    for name in ("attn-purified", "lad"):
        assert metrics[name]["delta_rstd"] == pytest.approx(
            metrics[name]["rstd"] - metrics["vanilla"]["rstd"]
        )
    page = (run / "report" / "index.html").read_text()
    assert "<th>PurAttn ↑</th>" in page and "<td>run</td>" in page
    assert main(args) == 0  # a rerun resumes: the question template is chosen again


def test_predict_question_end_to_end(qwen, questions, tmp_path, capsys):
    cal = tmp_path / "cal.json"
    common = ["--model", qwen, "--labels", "image-ordinals", "--device", "cpu"]
    args = ["calibrate", *common, "--data", str(questions[1]), "--out", str(cal)]
    assert main(args) == 0
    capsys.readouterr()
    images = [str(p) for p in read_items(questions[0])[0].images]
    asked = ["predict", *common, "--calibration", str(cal)]
    assert main([*asked, "--question", FORGED, *images, "--json"]) == 0
    choice = json.loads(capsys.readouterr().out)
    assert choice["labels"] == ORDINALS.labels(4) and choice["question"] is True
    assert choice["query"] == FORGED
    assert sum(choice["prob_after"]) == pytest.approx(1.0) and 0 <= choice["lad"] < 4
    assert main([*asked, "--question", FORGED, *images]) == 0
    assert f"question: {FORGED}" in capsys.readouterr().out
    # The calibration was fitted under the question template: a caption is refused.
    assert main([*asked, "--query", "a red circle", *images]) == 1
    err = capsys.readouterr().err
    assert "the calibration's prompt is the question prompt" in err
    assert "but this query's is the paper's caption prompt" in err
    assert "captions need a calibration made on captions" in err
    assert "(--no-calibration-check)" in err and "sha256" not in err.lower()
    with pytest.raises(SystemExit):
        main([*asked, *images])  # neither --query nor --question


def test_debiaser_predicts_questions_under_a_custom_template(qwen, questions, asked):
    items = read_items(questions[1])
    mine = PromptTemplate("Pictures {first} to {last}. Q: {query}\nA:")
    debiaser = Debiaser(qwen, labels="image-ordinals", device="cpu", prompt_template=mine)
    debiaser.fit(items)
    asked.clear()
    choice = debiaser.predict(question=FORGED, images=items[0].images)
    assert asked == [f"Pictures the first image to the fourth image. Q: {FORGED}\nA:"]
    assert choice.question and choice.labels == ORDINALS.labels(4)
    with pytest.raises(LadError, match=r"exactly one of query .* and question; got neither"):
        debiaser.predict(images=items[0].images)
    # Fitted under the built-in question template, a custom one is refused, unless overridden.
    plain = Debiaser(qwen, labels="image-ordinals", device="cpu").fit(items)
    strict = Debiaser(qwen, labels="image-ordinals", device="cpu", prompt_template=mine)
    strict.calibration_ = plain.calibration_
    with pytest.raises(
        CalibrationError,
        match=r"prompt is the question prompt .*, but this query's is a prompt template of one's "
        r"own .*\(check_calibration=False\)$",
    ):
        strict.predict(question=FORGED, images=items[0].images)
    strict.check_calibration = False
    assert strict.predict(question=FORGED, images=items[0].images).question


# ----------------------------------------------------------------------------- Table 5's view


def test_metrics_and_report_give_table_5s_columns(tmp_path):
    from lad.core.metrics import compute_metrics, format_table
    from lad.outputs.report import write_report
    from tests.test_metrics import hand_records

    # Hand-worked (tests/test_metrics.py's case): answers at positions [0, 1, 1, 0].
    # vanilla [0, 1, 0, 0]: recall 100 / 50, RStd 35.36, Acc 75; lad always right: RStd 0, Acc
    # 100; attn-purified always 1: recall 0 / 100, RStd 70.71, Acc 50.
    predictions = {"vanilla": [0, 1, 0, 0], "attn-purified": [1, 1, 1, 1], "lad": [0, 1, 1, 0]}
    metrics = compute_metrics(hand_records(), {k: np.array(v) for k, v in predictions.items()})
    methods = metrics["methods"]
    assert methods["lad"]["delta_rstd"] == pytest.approx(-(50 / np.sqrt(2)))
    assert methods["attn-purified"]["delta_rstd"] == pytest.approx(50 / np.sqrt(2))
    assert methods["vanilla"]["delta_rstd"] == 0.0
    table = format_table(metrics)
    assert "ΔRStd" in table.splitlines()[1]
    assert "-35.36" in next(line for line in table.splitlines() if line.startswith("lad "))
    runs = []
    for name in ("forgery", "emotion"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(metrics))
        runs.append(tmp_path / name)
    page = write_report(runs, tmp_path / "report").read_text()
    for name in ("forgery", "emotion"):
        assert f"<tr><td>{name}</td><td>75.0</td><td>50.0</td><td>100.0</td><td>-35.4</td>" in page
    del metrics["methods"]["attn-purified"]
    (runs[1] / "metrics.json").write_text(json.dumps(metrics))
    page = write_report(runs, tmp_path / "report").read_text()
    # A run without attn-purified keeps its row, with a dash and a note saying how to add it.
    assert "<tr><td>forgery</td><td>75.0</td><td>50.0</td><td>100.0</td><td>-35.4</td>" in page
    assert "<tr><td>emotion</td><td>75.0</td><td>–</td><td>100.0</td><td>-35.4</td>" in page
    assert "emotion has no attn-purified: rerun it with lad eval --methods " in page

"""A small local MuirBench: lad's shapes items as a parquet in MuirBench's published schema
(MUIRBENCH/MUIRBENCH: idx, task, image_relation, image_type, question, options, answer,
image_list, counterpart_idx; a picture option is "<image>", the answer a letter, image_list the
question's pictures at its `<image>` places, then the options'), and a task YAML that loads it
with lmms-eval from the file, no hub."""

from __future__ import annotations

from pathlib import Path

from lad.data.items import read_items
from lad.data.shapes import build_shapes

QUESTION = "Which image shows {caption}?"
WITH_CONTEXT = "This picture <image> is not the answer. Which image shows {caption}?"
TEXT_OPTIONS = "Does <image> show {caption}?"


def _row(idx: str, question: str, options: list[str], answer: int, pictures: list[Path]) -> dict:
    return {
        "idx": idx,
        "task": "Image-Text Matching",
        "image_relation": "Independent",
        "image_type": "Drawing",
        "question": question,
        "options": options,
        "answer": chr(ord("A") + answer),
        "image_list": [{"bytes": p.read_bytes(), "path": None} for p in pictures],
        "counterpart_idx": "",
    }


def shapes_muirbench(
    folder: Path, *, items: int, split: str, n: int = 4, extras: bool = False
) -> Path:
    """`items` shapes items of N candidates as MuirBench picture questions in
    `folder/muirbench.parquet`; with `extras`, also two questions that show a context picture
    (a distractor, at the question's <image>) and one whose options are text (answered by
    generation under --model lad)."""
    import datasets

    shapes = read_items(build_shapes(folder / "shapes", num_candidates=n, items=items, split=split))
    rows = [
        _row(it.id, QUESTION.format(caption=it.query), ["<image>"] * n, it.answer, it.images)
        for it in shapes
    ]
    if extras:
        for k, it in enumerate(shapes[:2]):
            other = it.images[(it.answer + 1) % n]
            question = WITH_CONTEXT.format(caption=it.query)
            pictures = [other, *it.images]
            rows.append(_row(f"context-{k}", question, ["<image>"] * n, it.answer, pictures))
        it = shapes[0]
        question = TEXT_OPTIONS.format(caption=it.query)
        rows.append(_row("text-0", question, ["yes", "no"], 0, [it.images[it.answer]]))
    features = datasets.Features(
        {
            "idx": datasets.Value("string"),
            "task": datasets.Value("string"),
            "image_relation": datasets.Value("string"),
            "image_type": datasets.Value("string"),
            "question": datasets.Value("string"),
            "options": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.Value("string"),
            "image_list": datasets.Sequence(datasets.Image()),
            "counterpart_idx": datasets.Value("string"),
        }
    )
    path = folder / "muirbench.parquet"
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def local_task(
    folder: Path, parquet: Path, task: str, template: Path, utils: str | None = None
) -> Path:
    """A task YAML `task` that is `template` (a YAML of lmms-eval's or lad's) with its data
    read from `parquet`, no hub access, and its `!function utils.x` read from the module
    `utils`; returns the folder to pass as --include_path."""
    text = Path(template).read_text(encoding="utf-8")
    if utils:
        text = text.replace("!function utils.", f"!function {utils}.")
    lines = []
    for line in text.splitlines():
        if line.startswith(("dataset_path:", "task:", "dataset_kwargs:", "  token:")):
            continue
        lines.append(line)
    head = (
        f"task: {task}\ndataset_path: parquet\ndataset_kwargs:\n"
        f"  data_files:\n    test: {parquet}\n"
    )
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task}.yaml"
    path.write_text(head + "\n".join(lines) + "\n", encoding="utf-8")
    return folder


ORDINALS = ("first", "second", "third", "fourth")


def shapes_blink(folder: Path, *, items: int, split: str, n: int = 3) -> Path:
    """`items` shapes items of N <= 3 candidates as BLINK Art_Style-like questions in
    `folder/blink.parquet` (BLINK-Benchmark/BLINK's schema: idx, sub_task, question, choices,
    answer "(X)", prompt, explanation, image_1 … image_4): image_1 a reference picture (a
    distractor), image_2 … the candidates, the choices naming them in reverse picture order."""
    import datasets

    shapes = read_items(build_shapes(folder / "shapes", num_candidates=n, items=items, split=split))
    rows = []
    for k, it in enumerate(shapes):
        pictures = [it.images[(it.answer + 1) % n], *it.images]
        choices = [f"the {ORDINALS[j + 1]} image" for j in reversed(range(n))]
        cells = [{"bytes": p.read_bytes(), "path": None} for p in pictures]
        cells += [None] * (4 - len(cells))
        rows.append(
            {
                "idx": f"val_Art_Style_{split}_{k}",
                "sub_task": "Art_Style",
                "question": f"Which image shows {it.query}?",
                "choices": choices,
                "answer": f"({chr(ord('A') + n - 1 - it.answer)})",
                "prompt": "",
                "explanation": "",
                **{f"image_{j + 1}": cell for j, cell in enumerate(cells)},
            }
        )
    features = datasets.Features(
        {
            "idx": datasets.Value("string"),
            "sub_task": datasets.Value("string"),
            "question": datasets.Value("string"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.Value("string"),
            "prompt": datasets.Value("string"),
            "explanation": datasets.Value("string"),
            **{f"image_{j}": datasets.Image() for j in range(1, 5)},
        }
    )
    path = folder / "blink.parquet"
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def blink_local_task(folder: Path, parquet: Path, task: str, template: Path) -> Path:
    """`local_task` for one of lad's BLINK YAMLs: no hub config name, the parquet as `val`."""
    text = Path(template).read_text(encoding="utf-8")
    text = "\n".join(line for line in text.splitlines() if not line.startswith("dataset_name:"))
    folder.mkdir(parents=True, exist_ok=True)
    plain = folder / f"{task}.template.yaml.txt"
    plain.write_text(text + "\n", encoding="utf-8")
    local_task(folder, parquet, task, plain)
    yaml = folder / f"{task}.yaml"
    yaml.write_text(yaml.read_text().replace("    test: ", "    val: "), encoding="utf-8")
    return folder

"""A small local MuirBench: lad's shapes items as a parquet in MuirBench's published schema
(MUIRBENCH/MUIRBENCH: idx, task, image_relation, image_type, question, options, answer,
image_list, counterpart_idx; an option that is a picture is "<image>", the answer a letter), a
task YAML that loads it with lmms-eval, and the same items in lad's items format."""

from __future__ import annotations

import json
from pathlib import Path

from lad.data.items import read_items
from lad.data.shapes import build_shapes

QUESTION = "Which image shows {caption}?"


def shapes_muirbench(folder: Path, *, items: int, split: str, n: int = 4) -> Path:
    """`items` shapes items of N candidates as muirbench.parquet (and items.jsonl with each
    item's question, for lad eval); returns the parquet."""
    import datasets

    shapes = read_items(build_shapes(folder / "shapes", num_candidates=n, items=items, split=split))
    rows = []
    for it in shapes:
        rows.append(
            {
                "idx": it.id,
                "task": "Image-Text Matching",
                "image_relation": "Independent",
                "image_type": "Drawing",
                "question": QUESTION.format(caption=it.query),
                "options": ["<image>"] * n,
                "answer": chr(ord("A") + it.answer),
                "image_list": [{"bytes": p.read_bytes(), "path": None} for p in it.images],
                "counterpart_idx": "",
            }
        )
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
    with (folder / "items.jsonl").open("w", encoding="utf-8") as f:
        for it, row in zip(shapes, rows, strict=True):
            obj = {
                "id": it.id,
                "query": row["question"],
                "question": row["question"],
                "images": [str(p) for p in it.images],
                "answer": it.answer,
            }
            f.write(json.dumps(obj) + "\n")
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

"""The README's "Your own multi-image questions" commands (docs/data.md's are the same), run as
written on files in the three benchmarks' released schemas (the fixtures of test_data_mmiu and
test_data_hub, laid out as the downloads are): every `lad data` line converts, the documented
`lad eval` and one like it per other benchmark run on the embedded demo model (few items and
shuffles), and the documented `lad report` lays the four runs out as Table 5 does."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lad.cli import main
from lad.data.items import read_items
from tests.data_fixtures import make_images
from tests.test_data_hub import BLINK_SCHEMA, LATTER, MUIR_SCHEMA, PICK, RETRIEVE, SIMILAR, _blink
from tests.test_data_hub import _muir as muir_row
from tests.test_data_mmiu import (
    FAKE,
    FORGERY,
    FORGERY_OPTIONS,
    I2I,
    I2I_OPTIONS,
    I2I_QUESTION,
    RELATIONSHIP,
    _write_parquet,
)
from tests.test_data_mmiu import _row as mmiu_row

ROOT = Path(__file__).resolve().parent.parent
FAST = ["--num-shuffles", "2", "--items", "2", "--methods", "vanilla,attn-purified,lad"]
FAST += ["--device", "cpu", "--quiet"]


def documented_commands(
    doc: str = "README.md", heading: str = "## Your own multi-image questions"
) -> list[list[str]]:
    """The `lad ...` lines of the first code block under `heading`, continuations joined."""
    text = (ROOT / doc).read_text(encoding="utf-8")
    section = text[text.index(heading) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1).replace("\\\n", " ")
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("lad ")]


def _downloads(root: Path) -> None:
    """MMIU (all.parquet, pictures extracted), MUIRBENCH/data and BLINK/<task>, seven usable
    questions each, written where the README's download lines put them."""
    rows = [mmiu_row(FORGERY, q, 4, FORGERY_OPTIONS, FAKE, "ABCD"[q % 4]) for q in range(7)]
    rows += [mmiu_row(I2I, q, 5, I2I_OPTIONS, I2I_QUESTION, "DCBA"[q % 4]) for q in range(7)]
    for task, relationship in RELATIONSHIP.items():
        folder = root / "MMIU" / relationship / task
        paths = [p for r in rows if r["task"] == task for p in r["input_image_path"]]
        for name, p in zip(make_images(folder, len(paths), seed=len(task)), paths, strict=True):
            (folder / name).rename(folder / Path(p).name)
    _write_parquet(root / "MMIU" / "all.parquet", rows)
    muir = [muir_row(str(k), "Visual Retrieval", RETRIEVE, PICK, "ABCD"[k % 4],
                     range(5 * k, 5 * k + 5)) for k in range(7)]  # fmt: skip
    (root / "MUIRBENCH" / "data").mkdir(parents=True)
    table = pa.Table.from_pylist(muir, schema=MUIR_SCHEMA)
    pq.write_table(table, root / "MUIRBENCH" / "data" / "test-00000-of-00001.parquet")
    blink = [
        _blink(f"val_Visual_Similarity_{k}", "Visual_Similarity", SIMILAR, LATTER,
               f"({'AB'[k % 2]})", range(3 * k, 3 * k + 3))
        for k in range(7)
    ]  # fmt: skip
    (root / "BLINK" / "Visual_Similarity").mkdir(parents=True)
    table = pa.Table.from_pylist(blink, schema=BLINK_SCHEMA)
    pq.write_table(table, root / "BLINK" / "Visual_Similarity" / "val-00000-of-00001.parquet")


def _on_demo(args: list[str]) -> list[str]:
    at = args.index("--model")
    return [*args[:at], "--model", "demo", *args[at + 2 :], *FAST]


def test_docs_data_shows_the_same_commands():
    assert documented_commands("docs/data.md", "## From download to Table 5") == (
        documented_commands()
    )


@pytest.mark.slow
def test_documented_benchmark_commands_run_end_to_end(tmp_path, monkeypatch, capsys):
    commands = documented_commands()
    kinds = [c[0] if c[0] != "data" else f"data {c[1]}" for c in commands]
    assert kinds == ["data mmiu", "data mmiu", "data muirbench", "data blink", "eval", "report"]
    _downloads(tmp_path)
    monkeypatch.chdir(tmp_path)
    for args in commands[:4]:
        assert main(args) == 0, args
    printed = capsys.readouterr().out
    assert printed.count("Summary written to") == 4
    converted = {}
    for name in ("forgerynet", "i2i", "muir-retrieval", "blink-similarity"):
        items = read_items(Path("data") / f"{name}.jsonl")
        calibration = read_items(Path("data") / f"{name}.calibration.jsonl")
        assert (len(items), len(calibration)) == (2, 5)
        converted[name] = items
    assert {len(it.context_images) for it in converted["i2i"]} == {1}
    assert {len(it.context_images) for it in converted["muir-retrieval"]} == {1}
    assert "<image>" in converted["muir-retrieval"][0].question  # shown at its place
    assert {len(it.context_images) for it in converted["blink-similarity"]} == {1}

    documented = commands[4]
    assert main(_on_demo(documented)) == 0
    for name, n, labels in (("forgerynet", 4, "image-ordinals"), ("muir-retrieval", 4, "upper"),
                            ("blink-similarity", 2, "upper")):  # fmt: skip
        args = list(documented)
        args[args.index("--data") + 1] = f"data/{name}.jsonl"
        args[args.index("--calibration-data") + 1] = f"data/{name}.calibration.jsonl"
        args[args.index("-n") + 1] = str(n)
        args[args.index("--labels") + 1] = labels
        args[args.index("--out") + 1] = f"runs/{name}"
        assert main(_on_demo(args)) == 0, name
    for name in ("forgerynet", "i2i", "muir-retrieval", "blink-similarity"):
        records = [json.loads(x) for x in (Path("runs") / name / "records.jsonl").open()]
        n = 2 if name == "blink-similarity" else 4
        assert {len(r["logprobs"]) for r in records} == {n}  # candidates only
    assert main(commands[5]) == 0
    page = (Path("report") / "index.html").read_text()
    assert "<th>PurAttn ↑</th>" in page  # Table 5's layout, one row per run
    for name in ("forgerynet", "i2i", "muir-retrieval", "blink-similarity"):
        assert f"<td>{name}</td>" in page

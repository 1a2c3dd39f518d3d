"""Where a suite's benchmarks live and their cells as items files: each benchmark's root folder
(`--data-root`), checked before any work, and each cell converted once (lad's converters and
builders, lad.data) into the suite's data/ folder, kept for every model and every rerun."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.data.benchmarks import BENCHMARKS
from lad.data.builders import BuildOptions, build_from_files, calibration_path_for
from lad.data.released import Options, convert
from lad.errors import DataError
from lad.io.files import below, child
from lad.suites import Benchmark, Suite, SuiteCell


def benchmark_roots(suite: Suite, given: list[str]) -> dict[str, Path]:
    """Each benchmark's root folder: `NAME=DIR` names one benchmark's; a plain DIR is the root
    of a suite's one benchmark, or the folder holding each benchmark's own folder (its
    `folder`, by default its name) when there are several; else the suite file's `root`."""
    folders = [b for b in suite.benchmarks.values() if b.kind != "shapes"]
    used = [b for b in folders if any(c.benchmark == b.name for c in suite.cells)]
    roots: dict[str, Path] = {}
    common = None
    for text in given:
        name, sep, folder = text.partition("=")
        if sep and name in suite.benchmarks:
            roots[name] = Path(folder)
        elif sep and not Path(text).exists():
            raise DataError(
                f"--data-root {text}: {name!r} is not a benchmark of {suite.name} "
                f"({', '.join(suite.benchmarks)})"
            )
        else:
            common = Path(text)
    for bench in used:
        if bench.name not in roots and common is not None:
            roots[bench.name] = common if len(folders) == 1 else child(common, bench.folder)
        elif bench.name not in roots and bench.root is not None:
            roots[bench.name] = bench.root
    missing = [b.name for b in used if b.name not in roots]
    if missing:
        raise DataError(
            f"suite {suite.name} needs the folder of {', '.join(missing)}: pass --data-root DIR "
            f"(or --data-root {missing[0]}=DIR); lad never downloads data"
        )
    return roots


def check_data(suite: Suite, roots: dict[str, Path]) -> None:
    """Refuse, naming it, a benchmark folder or file that is not there, before any work."""
    for bench in suite.benchmarks.values():
        if bench.kind == "shapes" or not any(c.benchmark == bench.name for c in suite.cells):
            continue
        root = roots[bench.name]
        if not root.is_dir():
            raise DataError(f"{root}: no such folder ({bench.name}'s data, your download)")
        for key, sub in bench.paths.items():
            if key == "instances" and not any(
                c.benchmark == bench.name and c.setting == "adversarial" for c in suite.cells
            ):
                continue
            if not below(root, sub, DataError).exists():
                raise DataError(f"{root / sub}: not found ({bench.name}'s {key}, below {root})")
    for cell in suite.cells:
        kind = suite.benchmarks[cell.benchmark].kind
        if kind not in BENCHMARKS and cell.num_candidates is None:
            raise DataError(f"{suite.source}: cell {cell.id!r} ({kind}) needs num_candidates")


def cell_data(
    suite: Suite, cell: SuiteCell, roots: dict[str, Path], out: Path, settings: dict[str, Any]
) -> dict[str, Any]:
    """The run settings naming the cell's data: its converted items and held-out calibration
    items (converted now unless an earlier run of the suite did), or the shapes benchmark."""
    bench = suite.benchmarks[cell.benchmark]
    if bench.kind == "shapes":
        return {"data": "shapes", "setting": cell.setting}
    items = child(out / "data", f"{cell.slug}.jsonl", DataError)
    calibration = calibration_path_for(items)
    if not (items.is_file() and calibration.is_file()):
        made = not items.parent.exists()
        items.parent.mkdir(parents=True, exist_ok=True)
        try:
            _convert(bench, cell, roots[bench.name], items, settings)
        except DataError as e:  # the converter's advice is for `lad data`'s flags
            if made and not any(items.parent.iterdir()):
                items.parent.rmdir()  # a refusal leaves no trace
            text = str(e)
            if "choose one with --num-candidates" in text:
                text = text[: text.index("choose one with")] + (
                    f"give cell {cell.id!r} of {suite.source} its num_candidates"
                )
            raise DataError(text) from None
    return {"data": str(items), "calibration_data": str(calibration)}


def _convert(
    bench: Benchmark, cell: SuiteCell, root: Path, out: Path, settings: dict[str, Any]
) -> None:
    """A setting the suite leaves out keeps the converter's own default (lad data's)."""
    split = {
        "items": settings.get("items"),
        "calibration_items": settings.get("calibration_items") or Options.calibration_items,
        "seed": settings.get("seed", Options.seed),
    }
    paths = {k: below(root, v, DataError) for k, v in bench.paths.items()}
    n = cell.num_candidates
    if bench.kind in BENCHMARKS:  # a released benchmark: lad data's converter of it
        benchmark, source, task = BENCHMARKS[bench.kind], paths["questions"], cell.task
        if benchmark.embedded and task and child(source, task, DataError, "task ").is_dir():
            # BLINK's folder per subtask (Forensic_Detection/) holds that subtask alone, whose
            # rows' `sub_task` spells it otherwise ("Forensic Detection"): all its rows
            source, task = source / task, None
        options = Options(images=paths.get("images"), task=task, num_candidates=n, **split)
        convert(benchmark, source, out, options)
        return
    options = BuildOptions(
        num_candidates=n or BuildOptions.num_candidates,
        setting=cell.setting,
        items=split["items"] or BuildOptions.items,
        calibration_items=split["calibration_items"],
        seed=split["seed"],
        clip=bench.options.get("clip", BuildOptions.clip),
        device=settings.get("device", BuildOptions.device),
    )
    if cell.setting != "adversarial":
        paths["instances"] = None  # the random setting needs no category sets
    build_from_files(bench.kind, paths, out, options)

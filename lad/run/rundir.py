"""`RunDir`: the one reader and writer of a run directory (docs/formats.md, "Run directory").

Every command that reads a run (`lad eval` resuming or rescoring, `lad score`/`metrics`, `lad
report`, `lad ablate`) and the harness writing its audit folders (`write_run`) go through it, so
each applies the same checks (`check`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from lad.core.calibrate import Calibration
from lad.core.cells import cells_from_json
from lad.core.fingerprint import UNKNOWN, Fingerprint
from lad.core.predictions import write_predictions
from lad.core.records import RecordSet, read_records, write_records
from lad.errors import LadError, RunError
from lad.io.files import read_json, write_text
from lad.run.runjson import RECORDS_VERSION as RECORDS_VERSION
from lad.run.runjson import RUN_FORMAT, RunJson, check_same, json_text
from lad.run.spec import RecordSpec

RUN_FILE, CALIBRATION_FILE, METRICS_FILE = "run.json", "calibration.json", "metrics.json"
CELLS_FILE = "cells.json"  # a mixed run's (task, N) cells; one part run directory n{N}/ per N
# The records file each method stage reads (lad.core.methods.Method.stage).
STAGE_FILES = {
    "records": "records.jsonl",
    "instruction": "instruction_records.jsonl",
    "cot": "cot_records.jsonl",
    "self-consistency": "sc_records.jsonl",
    "sofa": "sofa_records.jsonl",
    # The extra passes of blank and perm-avg (lad.core.methods.Method.extra).
    "blank": "blank_records.jsonl",
    "perm-avg": "perm_records.jsonl",  # each evaluation item under all N cyclic shifts
}
# Every records file of a run, by the stage that makes it.
RECORDS_FILES = {"calibration": "calibration.jsonl", **STAGE_FILES}
# A part's share of the mixed run's input files (n{N}/data/), by the argument naming them.
PART_INPUTS = {"data": "data/items.jsonl", "calibration_data": "data/calibration.jsonl",
               "orders": "data/orders.jsonl"}  # fmt: skip
# Files `lad eval` writes in a run directory; none may be one of its inputs.
RUN_OUTPUTS = (RUN_FILE, CALIBRATION_FILE, "predictions.jsonl", METRICS_FILE, "sofa.json",
               CELLS_FILE, *RECORDS_FILES.values())  # fmt: skip


class RunDir(RunJson):
    """A run directory: `lad eval`'s, or a harness audit's folder for one (task, N). Reading
    never writes; each file is read and checked once per RunDir."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.run_file = self.file(RUN_FILE)
        self.calibration_file = self.file(CALIBRATION_FILE)
        self.metrics_file = self.file(METRICS_FILE)
        self.records_path = self.records_file("records")  # records.jsonl: the evaluation's
        self.predictions_file = self.file("predictions.jsonl")
        self.report_folder = self.file("report")
        self.blank_folder = self.file("blank")  # the blank stage's grey pictures (lad.data.blank)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    @staticmethod
    def made(path: Path, count: int) -> bool:
        """Whether the records file `path` holds `count` records: its stage has none to make."""
        return path.is_file() and path.read_bytes().count(b"\n") >= count

    def records_file(self, stage: str) -> Path:
        """A stage's records file (RECORDS_FILES: "calibration", "records", "perm-avg", ...)."""
        return self.file(RECORDS_FILES[stage])

    def sofa_grid_file(self, sigma: float) -> Path:
        """The calibration records of SoFA's σ grid at `sigma` (--sofa-sigma auto)."""
        path = self.file("sofa_grid") / f"sigma{sigma:g}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def data_folder(self, split: str) -> Path:
        """Where generated items of a split ("eval", "calibration") are written (--data shapes)."""
        return self.file("data") / split

    # -- writes --------------------------------------------------------------------------------

    def write_calibration(self, calibration: Calibration) -> None:
        calibration.save(self.calibration_file)

    def write_sofa_choice(self, choice: Mapping[str, Any]) -> None:
        """sofa.json: the σ grid, each σ's accuracy and the σ chosen (--sofa-sigma auto)."""
        write_text(self.file("sofa.json"), json_text(dict(choice)))

    def write_cells(self, layout: Any) -> None:
        """cells.json of a mixed run (lad.core.cells.cells_json)."""
        write_text(self.file(CELLS_FILE), json_text(layout, indent=1))

    def write_metrics(self, metrics: Mapping[str, Any]) -> None:
        write_text(self.metrics_file, json_text(dict(metrics)))
        self.__dict__.pop("_checked_metrics", None)  # read back as written

    def writes(self, path: str | Path) -> bool:
        """Whether `lad eval` writes `path` in this run (RUN_OUTPUTS, report/, the lock, SoFA's
        grid; in a part n{N}/ alike): never an input (RUN/report/x.png would be overwritten)."""
        try:
            parts = Path(path).resolve().relative_to(self.path.resolve()).parts
        except ValueError:
            return False
        if len(parts) > 1 and re.fullmatch(r"n\d+", parts[0]):
            parts = parts[1:]  # a mixed run's part
        return bool(parts) and parts[0] in (*RUN_OUTPUTS, "report", "run.lock", "sofa_grid")

    # -- run.json ------------------------------------------------------------------------------

    @property
    def spec(self) -> Any:
        """The RecordSpec the records were made with (lad.run.spec)."""
        return RecordSpec.from_mapping(self.arguments)

    def made_records(self) -> bool:
        """Whether any records file in the run directory holds a record."""
        files = [*self.path.glob("*.jsonl"), *self.path.glob("sofa_grid/*.jsonl")]
        if self.is_mixed:  # a mixed run's records are its parts'
            files += [p for part in self.path.glob("n*/") for p in part.glob("*.jsonl")]
        return any(p.is_file() and p.stat().st_size > 0 for p in files)

    # -- a mixed run's cells and parts ---------------------------------------------------------

    @property
    def is_mixed(self) -> bool:
        """A run of several (task, N) cells (docs/formats.md, "Mixed runs")."""
        return self.file(CELLS_FILE).is_file()

    def cells(self) -> list[Any]:
        """cells.json's cells (lad.core.cells.Cell)."""
        return cells_from_json(read_json(self.file(CELLS_FILE), RunError), self.file(CELLS_FILE))

    def parts(self) -> dict[int, RunDir]:
        """The run directory of each N of a mixed run (n{N}/), by N."""
        parts = {n: self.part(n) for n in sorted({c.num_candidates for c in self.cells()})}
        root = self.path.resolve()
        for part in parts.values():  # a run reads its own parts, never a folder elsewhere
            if part.path.is_symlink() or not part.path.resolve().is_relative_to(root):
                raise RunError(
                    f"{part.path}: a symlink or a folder outside the run {self.path}; a mixed "
                    "run's parts are folders inside it"
                )
        return parts

    def part(self, n: int) -> RunDir:
        """The part run directory of a mixed run's items of N candidates."""
        return RunDir(self.file(self.part_name(n)))

    @staticmethod
    def part_name(n: int) -> str:
        return f"n{n}"

    # -- records -------------------------------------------------------------------------------

    @cached_property
    def records(self) -> RecordSet:
        """records.jsonl: every item under the same number of orderings, numbered 0..T-1."""
        path = self.records_path
        if not path.is_file():
            raise RunError(
                f"{self.path}: no records.jsonl; the run is unfinished, rerun its lad eval"
            )
        records = read_records(path)
        if not len(records):
            raise RunError(f"{path}: holds no records; rerun its lad eval")
        # Every item under the same number of orderings: a record deleted or added is refused.
        names, counts = np.unique(records.items, return_counts=True)
        short = np.flatnonzero(counts != counts.max())
        if short.size:
            raise RunError(
                f"{path}: item {str(names[short[0]])!r} has {counts[short[0]]} of the "
                f"{counts.max()} orderings the other items have; the file was cut or edited. "
                "Rerun the run's lad eval to remake it."
            )
        return records

    def stage_records(self, stage: str) -> RecordSet | None:
        """A method stage's records (STAGE_FILES), None where the run has none; they must
        answer the same requests as records.jsonl, in order (perm-avg's: every evaluation item
        under all N cyclic shifts)."""
        path = self.records_file(stage)
        if not path.is_file():
            return None
        made = read_records(path)
        records = self.records
        if stage == "perm-avg":
            n = records.num_candidates
            counts = np.unique(made.items, return_counts=True)[1] if len(made) else np.array([])
            fits = set(made.items.tolist()) == set(records.items.tolist()) and (counts == n).all()
            differs = f"does not hold every evaluation item under all {n} cyclic shifts"
        else:
            fits = made.keys() == records.keys() and np.array_equal(made.order, records.order)
            differs = "its (item, ordering) records differ from records.jsonl"
        if not fits:
            raise RunError(
                f"{path}: {differs}; the file is unfinished or from another run. Rerun the run's "
                "lad eval to finish it."
            )
        return made

    def stages(self) -> dict[str, RecordSet]:
        """The records of every method stage present, by stage name (records.jsonl's apart)."""
        out = {s: self.stage_records(s) for s in STAGE_FILES if s != "records"}
        return {s: r for s, r in out.items() if r is not None}

    def calibration_records(self) -> RecordSet | None:
        """calibration.jsonl (the symmetrised calibration set), or None."""
        path = self.records_file("calibration")
        return read_records(path) if path.is_file() else None

    # -- calibration and metrics ---------------------------------------------------------------

    def calibration(self, *, check: bool = True) -> Calibration:
        """calibration.json, refused if it does not fit the run's records (their N and L always;
        with `check`, their model, label scheme, prompt, chat template and preprocessing)."""
        path = self.calibration_file
        if not path.is_file():
            raise RunError(
                f"{self.path}: no calibration.json; the run is unfinished, rerun its lad eval"
            )
        calibration = Calibration.load(path)
        records = self.records
        fingerprint = self.fingerprint(records.num_candidates)
        strict = check and not self.is_harness  # a harness made it of these records: N, L suffice
        where = self.arguments.get("calibration") or "calibration.json"
        calibration.check_compatible(records, fingerprint, strict=strict, where=where)
        return calibration

    def fingerprint(self, num_candidates: int) -> Fingerprint:
        """What the run's records of `num_candidates` candidates were made as (run.json's
        arguments and inputs): what a calibration applied to them is checked against."""
        try:
            return self.spec.fingerprint(num_candidates, self.inputs)
        except LadError as e:  # run.json's arguments name no label scheme lad knows, ...
            raise RunError(f"{self.run_file}: {e}") from None

    def check(self) -> RunDir:
        """The checks every reader of a finished run makes before reading on (a mixed run: each
        part's too): run.json of lad's format, every item of records.jsonl under the same number
        of orderings, metrics.json computed from these very records and arguments."""
        _ = self.arguments
        if self.is_mixed:
            for part in self.parts().values():
                part.check()
        elif self.records_path.is_file() or not self.metrics_file.is_file():
            _ = self.records
        if self.metrics_file.is_file():
            self.metrics()
        return self

    @property
    def answers_only(self) -> bool:
        """A harness audit of any model's logged answers: metrics without records."""
        return self.is_harness and not self.records_path.is_file()

    def metrics(self) -> dict[str, Any]:
        """metrics.json, refused unless it was computed from this run's records and arguments."""
        return self._checked_metrics

    @cached_property
    def _checked_metrics(self) -> dict[str, Any]:  # read and checked once
        path = self.metrics_file
        if not path.is_file():
            raise RunError(f"{self.path}: no metrics.json; finish the run with `lad eval` first")
        metrics = read_json(path, RunError)
        if not isinstance(metrics, dict):
            raise RunError(f"{path}: damaged (not a JSON object); rerun `lad eval` to rewrite it")
        source = metrics.get("source")
        if self.is_mixed and not isinstance(source, dict):
            raise RunError(f'{path}: no "source" (what it was computed from); rerun lad eval')
        if not self.is_mixed and not self.records_path.is_file():
            return metrics  # a model's answers only: nothing to match
        if isinstance(source, dict):  # written since lad kept it: both must match
            if source != self.source():
                raise RunError(
                    f"{path}: was computed from other records or arguments than this run's "
                    f"{'cells.json and parts' if self.is_mixed else 'records.jsonl and run.json'}"
                    " (a file was replaced or edited since); rerun `lad eval` on the run to "
                    "rescore it"
                )
        elif metrics.get("num_records", len(self.records)) != len(self.records):
            raise RunError(
                f"{path}: counts {metrics.get('num_records')} records but records.jsonl holds "
                f"{len(self.records)}; rerun `lad eval` on the run to rescore it"
            )
        return metrics

    def source(self) -> dict[str, Any]:
        """What metrics.json was computed from: the SHA-256 of records.jsonl and of run.json's
        arguments (a mixed run: of cells.json, and each part's by N)."""
        if self.is_mixed:
            cells = hashlib.sha256(self.file(CELLS_FILE).read_bytes()).hexdigest()
            parts = {str(n): part.source() for n, part in self.parts().items()}
            return {"cells_sha256": cells, "parts": parts}
        arguments = json.dumps(self.run_json["arguments"], sort_keys=True)
        return {
            "records_sha256": hashlib.sha256(self.records_path.read_bytes()).hexdigest(),
            "arguments_sha256": hashlib.sha256(arguments.encode()).hexdigest(),
        }

    def write_scored(self, scored: Any, **more: Any) -> dict[str, Any]:
        """predictions.jsonl and metrics.json of a `lad.core.scoring.Scored` (plus `more`
        top-level metrics keys); returns the metrics written."""
        write_predictions(self.predictions_file, scored.predictions)
        metrics = {**scored.metrics, **more, "source": self.source()}
        self.write_metrics(metrics)
        return metrics

    def finished(self, arguments: Mapping[str, Any], methods: Any) -> dict[str, Any] | None:
        """The run's metrics when it was finished with these record-defining `arguments`
        (`begin`'s rule) and scored every one of `methods`; else None."""
        if not self.metrics_file.is_file():
            return None
        try:
            stored = self.check().run_json
            wanted = {"arguments": json.loads(json.dumps(dict(arguments))), "inputs": {}}
            check_same(self.path, stored, wanted, self.arguments)
            metrics = self.metrics()
        except LadError:
            return None
        scored = metrics.get("methods")
        if not isinstance(scored, dict):  # a mixed run: its overall, item-weighted row
            scored = metrics.get("groups", {}).get("overall", {}).get("methods", {})
        return metrics if all(m in scored for m in methods) else None

    # -- written without lad eval --------------------------------------------------------------

    def write_run(
        self,
        arguments: Mapping[str, Any],
        records: RecordSet | None,
        *,
        harness: Mapping[str, Any],
        stages: Mapping[str, RecordSet] | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        """A run directory of records made elsewhere (a harness audit's folder for one task and
        N): run.json (marked "harness"), records (None: a model's answers only, whose metrics
        `write_metrics` writes), the other stages' records (perm-avg's) and calibration."""
        self._write_run_json(
            {"format": RUN_FORMAT, "arguments": dict(arguments), "harness": dict(harness)}
        )
        self.__dict__.pop("records", None)
        if records is not None:
            write_records(self.records_path, records)
        for stage, made in (stages or {}).items():
            write_records(self.records_file(stage), made)
        if calibration is not None:
            self.write_calibration(calibration)


def run_folders(path: Path) -> list[Path]:
    """A mixed run's part run directories (one per N), else [path]: what readers of runs read."""
    if not (path / CELLS_FILE).is_file():
        return [path]
    return [part.path for part in RunDir(path).parts().values()]


def made_as(records_path: str | Path, records: RecordSet) -> Fingerprint:
    """What the records of the file `records_path` were made as: the fingerprint of the run
    whose run.json lies beside it (`RunDir.fingerprint`); unknown (UNKNOWN: a calibration is then
    checked on N and L alone) for a file of records without one, or in a harness audit's folder,
    whose prompts are the harness's."""
    run = RunDir(Path(records_path).parent)
    if not len(records) or not run.run_file.is_file() or run.is_harness:
        return UNKNOWN
    return run.fingerprint(records.num_candidates)


def cells_of_part(records_path: str | Path) -> list[Any]:
    """The cells of the mixed run whose part holds this records file (RUN/n{N}/records.jsonl),
    else []: what `lad score` and `lad metrics` show per cell."""
    run = RunDir(Path(records_path).resolve().parent.parent)
    return run.cells() if run.is_mixed else []


def check_not_run_files(outputs: dict[str, Path]) -> None:
    """No command's output is a file a finished run's lad eval wrote (`RunDir.writes`, its
    report/ aside) in the nearest folder above it holding run.json, or a mixed run's above its
    part: records, calibration, predictions and metrics vouch for each other. A run the command
    writes itself (one of `outputs`: lad eval's own --out) is its own."""
    given = {Path(p).resolve() for p in outputs.values() if p is not None}
    for flag, path in outputs.items():
        if path is None:
            continue
        for folder in Path(path).resolve().parents[:3]:
            if folder in given or not (folder / RUN_FILE).is_file():
                continue
            inside = Path(path).resolve().relative_to(folder).parts
            if RunDir(folder).writes(path) and "report" not in inside[:2]:
                raise RunError(
                    f"{flag} {path}: a file lad eval writes in the run {folder}, which holds "
                    "what its other files were computed from; choose another output"
                )

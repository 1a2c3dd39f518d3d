"""`RunDir`: the one reader and writer of a run directory (docs/formats.md, "Run directory").

Every command that reads a run — `lad eval` resuming or rescoring it, `lad score`/`metrics` on its
records, `lad report`, `lad ablate` — goes through `RunDir`, so each applies the same checks:
run.json of lad's format (older layouts are read in lad.run.runjson alone), every stage's records
answering the same (item, ordering) requests as records.jsonl, each item under the same number of
orderings, and metrics.json made from these very records and arguments. The harness writes its
audit folders through it too (`write_run`), so they are run directories like any other.
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
from lad.core.records import RecordSet, read_records, write_records
from lad.errors import CalibrationError, LadError, RunError
from lad.io.files import read_json, write_text
from lad.run.runjson import RUN_FORMAT, check_same, read_run_json

# A harness audit (lad.harness.audit): a folder whose lad_audit.json lists run folders.
AUDIT_FORMAT = "lad-harness-audit/1"
AUDIT_FILE = "lad_audit.json"
ANSWERS_FILE = "answers.jsonl"  # a harness audit folder's rows, for lad export
CELLS_FILE = "cells.json"  # a mixed run's (task, N) cells; one part run directory n{N}/ per N
# How records are made from the same arguments; bumped when lad would now make other records, so a
# run begun by an older lad is never extended with records that do not match its own (1: labels
# tokenised glued to the prompt; 2: labels as the chat template writes the reply).
RECORDS_VERSION = 2
# The records file each method stage reads (lad.core.methods.Method.stage).
STAGE_FILES = {
    "records": "records.jsonl",
    "instruction": "instruction_records.jsonl",
    "cot": "cot_records.jsonl",
    "self-consistency": "sc_records.jsonl",
    "sofa": "sofa_records.jsonl",
    "blank": "blank_records.jsonl",  # blank's extra pass (lad.core.methods.Method.extra)
}
# Files `lad eval` writes in a run directory; none may be one of its inputs.
RUN_OUTPUTS = (
    "run.json",
    "calibration.jsonl",
    "calibration.json",
    "perm_records.jsonl",
    "predictions.jsonl",
    "metrics.json",
    "sofa.json",
    CELLS_FILE,
    *STAGE_FILES.values(),
)


class RunDir:
    """A run directory: `lad eval`'s, or a harness audit's folder for one (task, N).

    Reading never writes; each file is read and checked once per RunDir.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"RunDir({str(self.path)!r})"

    def file(self, name: str) -> Path:
        return self.path / name

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

    def begin(
        self,
        arguments: Mapping[str, Any],
        defaults: Mapping[str, Any],
        inputs: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        """Create run.json holding the record-defining `arguments` and the `inputs`'
        fingerprints, or check that an existing one was made with the same arguments from the
        same inputs.

        An argument missing from an older run.json was made with its value in `defaults`. A
        run.json under which no record was made yet (a run that failed at its start) does not
        bind: it is replaced.
        """
        wanted = self.check_begin(arguments, defaults, inputs, live=False)  # we hold the lock
        if wanted is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        write_text(self.file("run.json"), json.dumps(wanted, indent=2) + "\n")
        self.__dict__.pop("run_json", None)

    def check_begin(
        self,
        arguments: Mapping[str, Any],
        defaults: Mapping[str, Any],
        inputs: Mapping[str, dict[str, Any]] | None = None,
        live: bool = True,
    ) -> dict[str, Any] | None:
        """What `begin` checks, writing nothing (a refusal before the first write): a live `lad
        eval` here, or a run.json of other arguments or inputs with records made (a mixed run's:
        in its parts). Returns the run.json to write, None where the one there says so."""
        from lad.run.lock import running_holder

        holder = running_holder(self.path) if live else None
        if holder is not None:
            raise RunError(
                f"{self.path} is in use by another lad eval ({holder}); wait for it to finish, "
                "or use another --out"
            )
        path = self.file("run.json")
        wanted = {"format": RUN_FORMAT, "arguments": json.loads(json.dumps(dict(arguments)))}
        wanted["inputs"] = dict(inputs or {})
        wanted["records_version"] = RECORDS_VERSION
        if path.exists():
            stored = read_run_json(path)
            try:
                check_same(self.path, stored, wanted, json.loads(json.dumps(dict(defaults))))
                return None
            except RunError:
                if self.made_records():
                    raise
        return wanted

    def check_records_version(self) -> None:
        """Refuse to add records to a run whose records an older lad made another way (the two
        would mix in one run); its finished records can still be rescored without the model."""
        made = read_run_json(self.file("run.json")).get("records_version", 1)
        if made != RECORDS_VERSION and self.made_records():
            raise RunError(
                f"{self.path} holds records made by an older lad (records version {made}; this "
                f"lad makes version {RECORDS_VERSION}, whose label probabilities differ for "
                "models whose chat template writes a space before the reply): it can be "
                "rescored, not extended. Finish it with the lad that began it, or use another "
                "--out."
            )

    def check_is_run(self) -> None:
        """Refuse a path that is not a run directory, naming what it lacks."""
        if not self.path.is_dir():
            raise RunError(
                f"{self.path}: not a directory; pass run directories made by lad eval --out DIR"
            )
        if not self.file("run.json").is_file():
            raise RunError(
                f"{self.path}: not a lad run directory (no run.json); make one with lad eval"
            )

    @cached_property
    def run_json(self) -> dict[str, Any]:
        if not self.file("run.json").is_file() and self.file("metrics.json").is_file():
            return {"format": RUN_FORMAT, "arguments": {}}  # lad score's and metrics' output
        self.check_is_run()
        return read_run_json(self.file("run.json"), older=True)

    @property
    def arguments(self) -> dict[str, Any]:
        """run.json's arguments, those an older run.json lacks at their default."""
        from lad.run.config import EvalConfig

        stored = self.run_json["arguments"]
        if self.is_harness:
            return dict(stored)
        made = EvalConfig().identity()  # what an older run.json leaves out was made by default
        return {name: stored.get(name, value) for name, value in made.items()}

    @property
    def inputs(self) -> dict[str, Any]:
        return self.run_json.get("inputs", {})

    @property
    def is_harness(self) -> bool:
        """A harness audit's folder (lad.harness.runner): made without `lad eval`."""
        return "harness" in self.run_json

    @property
    def spec(self) -> Any:
        """The RecordSpec the records were made with (lad.run.spec)."""
        from lad.run.spec import RecordSpec

        return RecordSpec.from_mapping(self.arguments)

    def timing(self) -> dict[str, float]:
        """run.json's "timing" (empty for a run made before lad recorded it)."""
        return dict(self.run_json.get("timing", {}))

    def add_times(self, seconds: Mapping[str, float]) -> None:
        """Add wall times (seconds per stage) to run.json's "timing", the sum over every session
        that worked on a stage. It sits beside "arguments", so a rerun's check never compares it."""
        stored = read_run_json(self.file("run.json"))
        timing = stored.setdefault("timing", {})
        for stage, s in seconds.items():
            timing[stage] = round(timing.get(stage, 0.0) + s, 3)
        write_text(self.file("run.json"), json.dumps(stored, indent=2) + "\n")
        self.__dict__.pop("run_json", None)

    def threads(self) -> Any:
        """run.json's "threads": the CPU threads its records were made with (None on an
        accelerator, or for a run from before lad recorded them)."""
        return self.run_json.get("threads")

    def set_threads(self, threads: Mapping[str, Any]) -> None:
        """Write run.json's "threads" (lad.backends.threads.record_choice), beside "arguments"."""
        stored = read_run_json(self.file("run.json"))
        stored["threads"] = dict(threads)
        write_text(self.file("run.json"), json.dumps(stored, indent=2) + "\n")
        self.__dict__.pop("run_json", None)

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
        from lad.core.cells import cells_from_json

        return cells_from_json(read_json(self.file(CELLS_FILE), RunError), self.file(CELLS_FILE))

    def parts(self) -> dict[int, RunDir]:
        """The run directory of each N of a mixed run (n{N}/), by N."""
        ns = {c.num_candidates for c in self.cells()}
        parts = {n: RunDir(self.path / f"n{n}") for n in sorted(ns)}
        root = self.path.resolve()
        for part in parts.values():  # a run reads its own parts, never a folder elsewhere
            if part.path.is_symlink() or not part.path.resolve().is_relative_to(root):
                raise RunError(
                    f"{part.path}: a symlink or a folder outside the run {self.path}; a mixed "
                    "run's parts are folders inside it"
                )
        return parts

    # -- records -------------------------------------------------------------------------------

    @cached_property
    def records(self) -> RecordSet:
        """records.jsonl: every item under the same number of orderings, numbered 0..T-1."""
        path = self.file("records.jsonl")
        if not path.is_file():
            raise RunError(
                f"{self.path}: no records.jsonl; the run is unfinished, rerun its lad eval"
            )
        records = read_records(path)
        if not len(records):
            raise RunError(f"{path}: holds no records; rerun its lad eval")
        _check_complete(records, path)
        return records

    def stage_records(self, stage: str) -> RecordSet | None:
        """A method stage's records (STAGE_FILES), None where the run has none; they must
        answer the same requests as records.jsonl, in order."""
        if stage == "records":
            return self.records
        path = self.file(STAGE_FILES[stage])
        if not path.is_file():
            return None
        made = read_records(path)
        records = self.records
        if made.keys() != records.keys() or not np.array_equal(made.order, records.order):
            raise RunError(
                f"{path}: its (item, ordering) records differ from records.jsonl; the file is "
                "unfinished or from another run. Rerun the run's lad eval to finish it."
            )
        return made

    def stages(self) -> dict[str, RecordSet]:
        """The records of every method stage present, by stage name (records.jsonl's apart)."""
        out = {s: self.stage_records(s) for s in STAGE_FILES if s != "records"}
        return {s: r for s, r in out.items() if r is not None}

    def perm_records(self) -> RecordSet | None:
        """perm_records.jsonl (each evaluation item under all N cyclic shifts), or None."""
        path = self.file("perm_records.jsonl")
        if not path.is_file():
            return None
        made = read_records(path)
        n = self.records.num_candidates
        counts = np.unique(made.items, return_counts=True)[1] if len(made) else np.array([])
        evaluated = set(self.records.items.tolist())
        if set(made.items.tolist()) != evaluated or (counts != n).any():
            raise RunError(
                f"{path}: does not hold every evaluation item under all {n} cyclic shifts; the "
                "file is unfinished or from another run. Rerun the run's lad eval to finish it."
            )
        return made

    def calibration_records(self) -> RecordSet | None:
        """calibration.jsonl (the symmetrised calibration set), or None."""
        path = self.file("calibration.jsonl")
        return read_records(path) if path.is_file() else None

    # -- calibration and metrics ---------------------------------------------------------------

    def calibration(self, *, check: bool = True) -> Calibration:
        """calibration.json, refused if it does not fit the run's records (their N and L always;
        with `check`, their model, label scheme, prompt, chat template and preprocessing)."""
        path = self.file("calibration.json")
        if not path.is_file():
            raise RunError(
                f"{self.path}: no calibration.json; the run is unfinished, rerun its lad eval"
            )
        calibration = Calibration.load(path)
        records = self.records
        try:
            fingerprint = self.spec.fingerprint(records.num_candidates, self.inputs)
        except LadError as e:  # run.json's arguments name no label scheme lad knows, ...
            raise RunError(f"{self.file('run.json')}: {e}") from None
        if self.is_harness:  # made by the harness from the same records: N and L suffice
            check = False
        try:
            calibration.check_compatible(records, **fingerprint, strict=check)
        except CalibrationError as e:
            given = self.arguments.get("calibration") or "calibration.json"
            raise CalibrationError(f"{given}: {e}") from e
        return calibration

    def check(self) -> RunDir:
        """The checks every reader of a finished run makes before reading on: run.json of lad's
        format, every item of records.jsonl under the same number of orderings, and metrics.json,
        where there is one, computed from these very records and arguments (a mixed run: each
        part's too); returns self."""
        _ = self.arguments
        if self.is_mixed:
            for part in self.parts().values():
                part.check()
        elif self.file("records.jsonl").is_file() or not self.file("metrics.json").is_file():
            _ = self.records
        if self.file("metrics.json").is_file():
            self.metrics()
        return self

    @property
    def answers_only(self) -> bool:
        """A harness audit of any model's logged answers: metrics without records."""
        return self.is_harness and not self.file("records.jsonl").is_file()

    def metrics(self) -> dict[str, Any]:
        """metrics.json, refused unless it was computed from this run's records and arguments."""
        path = self.file("metrics.json")
        if not path.is_file():
            raise RunError(f"{self.path}: no metrics.json; finish the run with `lad eval` first")
        metrics = read_json(path, RunError)
        if not isinstance(metrics, dict):
            raise RunError(f"{path}: damaged (not a JSON object); rerun `lad eval` to rewrite it")
        source = metrics.get("source")
        if self.is_mixed and not isinstance(source, dict):
            raise RunError(f'{path}: no "source" (what it was computed from); rerun lad eval')
        if not self.is_mixed and not self.file("records.jsonl").is_file():
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
        """What metrics.json was computed from: the SHA-256 of records.jsonl's bytes and of
        run.json's arguments (a mixed run: of cells.json, and each part's by N)."""
        if self.is_mixed:
            cells = hashlib.sha256(self.file(CELLS_FILE).read_bytes()).hexdigest()
            parts = {str(n): part.source() for n, part in self.parts().items()}
            return {"cells_sha256": cells, "parts": parts}
        arguments = json.dumps(self.run_json["arguments"], sort_keys=True)
        return {
            "records_sha256": hashlib.sha256(self.file("records.jsonl").read_bytes()).hexdigest(),
            "arguments_sha256": hashlib.sha256(arguments.encode()).hexdigest(),
        }

    def write_scored(self, scored: Any, **more: Any) -> dict[str, Any]:
        """predictions.jsonl and metrics.json of a `lad.core.scoring.Scored` (plus `more`
        top-level metrics keys); returns the metrics written."""
        from lad.core.predictions import write_predictions

        write_predictions(self.file("predictions.jsonl"), scored.predictions)
        metrics = {**scored.metrics, **more, "source": self.source()}
        write_text(self.file("metrics.json"), json.dumps(metrics, indent=2) + "\n")
        return metrics

    def write_answers(self, metrics: Mapping[str, Any]) -> None:
        """metrics.json of a model's answers only (no records to fingerprint)."""
        write_text(self.file("metrics.json"), json.dumps(dict(metrics), indent=2) + "\n")

    # -- written without lad eval --------------------------------------------------------------

    def write_run(
        self,
        arguments: Mapping[str, Any],
        records: RecordSet | None,
        *,
        harness: Mapping[str, Any],
        perm_records: RecordSet | None = None,
        calibration: Calibration | None = None,
    ) -> None:
        """A run directory of records made elsewhere (a harness audit's folder for one task and
        N): run.json (marked "harness"), records (None: a model's answers only, whose metrics
        `write_answers` writes), perm records and calibration."""
        self.path.mkdir(parents=True, exist_ok=True)
        run = {"format": RUN_FORMAT, "arguments": dict(arguments), "harness": dict(harness)}
        write_text(self.file("run.json"), json.dumps(run, indent=2) + "\n")
        self.__dict__.pop("run_json", None)
        self.__dict__.pop("records", None)
        if records is not None:
            write_records(self.file("records.jsonl"), records)
        if perm_records is not None:
            write_records(self.file("perm_records.jsonl"), perm_records)
        if calibration is not None:
            calibration.save(self.file("calibration.json"))


def _check_complete(records: RecordSet, path: Path) -> None:
    """Every item under the same number of orderings: a record deleted or added is refused."""
    names, counts = np.unique(records.items, return_counts=True)
    short = np.flatnonzero(counts != counts.max())
    if short.size:
        raise RunError(
            f"{path}: item {str(names[short[0]])!r} has {counts[short[0]]} of the {counts.max()} "
            "orderings the other items have; the file was cut or edited. Rerun the run's lad "
            "eval to remake it."
        )


def check_audit_destination(output: Path, source: str) -> None:
    """Refuse, before anything is written, an audit of logged samples into a folder whose
    lad_audit.json is `--model lad`'s own (or not an audit): it would be replaced."""
    path = output / AUDIT_FILE
    if not path.exists():
        return
    stored = read_json(path, RunError)
    if not isinstance(stored, dict) or stored.get("format") != AUDIT_FORMAT:
        raise RunError(f"{path}: not a lad harness audit, and lad never replaces it; use --out")
    if (stored.get("source") == "--model lad") != (source == "--model lad"):
        raise RunError(
            f"{path}: holds the audit of {stored.get('source')!r}, which this audit of {source!r} "
            "would replace; write it elsewhere with --out"
        )


def audit_folders(path: Path) -> list[Path]:
    """The run folders a harness audit lists, when `path` holds lad_audit.json and no
    metrics.json of its own; a mixed run's parts (one per N); else [path]."""
    if (path / CELLS_FILE).is_file():
        return [part.path for part in RunDir(path).parts().values()]
    audit_path = path / AUDIT_FILE
    if (path / "metrics.json").is_file() or not audit_path.is_file():
        return [path]
    audit = read_json(audit_path, RunError)
    if not isinstance(audit, dict) or audit.get("format") != AUDIT_FORMAT:
        raise RunError(f"{audit_path}: not a lad harness audit (format {AUDIT_FORMAT!r})")
    tasks = audit.get("tasks")
    listed = [
        entry["folder"]
        for by_n in (tasks.values() if isinstance(tasks, dict) else [])
        for entry in by_n.values()
        if isinstance(entry, dict) and isinstance(entry.get("folder"), str)
    ]
    if not listed:
        raise RunError(f"{audit_path}: lists no task folder")
    root = path.resolve()
    for name in listed:  # an audit names its own folders, never another place on the machine
        if not (path / name).resolve().is_relative_to(root):
            raise RunError(
                f"{audit_path}: lists the folder {name!r}, which is outside the audit's folder "
                f"{path}; an audit lists only folders inside it"
            )
    return [path / name for name in listed]

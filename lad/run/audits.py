"""A harness audit's folder (lad.harness.audit): lad_audit.json, which lists one run directory
(lad.run.rundir.RunDir) per (task, N) inside it; their names and lad_audit.json's writes."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from lad.errors import RunError
from lad.io.files import child, read_json, write_text
from lad.run.rundir import CELLS_FILE, METRICS_FILE, RunDir, json_text, run_folders

AUDIT_FORMAT = "lad-harness-audit/1"
AUDIT_FILE = "lad_audit.json"
ANSWERS_FILE = "answers.jsonl"  # a harness audit folder's rows, for lad export


def audit_part(root: Path, task: str, n: int, *, under: str = "") -> tuple[RunDir, str]:
    """A harness audit's run folder of one (task, N) and its name as lad_audit.json lists it
    (relative to `root`); `under`: a subfolder of `root` holding them all."""
    base = Path(root) / under if under else Path(root)
    folder = child(base, task, RunError, "a task named ") / RunDir.part_name(n)
    name = "/".join(filter(None, (under, task, RunDir.part_name(n))))
    return RunDir(folder), name


def write_answers(run: RunDir, rows: Iterable[Mapping[str, Any]]) -> None:
    """The audit rows behind a (task, N)'s folder, one JSON object a line (lad export reads
    them)."""
    write_text(run.file(ANSWERS_FILE), "".join(json.dumps(r) + "\n" for r in rows))


def write_audit(root: Path, audit: Mapping[str, Any]) -> Path:
    """lad_audit.json in `root`, of lad's audit format."""
    path = Path(root) / AUDIT_FILE
    write_text(path, json_text({"format": AUDIT_FORMAT, **audit}))
    return path


def audit_folders(path: Path) -> list[Path]:
    """The run folders a harness audit lists, when `path` holds lad_audit.json and no
    metrics.json of its own; a mixed run's parts (one per N); else [path]."""
    audit_path = path / AUDIT_FILE
    if (path / CELLS_FILE).is_file() or (path / METRICS_FILE).is_file() or not audit_path.is_file():
        return run_folders(path)
    audit = read_json(audit_path, RunError)
    if not isinstance(audit, dict) or audit.get("format") != AUDIT_FORMAT:
        raise RunError(f"{audit_path}: not a lad harness audit (format {AUDIT_FORMAT!r})")
    tasks = audit.get("tasks")
    if not isinstance(tasks, dict) or not all(isinstance(t, dict) for t in tasks.values()):
        raise RunError(f"{audit_path}: 'tasks' must be an object of objects, one per task and N")
    entries = [entry for by_n in tasks.values() for entry in by_n.values()]
    if not all(isinstance(e, dict) and isinstance(e.get("folder"), str) for e in entries):
        raise RunError(f"{audit_path}: each task's entry per N must be an object with a 'folder'")
    if not entries:
        raise RunError(f"{audit_path}: lists no task folder")
    return [_listed_folder(path, audit_path, entry["folder"]) for entry in entries]


def _listed_folder(path: Path, audit_path: Path, name: str) -> Path:
    """An audit names its own folders, never another place on the machine: each part of `name`
    a plain name (lad.io.files.child), and no symlink out of the audit's folder."""
    try:
        folder = path
        for part in name.split("/"):
            folder = child(folder, part, RunError)
        ok = folder.resolve().is_relative_to(path.resolve())
    except RunError:
        ok = False
    if not ok:
        raise RunError(
            f"{audit_path}: lists the folder {name!r}, which is outside the audit's folder "
            f"{path}; an audit lists only folders inside it, by relative names"
        )
    return folder


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

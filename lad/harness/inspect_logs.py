"""Rows of lad's audit from Inspect's logs (`lad harness audit LOG_DIR`): the samples that the
scorer `lad/position` scored (lad.harness.inspect_audit) carry their rows in the score's metadata
(`lad_rows`; epochs after the first as repeats). Read with inspect_ai's own log reader, so this
needs lad's [inspect] extra; each row is checked as a samples log's are (lad.harness.samples)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lad.errors import LadError
from lad.harness import harness_module


def has_logs(folder: Path) -> bool:
    """Whether `folder` holds Inspect's binary logs (`.eval`, its default format)."""
    return any(folder.rglob("*.eval"))


def _name(task: str, model: str) -> str:
    """One audit entry per task and model (Inspect keeps every model's logs in one folder)."""
    return f"{task}__{model}".replace("/", "__")


def inspect_rows(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """{"<task>__<model>": rows} from the newest log of each task and model under `folder` whose
    samples lad/position scored; other logs are passed over."""
    from lad.harness.samples import checked_rows

    log = harness_module("inspect_ai.log", "inspect")
    from lad.harness.inspect_audit import STORE_KEY

    newest: dict[str, Any] = {}
    for info in log.list_eval_logs(str(folder), recursive=True):
        header = log.read_eval_log(info, header_only=True)
        key = _name(header.eval.task, header.eval.model)
        if key not in newest or header.eval.created > newest[key][1].eval.created:
            newest[key] = (info, header)
    out: dict[str, list[dict[str, Any]]] = {}
    for key, (info, _) in sorted(newest.items()):
        read = log.read_eval_log(info)
        found = []
        for sample in read.samples or []:
            for name, score in (sample.scores or {}).items():
                rows = (score.metadata or {}).get(STORE_KEY)
                if rows is None:
                    continue
                if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                    raise LadError(f"{info.name}: sample {sample.id!r}: {name}'s lad rows are not "
                                   "a list of rows")  # fmt: skip
                where = f"{info.name}: sample {sample.id!r} epoch {sample.epoch}: "
                found += [(where, r) for r in rows]
        if found:
            out[key] = checked_rows(found)
    return out

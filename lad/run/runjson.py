"""run.json: lad's format (older layouts read in `read_run_json` alone), the fingerprints of a run's
input files, and the check that a rerun has the same arguments and inputs (lad.run.rundir)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lad.errors import RunError
from lad.io.files import read_json

RUN_FORMAT = "lad-run/1"


# Arguments that name a file or folder: `./data/x.jsonl` and `data/x.jsonl` are the same one.
PATH_ARGUMENTS = ("model", "data", "calibration_data", "calibration", "orders", "chat_template")


def file_digest(path: str | Path, images: Iterable[Path] = ()) -> dict[str, Any]:
    """What run.json keeps of an input file: the SHA-256 of its bytes and, for each image it
    lists, the image's size and modification time (not its bytes, which would mean reading
    every image on every rerun), keyed by the image's path relative to the file's folder."""
    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    stats = {}
    for image in dict.fromkeys(images):
        st = image.stat()
        stats[os.path.relpath(image, path.parent)] = f"{st.st_size} {st.st_mtime_ns}"
    out: dict[str, Any] = {"path": str(path.resolve()), "sha256": digest}
    if stats:
        out["images"] = stats
    return out


def read_run_json(path: Path, older: bool = False) -> dict[str, Any]:
    """run.json, checked; the one place older layouts are read (`older`, for readers of finished
    runs): a run.json without "format" (a harness folder before lad marked it, whose metrics.json
    says "harness") reads as one of lad's format."""
    stored = read_json(path, RunError, "run.json")
    if older and isinstance(stored, dict) and "format" not in stored:
        stored = {**stored, "format": RUN_FORMAT}
        metrics = path.parent / "metrics.json"
        made = read_json(metrics, RunError) if metrics.is_file() else None
        if isinstance(made, dict) and isinstance(made.get("harness"), dict):
            stored["harness"] = made["harness"]
    if not isinstance(stored, dict) or stored.get("format") != RUN_FORMAT:
        got = stored.get("format") if isinstance(stored, dict) else type(stored).__name__
        raise RunError(f"{path}: not a lad run (format {got!r}); use another --out")
    if not isinstance(stored.get("arguments"), dict) or not isinstance(
        stored.get("inputs", {}), dict
    ):
        raise RunError(f"{path}: damaged ('arguments' must be an object); use another --out")
    return stored


def check_same(
    run_dir: Path, stored: dict[str, Any], wanted: dict[str, Any], defaults: dict[str, Any]
) -> None:
    made_from, now_from = stored.get("inputs", {}), wanted["inputs"]
    for name, value in wanted["arguments"].items():
        made = stored["arguments"].get(name, defaults.get(name))
        if name in made_from and name in now_from:
            continue  # a fingerprinted file: its content decides, not how its path is spelled
        if made != value and not (name in PATH_ARGUMENTS and _same_path(made, value)):
            flag = "--" + name.replace("_", "-")
            raise RunError(
                f"{run_dir} was made with {flag} {made!r}, not {value!r}. "
                "Rerun with the same arguments to resume, or use another --out."
            )
    for name, now in now_from.items():
        before = made_from.get(name)
        if before is None:
            continue  # a run.json from before lad kept fingerprints
        flag = "--" + name.replace("_", "-")
        if before.get("sha256") != now["sha256"]:
            raise RunError(
                f"{now['path']} ({flag}) changed since {run_dir} was made from it: its records "
                "would be stale. Rerun with the file as it was, or use another --out."
            )
        folder = Path(now["path"]).parent
        old_images = before.get("images", {})
        for image, stat in now.get("images", {}).items():
            if old_images.get(image, stat) != stat:
                raise RunError(
                    f"{folder / image}: changed since {run_dir} was made (its size or "
                    f"modification time differ), so its records would be stale. Restore it, "
                    "or use another --out."
                )


def _same_path(a: Any, b: Any) -> bool:
    return isinstance(a, str) and isinstance(b, str) and os.path.normpath(a) == os.path.normpath(b)

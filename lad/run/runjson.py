"""run.json: lad's format (older layouts read in `read_run_json` alone), the fingerprints of a run's
input files, and the check that a rerun has the same arguments and inputs (lad.run.rundir)."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable, Mapping
from functools import cached_property
from pathlib import Path
from typing import Any

from lad.errors import RunError
from lad.io.files import read_json, write_text
from lad.run.lock import in_use, running_holder

RUN_FORMAT = "lad-run/1"
# How records are made from the same arguments; bumped when lad would now make other records, so a
# run begun by an older lad is never extended with records that do not match its own (1: labels
# tokenised glued to the prompt; 2: labels as the chat template writes the reply).
RECORDS_VERSION = 2


# Arguments that name a file or folder: `./data/x.jsonl` and `data/x.jsonl` are the same one.
PATH_ARGUMENTS = ("model", "data", "calibration_data", "calibration", "orders", "chat_template")


def file_digest(path: str | Path, images: Iterable[Path] = ()) -> dict[str, Any]:
    """What run.json keeps of an input file: the SHA-256 of its bytes and, for each image it
    lists, the image's size and modification time (not its bytes, which would mean reading
    every image on every rerun), keyed by the image's path relative to the file's folder."""
    path = Path(path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    stats = {os.path.relpath(image, path.parent): file_stamp(image) for image in images}
    out: dict[str, Any] = {"path": str(path.resolve()), "sha256": digest}
    if stats:
        out["images"] = stats
    return out


def file_stamp(path: Path) -> str:
    """A file's size and modification time, "SIZE MTIME_NS": what run.json keeps of a file too
    large to read on every rerun (an image an items file lists, a checkpoint's weights)."""
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


# A local checkpoint's files read whole on a rerun (configs, tokenizer, chat template): their
# content decides, not when they were written; every other file (weights) by its file_stamp.
HASHED_SUFFIXES = (".json", ".jinja")
HASHED_BELOW = 64 * 2**20  # bytes: a JSON file larger than this is stamped, not read


def folder_digest(path: str | Path) -> dict[str, Any]:
    """What run.json keeps of a local --model folder (lad.run.preflight.model_digest): each file
    the checkpoint loads from (the folder's own, hidden ones aside) by its file_stamp, its
    JSON and Jinja files by "sha256:HEX" (a rewrite with the same bytes is no change)."""
    path = Path(path)
    files = {}
    for file in sorted(p for p in path.iterdir() if p.is_file() and not p.name.startswith(".")):
        if file.suffix in HASHED_SUFFIXES and file.stat().st_size < HASHED_BELOW:
            files[file.name] = "sha256:" + hashlib.sha256(file.read_bytes()).hexdigest()
        else:
            files[file.name] = file_stamp(file)
    return {"path": str(path.resolve()), "files": files}


def read_run_json(path: Path, metrics: Path | None = None) -> dict[str, Any]:
    """run.json, checked; the one place older layouts are read (`metrics`: the run's metrics.json,
    for readers of finished runs): a run.json without "format" (a harness folder before lad marked
    it, whose metrics.json says "harness") reads as one of lad's format."""
    stored = read_json(path, RunError, "run.json")
    if metrics is not None and isinstance(stored, dict) and "format" not in stored:
        stored = {**stored, "format": RUN_FORMAT}
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
        if name in made_from and "sha256" in now_from.get(name, {}):
            continue  # a fingerprinted file: its content decides, not how its path is spelled
        # (a --model folder's name stays compared: the records' fingerprint names the model)
        paths = name in PATH_ARGUMENTS and isinstance(made, str) and isinstance(value, str)
        if made != value and not (paths and os.path.normpath(made) == os.path.normpath(value)):
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
        if "files" in now:  # a local --model folder (folder_digest)
            check_same_folder(run_dir, flag, before.get("files", {}), now)
            continue
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


def check_same_folder(
    run_dir: Path, flag: str, before: Mapping[str, str], now: Mapping[str, Any]
) -> None:
    """Refuse a folder (folder_digest) one of whose files changed, appeared or went since the
    run was made from it, naming the first such file."""
    files = now["files"]
    for name in sorted(before.keys() | files.keys()):
        if before.get(name) != files.get(name):
            how = "is new" if name not in before else "is gone" if name not in files else ""
            if not how:
                what = "bytes" if files[name].startswith("sha256:") else "size or modification time"
                how = f"changed (its {what} differ)"
            raise RunError(
                f"{Path(now['path']) / name} ({flag}) {how} since {run_dir} was made from that "
                "folder, so its records would be stale. Restore the folder as it was, or use "
                "another --out."
            )


def summed_times(
    timing: Mapping[str, float] | None, seconds: Mapping[str, float]
) -> dict[str, float]:
    """`timing` with `seconds` added stage by stage: run.json's "timing" is the sum over every
    session that worked on a stage (a mixed run's, over its parts)."""
    out = dict(timing or {})
    for stage, s in seconds.items():
        out[stage] = round(out.get(stage, 0.0) + s, 3)
    return out


def json_text(obj: Any, indent: int = 2) -> str:
    return json.dumps(obj, indent=indent) + "\n"


class RunJson:
    """run.json of a run directory (RunDir's part): created or checked by `begin`, read once
    (`run_json`), updated beside its arguments by `update` alone."""

    path: Path
    run_file: Path  # run.json, and the run's metrics.json (RunDir's)
    metrics_file: Path

    def file(self, name: str) -> Path:
        return self.path / name

    def _write_run_json(self, run_json: Mapping[str, Any]) -> None:
        write_text(self.run_file, json_text(dict(run_json)))
        self.__dict__.pop("run_json", None)

    def update(self, key: str, change: Any) -> None:
        """run.json with `change(stored[key])` as its `key`, beside "arguments" (a rerun's check
        never compares it): the one way a begun run's run.json is updated ("timing", "threads",
        "attention_layers": lad.run.stages.Clock)."""
        stored = read_run_json(self.run_file)
        stored[key] = change(stored.get(key))
        self._write_run_json(stored)

    def begin(
        self,
        arguments: Mapping[str, Any],
        defaults: Mapping[str, Any],
        inputs: Mapping[str, dict[str, Any]] | None = None,
        *,
        write: bool = True,
    ) -> None:
        """Create run.json holding the record-defining `arguments` and the `inputs`'
        fingerprints, or check that an existing one was made with the same arguments (an older
        run.json lacking one: at its value in `defaults`) from the same inputs. A run.json under
        which no record was made yet (a run that failed at its start) does not bind: it is
        replaced. `write` False: the checks alone, a live `lad eval` here among them (a refusal
        before the first write; the writer holds the lock)."""
        holder = None if write else running_holder(self.path)
        if holder is not None:
            raise in_use(self.path, holder)
        path = self.run_file
        wanted = {"format": RUN_FORMAT, "arguments": json.loads(json.dumps(dict(arguments)))}
        wanted["inputs"] = dict(inputs or {})
        wanted["records_version"] = RECORDS_VERSION
        if path.exists():
            stored = read_run_json(path)
            try:
                check_same(self.path, stored, wanted, json.loads(json.dumps(dict(defaults))))
                return
            except RunError:
                if self.made_records():
                    raise
        if write:
            self._write_run_json(wanted)

    def check_records_version(self) -> None:
        """Refuse to add records to a run whose records an older lad made another way (the two
        would mix in one run); its finished records can still be rescored without the model."""
        made = self.run_json.get("records_version", 1)
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
        if not self.run_file.is_file():
            raise RunError(
                f"{self.path}: not a lad run directory (no run.json); make one with lad eval"
            )

    @cached_property
    def run_json(self) -> dict[str, Any]:
        if not self.run_file.is_file() and self.metrics_file.is_file():
            return {"format": RUN_FORMAT, "arguments": {}}  # lad score's and metrics' output
        self.check_is_run()
        return read_run_json(self.run_file, self.metrics_file)

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
        """A harness audit's folder (lad.harness.audit): made without `lad eval`."""
        return "harness" in self.run_json

    def timing(self) -> dict[str, float]:
        """run.json's "timing" (empty for a run made before lad recorded it)."""
        return dict(self.run_json.get("timing", {}))

    def threads(self) -> Any:
        """run.json's "threads": the CPU threads its records were made with (None on an
        accelerator, or for a run from before lad recorded them)."""
        return self.run_json.get("threads")

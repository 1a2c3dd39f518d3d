"""Faults and hostile surroundings (docs/errors.md): nothing silently wrong, nothing clobbered.

Whole-file writes replace the old file only when complete; a symlink is never written through;
a full disk, a read-only folder or Ctrl-C end in one `Error:` line and lose nothing.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lad.cli import main
from lad.core.records import write_records
from lad.io.files import replacing, write_text
from lad.run.lock import RunLock
from tests.runfiles import comparable
from tests.synthetic import SyntheticModel


@pytest.fixture
def scored(tmp_path) -> Path:
    """A folder with records, calibration records, predictions and metrics.json (no model)."""
    model = SyntheticModel(num_candidates=4, num_layers=6)
    write_records(tmp_path / "records.jsonl", model.eval_records(6, num_shuffles=2))
    write_records(tmp_path / "calibration.jsonl", model.calibration_records(3))
    d = str(tmp_path)
    assert main(["score", "--records", f"{d}/records.jsonl", "--calibration-records",
                 f"{d}/calibration.jsonl", "--method", "vanilla", "--method", "lad",
                 "--save-calibration", f"{d}/calibration.json",
                 "--out", f"{d}/predictions.jsonl"]) == 0  # fmt: skip
    assert main(["metrics", "--records", f"{d}/records.jsonl", "--predictions",
                 f"{d}/predictions.jsonl", "--out", f"{d}/metrics.json"]) == 0  # fmt: skip
    return tmp_path


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("Error: "), err
    return err[0]


# ---------------------------------------------------------------- whole-file writes


def test_report_replaces_a_symlink_at_index_html(scored, tmp_path_factory, capsys):
    victim = tmp_path_factory.mktemp("elsewhere") / "precious.txt"
    victim.write_text("keep me")
    (scored / "report").mkdir()
    (scored / "report" / "index.html").symlink_to(victim)
    (scored / "report" / "recall.png").symlink_to(victim)
    assert main(["report", str(scored)]) == 0
    assert victim.read_text() == "keep me"
    page = scored / "report" / "index.html"
    assert not page.is_symlink() and "lad report" in page.read_text()
    assert not (scored / "report" / "recall.png").is_symlink()


def _fail_midway(monkeypatch, code: int) -> None:
    """Every write of a temporary file stops after a few bytes with OSError(code)."""
    real = Path.write_text

    def partial(self, text, *args, **kwargs):
        if ".tmp" in self.name:
            real(self, text[:5], *args, **kwargs)
            raise OSError(code, os.strerror(code))
        return real(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", partial)


def test_full_disk_during_a_whole_file_write_keeps_the_old_file(scored, monkeypatch, capsys):
    before = (scored / "metrics.json").read_bytes()
    _fail_midway(monkeypatch, errno.ENOSPC)
    d = str(scored)
    code = main(["metrics", "--records", f"{d}/records.jsonl", "--predictions",
                 f"{d}/predictions.jsonl", "--out", f"{d}/metrics.json"])  # fmt: skip
    assert code == 1
    line = one_error_line(capsys)
    assert re.search(r"metrics\.json: No space left on device\. Free some space", line), line
    assert (scored / "metrics.json").read_bytes() == before
    assert not [p for p in scored.iterdir() if ".tmp" in p.name]


def test_replacing_leaves_nothing_behind_on_error(tmp_path):
    target = tmp_path / "a.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError
    assert target.read_text() == "old" and list(tmp_path.iterdir()) == [target]
    write_text(target, "new")
    assert target.read_text() == "new" and list(tmp_path.iterdir()) == [target]


# ---------------------------------------------------------------- runs: lock, changed inputs

N = 3
RUN_FILES = ("calibration.jsonl", "records.jsonl", "perm_records.jsonl", "metrics.json")


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> Path:
    """A folder holding `model/`, `bench/{eval,cal}/` and a finished run `run/`, made with paths
    relative to the folder (as a user in it would type them)."""
    from lad.data.shapes import build_shapes, shapes_vocabulary
    from lad.testing.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("made")
    build_tiny_model("llava", root / "model", words=shapes_vocabulary())
    kw = {"num_candidates": N, "setting": "random", "seed": 1, "image_size": 16}
    build_shapes(root / "bench/eval", items=3, split="eval", **kw)
    build_shapes(root / "bench/cal", items=1, split="calibration", **kw)
    cwd = os.getcwd()
    os.chdir(root)
    try:
        assert main(_eval_args("run")) == 0
    finally:
        os.chdir(cwd)
    return root


def _eval_args(out: str, data: str = "bench/eval/items.jsonl", *extra: str) -> list[str]:
    return ["eval", "--model", "model", "--data", data, "--calibration-data",
            "bench/cal/items.jsonl", "-n", str(N), "--calibration-items", "1", "--num-shuffles",
            "2", "--batch-size", "2", "--device", "cpu", "--quiet", "--out", out,
            *extra]  # fmt: skip


@pytest.fixture
def here(made, tmp_path, monkeypatch) -> Path:
    """A copy of `made` (times kept) as the working folder."""
    shutil.copytree(made, tmp_path / "w", copy_function=shutil.copy2)
    monkeypatch.chdir(tmp_path / "w")
    return tmp_path / "w"


@pytest.fixture
def no_model(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("this rerun must not load the model")

    monkeypatch.setattr("lad.backends.load_backend", refuse)


def test_same_input_spelled_otherwise_resumes(here, no_model, capsys):
    before = {n: comparable(here / "run" / n) for n in RUN_FILES}
    assert main(_eval_args("./run/", "./bench/eval/../eval/items.jsonl")) == 0
    assert {n: comparable(here / "run" / n) for n in RUN_FILES} == before
    stored = json.loads((here / "run/run.json").read_text())
    assert (
        stored["inputs"]["data"]["sha256"]
        == hashlib.sha256((here / "bench/eval/items.jsonl").read_bytes()).hexdigest()
    )


def test_changed_items_file_is_refused(here, no_model, capsys):
    items = here / "bench/eval/items.jsonl"
    lines = items.read_text().splitlines()
    obj = json.loads(lines[1])
    obj["query"] = "a blue star"  # a caption edited after the run
    lines[1] = json.dumps(obj)
    items.write_text("\n".join(lines) + "\n")
    before = (here / "run/metrics.json").read_bytes()
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert re.search(r"bench/eval/items\.jsonl \(--data\) changed since run was made", line), line
    assert (here / "run/metrics.json").read_bytes() == before


def test_changed_image_is_refused(here, no_model, capsys):
    item = json.loads((here / "bench/eval/items.jsonl").read_text().splitlines()[2])
    image = here / "bench/eval" / item["images"][1]
    from PIL import Image

    Image.new("RGB", (16, 16), (0, 0, 0)).save(image)
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert re.search(rf"{re.escape(item['images'][1])}: changed since run was made", line), line


def test_changed_calibration_items_are_refused(here, no_model, capsys):
    cal = here / "bench/cal/items.jsonl"
    cal.write_text(cal.read_text().replace('"answer": ', '"source": "edited", "answer": '))
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert re.search(r"cal/items\.jsonl \(--calibration-data\) changed since run", line), line


def test_changed_model_folder_is_refused(here, no_model, capsys):
    """A local --model folder is an input: its weights by size and modification time, its JSON
    files by their bytes; a run.json from before lad stamped it resumes as it did."""
    weights = here / "model/model.safetensors"
    stored = json.loads((here / "run/run.json").read_text())
    assert set(stored["inputs"]["model"]["files"]) == {p.name for p in (here / "model").iterdir()}
    config = here / "model/config.json"
    config.write_bytes(config.read_bytes())  # rewritten, the same bytes: no change
    assert main(_eval_args("run")) == 0
    capsys.readouterr()
    weights.write_bytes(weights.read_bytes()[:-1] + b" ")  # new weights, in the same folder
    before = (here / "run/metrics.json").read_bytes()
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert re.search(r"model/model\.safetensors \(--model\) changed .* since run was made", line)
    assert "another --out" in line, line
    assert (here / "run/metrics.json").read_bytes() == before
    del stored["inputs"]["model"]  # as lad wrote it before it stamped the model folder
    (here / "run/run.json").write_text(json.dumps(stored, indent=2) + "\n")
    assert main(_eval_args("run")) == 0


def test_changed_calibration_file_is_refused(here, no_model, capsys):
    # The stored records suit a run that loads --calibration (records do not depend on it).
    fresh = here / "with-cal"
    fresh.mkdir()
    for name in ("records.jsonl", "perm_records.jsonl", "blank_records.jsonl"):
        shutil.copy2(here / "run" / name, fresh / name)
    cal = here / "cal.json"
    shutil.copy2(here / "run/calibration.json", cal)
    argv = ["eval", "--model", "model", "--data", "bench/eval/items.jsonl", "--calibration",
            "cal.json", "-n", str(N), "--num-shuffles", "2", "--batch-size", "2", "--device",
            "cpu", "--quiet", "--out", "with-cal"]  # fmt: skip
    assert main(argv) == 0
    obj = json.loads(cal.read_text())
    obj["num_items"] = 99
    cal.write_text(json.dumps(obj))
    assert main(argv) == 1
    line = one_error_line(capsys)
    assert re.search(r"cal\.json \(--calibration\) changed since with-cal was made", line), line


def _made_by_older_lad(run: Path) -> None:
    """run.json as lad wrote it before label tokens came from the chat template (no version)."""
    stored = json.loads((run / "run.json").read_text())
    del stored["records_version"]
    (run / "run.json").write_text(json.dumps(stored, indent=2) + "\n")


def test_an_older_lads_run_is_rescored_not_extended(here, no_model, capsys):
    _made_by_older_lad(here / "run")
    assert main(_eval_args("run", "bench/eval/items.jsonl", "--top-k", "1")) == 0  # rescoring
    lines = (here / "run/records.jsonl").read_bytes().splitlines(keepends=True)
    (here / "run/records.jsonl").write_bytes(b"".join(lines[:2]))  # an unfinished stage
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert "records made by an older lad (records version 1" in line, line
    assert "can be rescored, not extended" in line, line
    assert len((here / "run/records.jsonl").read_bytes().splitlines()) == 2


def test_a_run_json_of_this_lad_names_its_records_version(here):
    from lad.run.rundir import RECORDS_VERSION

    stored = json.loads((here / "run/run.json").read_text())
    assert stored["records_version"] == RECORDS_VERSION == 2


def test_rerun_rewrites_damaged_metrics_and_calibration(here, made, no_model, capsys):
    """lad eval recomputes both from the stored records: a damaged copy is replaced, not read."""
    (here / "run/metrics.json").write_bytes(b"\xff{ half")
    (here / "run/calibration.json").write_text('{"format": "lad-calibration/1"}')
    assert main(_eval_args("run")) == 0
    for name in ("metrics.json", "calibration.json"):
        assert comparable(here / "run" / name) == comparable(made / "run" / name), name


def test_a_second_eval_on_a_locked_run_says_who_holds_it(here, no_model, capsys):
    before = {n: (here / "run" / n).read_bytes() for n in RUN_FILES}
    with RunLock(here / "run"):
        assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    who = f"pid {os.getpid()} on host {socket.gethostname()}"
    assert re.search(rf"run is in use by another lad eval \({who}, since .*\); wait", line), line
    assert {n: (here / "run" / n).read_bytes() for n in RUN_FILES} == before
    assert not (here / "run/run.lock").exists()


def test_a_stale_lock_of_a_dead_process_is_taken_over(here, no_model, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    left = {"pid": dead.pid, "host": socket.gethostname(), "since": "earlier"}
    (here / "run/run.lock").write_text(json.dumps(left))
    assert main(_eval_args("run")) == 0
    err = capsys.readouterr().err
    assert f"taking over the lock left by pid {dead.pid} on host" in err
    assert not (here / "run/run.lock").exists()


def test_two_evals_at_once_one_refused_the_other_intact(made, tmp_path, monkeypatch, capsys):
    """The issue's case: two `lad eval` on one run directory. The second is refused while the
    first runs, and the first finishes with the same files as an undisturbed run."""
    monkeypatch.chdir(made)
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    first = subprocess.Popen(
        [sys.executable, "-m", "lad", *_eval_args(str(out))], env=env, stderr=subprocess.PIPE
    )
    deadline = time.time() + 120
    while not (out / "run.lock").exists() and first.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    code = main(_eval_args(str(out)))
    _, err = first.communicate(timeout=300)
    assert first.returncode == 0, err.decode()[-2000:]
    if code == 0:
        pytest.skip("the first run finished before the second started (a very fast machine)")
    assert code == 1
    assert f"in use by another lad eval (pid {first.pid} on host" in one_error_line(capsys)
    for name in RUN_FILES:
        assert comparable(out / name) == comparable(made / "run" / name), name


# ---------------------------------------------------------------- full disk, read-only, Ctrl-C


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_full_disk_while_making_records_then_resume(here, made, capsys):
    """Records go to /dev/full (every write fails with ENOSPC, as on a full disk): one Error line
    naming the file; after space is freed the rerun gives the undisturbed run's files."""
    perm = here / "run/perm_records.jsonl"
    perm.unlink()
    perm.symlink_to("/dev/full")
    assert main(_eval_args("run")) == 1
    line = one_error_line(capsys)
    assert re.search(r"perm_records\.jsonl: No space left on device\. Free some space", line), line
    perm.unlink()
    assert main(_eval_args("run")) == 0
    for name in RUN_FILES:
        assert comparable(here / "run" / name) == comparable(made / "run" / name), name


@pytest.fixture
def read_only(tmp_path) -> Path:
    """A folder nobody may write in: chmod 555, or, for root (whom chmod does not stop), a
    read-only tmpfs mounted there; skipped where neither works."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    mounted = False
    if os.access(folder, os.W_OK):  # root
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
            capture_output=True,
        )
        if done.returncode != 0:
            folder.chmod(0o755)
            pytest.skip("running as root and cannot mount a read-only tmpfs")
        mounted = True
    yield folder
    if mounted:
        subprocess.run(["umount", str(folder)], check=True)
    folder.chmod(0o755)


def test_read_only_output_folder(read_only, scored, made, capsys):
    d = str(scored)
    argv = ["score", "--records", f"{d}/records.jsonl", "--calibration-records",
            f"{d}/calibration.jsonl", "--method", "lad"]  # fmt: skip
    assert main([*argv, "--out", str(read_only / "p.jsonl")]) == 1
    assert re.search(
        r"--out .*ro/p\.jsonl: cannot write in .*ro \(read-only", one_error_line(capsys)
    )
    assert main([*argv, "--out", str(read_only / "sub/p.jsonl")]) == 1
    assert "cannot write in" in one_error_line(capsys)
    os.chdir(made)
    try:
        assert main(_eval_args(str(read_only / "run"))) == 1
    finally:
        os.chdir(Path(d))
    assert re.search(r"--out .*ro/run: cannot write in .*ro \(read-only", one_error_line(capsys))


def test_read_only_file_system_mid_write_is_one_error_line(scored, monkeypatch, capsys):
    _fail_midway(monkeypatch, errno.EROFS)
    d = str(scored)
    code = main(["metrics", "--records", f"{d}/records.jsonl", "--predictions",
                 f"{d}/predictions.jsonl", "--out", f"{d}/metrics.json"])  # fmt: skip
    assert code == 1
    assert re.search(
        r"metrics\.json: Read-only file system\. Choose a folder", one_error_line(capsys)
    )


def test_ctrl_c_while_lad_starts_is_one_line(monkeypatch, capsys):
    import lad.cli

    def interrupted(name):
        raise KeyboardInterrupt  # as if Ctrl-C came while a command module imports numpy

    monkeypatch.setattr(lad.cli.importlib, "import_module", interrupted)
    assert main(["eval"]) == 130
    assert capsys.readouterr().err == "Interrupted; what was written so far is kept.\n"


# Runs `python ARGS` with SIGINT's default action, as from a terminal, even where pytest runs as
# a background job: SIGINT ignored there is inherited through exec, Python then leaves it ignored
# and so does lad (docs/errors.md), and the signal would never arrive. exec, not preexec_fn,
# which is unsafe in a process with threads (pytest-xdist's).
_WITH_DEFAULT_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.parametrize("after", ["lad.errors", "numpy", "torch", "transformers"])
def test_ctrl_c_at_start_up_never_prints_a_traceback(made, tmp_path, after):
    """SIGINT to a real `python -m lad eval` right after it imported `after` (lad's own modules,
    numpy, torch, transformers), found from `-X importtime`'s lines rather than by a sleep, so the
    moment is the same however busy the machine. A SIGINT before Python runs lad's first line is
    Python's own to handle (docs/errors.md), and not sent here."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    lad_eval = ["-X", "importtime", "-m", "lad", *_eval_args(str(tmp_path / "run"))]
    proc = subprocess.Popen(
        [sys.executable, "-c", _WITH_DEFAULT_SIGINT, *lad_eval],
        cwd=made,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    seen = []
    for raw in proc.stderr:
        seen.append(raw.decode())
        if seen[-1].startswith("import time:") and seen[-1].split("|")[-1].strip() == after:
            break
    else:
        pytest.fail(f"lad eval never imported {after}: {''.join(seen)}")
    proc.send_signal(signal.SIGINT)
    seen += proc.stderr.read().decode().splitlines(keepends=True)
    proc.wait(timeout=120)
    text = "".join(line for line in seen if not line.startswith("import time:"))
    assert "Traceback" not in text, text
    assert proc.returncode == 130, (proc.returncode, text)
    assert text.strip().splitlines() == ["Interrupted; what was written so far is kept."], text


# Ctrl-C while a dataclass's methods are built (a string exec) during `lad eval`'s imports: a
# meta-path finder raises the KeyboardInterrupt inside a string exec, where CPython's flag for an
# unhandled Ctrl-C is set even though lad catches it.
_INTERRUPT_IN_STRING_EXEC = """
import sys

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == "lad.cli.run":
            exec("raise KeyboardInterrupt")

sys.meta_path.insert(0, Interrupt())
"""


def test_ctrl_c_inside_a_string_exec_still_exits_130(made, tmp_path):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(_INTERRUPT_IN_STRING_EXEC)
    path = os.pathsep.join([str(tmp_path / "site"), *sys.path])
    proc = subprocess.run(
        [sys.executable, "-m", "lad", *_eval_args(str(tmp_path / "run"))],
        cwd=made,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.stderr == "Interrupted; what was written so far is kept.\n"
    assert proc.returncode == 130  # not -2: ended by SIGINT although lad exited with 130

"""`accelerate launch` over 2 CPU processes (gloo) gives the same run directory as one process,
and a run killed midway resumes per shard."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from lad.data.shapes import build_shapes, shapes_vocabulary
from lad.errors import RunError
from lad.evaluate import evaluate
from lad.run.config import eval_config
from lad.testing.tiny import build_tiny_model
from tests.runfiles import comparable

pytest.importorskip("accelerate")

COMPARED = (
    "calibration.jsonl",
    "calibration.json",
    "records.jsonl",
    "perm_records.jsonl",
    "predictions.jsonl",
    "metrics.json",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dist")
    model = build_tiny_model("llava", root / "tiny", words=shapes_vocabulary())
    kw = {"num_candidates": 3, "seed": 2, "image_size": 32}
    data = build_shapes(root / "eval", items=16, split="eval", **kw)
    cal = build_shapes(root / "cal", items=2, split="calibration", **kw)
    args = {
        "model": str(model), "data": str(data), "calibration_data": str(cal),
        "num_candidates": 3, "calibration_items": 2, "num_shuffles": 3, "batch_size": 2,
        "device": "cpu", "quiet": True,
    }  # fmt: skip
    single = root / "single"
    evaluate(eval_config(**args), single)
    return args, single


def _launch(args: dict, out: Path) -> subprocess.Popen:
    cmd = [
        sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "--main_process_port", str(_free_port()), "-m", "lad", "eval",
        "--model", args["model"], "--data", args["data"],
        "--calibration-data", args["calibration_data"], "-n", "3", "--calibration-items", "2",
        "--num-shuffles", "3", "--batch-size", "2", "--device", "cpu", "--quiet", "--out", str(out),
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )


def _same_files(a: Path, b: Path) -> None:
    for name in COMPARED:
        assert comparable(a / name) == comparable(b / name), name
    assert not list(a.glob("*.shard*")), "shards must be merged and removed"


def test_two_processes_give_the_single_process_run(setup, tmp_path):
    args, single = setup
    proc = _launch(args, tmp_path / "run")
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out.decode()[-3000:]
    _same_files(tmp_path / "run", single)


def _lines(path: Path) -> int:
    """Whole lines in `path`, 0 where it is gone."""
    try:
        return path.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def test_killed_run_resumes_per_shard(setup, tmp_path):
    args, single = setup
    run = tmp_path / "run"
    proc = _launch(args, run)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        # Kill at the first record of a stage's shards: the rest of the run must take far longer
        # than the kill (a single-threaded tiny model finishes 16 items in well under a second
        # otherwise). A stage's shards vanish once merged, between the glob and the read.
        if any(_lines(p) >= 1 for p in run.glob("*.shard*of2.jsonl")):
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run finished before it could be killed"
    # The launcher's workers may run in sessions of their own: kill the whole tree at once.
    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for p in tree:
        p.send_signal(signal.SIGKILL)
    proc.wait()
    psutil.wait_procs(tree, timeout=60)  # the run lock is free once its holder is gone
    assert not (run / "metrics.json").exists()

    # Another number of processes over the partial run is refused, never mixed.
    with pytest.raises(RunError, match="another number of processes"):
        evaluate(eval_config(**args), run)

    proc = _launch(args, run)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out.decode()[-3000:]
    _same_files(run, single)

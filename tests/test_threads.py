"""torch's CPU thread count (lad.backends.threads; docs/backends.md, "CPU threads"): chosen from
the cores free now, recorded in run.json and kept by a resumed run (issue 34)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lad.backends import threads
from lad.backends.threads import (
    BY_ENV,
    BY_LOAD,
    BY_NOTHING,
    BY_RESUME,
    BY_SAMPLE,
    THREADS_PER_CPU,
    CpuTimes,
    available_cpus,
    busy_between,
    choose_threads,
    describe_threads,
    measure_busy,
    plan_threads,
    read_cpu_times,
    record_choice,
    requested_threads,
    resumed_threads,
)
from lad.cli import main
from lad.errors import LadError, RunError

# ---------------------------------------------------------------- LAD_NUM_THREADS


@pytest.mark.parametrize(
    "text",
    ["²", "٣", "３", "1²", "0", "-1", "+2", "2.0", "1e3", "4097", "9" * 30, "2 2"],
)
def test_bad_lad_num_threads_is_one_line_naming_it(text):
    with pytest.raises(LadError) as caught:
        requested_threads({"LAD_NUM_THREADS": text})
    message = str(caught.value)
    assert message == (
        "LAD_NUM_THREADS must be a whole number >= 1 (ASCII digits 0-9, at most 4096). "
        f"Got {text!r}."
    )
    assert "\n" not in message


def test_lad_num_threads_values():
    assert requested_threads({}) is None
    assert requested_threads({"LAD_NUM_THREADS": " "}) is None  # empty: unset
    assert requested_threads({"LAD_NUM_THREADS": " 3 "}) == 3
    bound = THREADS_PER_CPU * available_cpus()  # a few threads per CPU, never thousands
    assert requested_threads({"LAD_NUM_THREADS": str(bound)}) == bound
    with pytest.raises(LadError, match=rf"LAD_NUM_THREADS={bound + 1} is more than"):
        requested_threads({"LAD_NUM_THREADS": str(bound + 1)})
    assert requested_threads({"LAD_NUM_THREADS": "007"}) == 7


def test_bad_lad_num_threads_refused_before_the_weights_load(monkeypatch):
    import transformers

    from lad.backends import load_backend

    def loading(*a, **k):
        raise AssertionError("weights loaded before LAD_NUM_THREADS was checked")

    monkeypatch.setattr(transformers.AutoModelForImageTextToText, "from_pretrained", loading)
    monkeypatch.setenv("LAD_NUM_THREADS", "٣")
    with pytest.raises(LadError, match=r"LAD_NUM_THREADS must be a whole number >= 1"):
        load_backend("demo", device="cpu")


def test_bad_lad_num_threads_is_lad_eval_s_one_error_line(run_inputs, monkeypatch, capsys):
    def loading(*a, **k):
        raise AssertionError("model work before LAD_NUM_THREADS was checked")

    monkeypatch.setattr("lad.backends.load_backend", loading)
    monkeypatch.setenv("LAD_NUM_THREADS", "²")
    out = run_inputs / "run"
    assert main(_eval_args(run_inputs, out)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "Error: LAD_NUM_THREADS must be a whole number >= 1 (ASCII digits 0-9, at most 4096). "
        "Got '²'."
    ]
    assert not out.exists()


# ---------------------------------------------------------------- measuring the busy CPUs


def _times(own: int, **cpus: tuple[int, int]) -> CpuTimes:
    return CpuTimes({int(k[3:]): v for k, v in cpus.items()}, own)


def test_busy_cpus_between_two_readings():
    before = _times(0, cpu0=(100, 1000), cpu1=(100, 1000), cpu2=(0, 0))
    # cpu0 all busy, cpu1 idle but 5 of 25 ticks; cpu2 outside this process's CPUs
    after = _times(0, cpu0=(100, 1025), cpu1=(120, 1025), cpu2=(0, 25))
    assert busy_between(before, after, {0, 1}) == pytest.approx(1.0 + 5 / 25)
    # this process used 15 ticks of the 25: those are not other work's
    mine = _times(15, cpu0=(100, 1025), cpu1=(120, 1025), cpu2=(0, 25))
    assert busy_between(before, mine, {0, 1}) == pytest.approx(1.2 - 15 / 25)
    # never below 0 nor above the CPUs sampled
    assert busy_between(before, _times(99, cpu0=(125, 1025), cpu1=(125, 1025)), {0, 1}) == 0.0
    assert busy_between(before, before, {0, 1}) == 0.0  # no tick passed: nothing to say


def test_reading_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(
        "cpu  10 0 10 100 5 0 0 0 0 0\n"
        "cpu0 1 2 3 40 5 6 7 8 9 10\n"  # user nice system idle iowait irq softirq steal guest..
        "cpu1 0 0 0 50 0 0 0 0\n"
        "intr 123 4 5\n"
        "\n"
        "cpus_allowed 9 9 9 9\n"
    )
    own = tmp_path / "self_stat"
    # a command name with spaces and ")" in it; utime 70, stime 8 (fields 14 and 15)
    own.write_text("4242 (a (b) c) S 1 2 3 4 5 6 7 8 9 10 70 8 0 0 20 0 1 0\n")
    got = read_cpu_times(str(stat), str(own))
    assert got == CpuTimes({0: (45, 72), 1: (50, 50)}, 78)  # idle+iowait; steal counts as busy
    assert read_cpu_times(str(tmp_path / "missing"), str(own)) is None
    own.write_text("4242 (x) S 1\n")
    assert read_cpu_times(str(stat), str(own)) is None


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat here")
def test_the_real_readings_cover_this_process_s_cpus():
    first = read_cpu_times()
    assert set(os.sched_getaffinity(0)) <= set(first.cpus)
    assert all(0 <= idle <= total for idle, total in first.cpus.values())


def test_measure_samples_then_falls_back(monkeypatch):
    readings = iter([_times(0, cpu0=(0, 0), cpu1=(0, 0)), _times(0, cpu0=(0, 25), cpu1=(25, 25))])
    slept = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    busy = measure_busy(0.3, read=lambda: next(readings), sleep=slept.append)
    assert busy == (1.0, BY_SAMPLE) and slept == [0.3]
    monkeypatch.setattr(os, "getloadavg", lambda: (1.7, 1.0, 0.5), raising=False)
    assert measure_busy(read=lambda: None, sleep=slept.append) == (1.7, BY_LOAD)
    assert slept == [0.3]  # nothing to sample: no wait
    monkeypatch.delattr(os, "getloadavg", raising=False)
    assert measure_busy(read=lambda: None) == (0.0, BY_NOTHING)


@pytest.mark.skipif(read_cpu_times() is None, reason="no /proc/stat here")
def test_busy_loops_on_every_cpu_leave_one_thread():
    """Real contention, as issue 27 measured it: a Python loop on every CPU this process may use
    (children inherit its affinity). Other jobs on the machine can only add to what is busy."""
    cpus = len(os.sched_getaffinity(0))
    loop = "print(flush=True)\nwhile True: pass"
    loops = [
        subprocess.Popen([sys.executable, "-c", loop], stdout=subprocess.PIPE) for _ in range(cpus)
    ]
    try:
        for p in loops:
            p.stdout.readline()  # running
        busy, how = measure_busy()
    finally:
        for p in loops:
            p.kill()
            p.wait()
            p.stdout.close()
    assert how == BY_SAMPLE
    assert busy >= cpus - 0.5, busy
    assert plan_threads({}, cpus, lambda: (busy, how)) == (1, BY_SAMPLE, busy)


# ---------------------------------------------------------------- the choice


def test_a_run_right_after_another_sees_the_cores_free_now(monkeypatch):
    """Issue 34's case: the 1-minute load average still says 2.01 (a job just ended), so the old
    rule took one thread of two; the sample finds both cores idle now."""
    assert choose_threads({}, cpus=2, busy=2.01) == 1  # what the load average would give
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    readings = iter([_times(0, cpu0=(0, 0), cpu1=(0, 0)), _times(1, cpu0=(24, 25), cpu1=(25, 25))])
    measure = lambda: measure_busy(read=lambda: next(readings), sleep=lambda s: None)  # noqa: E731
    assert plan_threads({}, 2, measure) == (2, BY_SAMPLE, pytest.approx(0.0, abs=1e-12))


def test_what_decides_the_count():
    def measure():
        raise AssertionError("measured although the count was given")

    env = {"LAD_NUM_THREADS": "3", "OMP_NUM_THREADS": "1"}
    assert plan_threads(env, 2, measure, resumed=1) == (3, BY_ENV, None)  # the override wins
    assert plan_threads({"OMP_NUM_THREADS": "1"}, 2, measure, resumed=2) == (2, BY_RESUME, None)
    assert plan_threads({"OMP_NUM_THREADS": "1"}, 8, measure) == (None, "OMP_NUM_THREADS", None)
    assert plan_threads({}, 4, lambda: (1.5, BY_LOAD)) == (3, BY_LOAD, 1.5)  # 1.5 rounds down


def test_what_run_json_keeps_of_each_session():
    fresh = threads.ThreadChoice(2, BY_SAMPLE, 0.04)
    first = {"count": 2, "chosen_by": BY_SAMPLE, "busy_cpus": 0.04}
    assert record_choice(None, fresh) == first
    assert record_choice(first, threads.ThreadChoice(2, BY_RESUME)) == first  # as if unbroken
    one = threads.ThreadChoice(1, BY_ENV)
    later = record_choice(first, one)
    assert later == {**first, "then": [{"count": 1, "chosen_by": BY_ENV}]}
    assert record_choice(later, one)["then"] == [{"count": 1, "chosen_by": BY_ENV}] * 2


def test_the_first_session_s_count_is_the_one_kept():
    where = Path("run/run.json")
    assert resumed_threads(None, where) is None
    assert resumed_threads({"count": 2, "chosen_by": BY_SAMPLE, "then": [{"count": 1}]}, where) == 2
    for damaged in ([{"count": 2}], {"count": "2"}, {"count": True}, 7, {"count": 0}, {}):
        with pytest.raises(RunError, match=r"^run/run\.json: damaged \('threads' must be"):
            resumed_threads(damaged, where)


def test_threads_in_words():
    recorded = {
        "count": 2,
        "chosen_by": BY_SAMPLE,
        "busy_cpus": 0.04,
        "then": [{"count": 1, "chosen_by": BY_ENV}, {"count": 3, "chosen_by": BY_ENV}],
    }
    assert describe_threads(recorded) == (
        "2 CPU threads (measured free cores: 0.04 CPUs busy), then 1 CPU thread "
        "(LAD_NUM_THREADS), then 3 CPU threads (LAD_NUM_THREADS)"
    )
    assert describe_threads({"count": 1, "chosen_by": BY_RESUME}) == "1 CPU thread (resumed run)"
    assert describe_threads(None) == "" and describe_threads([]) == ""


def test_loading_on_cpu_says_how_it_chose(monkeypatch):
    import torch

    from lad.backends import load_backend

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LAD_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 3)
    monkeypatch.setattr(threads, "measure_busy", lambda: (1.0, BY_SAMPLE))
    try:
        backend = load_backend("demo", device="cpu")
        assert backend.threads == threads.ThreadChoice(2, BY_SAMPLE, 1.0)
        assert torch.get_num_threads() == 2
        assert load_backend("demo", device="cpu", threads=1).threads.chosen_by == BY_RESUME
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------- run.json and resume

N = 3


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    from lad.data.shapes import build_shapes, shapes_vocabulary
    from lad.testing.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("threads")
    build_tiny_model("llava", root / "model", words=shapes_vocabulary())
    kw = {"num_candidates": N, "setting": "random", "seed": 1, "image_size": 16}
    build_shapes(root / "eval", items=3, split="eval", **kw)
    build_shapes(root / "cal", items=1, split="calibration", **kw)
    return root


@pytest.fixture
def run_inputs(inputs, tmp_path) -> Path:
    (tmp_path / "in").symlink_to(inputs)
    return tmp_path


def _eval_args(root: Path, out: Path) -> list[str]:
    return ["eval", "--model", f"{root}/in/model", "--data", f"{root}/in/eval/items.jsonl",
            "--calibration-data", f"{root}/in/cal/items.jsonl", "-n", str(N),
            "--calibration-items", "1", "--num-shuffles", "2", "--batch-size", "2",
            "--device", "cpu", "--quiet", "--out", str(out)]  # fmt: skip


def _machine(monkeypatch):
    """A 3-CPU machine whose busy CPUs the caller sets (`busy(cpus)`); torch's count restored."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LAD_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "available_cpus", lambda: 3)

    def busy(cpus: float) -> None:
        monkeypatch.setattr(threads, "measure_busy", lambda: (cpus, BY_SAMPLE))

    yield busy
    torch.set_num_threads(before)


machine = pytest.fixture(_machine)


@pytest.fixture(scope="module")
def one_busy(inputs, tmp_path_factory) -> Path:
    """A folder like `run_inputs` holding a finished run, `run/`, made as the tests below make
    their first (3 CPUs, one busy: 2 threads), for those that only resume one: each resumes its
    own copy (`copy_of`) with this folder's inputs (a run resumes on the paths it was made with),
    never this run."""
    root = tmp_path_factory.mktemp("one_busy")
    (root / "in").symlink_to(inputs)
    with pytest.MonkeyPatch.context() as monkeypatch:
        made = _machine(monkeypatch)
        next(made)(1.0)
        assert main(_eval_args(root, root / "run")) == 0
        next(made, None)  # torch's thread count restored
    return root


def copy_of(root: Path, folder: Path) -> Path:
    """`root`'s run copied to `folder`/run."""
    import shutil

    return Path(shutil.copytree(root / "run", folder / "run", symlinks=True))


def _threads(run: Path) -> dict:
    """run.json's "threads", each entry's machine checked to be this one and left out."""
    from lad.backends.threads import this_machine

    threads = json.loads((run / "run.json").read_text())["threads"]
    for entry in [threads, *threads.get("then", [])]:
        assert entry.pop("machine", this_machine()) == this_machine()
    return threads


def _wall_line(capsys) -> str:
    return next(x for x in capsys.readouterr().out.splitlines() if x.startswith("wall time:"))


def _cut(path: Path, lines: int) -> None:
    path.write_bytes(b"".join(path.read_bytes().splitlines(keepends=True)[:lines]))


def test_run_json_records_threads_and_a_resume_keeps_them(run_inputs, machine, monkeypatch, capsys):
    import torch

    from tests.runfiles import comparable

    run = run_inputs / "run"
    machine(1.0)  # 3 CPUs, one busy: 2 threads
    assert main(_eval_args(run_inputs, run)) == 0
    first = {"count": 2, "chosen_by": BY_SAMPLE, "busy_cpus": 1.0}
    assert _threads(run) == first
    said = " s; 2 CPU threads (measured free cores: 1.00 CPUs busy)"
    assert _wall_line(capsys).endswith(said)
    whole = {name: comparable(run / name) for name in ("run.json", "records.jsonl")}

    _cut(run / "records.jsonl", 1)
    machine(3.0)  # now every CPU is busy: a fresh choice would be 1 thread
    assert main(_eval_args(run_inputs, run)) == 0
    assert torch.get_num_threads() == 2
    # run.json (less its wall times) and the records as if the run had never stopped
    assert {name: comparable(run / name) for name in whole} == whole
    assert _wall_line(capsys).endswith(said)

    _cut(run / "records.jsonl", 1)
    monkeypatch.setenv("LAD_NUM_THREADS", "1")  # the override wins over the recorded count
    assert main(_eval_args(run_inputs, run)) == 0
    assert torch.get_num_threads() == 1
    overridden = {**first, "then": [{"count": 1, "chosen_by": BY_ENV}]}
    assert _threads(run) == overridden
    monkeypatch.delenv("LAD_NUM_THREADS")

    _cut(run / "records.jsonl", 1)
    assert main(_eval_args(run_inputs, run)) == 0  # back to the first count, said once
    assert torch.get_num_threads() == 2
    assert _threads(run) == overridden
    assert main(_eval_args(run_inputs, run)) == 0  # only rescores: the model does not load
    assert _threads(run) == overridden
    assert _wall_line(capsys).endswith(f"{said}, then 1 CPU thread (LAD_NUM_THREADS)")


def test_a_session_that_made_no_record_does_not_bind(run_inputs, machine, capsys):
    run = run_inputs / "run"
    machine(2.0)
    assert main(_eval_args(run_inputs, run)) == 0
    assert _threads(run) == {"count": 1, "chosen_by": BY_SAMPLE, "busy_cpus": 2.0}
    for made in run.glob("*.jsonl"):
        made.unlink()  # as if that session had stopped before its first record
    machine(0.0)
    assert main(_eval_args(run_inputs, run)) == 0
    assert _threads(run) == {"count": 3, "chosen_by": BY_SAMPLE, "busy_cpus": 0.0}


def test_a_run_from_before_lad_recorded_threads_resumes(tmp_path, machine, one_busy):
    run = copy_of(one_busy, tmp_path)
    machine(1.0)
    whole = (run / "records.jsonl").read_bytes()
    stored = json.loads((run / "run.json").read_text())
    del stored["threads"]
    (run / "run.json").write_text(json.dumps(stored, indent=2) + "\n")
    _cut(run / "records.jsonl", 1)
    assert main(_eval_args(one_busy, run)) == 0
    assert (run / "records.jsonl").read_bytes() == whole
    assert _threads(run) == {"count": 2, "chosen_by": BY_SAMPLE, "busy_cpus": 1.0}


def test_a_damaged_thread_record_is_one_error_line(tmp_path, machine, one_busy, capsys):
    run = copy_of(one_busy, tmp_path)
    machine(1.0)
    stored = json.loads((run / "run.json").read_text())
    stored["threads"] = {"count": "two"}
    (run / "run.json").write_text(json.dumps(stored, indent=2) + "\n")
    _cut(run / "records.jsonl", 1)
    capsys.readouterr()
    assert main(_eval_args(one_busy, run)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"Error: {run}/run.json: damaged ('threads'"), err


def test_the_benchmark_sets_lad_s_choice_against_the_best_fixed_count():
    import importlib.util

    root = Path(__file__).resolve().parents[1]
    spec = importlib.util.spec_from_file_location(
        "bench_threads", root / "benchmarks/bench_threads.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [
        {"case": "busy", "setting": "1", "threads": 1, "seconds": 2.0},
        {"case": "busy", "setting": "2", "threads": 2, "seconds": 8.0},
        {"case": "busy", "setting": "auto", "threads": 1, "seconds": 2.1},
        {"case": "idle", "setting": "1", "threads": 1, "seconds": 3.0},
        {"case": "idle", "setting": "2", "threads": 2, "seconds": 2.0},
        {"case": "idle", "setting": "auto", "threads": 2, "seconds": 2.5},
    ]
    bench.versus_best_fixed(rows)
    assert (rows[2]["vs_best_fixed"], rows[2]["best_fixed_threads"]) == (1.05, 1)
    assert (rows[5]["vs_best_fixed"], rows[5]["best_fixed_threads"]) == (1.25, 2)
    assert "vs_best_fixed" not in rows[0]


def test_a_resume_on_another_machine_is_recorded_and_said(tmp_path, machine, one_busy, capsys):
    from lad.backends.threads import this_machine

    run = copy_of(one_busy, tmp_path)
    machine(1.0)
    stored = json.loads((run / "run.json").read_text())
    elsewhere = {"cpu": "Another CPU", "kernels": "AVX512", "torch": "2.0"}
    stored["threads"]["machine"] = elsewhere
    (run / "run.json").write_text(json.dumps(stored, indent=2) + "\n")
    _cut(run / "records.jsonl", 1)
    capsys.readouterr()
    assert main(_eval_args(one_busy, run)) == 0
    threads = json.loads((run / "run.json").read_text())["threads"]
    assert threads["machine"] == elsewhere and threads["count"] == 2
    assert threads["then"] == [{"count": 2, "chosen_by": BY_RESUME, "machine": this_machine()}]
    cpu, kernels = this_machine()["cpu"], this_machine()["kernels"]
    assert _wall_line(capsys).endswith(
        f", then 2 CPU threads (resumed run) on another machine ({cpu}, {kernels})"
    )

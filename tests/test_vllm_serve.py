"""`lad serve` under concurrent load on loopback (docs/backends.md, "Serving").

One server (lad's demo model, vLLM's async engine in processes of its own, --max-queue 8) on
127.0.0.1: bad input is a 4xx with one line; 8 clients × 6 requests each at once all get
answers equal to `lad predict --json`'s for the same query (made in lad's own environment with
the HF backend: the same choices, probabilities within 1e-4), none lost, the server's memory
after the load within 300 MiB of before it; a burst of 32 at once past the queue's bound gets
503s and the rest correct answers. Every request loop is bounded in count and time.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.vllm_fixtures import ROOT, engine_env, needs_hf, needs_vllm, picture_items

pytestmark = [needs_vllm, needs_hf]
CLIENTS, EACH, BURST, QUEUE = 8, 6, 32, 8
TOL = 1e-4


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _post(url: str, body: Any, timeout: float = 300) -> tuple[int, dict[str, Any]]:
    import httpx

    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(url, content=content, timeout=timeout)
    return answer.status_code, answer.json()


def _rss(pid: int) -> int:
    """Resident memory of the server and its engine's processes, bytes."""
    import psutil

    root = psutil.Process(pid)
    return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """(base URL, server pid, queries, lad predict's answers), the server running."""
    folder = tmp_path_factory.mktemp("serve")
    items = picture_items(folder, counts=(4, 4, 4, 4, 4))
    hf = dict(os.environ, PYTHONPATH=str(ROOT))
    python = os.environ["LAD_HF_PYTHON"]
    lines = [json.loads(line) for line in items.read_text().splitlines()]
    (folder / "cal.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:2]))
    calibration = folder / "cal.json"
    lad = [python, "-m", "lad"]
    done = subprocess.run(
        [*lad, "calibrate", "--data", str(folder / "cal.jsonl"), "--out", str(calibration), "-q"],
        env=hf,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    queries = [[str(folder / p) for p in x["images"]] for x in lines[2:]]
    expected = []
    for images in queries:
        done = subprocess.run(
            [*lad, "predict", "--calibration", str(calibration), "--query", "a red circle",
             "--json", *images],
            env=hf, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        expected.append(json.loads(done.stdout))
    port = _port()
    command = [sys.executable, "-m", "lad", "serve", "--calibration", str(calibration)]
    command += ["--port", str(port), "--max-queue", str(QUEUE), "--image-root", str(folder)]
    log = (folder / "server.log").open("w")
    proc = subprocess.Popen(command, env=engine_env(), stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    import httpx

    while True:
        assert proc.poll() is None, (folder / "server.log").read_text()[-3000:]
        assert time.monotonic() < deadline, "the server did not start in 600 s"
        try:
            if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(2)
    try:
        yield url, proc.pid, queries, expected
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)
        log.close()


def _same(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key in ("vanilla", "lad", "layers", "labels", "query"):
        assert got[key] == want[key], key
    for key in ("prob_before", "prob_after", "posterior"):
        assert max(abs(a - b) for a, b in zip(got[key], want[key], strict=True)) <= TOL, key


@pytest.mark.parametrize(
    ("body", "status", "said"),
    [
        (b"{not json", 400, "not JSON"),
        ({"images": ["a.png", "b.png"]}, 400, "exactly one of 'query'"),
        ({"query": "x", "images": ["a.png"]}, 400, "at least 2"),
        ({"query": "x", "images": ["no-such.png", "b.png"]}, 400, "no-such.png"),
        ({"query": "x", "images": ["/etc/hostname", "b.png"]}, 400, "outside"),
        ({"query": "x", "texts": ["a", "b"], "images": ["c"]}, 400, "exactly one of 'images'"),
        ({"query": "x", "colour": 1}, 400, "unknown field 'colour'"),
    ],
)
def test_bad_input_is_a_4xx_with_one_line(server: Any, body: Any, status: int, said: str) -> None:
    url = server[0]
    code, answer = _post(f"{url}/choose", body)
    assert code == status and said in answer["error"] and "\n" not in answer["error"]


def test_a_query_of_another_n_than_the_calibration_is_refused(server: Any) -> None:
    url, _, queries, _ = server
    code, answer = _post(f"{url}/choose", {"query": "a red circle", "images": queries[0][:3]})
    assert code == 422 and "N = 4" in answer["error"]


def test_concurrent_clients_get_lad_predicts_answers(server: Any) -> None:
    url, pid, queries, expected = server
    asks = [k % len(queries) for k in range(CLIENTS * EACH)]

    def client(c: int) -> list[tuple[int, int, dict[str, Any]]]:
        mine = asks[c::CLIENTS]
        body = lambda k: {"query": "a red circle", "images": queries[k]}  # noqa: E731
        return [(k, *_post(f"{url}/choose", body(k))) for k in mine]

    for k, want in enumerate(expected):  # one at a time first: warm, and the memory before
        code, got = _post(f"{url}/choose", {"query": "a red circle", "images": queries[k]})
        assert code == 200, got
        _same(got, want)
    before = _rss(pid)
    start = time.monotonic()
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = [a for part in pool.map(client, range(CLIENTS)) for a in part]
    seconds = time.monotonic() - start
    after = _rss(pid)
    print(f"\n{len(answers)} answers to {CLIENTS} clients in {seconds:.1f} s; RSS "
          f"{before / 2**20:.0f} -> {after / 2**20:.0f} MiB")  # fmt: skip
    assert len(answers) == CLIENTS * EACH
    for k, code, got in answers:
        assert code == 200, got
        _same(got, expected[k])
    assert after - before < 300 * 2**20


def test_past_the_queue_bound_the_answer_is_503(server: Any) -> None:
    url, _, queries, expected = server
    body = {"query": "a red circle", "images": queries[0]}
    with ThreadPoolExecutor(BURST) as pool:
        answers = list(pool.map(lambda _: _post(f"{url}/choose", body), range(BURST)))
    codes = [code for code, _ in answers]
    assert set(codes) <= {200, 503} and 503 in codes and 200 in codes
    for code, got in answers:
        if code == 503:
            assert "busy" in got["error"]
        else:
            _same(got, expected[0])

"""Input preparation overlapped with the model (lad.backends.pipeline, Backend.records(prefetch=)).

Records made with batches prepared ahead in worker threads, and with batch b+1 queued before
batch b is read back, are byte-identical to the serial path's; an unreadable image in a later
batch raises the serial path's error after exactly the earlier batches' records.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest

from lad.backends import load_backend
from lad.backends.hf import Backend
from lad.backends.pipeline import ProcessorPool, prefetched
from lad.core.labels import get_scheme
from lad.core.records import RecordWriter, read_records
from lad.data.items import Item
from lad.errors import DataError
from lad.testing.tiny import build_tiny_model

DIGITS = get_scheme("digits")


def test_prefetched_keeps_order_and_prepares_ahead() -> None:
    started: list[int] = []

    def prepare(b: int) -> int:
        started.append(b)
        time.sleep(0.01 * (b % 3))  # later batches may finish first
        return b * 10

    for ahead in (0, 1, 3):
        started.clear()
        out = []
        for value in prefetched(range(7), prepare, ahead=ahead):
            if not out and ahead:
                time.sleep(0.05)
                assert len(started) == 1 + ahead  # the next `ahead` batches are under way
            out.append(value)
        assert out == [b * 10 for b in range(7)]


def test_prefetched_raises_at_the_failing_batch() -> None:
    def prepare(b: int) -> int:
        if b == 3:
            raise DataError("bad batch 3")
        return b

    for ahead in (0, 2):
        got = []
        with pytest.raises(DataError, match="bad batch 3"):
            for value in prefetched(range(6), prepare, ahead=ahead):
                got.append(value)
        assert got == [0, 1, 2]


def test_prefetched_stops_its_workers_when_abandoned() -> None:
    stream = prefetched(range(100), lambda b: b, ahead=2)
    assert next(stream) == 0
    stream.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("lad-prepare")]


def test_processor_pool_hands_out_separate_copies() -> None:
    pool = ProcessorPool({"tokenizer": [1, 2]})
    with pool.borrowed() as a, pool.borrowed() as b:
        assert a == b == pool.processor
        assert a is not b and a is not pool.processor
    with pool.borrowed() as again:
        assert again is b  # returned copies are reused


def _images(folder: Path, count: int) -> list[Path]:
    from PIL import Image

    rng = np.random.default_rng(0)
    paths = []
    for i in range(count):
        paths.append(folder / f"{i}.jpg")
        pixels = (rng.random((30 + 5 * i, 50, 3)) * 255).astype("uint8")
        Image.fromarray(pixels).save(paths[-1])
    return paths


@pytest.fixture(scope="module", params=["qwen2_5_vl", "idefics3"])
def setup(request, tmp_path_factory) -> tuple[Backend, list[tuple[Item, int, list[int]]]]:
    folder = tmp_path_factory.mktemp(request.param)
    path = build_tiny_model(request.param, folder / "model")
    backend = load_backend(str(path), device="cpu", dtype="float32")
    images = _images(folder, 7)
    items = [Item(f"q{k}", "a red star", images[k : k + 4], k % 4) for k in range(4)]
    rng = np.random.default_rng(3)
    reqs = [(it, t, rng.permutation(4).tolist()) for it in items for t in range(2)]
    return backend, reqs


def _write(tmp_path: Path, stream, name: str) -> bytes:
    path = tmp_path / name
    with RecordWriter(path) as writer:
        for rec in stream:
            writer.write(rec)
    return path.read_bytes()


def test_prefetched_records_are_byte_identical(setup, tmp_path: Path) -> None:
    backend, reqs = setup
    serial = _write(tmp_path, backend.records(reqs, scheme=DIGITS, batch_size=3, prefetch=0), "a")
    assert serial.count(b"\n") == len(reqs)
    for prefetch in (1, 3):
        for overlap in (False, True):  # True: the GPU order (queue b+1, then read b), on a CPU
            backend.overlap = overlap
            try:
                stream = backend.records(reqs, scheme=DIGITS, batch_size=3, prefetch=prefetch)
                made = _write(tmp_path, stream, f"p{prefetch}{overlap}")
            finally:
                backend.overlap = False
            assert made == serial, (prefetch, overlap)


def test_bad_image_in_a_later_batch(setup, tmp_path: Path) -> None:
    backend, reqs = setup
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"not an image")
    item, ordering, order = reqs[4]
    bad = Item("bad-item", item.query, [*item.images[:3], broken], item.answer)
    reqs = [*reqs[:4], (bad, ordering, order), *reqs[5:]]  # batch 2 of 3 (batch size 3)
    outcomes = []
    for prefetch, overlap in ((0, False), (2, False), (2, True)):
        backend.overlap = overlap
        path = tmp_path / f"records{prefetch}{overlap}.jsonl"
        try:
            with pytest.raises(DataError) as err, RecordWriter(path) as writer:
                stream = backend.records(reqs, scheme=DIGITS, batch_size=3, prefetch=prefetch)
                for rec in stream:
                    writer.write(rec)
        finally:
            backend.overlap = False
        assert str(broken) in str(err.value)
        done = read_records(path)
        assert list(done.items) == [it.id for it, _, _ in reqs[:3]]  # batch 1 only
        outcomes.append((str(err.value), path.read_bytes()))
    assert outcomes[1] == outcomes[0] and outcomes[2] == outcomes[0]

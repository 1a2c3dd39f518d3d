"""The largest N agrees across label schemes, items files, converters and `lad eval`: a scheme
that cannot name N says which schemes can, before any model work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lad.cli import main
from lad.core.labels import LABEL_SCHEMES, MAX_CANDIDATES, get_scheme
from lad.data.items import read_items
from lad.errors import DataError, LadError
from tests.data_fixtures import make_images


def test_largest_n_is_the_largest_any_scheme_names():
    assert MAX_CANDIDATES == 26 == max(s.max_candidates for s in LABEL_SCHEMES.values())
    assert len(get_scheme("upper").labels(26)) == 26
    with pytest.raises(LadError, match=r"names 1 to 12 candidates, but N = 13 .*; for N = "
                       r"13 use --labels upper or lower"):  # fmt: skip
        get_scheme("digits").labels(13)
    with pytest.raises(LadError, match="no label scheme names more than 26 candidates"):
        get_scheme("upper").labels(27)


def _items(tmp_path: Path, n: int, prefix: str = "q") -> Path:
    names = make_images(tmp_path / "img", n)
    path = tmp_path / f"{prefix}{n}.jsonl"
    rows = [
        {
            "id": f"{prefix}{k}",
            "query": "a kite",
            "images": [f"img/{x}" for x in names],
            "answer": k,
        }
        for k in range(3)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_items_file_refuses_more_candidates_than_any_scheme_names(tmp_path):
    assert read_items(_items(tmp_path, 26))[0].num_candidates == 26
    with pytest.raises(DataError, match="has 27 candidate images; no label scheme names more "
                       "than 26"):  # fmt: skip
        read_items(_items(tmp_path, 27))


def test_eval_names_the_schemes_that_can_before_any_model_work(tmp_path, capsys):
    data = _items(tmp_path, 13)
    out = tmp_path / "run"
    calibration = _items(tmp_path, 13, prefix="c")
    args = ["eval", "--data", str(data), "-n", "13", "--calibration-data", str(calibration)]
    assert main([*args, "--labels", "digits", "--out", str(out), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: --labels digits names 1 to 12 candidates, but N = 13")
    assert "for N = 13 use --labels upper or lower" in err
    assert not out.exists()  # refused before the run directory or the model

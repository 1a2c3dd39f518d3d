"""Faults and hostile surroundings (docs/errors.md): nothing silently wrong, nothing clobbered.

Whole-file writes replace the old file only when complete; a symlink is never written through;
a full disk, a read-only folder or Ctrl-C end in one `Error:` line and lose nothing.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

import pytest

from lad.cli import main
from lad.files import replacing, write_text
from lad.records import write_records
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

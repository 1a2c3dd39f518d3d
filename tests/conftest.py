import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# One torch thread in every test process and every `lad` it starts, however pytest is started:
# under xdist a second thread per worker oversubscribes the cores (OpenMP's spinning threads then
# make tiny models run many times slower), and without xdist lad would choose its thread count
# from the load it measures, so that two runs compared byte for byte (a resumed run and a whole
# one) could differ on a busy machine. Tests of that choice pass their own environment.
os.environ["OMP_NUM_THREADS"] = "1"
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keep any user or cache folder a test might touch inside a temp dir."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("MPLCONFIGDIR", str(home / "mpl"))


@pytest.fixture(autouse=True)
def _no_figure_left_open():
    """A test that keeps a figure to read it (one that replaces lad's saving) leaves it to be
    closed here, so figures never pile up across the tests of one worker."""
    import sys

    yield
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


@pytest.fixture(scope="session")
def llava15_tiny(tmp_path_factory):
    """LLaVA-OneVision-1.5's shrunk random-weight copy (lad.testing.remote) in a folder of its hub
    id's name, built once for the remote-code tests (test_remote_code.py, test_remote_harness.py,
    run together in .ci/.venv-remote); skipped where LAD_REAL_CHECKPOINTS lacks the real files."""
    from lad.testing.remote import save_shrunk_remote
    from tests.test_real_checkpoints import _source

    name = "LLaVA-OneVision-1.5-8B-Instruct"
    return save_shrunk_remote(_source(name), tmp_path_factory.mktemp("remote") / name)

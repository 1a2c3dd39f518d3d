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

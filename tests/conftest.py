import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
if "PYTEST_XDIST_WORKER" in os.environ:
    # xdist already runs one worker per core: a second torch thread per worker oversubscribes the
    # cores, and OpenMP's spinning threads then make tiny models run many times slower. Subprocess
    # `lad` runs inherit the setting.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Keep any user or cache folder a test might touch inside a temp dir."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HF_HOME", str(home / "hf"))
    monkeypatch.setenv("MPLCONFIGDIR", str(home / "mpl"))

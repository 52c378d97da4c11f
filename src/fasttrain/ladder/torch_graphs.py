"""`torch-graphs`: torch-optimized's epoch — the same static buffers, the same 4-op step — captured
once as ONE CUDA graph and replayed each epoch with no host involvement.

- The graph holds the whole epoch: the shuffle (one gather of the training set into epoch order),
  469 steps of 4 kernels (mm, log_softmax, log_softmax backward = softmax - onehot, addmm_ that
  applies gradient and SGD update in one GEMM), and the epoch's loss sum (3 kernels).
- Each epoch copies its order into the graph's static order buffer (device to device,
  stream-ordered, no host sync) and replays the graph: one host call an epoch.
- The loss is read every 10 epochs, the only host sync.
- torch-optimized's v4 (its steps under inference mode, ops bound to locals) is captured as is:
  inference mode is host-side dispatch state, so the graph's kernels are the same, and no tensor
  the capture makes is an inference tensor; its host savings buy nothing here (no dispatch at
  replay), only a shorter capture.

What limits it: ~4-6 dependent kernels a step (cuBLAS may split a GEMM's K into a GEMM and a
reduction kernel), each ≥ ~1 µs even inside a graph (graph_node_us, measured 1.00 µs on the H100,
second loan), plus the GEMMs' own time: in the CUDA rungs on the H100 (cuda_step_profile) cuBLAS
took ~16.4 µs a step for the two products at these shapes (a split-K GEMM with its reduction, 12.4
µs, and a 4 µs one); the ops are far too small to fill the GPU. Which kernels the two products get
is cuBLAS's heuristic, which two things a PyTorch user controls move: the BLAS library
(`torch.backends.cuda.preferred_blas_library`: cuBLAS or cuBLASLt, whose heuristic differs) and the
weight's memory layout (the operands' transposes). Those are the row's `Variant`;
`benchmarks/variant_sweep.py` times all of them (the graph records the kernels chosen at capture,
so the library is set only around the capture).

Versions: v1 7 kernels a step (gather, mm, log_softmax, loss addcmul, exp, sub, addmm_), 4 graphs
an epoch (H100: 14.7 ms/epoch, 31 µs/step); v2 (this file) 4 ops a step, the gather and the loss
moved to once an epoch, one graph an epoch.

Run alone:  python -m fasttrain bench --impl torch-graphs
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import torch

from fasttrain.ladder.common import Impl, LadderConfig, LadderData
from fasttrain.ladder.torch_optimized import (
    OPS_PER_STEP,
    EpochState,
    read_loss,
    train_epoch_steps,
)


@dataclass(frozen=True)
class Variant:
    """Which GEMM kernels the step's two products get. blas: the library PyTorch calls,
    "cublas" (its default on CUDA) or "cublaslt". transposed: the weight [10, 785] stored
    column-major ([785, 10] storage), so the forward GEMM reads both operands in the same
    layout."""

    blas: str = "cublas"
    transposed: bool = False

    @property
    def tag(self) -> str:
        return f"{self.blas}, {'Wᵀ' if self.transposed else 'W'} storage"

    def __str__(self) -> str:
        return f"BLAS {self.blas}, weight stored {'[785, 10]' if self.transposed else '[10, 785]'}"


# The row's: the fastest of SWEEP on an H100 (2026-11-27: 9.50 ms/epoch, W storage 10.6).
DEFAULT = Variant(transposed=True)
SWEEP = tuple(Variant(b, t) for b in ("cublas", "cublaslt") for t in (False, True))


@contextmanager
def preferred_blas(library: str):
    """PyTorch's BLAS library set to `library` inside, restored after."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


class TorchGraphs(Impl):
    name = "torch-graphs"
    device = "cuda"
    variant = DEFAULT  # benchmarks/variant_sweep.py sets another on a subclass

    @classmethod
    def unavailable(cls, env, cfg):
        return None if torch.cuda.is_available() else "needs a CUDA GPU (CUDA graphs)"

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        dev = torch.device("cuda")
        self.orders = torch.from_numpy(data.orders).to(dev)
        v = self.variant
        self.state = s = EpochState(data, cfg, dev, transposed=v.transposed)
        self.order = torch.empty_like(self.orders[0])  # the graph's static order buffer
        w0 = s.w.clone()
        # Warm up on a side stream (cuBLAS handles and workspaces are created here, not inside
        # the capture), then capture; both train, so the weights and loss are reset afterwards.
        with preferred_blas(v.blas):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.order.copy_(self.orders[0])
                train_epoch_steps(s, self.order)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                train_epoch_steps(s, self.order)
        s.w.copy_(w0)
        s.loss_sum.zero_()
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        self.order.copy_(self.orders[epoch])  # device to device, stream-ordered
        self.graph.replay()
        self.epochs_summed += 1
        return read_loss(self, epoch)

    def details(self) -> dict:
        return {"ops_per_step": OPS_PER_STEP, "shuffle": "one gather an epoch", "cuda_graph": True,
                "graphs_per_epoch": 1, "blas": self.variant.blas,
                "weight_storage": "[785, 10]" if self.variant.transposed else "[10, 785]"}

    def params(self):
        return self.state.params()

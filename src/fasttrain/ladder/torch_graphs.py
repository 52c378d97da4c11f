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

from fasttrain.ladder.common import Impl, LadderConfig, LadderData, batches
from fasttrain.ladder.torch_compiled import STEP, check_aligned, compiled
from fasttrain.ladder.torch_optimized import (
    OPS_PER_STEP,
    EpochState,
    read_loss,
    shuffle,
    sum_loss,
    train_epoch_steps,
)

STEPS = ("eager", "mm", "bcast")


@dataclass(frozen=True)
class Variant:
    """Which kernels the step gets. blas: the library PyTorch calls for a GEMM, "cublas" (its
    default on CUDA) or "cublaslt". transposed: the weight [10, 785] stored column-major
    ([785, 10] storage), so the forward GEMM reads both operands in the same layout. step:
    "eager" (torch-optimized's 4 aten ops) or a torch_compiled form, "mm" or "bcast", whose
    kernels Inductor generates; autotune: the compiled step in mode
    "max-autotune-no-cudagraphs" (GEMM templates and block sizes benchmarked at setup; the
    epoch's graph is still ours, so none of Inductor's)."""

    blas: str = "cublas"
    transposed: bool = False
    step: str = "eager"
    autotune: bool = False

    def __post_init__(self):
        if self.blas not in ("cublas", "cublaslt"):
            raise ValueError(f"blas {self.blas!r}: cublas or cublaslt")
        if self.step not in STEPS:
            raise ValueError(f"step {self.step!r}: one of {', '.join(STEPS)}")
        if self.autotune and self.step == "eager":
            raise ValueError("autotune is torch.compile's: the eager step has nothing to tune")

    @property
    def compiled(self) -> bool:
        return self.step != "eager"

    @property
    def mode(self) -> str | None:
        return "max-autotune-no-cudagraphs" if self.autotune else None

    @property
    def tag(self) -> str:
        layout = f"{'Wᵀ' if self.transposed else 'W'} storage"
        if not self.compiled:
            return f"{self.blas}, {layout}"
        return f"{self.blas}, {layout}, inductor {self.step}{' autotuned' if self.autotune else ''}"

    def __str__(self) -> str:
        step = "eager ops" if not self.compiled else (
            f"torch.compile {self.step} step, mode {self.mode or 'default'}")
        return (f"BLAS {self.blas}, weight stored {'[785, 10]' if self.transposed else '[10, 785]'}"
                f", {step}")


# The row's: the fastest of SWEEP on an H100 (2026-11-27: 9.50 ms/epoch, W storage 10.6). The
# compiled steps are not yet run on a GPU.
DEFAULT = Variant(transposed=True)
SWEEP = (*(Variant(b, t) for b in ("cublas", "cublaslt") for t in (False, True)),
         # Triton GEMM templates (no split-K) against cuBLAS, the softmax fused: both layouts.
         Variant(step="mm", autotune=True), Variant(transposed=True, step="mm", autotune=True),
         # 3 Triton reductions a step, no BLAS; default block sizes and autotuned ones.
         Variant(step="bcast"), Variant(step="bcast", autotune=True))


@contextmanager
def preferred_blas(library: str):
    """PyTorch's BLAS library set to `library` inside, restored after."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def epoch_fn(s: EpochState, v: Variant, batch_size: int, backend: str = "inductor"):
    """The epoch the graph captures, `epoch(order)`: the eager steps, or the compiled step of
    `v` called on every step's fixed views (its graphs are compiled on the first calls, which
    the warm-up makes). backend: what compiles the step (the tests' "aot_eager" runs the same
    traced graph on the CPU without Inductor's C++ build)."""
    if not v.compiled:
        return lambda order: train_epoch_steps(s, order)
    mode = v.mode if backend == "inductor" else None  # a mode is Inductor's options
    step, lr = compiled(STEP[v.step], mode, backend), s.lr
    views = [(s.shuffled[a:b], s.logp[a:b]) for a, b in batches(len(s.rows), batch_size)]
    check_aligned([s.w, *(t for view in views for t in view)])

    @torch.no_grad()
    def epoch(order):
        shuffle(s, order)
        for batch, logp in views:
            step(batch, s.w, logp, lr)
        sum_loss(s)

    return epoch


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
        epoch = epoch_fn(s, v, cfg.batch_size)
        w0 = s.w.clone()
        # Warm up on a side stream (cuBLAS handles and workspaces, and for a compiled step its
        # compilation, autotuning and the loading of its kernels, all happen here, not inside
        # the capture), then capture; both train, so the weights and loss are reset afterwards.
        with preferred_blas(v.blas):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self.order.copy_(self.orders[0])
                epoch(self.order)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                epoch(self.order)
        s.w.copy_(w0)
        s.loss_sum.zero_()
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        self.order.copy_(self.orders[epoch])  # device to device, stream-ordered
        self.graph.replay()
        self.epochs_summed += 1
        return read_loss(self, epoch)

    def details(self) -> dict:
        v = self.variant
        return {"ops_per_step": None if v.compiled else OPS_PER_STEP,
                "step": v.step, "compile_mode": v.mode if v.compiled else None,
                "shuffle": "one gather an epoch", "cuda_graph": True,
                "graphs_per_epoch": 1, "blas": v.blas,
                "weight_storage": "[785, 10]" if self.variant.transposed else "[10, 785]"}

    def params(self):
        return self.state.params()

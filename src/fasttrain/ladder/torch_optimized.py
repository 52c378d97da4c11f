"""`torch-optimized`: the report's optimized PyTorch row ("torch.compile(), pinned memory, AMP,
preloading dataset"), written the way a strong user writes a small model's training loop when
the GPU is starved by launches: few, fused, in-place eager ops on a preloaded device data set.

- Preloading: the training set crosses the bus once, as uint8 through pinned memory, and is
  expanded on the device into one float32 row per sample, `[x / 255 (784) | 1 | -onehot (10) |
  0 (5)]` (800 floats: 16-byte aligned rows for cuBLAS). The bias is column 784 of an augmented
  weight `[10, 785]`, so the forward is one GEMM and the weight *and* bias update is one.
- Shuffling: once per epoch the rows are gathered in the epoch's order (one `index_select` of
  the whole set, ~0.3 µs a step at HBM bandwidth on an H100); a step then reads a contiguous
  slice — no gather, no dtype conversion, no host work per step.
- The step is 4 ops, each one kernel (cuBLAS may add a split-K reduction to a GEMM):
      z    = x @ Wᵀ                          mm
      logp = log_softmax(z)  → this epoch's [N, 10] log-prob buffer   _log_softmax
      g    = softmax(z) - onehot             _log_softmax_backward_data(-onehot, logp)
      W   -= lr/B · gᵀ x                     addmm_ (gradient and SGD update in one GEMM)
  The gradient of the mean cross-entropy is written out (dL/dz = (softmax - onehot) / B), not
  taken by autograd: autograd + optimizer + zero_grad launch ~15 kernels a step.
- No host work but the 4 dispatches: every step's views (its slice of the shuffled rows, its
  logits and gradient buffers and the gradient's transpose, its slice of the log-prob buffer, the
  weight's transpose) and its learning rate over the batch are made once at setup, since the
  buffers never move; slicing them anew each step cost ~8 µs of Python a step on the 2-core EPYC,
  and even one `g.T` a step is a dispatch (aten::t, 0.6 µs there).
- The 4 dispatches as cheap as PyTorch's supported eager API makes them: under
  `torch.inference_mode()`, which takes the Autograd dispatch keys out of the path (`no_grad`
  does not; on these normal tensors ADInplaceOrView still runs and bumps the version counters),
  with the ops bound to locals. `benchmarks/dispatch_cost.py` times every way to issue them on
  CPU tensors of the smallest shapes (the host path up to the backend kernel): `torch.ops.aten.*`
  costs twice as much (pybind, not the generated argument parser), new outputs instead of out=
  cost more, functools.partial buys ~0.1 µs a step over locals, and TorchScript (deprecated in
  torch 2.13) would save another ~0.8 µs a step.
- The loss costs nothing per step: the log-probs land in an epoch-long buffer, reduced once per
  epoch on the device (3 kernels) and read every 10 epochs (the one host sync).
- fp32: at these sizes (B = 128, N = 10) every GEMM is latency-bound, so bf16 autocast would buy
  nothing and add cast kernels. No torch.compile of a single step either: on the H100
  (2026-11-26) v1's compiled bf16 autograd step took 114 µs, against ~25-30 µs of GPU work in ~10
  kernels: host-bound on Inductor's per-kernel launches and guards; 4 eager dispatches cost less
  (v2, v3 below). What pays is compiling k steps into one call that CUDA graph trees replay (v5,
  the row's on a CUDA GPU).

What limits it: the host's work per op (~14 µs an op on the H100's Xeon in v3, 4 a step) against
GPU time per step (~15-20 µs, two cuBLAS GEMMs, one of which cuBLAS may run split-K). Of that,
Python and the dispatcher up to the kernel are a small part: v3's whole step cost 5.0 µs on CPU
tensors of the smallest shapes on the 2-core EPYC (1.3 µs an op, tiny kernels included); the
rest is what the CUDA backend does on the host (device guard, stream, cuBLAS's host side, kernel
launches), not yet measured apart (`dispatch_cost.py --device cuda` does, on a GPU).
`torch-graphs` replays this same step from a CUDA graph, with none of it.

Versions: v1 torch.compile of 4 unrolled autograd steps with bf16 autocast (H100: 53.4 ms/epoch,
114 µs/step; 2-core Zen 4 EPYC: 61.3 ms/epoch); v2 4 eager ops a step, epoch-wise shuffle (H100:
34.0 ms/epoch, 72 µs/step, so ~18 µs of host time an op on that machine's Xeon, not the 5
estimated); v3 v2 with each step's views made once at setup (H100, 2026-11-27: 26.2 ms/epoch,
56 µs/step); v4 (this file) v3 under inference_mode, ops bound to locals, g.T and Wᵀ made at
setup: the step's host path on the 2-core EPYC, CPU tensors of the smallest shapes, 5.03 → 3.19
µs (-1.8 µs, -37%; dispatch_cost.py, 2026-11-27, load ~8.5 on 2 cores); on an H100 not yet
measured (if the saving carries over whole, ~54 µs/step, ~25 ms/epoch: the CUDA side dominates).
v5 (`Variant(k=...)`; written and CPU-checked, then run on an H200, 2026-11-28: k = 7 the row's
default on a CUDA GPU since, eager v4 elsewhere):
torch.compile(mode="reduce-overhead") of k steps a call (torch_compiled.CHUNK: each batch
gathered from the rows inside the graph, W, the rows and the loss sum static addresses), replayed
by Inductor's CUDA graph trees, so the host's ~4 × 14 µs a step becomes one call per k steps
(guards, graph trees' bookkeeping, one input copy and a graph launch: **estimate** 30-60 µs a call,
~4 ms an epoch at k = 7 against ~7-10 ms of GPU work in 3k + 3 kernels (mm products) or 3k + 1
(bcast)): GPU-bound, ~8-12 ms an epoch if graph trees replay as intended (**estimate**, from
torch-graphs' 9.26 ms for the same kernels in one graph; 3-6× optimism applies to the host part).
Measured (H200, 2026-11-28, run 10, `variant_sweep.py --steps compiled`, 10 epochs): k = 7 10.39
ms/epoch (22 µs a step, 155 µs a call), k = 67 10.66, against eager v4's 22.24 in the same run;
10 s of setup (compile, warm-up and recording) against 0.08. Reading: with mm products the GPU
work is ~21 µs a step whatever k (cuBLAS, as torch-graphs' 9.56 ms); k = 7 bcast (10.84, 13 s
of setup) is host-bound, 67 calls of ~160 µs. Swept next (compiled and checked on the CPU, not
yet run on a GPU): k = 67 bcast, 7 calls an epoch (~1 ms of host) under torch-graphs' measured
bcast kernels (10.5 µs a step, 4.94 ms an epoch): **estimate** ~5-6 ms/epoch, setup ~1.5 min
(2 graphs of 67 steps; k = 67 mm took 35 s, and Inductor lowers bcast ~2.5× slower than mm:
41 s against 21 s for one 67-step chunk's Triton code on the 2-core EPYC); and k = 34 classes,
14 calls an epoch (13 of 34 steps, the last of 27; ~2.2 ms of host against ~3.3 ms of GPU work
at torch-graphs' classes estimate of ~7 µs a step): **estimate** ~3.5-5 ms/epoch, setup ~2.5
min (61 steps to compile at ~4× bcast's lowering time a step; at k = 67 it would be 134 steps,
~5 min, for 7 calls fewer).

Run alone:  python -m fasttrain bench --impl torch-optimized [--device cuda]
Its variants:  python benchmarks/variant_sweep.py --rows torch-optimized [--steps compiled]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData, batches
from fasttrain.ladder.torch_compiled import CHUNK, FORMS, compiled

READ_LOSS_EVERY = 10
X = IN_FEATURES + 1  # augmented input: pixels | 1
ROW = 800  # [pixels | 1 | -onehot | 0 pad]: a multiple of 4 floats, so every row is 16-byte aligned
OPS_PER_STEP = 4  # mm, _log_softmax, _log_softmax_backward_data, addmm_ (asserted by the tests)


class Step(NamedTuple):
    """One step's fixed views of an EpochState's buffers, and its step size over the batch."""

    x: torch.Tensor  # [nb, 785]: pixels | 1, of the shuffled rows
    neg_onehot: torch.Tensor  # [nb, 10]
    z: torch.Tensor  # [nb, 10] logits
    g: torch.Tensor  # [nb, 10] dL/dz · nb
    gt: torch.Tensor  # [10, nb]: g.T, made once (a view made per step is a dispatch, ~0.6 µs)
    logp: torch.Tensor  # [nb, 10]: this step's slice of the epoch's log-probabilities
    alpha: float  # -lr / nb: the mean over the batch folded into the update


class EpochState:
    """Static device buffers for one epoch of steps: what the steps read and write, in place."""

    def __init__(self, data: LadderData, cfg: LadderConfig, device: torch.device,
                 transposed: bool = False):
        n = data.n_train
        pinned = device.type == "cuda"

        def to_device(array):
            t = torch.from_numpy(array)
            return t.pin_memory().to(device, non_blocking=True) if pinned else t

        x = to_device(data.train_x)  # uint8 [N, 784]: a quarter of float32's bytes on the bus
        y = to_device(data.train_y)
        rows = torch.zeros(n, ROW, dtype=torch.float32, device=device)
        rows[:, :IN_FEATURES] = x.float() / 255
        rows[:, IN_FEATURES] = 1.0
        rows[torch.arange(n, device=device), X + y] = -1.0
        self.rows = rows  # float32 [N, 800], the whole training set
        self.pixels = x  # uint8 [N, 784]: the lagged step's Grams (torch_lagged.py) read them
        self.shuffled = torch.empty_like(rows)  # this epoch's rows in visiting order
        w = torch.cat([torch.from_numpy(data.w0), torch.from_numpy(data.b0)[:, None]], dim=1)
        # float32 [10, 785]: weight | bias. transposed: the same [10, 785] tensor over [785, 10]
        # storage, so cuBLAS sees the other operand layouts (NN instead of TN) and may pick
        # other kernels; the ops and the results are the same.
        w = w.to(device)
        self.w = w.T.contiguous().T if transposed else w.contiguous()
        self.wt = self.w.T  # [785, 10] view, made once: the weight is updated in place, never moved
        self.z = torch.empty(cfg.batch_size, CLASSES, device=device)  # one step's logits
        self.g = torch.empty(cfg.batch_size, CLASSES, device=device)  # one step's dL/dz · B
        self.logp = torch.empty(n, CLASSES, device=device)  # the epoch's log-probabilities
        self.loss_sum = torch.zeros((), device=device)  # summed over epochs until read
        self.lr = cfg.lr
        self.steps = [self._step(start, stop) for start, stop in batches(n, cfg.batch_size)]

    def _step(self, start: int, stop: int) -> Step:
        nb = stop - start
        batch, g = self.shuffled[start:stop], self.g[:nb]
        return Step(batch[:, :X], batch[:, X : X + CLASSES], self.z[:nb], g, g.T,
                    self.logp[start:stop], -self.lr / nb)

    def params(self):
        w = self.w.detach().cpu().numpy()
        return w[:, :IN_FEATURES].copy(), w[:, IN_FEATURES].copy()


def shuffle(s: EpochState, order: torch.Tensor) -> None:
    """The epoch's rows in visiting order: one gather of the whole set (int64 order [N])."""
    torch.index_select(s.rows, 0, order, out=s.shuffled)


@torch.inference_mode()
def train_steps(s: EpochState, steps: list[Step]) -> None:
    """SGD steps in place, OPS_PER_STEP ops each and nothing else: fixed views of static buffers
    and no host syncs, so CUDA graphs capture it as is.

    Inference mode skips the Autograd dispatch keys (0.1-0.2 µs an op on the 2-core EPYC;
    no_grad does not); it creates no tensor here, so no inference tensor leaks out. The ops are
    bound to locals and every view is made at setup: the loop only calls."""
    mm, log_softmax, log_softmax_bw, update = (
        torch.mm, torch._log_softmax, torch._log_softmax_backward_data, s.w.addmm_)
    wt, f32 = s.wt, torch.float32
    for x, neg_onehot, z, g, gt, logp, alpha in steps:
        mm(x, wt, out=z)
        log_softmax(z, 1, False, out=logp)
        # log_softmax's own backward with upstream gradient -onehot: -onehot + softmax · 1.
        log_softmax_bw(neg_onehot, logp, 1, f32, out=g)
        update(gt, x, alpha=alpha)


def sum_loss(s: EpochState) -> None:
    """loss_sum += Σ over the epoch of -log p(label): 3 kernels an epoch, no host sync."""
    s.loss_sum.add_(torch.sum(s.logp * s.shuffled[:, X : X + CLASSES]))


def train_epoch_steps(s: EpochState, order: torch.Tensor) -> None:
    """One whole epoch: shuffle, every step, the loss sum."""
    shuffle(s, order)
    train_steps(s, s.steps)
    sum_loss(s)


@dataclass(frozen=True)
class Variant:
    """How the host issues the steps. k = 0: eager v4, 4 aten dispatches a step. k ≥ 1: v5,
    torch.compile(mode="reduce-overhead") of k steps a call (torch_compiled.CHUNK, the
    products in `form`), replayed by Inductor's CUDA graph trees: one host call per k steps
    (the last call of an epoch takes the steps left, the partial batch among them)."""

    k: int = 0
    form: str = "mm"

    def __post_init__(self):
        if self.k < 0:
            raise ValueError(f"k {self.k}: steps a compiled call, ≥ 1 (0: eager)")
        if self.form not in FORMS:
            raise ValueError(f"form {self.form!r}: one of {', '.join(FORMS)}")
        if not self.k and self.form != "mm":
            raise ValueError("the eager step's products are aten.mm and addmm_ (form 'mm')")

    @property
    def compiled(self) -> bool:
        return self.k > 0

    @property
    def tag(self) -> str:
        if not self.compiled:
            return "eager v4"
        form = "" if self.form == "mm" else f", {self.form}"
        return f"reduce-overhead, {self.k} steps a call{form}"

    def __str__(self) -> str:
        return ("4 eager ops a step" if not self.compiled else
                f"torch.compile reduce-overhead ({self.form} products), {self.k} steps a call")


# The row's on a CUDA GPU: v5 at k = 7, the fastest of SWEEP that passed its tests on an H200
# (2026-11-28, run 10, 10 epochs: 10.39 ms/epoch; k = 67 10.66, k = 7 bcast 10.84, eager v4 22.24;
# test_torch_compiled_cuda.py passed). Elsewhere (graph trees need CUDA) and before it: eager v4.
# 7 and 67 divide the 469 steps of an MNIST epoch (67 and 7 calls an epoch, the last with the
# partial batch).
DEFAULT = Variant(k=7)
EAGER = Variant()
# Each named apart from DEFAULT: a new DEFAULT (scripts/gpu-loan's edit) keeps SWEEP whole.
SWEEP = (EAGER, Variant(k=7),
         # Not yet run on a GPU, first (variant_sweep.py runs them in this order). Few enough
         # calls an epoch to be GPU-bound (~160 µs of host a call against 67 × bcast's 3
         # kernels, or 34 × classes' 2); classes at 34 (14 calls, the last of 27 steps), since
         # Inductor lowers its ~100 nodes a step ~4× slower than bcast's: 61 steps to compile,
         # not 134 (see the docstring).
         Variant(k=67, form="bcast"), Variant(k=34, form="classes"),
         # Run on an H200 (run 10): 10.66 and 10.84 ms/epoch.
         Variant(k=67), Variant(k=7, form="bcast"))


def row_variant(v: Variant, device: str) -> Variant:
    """The variant a row of `v` runs on `device`: the row's DEFAULT is eager v4 off CUDA."""
    return EAGER if v is DEFAULT and not device.startswith("cuda") else v


class TorchOptimized(Impl):
    name = "torch-optimized"
    reproduces = "+ torch.compile(), pinned memory, AMP, preloading dataset"
    report_ms = 600.0
    variant = DEFAULT  # benchmarks/variant_sweep.py sets another on a subclass
    sources = ("torch_compiled.py",)  # v5's compiled chunk: a figure's source hash names it too

    def __init__(self, device: str = "cpu"):
        self.device = device

    @classmethod
    def unavailable(cls, env, cfg):
        v = row_variant(cls.variant, cfg.device)
        if v.compiled and not cfg.device.startswith("cuda"):
            return f"{v.tag}: CUDA graph trees need a CUDA GPU (--device cuda)"
        return None

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.variant = row_variant(self.variant, self.device)
        dev = torch.device(self.device)
        self.state = EpochState(data, cfg, dev)
        self.orders = torch.from_numpy(data.orders).to(dev)  # int64 [epochs, N]
        self.epochs_summed = 0
        self._epoch = self._eager_epoch
        if self.variant.compiled:
            self._epoch = graph_tree_epochs(self.state, self.orders, self.variant, cfg)

    def _eager_epoch(self, epoch: int) -> None:
        train_epoch_steps(self.state, self.orders[epoch])

    def train_epoch(self, epoch: int) -> float | None:
        self._epoch(epoch)
        self.epochs_summed += 1
        return read_loss(self, epoch)

    def details(self) -> dict:
        v = self.variant
        return {"ops_per_step": None if v.compiled else OPS_PER_STEP,
                "shuffle": "gathered in the steps" if v.compiled else "one gather an epoch",
                "cuda_graph": "graph trees" if v.compiled else False,
                "steps_per_call": v.k or None, "products": v.form}

    def params(self):
        return self.state.params()


def graph_tree_epochs(s: EpochState, orders: torch.Tensor, v: Variant, cfg: LadderConfig,
                      mode: str | None = "reduce-overhead", backend: str = "inductor"):
    """v5's epoch, `epoch(e)`: the compiled chunk of v.k steps called on consecutive slices of
    epoch e's order (views made here, once), after a warm-up of two epochs, which compiles the
    chunk's graphs (full and last; one each) and lets graph trees warm up and record each (its
    first call runs, its second records); the weights and loss are reset after it.

    rows, W and loss_sum are static addresses, so graph trees neither copy them in nor refuse
    a graph for mutating an input; the order slice is the one input they copy. Unguarded: a
    second instance's buffers (the bench's check, then its timed run) reuse the compiled
    graphs instead of compiling them again, and graph trees record their graphs anew for the
    new addresses (checked on a GPU: test_torch_compiled_cuda.py). mode and backend:
    what compiles the chunk (the tests run it on the CPU with mode None and "aot_eager")."""
    for t in (s.rows, s.w, s.loss_sum):
        torch._dynamo.mark_static_address(t, guard=False)
    chunk, lr, batch_size = compiled(CHUNK[v.form], mode, backend), cfg.lr, cfg.batch_size
    span = v.k * cfg.batch_size
    slices = [[o[a : a + span] for a in range(0, len(o), span)] for o in orders]
    rows, w, loss_sum = s.rows, s.w, s.loss_sum

    @torch.no_grad()
    def epoch(e: int) -> None:
        for idx in slices[e]:
            chunk(idx, rows, w, loss_sum, lr, batch_size)

    w0 = w.clone()
    epoch(0)
    epoch(0)
    w.copy_(w0)  # in place: W's address is the graphs'
    loss_sum.zero_()
    return epoch


def read_loss(impl, epoch: int) -> float | None:
    """The mean training loss over the epochs summed since the last read, every READ_LOSS_EVERY
    epochs and after the last; None (no host sync) otherwise."""
    if (epoch + 1) % READ_LOSS_EVERY and epoch + 1 != impl.cfg.epochs:
        return None
    s = impl.state
    mean = s.loss_sum.item() / (impl.data.n_train * impl.epochs_summed)  # the host sync
    s.loss_sum.zero_()
    impl.epochs_summed = 0
    return mean

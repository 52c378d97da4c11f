"""torch-graphs' lagged-Gram steps (`Variant(step="lagged" or "lagged-fused", lag=L)`): plain SGD,
exactly, computed with fewer dependent kernels a step — the identity cuda-epoch v7 uses
(docs/measurements/cuda-epoch-v7-design.md), written in PyTorch ops.

An epoch's steps are cut into blocks of L consecutive steps (the last block cut short by the
epoch's end). For a block that starts from weights W_b, step t's logits and the next block's
weights are (x the augmented 785 columns [x/255 | 1], g_i = softmax(z_i) − onehot_i):

    z_t     = x_t W_bᵀ − (lr/B) Σ_{i in block, i < t} (x_t · x_i) g_i     (exactly SGD's z_t)
    W_{b+1} = W_b − Σ_{i in block} (lr/n_i) g_iᵀ x_i                      (one GEMM a block)

So a block is one GEMM for its partial logits P = X_block W_bᵀ, a small correction a step (its
Grams Γ_{t,<t} [n_t, (t − t_b)·B] times the block's g so far), the softmax and g, and one GEMM for
W's update. (lr/n_i = lr/B in every correction: only the epoch's last batch is partial, and no
step after it reads it; W's update takes it apart.)

The Grams depend only on the pixels and the epoch's order, so all of an epoch's are made at its
start, off the steps' chain: one batched GEMM of every block's rows with themselves over raw pixel
rows [x (784) | 255 | 0 (7)], so Γ̃ = 255² (x · x_i) with the bias column's 1 included, scaled by
-lr / (B · 255²) where it is used. On CUDA the pixel rows are bf16 and the GEMM a bf16 one that
accumulates and stores fp32 (`torch.bmm(out_dtype=float32)`): the pixels 0-255 (and 255) are exact
in bf16's 8-bit significand, their products (≤ 65,025) exact in fp32, so it is fp32's rounding of
sums ≤ 785 · 255² ≈ 5.1·10⁷ (a relative ~6e-8), with cuBLAS on tensor cores. That is an fp32-
accurate evaluation of the same products, not a precision change of the model (the bench's
float64 check at 2e-5 decides; bf16 reductions of a split-K are switched off around it). On the
CPU (no bf16 → fp32 bmm there) the rows are fp32, exact too.

Two forms of the step:
- "lagged": eager aten ops, captured in the epoch's one graph as torch-graphs' eager step is. A
  block: mm (P), then a step: addmm (z = P_t + c·Γ G, none for the block's first step),
  _log_softmax (into the epoch's log-prob buffer), _log_softmax_backward_data (g into the block's
  G buffer); then addmm_ (W's update; 2 in the block that holds the partial batch). 3L + 1 kernels
  a block (cuBLAS may split a GEMM), against 4L for L plain steps.
- "lagged-fused": a block as ONE torch.compile'd call (one graph for the full blocks, one for the
  cut last block: Dynamo's graphs differ only in the views' storage offsets), captured in the same
  graph. Its products in torch_compiled's "classes" form: P as 10 row reductions over 785, each
  step's correction as 10 row reductions over the block's earlier rows with the softmax, g and the
  rows' loss in their epilogue, W's update a bcast reduction storing into W. Inductor's Triton code
  read on the CPU (tests/ladder/test_torch_lagged.py, slow): `fused_kernels`, L + 4 a block.

Cost (**estimates**, not measured; basis: a graph node ~0.84 µs on the H200 (sync_cost), bcast's
~3.5 µs a Triton reduction kernel in the graph (torch-graphs' 4.94 ms/epoch, 3 kernels a step),
cuBLAS's GEMMs at these shapes ~4-12 µs each in the CUDA rungs; earlier estimates for this GPU
code were 3-6× optimistic):
- the Grams, a bf16 GEMM of 2 · N · LB · 792 flop an epoch (the whole L×L block, not only its
  lower triangle): 97 Gflop at L = 8, 195 at 16; at 0.3-1 Pflop/s ~0.1-0.3 ms (L = 8) and
  ~0.2-0.6 ms (L = 16); their fp32 output N · LB · 4 bytes (0.25 GB at 8, 0.5 at 16) written once
  and each correction reading its rows (~0.1 ms at HBM speed).
- "lagged": (3L + 1) kernels a block ≈ 3 a step, two of them cuBLAS: the addmm ~4-6 µs, the two
  softmax kernels ~2-3 µs each, per block mm + addmm_ ~8-20 µs → ~9-12 µs a step, ~4.5-6 ms an
  epoch: no better than the bcast step's measured 4.94 (eager cuBLAS at these shapes is the cost).
- "lagged-fused": L + 4 Triton kernels a block (`fused_kernels`: P, step 0's softmax, one a later
  step, two deferred copies, the update), each ~3.5 µs, a late step's wider reduction (up to
  (L−1)·128 columns a row) ~4-4.5 µs → L = 4 ~6.5-7.5 µs a step (3.0-3.5 ms/epoch), L = 8
  ~5.3-6.3 µs (2.5-2.9 ms), L = 16 ~4.4-5.4 µs (2.1-2.5 ms), plus the Grams' ~0.2-0.6 ms:
  L = 8 ~2.7-3.5, L = 16 ~2.3-3.1 ms/epoch, around the ≤ 3 ms target if the 3-6× optimism of
  past estimates does not repeat (it would put them at 4-10 ms).

Status: compiled and checked on the CPU (float64 reference over whole epochs, partial batch and
cut block included, planted bugs), not yet run on a GPU.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from typing import NamedTuple

import torch

from fasttrain.ladder.common import CLASSES, IN_FEATURES, batches
from fasttrain.ladder.torch_compiled import check_aligned, compiled
from fasttrain.ladder.torch_optimized import EpochState, X, shuffle, sum_loss

GRAM_K = 792  # [pixels (784) | 255 | 0 (7)]: bf16 rows of 16-byte multiples for cuBLAS
PIXEL_MAX = 255


class LaggedStep(NamedTuple):
    """A step's fixed views: its logits from W_b (P's rows), the Grams against the block's earlier
    rows (None for the block's first step) and those rows' g, where it writes."""

    p: torch.Tensor  # [nb, 10]
    gram: torch.Tensor | None  # [nb, j·B]: raw Γ̃ = 255² x_t · x_i
    g_prev: torch.Tensor | None  # [j·B, 10]
    z: torch.Tensor  # [nb, 10]
    neg_onehot: torch.Tensor  # [nb, 10]
    logp: torch.Tensor  # [nb, 10]: the epoch's log-prob buffer's slice
    g: torch.Tensor  # [nb, 10]: the block's G buffer's slice


class Block(NamedTuple):
    x: torch.Tensor  # [m, 785] the block's rows (of the shuffled rows)
    p: torch.Tensor  # [m, 10]
    steps: list[LaggedStep]
    updates: list[tuple[torch.Tensor, torch.Tensor, float]]  # (gᵀ [10, k], x [k, 785], -lr/nb)


def block_spans(n: int, batch_size: int, lag: int) -> list[tuple[int, int]]:
    """(start, stop) rows of every block of `lag` steps; the last one cut by the epoch's end."""
    if lag < 1:
        raise ValueError(f"lag {lag}: steps a block, ≥ 1")
    span = lag * batch_size
    return [(a, min(a + span, n)) for a in range(0, n, span)]


class Lagged:
    """The lagged steps' buffers beside an EpochState's: pixel rows, the epoch's Grams, P, G."""

    def __init__(self, s: EpochState, batch_size: int, lag: int):
        n, dev = len(s.rows), s.rows.device
        self.s, self.lag, self.batch_size = s, lag, batch_size
        self.spans = block_spans(n, batch_size, lag)
        self.span = span = lag * batch_size
        # bf16 where a bf16 GEMM can store fp32 (CUDA); fp32 elsewhere: both hold the integers
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        self.pixels = torch.zeros(n, GRAM_K, dtype=dtype, device=dev)
        self.pixels[:, :IN_FEATURES] = s.pixels.to(dtype)
        self.pixels[:, IN_FEATURES] = PIXEL_MAX  # the bias's 1, times 255
        # the epoch's pixel rows in visiting order, padded with zero rows to whole blocks
        self.shuffled = torch.zeros(len(self.spans) * span, GRAM_K, dtype=dtype, device=dev)
        self.grams = torch.empty(len(self.spans), span, span, device=dev)
        self.p = torch.empty(span, CLASSES, device=dev)
        self.g = torch.zeros(span, CLASSES, device=dev)
        # the correction's step size: every earlier step of a block is a full batch
        self.c = -s.lr / (batch_size * PIXEL_MAX**2)
        self.blocks = [self._block(i, a, b) for i, (a, b) in enumerate(self.spans)]

    def _block(self, i: int, a: int, b: int) -> Block:
        s, m = self.s, b - a
        x = s.shuffled[a:b, :X]
        p, steps, updates = self.p[:m], [], []
        for lo, hi in batches(m, self.batch_size):
            gram = self.grams[i, lo:hi, :lo] if lo else None
            steps.append(LaggedStep(p[lo:hi], gram, self.g[:lo] if lo else None,
                                    s.z[: hi - lo], s.shuffled[a + lo : a + hi, X : X + CLASSES],
                                    s.logp[a + lo : a + hi], self.g[lo:hi]))
        full = m - m % self.batch_size if b == len(s.rows) else m  # only the last batch is partial
        for lo, hi in ((0, full), (full, m)):
            if hi > lo:
                updates.append((self.g[lo:hi].T, x[lo:hi], -s.lr / min(self.batch_size, hi - lo)))
        return Block(x, p, steps, updates)

    def make_grams(self, order: torch.Tensor) -> None:
        """Every block's Γ̃ [LB, LB] of the epoch (`order` int64 [N]): one gather, one GEMM."""
        n = len(self.s.rows)
        torch.index_select(self.pixels, 0, order, out=self.shuffled[:n])
        x = self.shuffled.view(len(self.spans), self.span, GRAM_K)
        if x.dtype == torch.bfloat16:
            with fp32_reductions():
                torch.bmm(x, x.transpose(1, 2), out_dtype=torch.float32, out=self.grams)
        else:
            torch.bmm(x, x.transpose(1, 2), out=self.grams)


@contextmanager
def fp32_reductions():
    """cuBLAS's bf16 GEMMs with no reduced-precision (bf16) split-K reduction, restored after."""
    m = torch.backends.cuda.matmul
    before = m.allow_bf16_reduced_precision_reduction
    m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_bf16_reduced_precision_reduction = before


@torch.inference_mode()
def train_blocks(s: EpochState, lg: Lagged) -> None:
    """The epoch's lagged steps in eager aten ops, in place (as torch_optimized.train_steps)."""
    mm, addmm, log_softmax, log_softmax_bw, update = (
        torch.mm, torch.addmm, torch._log_softmax, torch._log_softmax_backward_data, s.w.addmm_)
    wt, c, f32 = s.wt, lg.c, torch.float32
    for x, p, steps, updates in lg.blocks:
        mm(x, wt, out=p)
        for p_t, gram, g_prev, z, neg_onehot, logp, g in steps:
            z = addmm(p_t, gram, g_prev, alpha=c, out=z) if gram is not None else p_t
            log_softmax(z, 1, False, out=logp)
            log_softmax_bw(neg_onehot, logp, 1, f32, out=g)
        for gt, xs, alpha in updates:
            update(gt, xs, alpha=alpha)


def eager_epoch_fn(s: EpochState, batch_size: int, lag: int):
    """The epoch the graph captures, `epoch(order)`: shuffle, Grams, lagged steps, loss sum."""
    lg = Lagged(s, batch_size, lag)

    @torch.no_grad()
    def epoch(order):
        shuffle(s, order)
        lg.make_grams(order)
        train_blocks(s, lg)
        sum_loss(s)

    return epoch


def _lse(zs):
    m = functools.reduce(torch.maximum, zs)
    return m + torch.log(sum(torch.exp(z - m) for z in zs))


def block_fused(rows, gram, g_buf, w, loss, lr, batch_size, n_full):
    """One block of lagged steps in torch_compiled's "classes" form, for torch.compile: rows
    [m, 800] (its shuffled rows), gram [m, m] (its Γ̃), g_buf [m, 10] the block's g (scratch:
    each step stores its g there and the later steps read it: a buffer Inductor's kernels store
    into and load from, where a torch.cat of the steps' g would be copy kernels of its own), W
    [10, 785] updated in place, the rows' loss -log p(label) stored into `loss` [m]; n_full: its
    rows of full batches (the rest is the epoch's partial batch, its update's own step size)."""
    x, neg_onehot = rows[:, :X], rows[:, X : X + CLASSES]
    ps = [(x * w[c]).sum(1) for c in range(CLASSES)]  # P = X W_bᵀ, one reduction a class
    c_gram = -lr / (batch_size * PIXEL_MAX**2)
    for lo, hi in batches(x.shape[0], batch_size):  # unrolled: one graph a block length
        zs = [p[lo:hi] for p in ps]
        if lo:  # 10 reductions over the block's earlier rows, the same ranges: one kernel
            gr, prev = gram[lo:hi, :lo], g_buf[:lo]
            zs = [z + c_gram * (gr * prev[:, c]).sum(1) for c, z in enumerate(zs)]
        lse = _lse(zs)
        g_buf[lo:hi].copy_(torch.stack([torch.exp(z - lse) + neg_onehot[lo:hi, c]
                                        for c, z in enumerate(zs)], 1))
        loss[lo:hi].copy_(lse + sum(z * neg_onehot[lo:hi, c] for c, z in enumerate(zs)))
    scale = torch.full((x.shape[0], 1), -lr / batch_size, device=x.device)
    if n_full < x.shape[0]:
        scale[n_full:] = -lr / (x.shape[0] - n_full)
    w.add_(((g_buf * scale)[:, :, None] * x[:, None, :]).sum(0))  # bcast's update reduction


def fused_epoch_fn(s: EpochState, batch_size: int, lag: int, mode=None, backend="inductor",
                   pdl: bool = False):
    """"lagged-fused"'s epoch: the Grams eagerly, then one compiled call a block."""
    lg = Lagged(s, batch_size, lag)
    block, lr, n = compiled(block_fused, mode, backend, pdl), s.lr, len(s.rows)
    loss = torch.empty(n, device=s.rows.device)
    views = []
    for i, (a, b) in enumerate(lg.spans):
        n_full = (b - a) - (b - a) % batch_size if b == n else b - a
        views.append((s.shuffled[a:b], lg.grams[i, : b - a, : b - a], lg.g[: b - a], loss[a:b],
                      n_full))
    check_aligned([s.w, *(t for v in views for t in v[:4])])

    @torch.no_grad()
    def epoch(order):
        shuffle(s, order)
        lg.make_grams(order)
        for rows, gram, g_buf, loss_out, n_full in views:
            block(rows, gram, g_buf, s.w, loss_out, lr, batch_size, n_full)
        s.loss_sum.add_(loss.sum())

    return epoch


def fused_kernels(lag: int) -> int:
    """Inductor's kernels for a fused block of `lag` full batches (its Triton code read on the CPU,
    torch 2.13): P's reduction, step 0's softmax, one reduction a later step (its correction with
    the softmax, g and the loss fused in), two pointwise copies Inductor defers to the block's end
    (stores of the loss and g), W's update reduction."""
    return lag + 4

"""`triton-fused`: each SGD step is ONE Triton kernel — gather of the batch's uint8 pixels,
logits, softmax, loss and accuracy, weight gradient and update — spread over SPLITS programs
(one per SM), and an epoch's 470 launches are captured once as a CUDA graph and replayed, so no
Python and no host sits between steps.

- The work is split over pixels (K): program j owns weight columns [64j, 64j + 64) of every class
  and updates them from its own pixels, so the update needs no reduction across programs; only
  the logits do. Program j therefore writes a *partial* logit block `x[:, cols_j] @ W[:, cols_j]ᵀ`
  ([B, 16] fp32, program 0 adds the bias), and the next launch — the kernel boundary is the only
  grid-wide barrier Triton offers — sums the SPLITS partials in a fixed order (deterministic,
  identical in every program), takes softmax, loss, accuracy and dL/dz, updates its columns, and
  computes the next step's partial logits with the columns it has just updated, still in
  registers. Step s's kernel thus also does step s+1's forward; one extra launch per epoch
  computes step 0's logits. Partials are double-buffered (step s reads one, writes the other).
- The bias and the loss/accuracy sums belong to program 0 alone (only it reads or writes them).
- Pixels stay uint8 (a quarter of float32's bytes); the 1/255 scale is folded into the logits and
  the gradient. fp32 everywhere: `tl.dot(..., input_precision="ieee")` (FMA, no tensor cores),
  never TF32, so the weights match the float64 reference to float32 rounding.
- Loss and accuracy are summed on the device and read every 10 epochs.

Per step and program: 8 KB of gathered pixels for this step and 8 KB for the next, 2.5 KB of
weights, SPLITS × 8 KB of partial logits from L2; 2 × 128 × 64 × 16 FMA.

Versions (the winner is wired in): v1 one launch per step from Python (launch-bound: ~20-40 µs of
Python per launch); v2 one single-program persistent launch per epoch (H100, 2026-11-26:
67.5 ms/epoch = 144 µs/step: one SM walked 2 × 49 dependent K-chunks of gathered loads a step,
~1.5 µs of memory latency each); v3 (this file) SPLITS programs per step, one kernel per step,
the epoch replayed from a CUDA graph: H100, 2026-11-26, 4.70 ms/epoch = 10.0 µs/step with 64 pixels
a program, 8 warps, ieee; the sweep of 2026-11-27 made 32 pixels the DEFAULT (3.81 ms/epoch).
`benchmarks/variant_sweep.py` times every Variant in SWEEP (pixels a program, warps, dot precision)
against it, to pick the next default. Variant(pdl=True): v3 launched with programmatic dependent
launch, each step's kernel gathering its batches while the one before ends (compiled and checked
on the CPU, not yet run on a GPU: docs/measurements/programmatic-dependent-launch.md).
Sources: v2's figure is the first H100 loan's bench,
benchmarks/results/2026-11-26-nvidia-h100-80gb-hbm3.json; v3's the second loan's (the same name
with -run2); v1's was measured by hand, output not kept.

Tested on the CPU under Triton's interpreter (TRITON_INTERPRET=1, set before triton is imported).

Run alone:  python -m fasttrain bench --impl triton-fused
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: the row reports itself unavailable
    triton = None

READ_LOSS_EVERY = 10
BLOCK_C = 16  # classes padded to tl.dot's minimum dimension


@dataclass(frozen=True)
class Variant:
    """How a step is cut and computed. block_k: pixels a program (784 / block_k programs a
    step): smaller blocks mean less FMA a program but more partial logits for every program to
    read (SPLITS × 8 KB from L2 a step). num_warps: ptxas, sm_90a, block_k 64: 4 warps spill
    1.2 KB a thread, 8 warps 120 bytes. precision: tl.dot's input_precision, "ieee" (exact fp32
    FMA) or "tf32x3" (fp32 emulated on tensor cores, about as accurate; checked against float64
    like every row)."""

    block_k: int = 64
    num_warps: int = 8
    precision: str = "ieee"
    pdl: bool = False  # programmatic dependent launch (Hopper+): see sgd_step_kernel

    @property
    def splits(self) -> int:
        return -(-IN_FEATURES // self.block_k)

    @property
    def dw_by_class(self) -> bool:
        """Compute the weight gradient as (gᵀ x)ᵀ, M = 16 classes, instead of xᵀ g, M = block_k
        pixels. Only where xᵀ g would go to wgmma (tensor cores, block_k ≥ 64) with more warps
        than its rows fill (16 rows a warp): ptxas 12.8 miscompiles that chain (the note
        under SWEEP). The same products and sums: bit-identical under the interpreter on the
        tests' data."""
        return self.precision != "ieee" and 64 <= self.block_k < 16 * self.num_warps

    @property
    def tag(self) -> str:
        return f"{self.block_k}, {self.num_warps}w, {self.precision}" + (", pdl" if self.pdl
                                                                          else "")

    def __str__(self) -> str:
        return (f"{self.block_k} pixels a program, {self.num_warps} warps, {self.precision}"
                + (", programmatic dependent launch" if self.pdl else ""))


# The row's: the fastest of SWEEP on an H100 (2026-11-27: 3.81 ms/epoch, 64 pixels 4.72).
DEFAULT = Variant(block_k=32)
SWEEP = (
    # Not yet run on a GPU, first (benchmarks/variant_sweep.py runs a row's SWEEP in this
    # order): the fastest cuts with programmatic dependent launch.
    *(Variant(k, w, "ieee", pdl=True) for k, w in ((32, 8), (32, 4), (64, 8))),
    *(Variant(k, w, p) for k in (32, 64, 128) for w in (4, 8) for p in ("ieee", "tf32x3")))
# [64, 8w, tf32x3] raised "illegal memory access" on the H100 and H200 loans (2026-11-27, Triton
# 3.6.0). compute-sanitizer: a 512-byte __shared__ read at sgd_step_kernel+0x7cc0, out of bounds.
# Compiled here ahead of time for sm_90a with the launch's specialization, +0x7cc0 is the second
# HGMMA.64x16x8 of the forward dot (B = 8 × 16 fp32 = 512 bytes), and ptxas 12.8 (Triton 3.6's
# own) builds its shared-memory descriptor from R1, the stack pointer, not from the shared base
# the PTX gives (`bfe.u32 …, global_smem, 4, 14`); ptxas 13.0 compiles the same PTX correctly.
# A ptxas fault, triggered by what only this variant has: the update dot xᵀg on 64 rows with 8
# warps, lowered as two warpgroups of m64n8 wgmma that hold copies, chained into the forward
# dot. Not a shared-memory overrun: the kernel plans 16 KB (Triton's metadata `shared`).
# Variant.dw_by_class computes that update the other way round for such variants; the
# other 11 compile to the same SASS as before (tests/ladder/test_triton_fused_sass.py checks
# that no variant's SASS reads a descriptor from R1).

if triton is not None:

    @triton.jit
    def sgd_step_kernel(x_ptr, y_ptr, order_ptr, w_ptr, b_ptr, z_in_ptr, z_out_ptr, stats_ptr,
                        cur, n_cur, nxt, n_nxt, lr,
                        K: tl.constexpr, C: tl.constexpr, SPLITS: tl.constexpr,
                        BLOCK_B: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr,
                        UPDATE: tl.constexpr, PREC: tl.constexpr,
                        DW_BY_CLASS: tl.constexpr, PDL: tl.constexpr):
        """Program j of one step. With UPDATE: the SGD step on batch `order[cur : cur + n_cur]`
        from the partial logits z_in [SPLITS, BLOCK_B, BLOCK_C], in place on columns j of
        w [C, K] (and, program 0, on b [C] and stats fp32 [2] += (loss sum, correct)). Always:
        partial logits of batch `order[nxt : nxt + n_nxt]` with the (updated) columns → z_out.
        x uint8 [N, K], y int64 [N], order int64 [N].

        PDL (launched with programmatic dependent launch): each program gathers its batches'
        indices, labels and pixels, which no step writes, then waits (griddepcontrol.wait: the
        grid before complete, its stores visible) before it touches what a step writes (W, b,
        the partials, stats), then lets the next step's kernel launch: its programs (on other
        SMs: SPLITS of 132) gather their batches while this one computes. Every program waits,
        so a grid completes only after the one before it (the double-buffered partials keep
        their order), and the next launches only once this one's wait is over, so at most two
        grids are resident, not a cascade of waiting ones."""
        pid = tl.program_id(0)
        first = pid == 0
        rows = tl.arange(0, BLOCK_B)
        cls = tl.arange(0, BLOCK_C)
        cmask = cls < C
        ks = pid * BLOCK_K + tl.arange(0, BLOCK_K)
        kmask = ks < K
        inv255 = 1.0 / 255.0
        zoffs = rows[:, None] * BLOCK_C + cls[None, :]  # [BLOCK_B, BLOCK_C] in a partial
        wt_ptr = w_ptr + cls[None, :] * K + ks[:, None]  # this program's columns, as Wᵀ
        wt_mask = kmask[:, None] & cmask[None, :]
        # pid == 0 as a [BLOCK_C] block, not a scalar and'ed into one: the same lanes, but
        # Triton's interpreter types a splatted scalar comparison int32, a mask 3.9 rejects.
        bmask = cmask & ((tl.zeros_like(cls) + pid) == 0)
        # The batches' indices, labels and pixels do not depend on any step: issue their loads
        # first (with PDL, before the wait for the step before).
        nmask = rows < n_nxt
        nidx = tl.load(order_ptr + nxt + rows, mask=nmask, other=0)
        xn = tl.load(x_ptr + nidx[:, None] * K + ks[None, :],
                     mask=nmask[:, None] & kmask[None, :], other=0).to(tl.float32)
        if UPDATE:
            rmask = rows < n_cur
            idx = tl.load(order_ptr + cur + rows, mask=rmask, other=0)
            y = tl.load(y_ptr + idx, mask=rmask, other=0)
            xb = tl.load(x_ptr + idx[:, None] * K + ks[None, :],
                         mask=rmask[:, None] & kmask[None, :], other=0).to(tl.float32)
        if PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        wt = tl.load(wt_ptr, mask=wt_mask, other=0.0)  # [BLOCK_K, BLOCK_C]
        b = tl.load(b_ptr + cls, mask=bmask, other=0.0)  # program 0 only; 0 elsewhere
        if UPDATE:
            # This step's logits: the sum of every program's partial, in a fixed order.
            z = tl.load(z_in_ptr + zoffs)
            for j in range(1, SPLITS):
                z += tl.load(z_in_ptr + j * BLOCK_B * BLOCK_C + zoffs)
            z = tl.where(cmask[None, :], z, float("-inf"))
            # Softmax, loss, accuracy; rows past the batch end (the last partial batch) masked.
            zmax = tl.max(z, axis=1)
            e = tl.exp(z - zmax[:, None])
            se = tl.sum(e, axis=1)
            onehot = cls[None, :] == y[:, None]
            zy = tl.sum(tl.where(onehot, z, 0.0), axis=1)
            loss = tl.sum(tl.where(rmask, tl.log(se) + zmax - zy, 0.0), axis=0)
            correct = tl.sum(tl.where(rmask & (zy == zmax), 1.0, 0.0), axis=0)
            tl.store(stats_ptr, tl.load(stats_ptr, mask=first, other=0.0) + loss, mask=first)
            tl.store(stats_ptr + 1, tl.load(stats_ptr + 1, mask=first, other=0.0) + correct,
                     mask=first)
            # d(mean loss)/dz with the learning rate folded in: lr * (softmax - onehot) / nb.
            g = e / se[:, None] - tl.where(onehot, 1.0, 0.0)
            g = tl.where(rmask[:, None] & cmask[None, :], g, 0.0) * (lr / n_cur)
            # Wᵀ[cols_j] -= x[:, cols_j]ᵀ g / 255, b -= Σ_rows g: no other program touches them.
            if DW_BY_CLASS:  # the same sums as (gᵀ x)ᵀ: see Variant.dw_by_class
                dwt = tl.trans(tl.dot(tl.trans(g), xb, input_precision=PREC))
            else:
                dwt = tl.dot(tl.trans(xb), g, input_precision=PREC)
            wt = wt - dwt * inv255
            tl.store(wt_ptr, wt, mask=wt_mask)
            b = tl.where(bmask, b - tl.sum(g, axis=0), 0.0)
            tl.store(b_ptr + cls, b, mask=bmask)
        # The next step's partial logits from the columns just updated (still in registers).
        zp = tl.dot(xn, wt, input_precision=PREC) * inv255 + b[None, :]
        tl.store(z_out_ptr + pid * BLOCK_B * BLOCK_C + zoffs, zp)


    # Triton's interpreter (TRITON_INTERPRET=1 when the kernel was defined) runs it as Python.
    INTERPRETED = type(sgd_step_kernel).__name__ == "InterpretedFunction"


def block_b(batch: int) -> int:
    if batch > 128:
        raise ValueError(f"triton-fused keeps a batch in one program: batch ≤ 128, got {batch}")
    return max(16, triton.next_power_of_2(batch))


def launch(x, y, order, w, b, z_in, z_out, stats, cur, n_cur, nxt, n_nxt, lr, update,
           v: Variant = DEFAULT):
    """One step (update=True) or the epoch's first forward (update=False): v.splits programs.
    Under Triton's interpreter a PDL variant runs without it (no grids overlap there, and its
    inline PTX does not run): the same loads and arithmetic."""
    pdl = v.pdl and not INTERPRETED
    sgd_step_kernel[(v.splits,)](x, y, order, w, b, z_in, z_out, stats, cur, n_cur, nxt, n_nxt,
                                 lr, K=IN_FEATURES, C=CLASSES, SPLITS=v.splits,
                                 BLOCK_B=z_in.shape[1], BLOCK_K=v.block_k, BLOCK_C=BLOCK_C,
                                 UPDATE=update, PREC=v.precision,
                                 DW_BY_CLASS=v.dw_by_class, PDL=pdl, num_warps=v.num_warps,
                                 **({"launch_pdl": True} if pdl else {}))


def partials(batch: int, device, v: Variant = DEFAULT) -> torch.Tensor:
    """The double-buffered partial logits: fp32 [2, v.splits, BLOCK_B, BLOCK_C]."""
    return torch.zeros(2, v.splits, block_b(batch), BLOCK_C, device=device)


def sgd_epoch(x, y, order, w, b, z, stats, batch: int, lr: float, v: Variant = DEFAULT) -> int:
    """One epoch in `order` (int64 [N]) on tensors of any device Triton runs on: the launch
    sequence that CUDA graphs capture. z: `partials(batch, device, v)`. Returns the number of
    launches."""
    n = len(order)
    starts = list(range(0, n, batch))
    size = [min(batch, n - s) for s in starts]
    launch(x, y, order, w, b, z[1], z[0], stats, 0, 0, 0, size[0], lr, False, v)
    for i, s in enumerate(starts):  # step i reads partials i % 2, writes (i + 1) % 2
        last = i + 1 == len(starts)
        launch(x, y, order, w, b, z[i % 2], z[(i + 1) % 2], stats, s, size[i],
               0 if last else starts[i + 1], 0 if last else size[i + 1], lr, True, v)
    return len(starts) + 1


class TritonFused(Impl):
    name = "triton-fused"
    device = "cuda"
    variant = DEFAULT  # benchmarks/variant_sweep.py sets another on a subclass

    @classmethod
    def unavailable(cls, env, cfg):
        if triton is None:
            return "triton is not installed"
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if cfg.batch_size > 128:
            return f"one program holds a batch of at most 128 samples, not {cfg.batch_size}"
        return None

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        dev = torch.device("cuda")
        self.x = torch.from_numpy(data.train_x).to(dev)  # uint8 [N, 784]
        self.y = torch.from_numpy(data.train_y).to(dev)
        self.orders = torch.from_numpy(data.orders).to(dev)
        self.order = self.orders[0].clone()  # the graph's static order buffer
        self.w = torch.from_numpy(data.w0).to(dev).contiguous()
        self.b = torch.from_numpy(data.b0).to(dev)
        v = self.variant
        self.z = partials(cfg.batch_size, dev, v)
        self.stats = torch.zeros(2, device=dev)
        # Compile every specialization (Triton specializes integer arguments on == 1 and
        # multiples of 16) with a whole epoch on scratch weights, on a side stream, then capture
        # the epoch's launches on the real buffers (capturing runs nothing).
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            sgd_epoch(self.x, self.y, self.order, self.w.clone(), self.b.clone(), self.z,
                      self.stats.clone(), cfg.batch_size, cfg.lr, v)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.launches = sgd_epoch(self.x, self.y, self.order, self.w, self.b, self.z,
                                      self.stats, cfg.batch_size, cfg.lr, v)
        self.epochs_summed = 0

    def train_epoch(self, epoch: int) -> float | None:
        self.order.copy_(self.orders[epoch])  # device to device, stream-ordered
        self.graph.replay()
        self.epochs_summed += 1
        if (epoch + 1) % READ_LOSS_EVERY and epoch + 1 != self.cfg.epochs:
            return None
        mean = self.stats[0].item() / (self.data.n_train * self.epochs_summed)  # host read
        self.stats.zero_()
        self.epochs_summed = 0
        return mean

    def details(self) -> dict:
        v = self.variant
        return {"programs_per_step": v.splits, "block_k": v.block_k, "num_warps": v.num_warps,
                "dot_precision": v.precision, "dw_by_class": v.dw_by_class,
                "programmatic_dependent_launch": v.pdl,
                "launches_per_epoch": self.launches,
                "cuda_graph": True}

    def params(self):
        return self.w.cpu().numpy().copy(), self.b.cpu().numpy().copy()

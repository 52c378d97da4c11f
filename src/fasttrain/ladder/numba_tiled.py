"""`numba-tiled`: the CPU row aimed at the roofline — register-tiled, one barrier pair per step.

Where `numba-fused` lost its time (measured, 2-core EPYC): three Numba `prange` regions per step
(~1,400 fork/joins an epoch, each a few µs), and inner loops that load more than they compute
(one weight element per four FMAs in the forward, a load and a store of the gradient per FMA
group in the backward). This row keeps the cores in one parallel region for the whole epoch and
makes every inner loop FMA-bound:

- Persistent threads: thread t is a Python thread running one `nogil` compiled function for the
  whole epoch; the threads meet at a spin barrier (acquire/release flags, one cache line each)
  twice per step instead of forking and joining three times.
- Forward + softmax, samples split: thread t widens its half of the batch once (uint8 → fp32, into
  a shared buffer) and computes all ten logits of two samples at a time from five weight rows
  held across the K loop: a 2 × 5 tile, 10 accumulators, 7 loads per 10 FMAs.
- Weight gradient + update, classes split: thread t owns weight rows c0..c1 and adds
  −lr·dL/dW straight into them (no gradient buffer, no reduction: the forward of this step has
  finished on every core by the barrier), eight samples × one class per K loop: 9 loads,
  1 store, 8 FMAs, the eight rows staying in L1 across the classes.
- 1/255 is folded into the logits and into the update's coefficients.

Versions (one thread, ms of CPU time per epoch, MNIST, 2-core EPYC, best of 5-6; CPU time because
the machine was shared by a dozen processes while this was written — wall times were meaningless;
measured by hand, output not kept):
  v1  2 × 5 forward tile per sample pair over both class halves; 4 × 2 update tile      ~53
  v2  rows widened first, then each half of W (16 KB) stays in L1 across all pairs      ~47
  v3  next step's rows prefetched during the update (same-process A/B: 50 → 44.5)       ~45
  v4  update tile 8 samples × 1 class instead of 4 × 2 (alone: 54-65 vs 40-45 GFLOP/s
      in one process; whole epoch A/B: 46.2 → 42.6 best, 52.3 → 45.1 median). Same
      weights to the bit: both add the samples' terms to w[j, k] in sample order       ~43

Where the remaining time goes (one thread, ~43 ms; the ideal at the forward tile's rate is ~22):
forward tiles ~11-12 (measured alone at 79-85 GFLOP/s a core: at the FMA ceiling); update tiles
~15 (55-65 GFLOP/s: each w[j, k] takes a dependent chain of 8 FMAs, and 9 loads per 8 FMAs);
softmax ~3.4 (scalar expf, 600k an epoch; a polynomial exp written for Numba ran slower, not
vectorized); gather, widening and bias ~8.5; tile reductions and loop overhead the rest. With two
threads each does half, plus 938 barriers and 200 KB of widened rows crossing cores per step.

Run alone:  python -m fasttrain bench --impl numba-tiled
"""

from __future__ import annotations

import threading

import numpy as np

from fasttrain.ladder.common import CLASSES, Impl, LadderConfig, LadderData
from fasttrain.peaks import cpu_threads

try:
    import numba
    from llvmlite import ir
    from numba import njit, types
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # optional: the row reports itself unavailable
    numba = None

FLAG_STRIDE = 16  # int64s per barrier flag: one 128-byte slot each, so flags never share a line
SPINS_BEFORE_YIELD = 2000  # on a shared machine a waiting core gives its slice away eventually
PREFETCH_AHEAD = 6  # rows

if numba is not None:

    def _flag_pointer(context, builder, sig, args):
        arr = context.make_array(sig.args[0])(context, builder, args[0])
        return cgutils.get_item_pointer(context, builder, sig.args[0], arr, [args[1]])

    @intrinsic
    def store_release(typingctx, flags, idx, value):
        """flags[idx] = value with release order: every write before it is visible first."""

        def codegen(context, builder, sig, args):
            builder.store_atomic(args[2], _flag_pointer(context, builder, sig, args), "release", 8)
            return context.get_dummy_value()

        return types.void(flags, idx, types.int64), codegen

    @intrinsic
    def load_acquire(typingctx, flags, idx):
        """flags[idx] with acquire order: what the writer did before its release is visible."""

        def codegen(context, builder, sig, args):
            return builder.load_atomic(_flag_pointer(context, builder, sig, args), "acquire", 8)

        return types.int64(flags, idx), codegen

    @intrinsic
    def spin_pause(typingctx):
        """One `pause` (tells the core it is spinning), every SPINS_BEFORE_YIELD a sched_yield."""

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(), codegen

    @intrinsic
    def sched_yield(typingctx):
        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
            builder.call(fn, [])
            return context.get_dummy_value()

        return types.void(), codegen

    # The same software prefetch of a shuffled row as the fused row's.
    from fasttrain.ladder.numba_fused import prefetch_row


def _barrier(flags, t, n_threads, generation):
    """Wait until every thread has arrived at `generation` (flags only grow within an epoch)."""
    store_release(flags, t * FLAG_STRIDE, generation)
    for u in range(n_threads):
        spins = 0
        while load_acquire(flags, u * FLAG_STRIDE) < generation:
            spin_pause()
            spins += 1
            if spins == SPINS_BEFORE_YIELD:
                sched_yield()
                spins = 0


def _forward(x, y, order, w, b, xf, dz, start, nb, i0, i1, inv255, scale):
    """Logits, softmax and loss of samples i0..i1 of the batch; writes their widened rows to xf
    and (p − onehot)/nb to dz; returns their summed loss."""
    n, k_in = order.shape[0], x.shape[1]
    for i in range(i0, i1):  # widen my rows once; they stay in L2 for both phases
        if start + i + PREFETCH_AHEAD < n:  # shuffled rows: DRAM latency hides behind 6 rows
            prefetch_row(x, order[start + i + PREFETCH_AHEAD])
        r, xr = xf[i], x[order[start + i]]
        for k in range(k_in):
            r[k] = np.float32(xr[k])
    for h in range(0, CLASSES, 5):  # five weight rows (16 KB) stay in L1 for every pair
        w0, w1, w2, w3, w4 = w[h], w[h + 1], w[h + 2], w[h + 3], w[h + 4]
        for i in range(i0, i1, 2):
            ia, ib = i, min(i + 1, i1 - 1)  # an odd last sample pairs with itself
            ra, rb = xf[ia], xf[ib]
            a0 = a1 = a2 = a3 = a4 = np.float32(0.0)
            c0 = c1 = c2 = c3 = c4 = np.float32(0.0)
            for k in range(k_in):  # 2 × 5 tile: 7 loads, 10 FMAs
                u, v = ra[k], rb[k]
                a0 += u * w0[k]
                a1 += u * w1[k]
                a2 += u * w2[k]
                a3 += u * w3[k]
                a4 += u * w4[k]
                c0 += v * w0[k]
                c1 += v * w1[k]
                c2 += v * w2[k]
                c3 += v * w3[k]
                c4 += v * w4[k]
            za, zb = dz[ia], dz[ib]
            za[h], za[h + 1], za[h + 2], za[h + 3], za[h + 4] = a0, a1, a2, a3, a4
            zb[h], zb[h + 1], zb[h + 2], zb[h + 3], zb[h + 4] = c0, c1, c2, c3, c4
    loss = 0.0
    for i in range(i0, i1):
        z = dz[i]
        label = y[order[start + i]]
        for j in range(CLASSES):
            z[j] = z[j] * inv255 + b[j]
        zmax = z[0]
        for j in range(1, CLASSES):
            zmax = max(zmax, z[j])
        total = np.float32(0.0)
        zy = z[label]
        for j in range(CLASSES):
            z[j] = np.exp(z[j] - zmax)
            total += z[j]
        loss += np.log(total) + zmax - zy
        for j in range(CLASSES):
            z[j] = (z[j] / total - np.float32(j == label)) * scale
    return loss


def _update(w, b, xf, dz, nb, c0, c1, coef, x, ahead):
    """w[c0:c1] += coef · dzᵀ @ xf (coef = −lr/255) and the bias alike: this step's SGD update of
    the classes this thread owns, eight samples per pass over K (a sample past nb adds zero).
    Meanwhile the rows `x[ahead]` this thread widens next step are prefetched, four per pass, so
    that next step's forward finds them in cache instead of waiting on DRAM."""
    k_in = xf.shape[1]
    n_ahead = ahead.shape[0]
    zero = np.float32(0.0)
    for j in range(c0, c1):
        acc = zero
        for i in range(nb):
            acc += dz[i, j]
        b[j] += coef * np.float32(255.0) * acc
    last = nb - 1
    for i in range(0, nb, 8):
        for q in range(i // 2, min(i // 2 + 4, n_ahead)):
            prefetch_row(x, ahead[q])
        r0, r1, r2, r3 = xf[i], xf[min(i + 1, last)], xf[min(i + 2, last)], xf[min(i + 3, last)]
        r4, r5 = xf[min(i + 4, last)], xf[min(i + 5, last)]
        r6, r7 = xf[min(i + 6, last)], xf[min(i + 7, last)]
        for j in range(c0, c1):  # eight rows (25 KB) stay in L1 across my classes
            wj = w[j]
            a0 = dz[i, j] * coef
            a1 = dz[i + 1, j] * coef if i + 1 < nb else zero
            a2 = dz[i + 2, j] * coef if i + 2 < nb else zero
            a3 = dz[i + 3, j] * coef if i + 3 < nb else zero
            a4 = dz[i + 4, j] * coef if i + 4 < nb else zero
            a5 = dz[i + 5, j] * coef if i + 5 < nb else zero
            a6 = dz[i + 6, j] * coef if i + 6 < nb else zero
            a7 = dz[i + 7, j] * coef if i + 7 < nb else zero
            for k in range(k_in):  # 8 × 1 tile: 9 loads, 1 store, 8 FMAs
                wj[k] += (a0 * r0[k] + a1 * r1[k] + a2 * r2[k] + a3 * r3[k]
                          + a4 * r4[k] + a5 * r5[k] + a6 * r6[k] + a7 * r7[k])


def _epoch_part(t, n_threads, x, y, order, w, b, lr, batch_size, xf, dz, flags, loss_out):
    """Thread t's share of one epoch. xf float32 [batch, 784] (widened rows) and dz float32
    [batch, 10] (logits, then their gradient) are shared; flags int64 [n_threads * FLAG_STRIDE]
    start at zero; loss_out float64 [n_threads] receives this thread's summed loss."""
    n = order.shape[0]
    inv255 = np.float32(1.0 / 255.0)
    coef = -np.float32(lr) * inv255
    c0, c1 = CLASSES * t // n_threads, CLASSES * (t + 1) // n_threads
    loss = 0.0
    generation = 0
    for start in range(0, n, batch_size):
        nb = min(batch_size, n - start)
        i0, i1 = nb * t // n_threads, nb * (t + 1) // n_threads
        # the barrier that closed the last step's update lets every core read every weight row
        loss += _forward(x, y, order, w, b, xf, dz, start, nb, i0, i1, inv255,
                         np.float32(1.0 / nb))
        generation += 1
        _barrier(flags, t, n_threads, generation)  # every sample's rows and dz are written
        nxt = min(start + batch_size, n)  # next step's rows of this thread
        nnb = min(batch_size, n - nxt)
        ahead = order[nxt + nnb * t // n_threads: nxt + nnb * (t + 1) // n_threads]
        _update(w, b, xf, dz, nb, c0, c1, coef, x, ahead)
        generation += 1
        _barrier(flags, t, n_threads, generation)  # every weight row is updated
    loss_out[t] = loss


if numba is not None:
    _barrier = njit(inline="always", fastmath=True, cache=True)(_barrier)
    _forward = njit(fastmath=True, cache=True)(_forward)
    _update = njit(fastmath=True, cache=True)(_update)
    _epoch_part = njit(nogil=True, fastmath=True, cache=True)(_epoch_part)


def run_epoch(x, y, order, w, b, lr, batch_size, scratch) -> float:
    """Train one epoch in place on every thread of `scratch`; returns the mean loss."""
    xf, dz, flags, loss_out = scratch
    n_threads = len(loss_out)
    flags[:] = 0
    args = (n_threads, x, y, order, w, b, lr, batch_size, xf, dz, flags, loss_out)
    workers = [threading.Thread(target=_epoch_part, args=(t, *args)) for t in range(1, n_threads)]
    for th in workers:
        th.start()
    _epoch_part(0, *args)  # the calling thread is thread 0
    for th in workers:
        th.join()
    return float(loss_out.sum() / len(order))


def make_scratch(batch_size: int, n_threads: int):
    return (np.zeros((batch_size, 784), np.float32),
            np.zeros((batch_size, CLASSES), np.float32),
            np.zeros(n_threads * FLAG_STRIDE, np.int64), np.zeros(n_threads, np.float64))


def threads_for(cores: int) -> int:
    """One thread per core this process may run on, at most one per class."""
    return max(1, min(CLASSES, cores))


class NumbaTiled(Impl):
    name = "numba-tiled"
    precision = "fp32, u8 input"

    @classmethod
    def unavailable(cls, env, cfg):
        return None if numba is not None else "numba is not installed (pip install numba)"

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.w, self.b = data.w0.copy(), data.b0.copy()
        self.threads = threads_for(cpu_threads())
        self.scratch = make_scratch(cfg.batch_size, self.threads)
        # JIT-compile now (setup time) on a one-step epoch of throw-away weights.
        run_epoch(data.train_x, data.train_y, data.orders[0][: cfg.batch_size], self.w.copy(),
                  self.b.copy(), cfg.lr, cfg.batch_size, self.scratch)

    def train_epoch(self, epoch: int) -> float:
        return run_epoch(self.data.train_x, self.data.train_y, self.data.orders[epoch], self.w,
                         self.b, self.cfg.lr, self.cfg.batch_size, self.scratch)

    def params(self):
        return self.w, self.b

    def details(self) -> dict:
        return {"threads": self.threads}

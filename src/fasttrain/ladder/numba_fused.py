"""`numba-fused`: beyond the report on the CPU — a whole epoch in one compiled function.

Why it can beat the GEMM floor: the pixels stay uint8 (a quarter of float32's bytes); a batch's
rows are gathered from DRAM once per step (with software prefetch, since shuffled rows defeat the
hardware prefetcher) and widened in groups of 4 into an L1-resident float buffer; each weight
element is loaded once per group of 4 samples; the 1/255 input scale is folded into the logits and
the gradient, so no scaled copy of the data exists.

The cores split the *classes*, not the batch: thread t owns weight rows c0..c1 for the whole run.
A step is three parallel phases — logits of every sample for my classes; softmax over half the
samples; gradient and update of my classes' rows — so weights and gradients never move between
cores and no reduction is needed (splitting the batch instead cost ~35% more: every step moved
both 31 KB gradient halves and the updated weights across cores).

Versions (the winner is wired in; epoch ms, MNIST-sized random data, 2-core EPYC, median of 7;
measured by hand as each version was written, output not kept):
  v1  per-sample fused forward/backward, one thread                          ~65
  v2  batch split across cores, per-thread gradients, reduce + update         ~39
  v3  classes split across cores, 3 phases per step, prefetch (this file)     ~29

Run alone:  python -m fasttrain bench --impl numba-fused
"""

from __future__ import annotations

import numpy as np

from fasttrain.ladder.common import Impl, LadderConfig, LadderData

try:
    import numba
    from llvmlite import ir
    from numba import njit, prange, types
    from numba.core import cgutils
    from numba.extending import intrinsic
except ImportError:  # optional: the row reports itself unavailable
    numba = None

ROW_BYTES = 784
CACHE_LINE = 64

if numba is not None:

    @intrinsic
    def prefetch_row(typingctx, array, row):
        """Ask the CPU to start loading the 784 bytes of array[row] (a software prefetch; it
        never faults and never waits). Shuffled rows defeat the hardware prefetcher: without
        this hint each group of samples stalls on DRAM latency (measured: the gather alone took
        ~13 ms of a 1-thread epoch, ~7 ms with the hint)."""

        def codegen(context, builder, sig, args):
            array_type = sig.args[0]
            arr = context.make_array(array_type)(context, builder, args[0])
            zero = context.get_constant(types.intp, 0)
            base = cgutils.get_item_pointer(context, builder, array_type, arr, [args[1], zero])
            i32 = ir.IntType(32)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), [base.type, i32, i32, i32]),
                "llvm.prefetch.p0",
            )
            for offset in range(0, ROW_BYTES, CACHE_LINE):  # read, keep in all levels, data
                line = builder.gep(base, [context.get_constant(types.intp, offset)])
                builder.call(fn, [line, i32(0), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(array, row), codegen


GROUP = 4  # samples that share each load of a weight element (register blocking)


def _epoch(x, y, order, w, b, lr, batch_size, z, gw, xbuf, loss_parts):
    """Train one epoch in place; returns its mean loss. x uint8 [N, 784]; y int64 [N]; order
    int64 [N]; w float32 [10, 784]; b float32 [10]. Scratch: z float32 [batch_size, 10] (the
    batch's logits, then d loss / d logits), gw float32 [10, 784], xbuf float32 [T, GROUP, 784],
    loss_parts float64 [T], where T is the number of threads."""
    n, k_in = order.shape[0], x.shape[1]
    n_threads, n_cls = xbuf.shape[0], w.shape[0]
    inv255 = np.float32(1.0 / 255.0)
    loss_parts[:] = 0.0
    for start in range(0, n, batch_size):
        nb = min(batch_size, n - start)
        scale = np.float32(1.0 / nb)
        # Phase A (classes split): logits of every sample for this thread's classes.
        for t in prange(n_threads):
            buf = xbuf[t]
            c0, c1 = n_cls * t // n_threads, n_cls * (t + 1) // n_threads
            for s0 in range(start, start + nb, GROUP):
                m = min(GROUP, start + nb - s0)
                for i in range(min(GROUP, n - s0 - GROUP)):  # the next group's rows
                    prefetch_row(x, order[s0 + GROUP + i])
                for i in range(m):  # widen once into an L1-resident float buffer
                    row = order[s0 + i]
                    for k in range(k_in):
                        buf[i, k] = np.float32(x[row, k])
                for j in range(c0, c1):  # each weight element loaded once for GROUP samples
                    a0 = a1 = a2 = a3 = np.float32(0.0)
                    for k in range(k_in):
                        wk = w[j, k]
                        a0 += wk * buf[0, k]
                        a1 += wk * buf[1, k]
                        a2 += wk * buf[2, k]
                        a3 += wk * buf[3, k]
                    zi = s0 - start
                    z[zi, j] = a0 * inv255 + b[j]
                    if m > 1:
                        z[zi + 1, j] = a1 * inv255 + b[j]
                    if m > 2:
                        z[zi + 2, j] = a2 * inv255 + b[j]
                    if m > 3:
                        z[zi + 3, j] = a3 * inv255 + b[j]
        # Phase B (samples split): softmax, loss, z <- (p - onehot) / B.
        for t in prange(n_threads):
            loss_t = 0.0
            for i in range(nb * t // n_threads, nb * (t + 1) // n_threads):
                label = y[order[start + i]]
                zmax = z[i, 0]
                for j in range(1, n_cls):
                    zmax = max(zmax, z[i, j])
                zy = z[i, label]
                total = np.float32(0.0)
                for j in range(n_cls):
                    z[i, j] = np.exp(z[i, j] - zmax)
                    total += z[i, j]
                loss_t += np.log(total) + zmax - zy
                for j in range(n_cls):
                    z[i, j] = (z[i, j] / total - np.float32(j == label)) * scale
            loss_parts[t] += loss_t
        # Phase C (classes split): weight gradient and update of this thread's rows.
        for t in prange(n_threads):
            buf = xbuf[t]
            c0, c1 = n_cls * t // n_threads, n_cls * (t + 1) // n_threads
            for j in range(c0, c1):
                acc_b = np.float32(0.0)
                for i in range(nb):
                    acc_b += z[i, j]
                b[j] -= lr * acc_b
            for s0 in range(start, start + nb, GROUP):
                m = min(GROUP, start + nb - s0)
                for i in range(GROUP):  # rows from L2 now; empty slots zeroed so they add nothing
                    if i < m:
                        row = order[s0 + i]
                        for k in range(k_in):
                            buf[i, k] = np.float32(x[row, k])
                    else:
                        for k in range(k_in):
                            buf[i, k] = 0.0
                zi = s0 - start
                for j in range(c0, c1):  # the 1/255 input scale folded into d
                    d0 = z[zi, j] * inv255
                    d1 = z[min(zi + 1, nb - 1), j] * inv255
                    d2 = z[min(zi + 2, nb - 1), j] * inv255
                    d3 = z[min(zi + 3, nb - 1), j] * inv255
                    for k in range(k_in):
                        gw[j, k] += (d0 * buf[0, k] + d1 * buf[1, k]
                                     + d2 * buf[2, k] + d3 * buf[3, k])
            for j in range(c0, c1):
                for k in range(k_in):
                    w[j, k] -= lr * gw[j, k]
                    gw[j, k] = 0.0
    return loss_parts.sum() / n


if numba is not None:
    _epoch = njit(parallel=True, fastmath=True, cache=True)(_epoch)


class NumbaFused(Impl):
    name = "numba-fused"

    @classmethod
    def unavailable(cls, env, cfg):
        return None if numba is not None else "numba is not installed (pip install numba)"

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        t = numba.get_num_threads()
        self.precision = "fp32, u8 input"
        self.w, self.b = data.w0.copy(), data.b0.copy()
        self.lr = np.float32(cfg.lr)
        self.scratch = (
            np.zeros((cfg.batch_size, 10), np.float32),
            np.zeros((10, 784), np.float32),
            np.zeros((t, GROUP, 784), np.float32),
            np.zeros(t, np.float64),
        )
        # JIT-compile now (setup time) on a one-sample epoch of throw-away weights.
        _epoch(data.train_x[:1], data.train_y[:1], np.zeros(1, np.int64), self.w.copy(),
               self.b.copy(), self.lr, 1, *self.scratch)

    def train_epoch(self, epoch: int) -> float:
        return float(_epoch(self.data.train_x, self.data.train_y, self.data.orders[epoch],
                            self.w, self.b, self.lr, self.cfg.batch_size, *self.scratch))

    def params(self):
        return self.w, self.b

"""This machine's ceilings: fp32 FMA throughput and memory bandwidth, measured; a GPU's, looked up.

The roofline row divides an epoch's work by these figures, so they are measured with the same
care as the rows: small compiled kernels, one thread per core running at once, several short
trials, each thread's rate taken over its own CPU time. The *fastest* trial is the figure (every
trial is kept in the JSON): interference from other work can only slow a microbenchmark down, so
the fastest trial is the closest to what the hardware can do, and a higher peak gives a lower,
more demanding floor.

- FMA: sixteen independent multiply-add chains, eight deep, per element of an L1-resident array
  (`p = p·v + c`), so more FMAs are ready each cycle than the 2 FMA pipes × 4 cycles of latency of
  current x86 cores can take. Only contraction into FMA is allowed (no reassociation, which would
  let the compiler shorten the chains). Measured on the 2-core EPYC this was written on: 16 × 8
  and 8 × 16 reach ~87 GFLOP/s a core, 10 × 8 only ~65 (too few chains in flight), and so does the
  ladder's best forward tile (~85): the chains are the ceiling, not an artefact of them.
- Bandwidth: each thread sums its own 64 MiB of float32 (far beyond the caches), read once.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from fasttrain.env import gpu_peaks

try:
    from numba import njit
except ImportError:  # the CPU figures need numba; without it the roofline row is unavailable
    njit = None

CHAINS = 16
DEPTH = 8
FMA_ELEMENTS = 256  # 1 KiB of float32 per thread: L1-resident
BW_BYTES = 64 * 2**20  # per thread; far beyond any L2/L3 slice a thread may use
TRIALS = 7


def _fma_chains(x, y, reps, c):
    for _ in range(reps):
        for k in range(x.shape[0]):
            v = x[k]
            p0, p1, p2, p3 = v + c[0], v + c[1], v + c[2], v + c[3]
            p4, p5, p6, p7 = v + c[4], v + c[5], v + c[6], v + c[7]
            p8, p9, p10, p11 = v + c[8], v + c[9], v + c[10], v + c[11]
            p12, p13, p14, p15 = v + c[12], v + c[13], v + c[14], v + c[15]
            # (read inside the loop: 16 broadcast constants + 16 chains would not fit the 16
            # vector registers; as memory operands they cost no FMA slot)
            c0, c1, c2, c3, c4, c5, c6, c7 = c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]
            c8, c9, c10, c11 = c[8], c[9], c[10], c[11]
            c12, c13, c14, c15 = c[12], c[13], c[14], c[15]
            for _ in range(DEPTH):
                p0, p1, p2, p3 = p0 * v + c0, p1 * v + c1, p2 * v + c2, p3 * v + c3
                p4, p5, p6, p7 = p4 * v + c4, p5 * v + c5, p6 * v + c6, p7 * v + c7
                p8, p9, p10, p11 = p8 * v + c8, p9 * v + c9, p10 * v + c10, p11 * v + c11
                p12, p13, p14, p15 = p12 * v + c12, p13 * v + c13, p14 * v + c14, p15 * v + c15
            y[k] = (p0 + p1 + p2 + p3 + p4 + p5 + p6 + p7
                    + p8 + p9 + p10 + p11 + p12 + p13 + p14 + p15)


def _sum(a):
    total = np.float32(0.0)
    for k in range(a.shape[0]):
        total += a[k]
    return total


if njit is not None:
    _fma_chains = njit(nogil=True, fastmath={"contract"}, cache=True)(_fma_chains)
    _sum = njit(nogil=True, fastmath=True, cache=True)(_sum)


def fma_flops(reps: int) -> float:
    """FLOPs one `_fma_chains` call performs (an FMA is 2 FLOPs; the setup adds are left out)."""
    return 2.0 * CHAINS * DEPTH * FMA_ELEMENTS * reps


def _concurrently(work, n_threads: int) -> float:
    """Run `work(t)` on `n_threads` threads started together; returns the sum over threads of
    units of work per second of each thread's own CPU time (`work` returns its units). CPU time,
    not wall time: on a shared machine a thread that waits for a core would otherwise count its
    wait as slowness of the hardware."""
    rates = [0.0] * n_threads

    def run(t: int) -> None:
        t0 = time.thread_time()
        units = work(t)
        rates[t] = units / (time.thread_time() - t0)

    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return sum(rates)


def cpu_threads() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def measure_cpu(n_threads: int | None = None, trials: int = TRIALS, reps: int = 5000) -> dict:
    """Peak fp32 FMA FLOP/s and read bandwidth (B/s) of `n_threads` cores (default: all this
    process may use), with every trial's figure."""
    n_threads = n_threads or cpu_threads()
    c = np.linspace(0.5, 0.9, CHAINS).astype(np.float32)
    xs = [np.random.default_rng(t).random(FMA_ELEMENTS, dtype=np.float32) for t in range(n_threads)]
    ys = [np.empty_like(x) for x in xs]
    big = [np.ones(BW_BYTES // 4, np.float32) for _ in range(n_threads)]  # touched: no page faults
    _fma_chains(xs[0], ys[0], 1, c)  # compile (or load from cache) outside the clock
    _sum(big[0][:16])
    flops, bws = [], []
    for _ in range(trials):
        flops.append(_concurrently(
            lambda t: (_fma_chains(xs[t], ys[t], reps, c), fma_flops(reps))[1], n_threads))
        bws.append(_concurrently(lambda t: (_sum(big[t]), BW_BYTES)[1], n_threads))
    return {
        "source": "measured",
        "threads": n_threads,
        "fp32_flops": max(flops),
        "bandwidth": max(bws),
        "fp32_flops_trials": flops,
        "bandwidth_trials": bws,
        "method": f"best of {trials} trials, rates over each thread's CPU time; FMA: {CHAINS} "
        f"chains × {DEPTH} deep on {FMA_ELEMENTS} floats per thread; bandwidth: a "
        f"{BW_BYTES // 2**20} MiB float32 sum per thread",
    }


def machine_peaks(env: dict, device: str) -> dict | None:
    """The ceilings of `device`: measured on a CPU, the data sheet's for a known GPU (None when
    the GPU is unknown, or numba is missing on a CPU)."""
    if device.startswith("cuda"):
        known = gpu_peaks(env.get("gpu"))
        if not known:
            return None
        return {"source": f"data sheet ({env.get('gpu')})", "fp32_flops": known["fp32"],
                "bandwidth": known["bw"]}
    if njit is None:
        return None
    return measure_cpu()

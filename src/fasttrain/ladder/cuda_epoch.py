"""`cuda-epoch`: a whole epoch — 469 dependent SGD steps — in ONE kernel launch, no host in between.

Built by `fasttrain.ladder.build` (nvcc → cached .so → ctypes) at setup from `csrc/cuda_epoch.cu`;
the training set, labels and orders are on the device as uint8 / int32. fp32 arithmetic: the
weights equal the float64 reference to float32 rounding. Kernel versions (`VERSIONS`; each one's
design, checks and measurements: docs/measurements/ladder-h100.md, "cuda-epoch v7, version by
version", and docs/measurements/cuda-epoch-v7-design.md):

- v2, v3: a thread-block cluster of 7 or 14 CTAs on Hopper (sm_90+), each CTA a slice of the 784
  features and of the weights in shared memory for the whole epoch; the partial logits meet
  through distributed shared memory (two cluster barriers a step), the softmax by the rows'
  owners, the next batch's pixels prefetched by cp.async. GPUs without clusters run them on a
  cooperative grid (global-memory inboxes, grid.sync()): v3 is the row's there (`GRID_VERSION`).
- v4: v3 with point-to-point mbarrier signals instead of the cluster barriers (clusters only).
- v5: v4 with both GEMMs on tensor cores in three bf16 parts (fp32-accurate; slower than v4).
- v6: v4 with W in registers for the whole epoch, the partial logits and update register-tiled.
- v7: the lagged-Gram step: an 8-CTA chain cluster computes each step's logits from weights L
  steps old plus a correction through exact integer Grams, 7 worker clusters apply the updates,
  7 producer clusters make the Grams (in the same launch: `V7_GRAMS`); 13 variants
  (`V7_VARIANTS`); the row's since 2026-11-28.

Measured (`sync_cost.py`, 14 CTAs): H100 80GB HBM3, 2026-11-26/27: v2 3.88 ms/epoch, v3 2.73, v4
2.27, v5 2.45; H200, 2026-11-27/28: v6 2.02-2.05, v7 in one launch: v7c 1.960, v7f 1.741, v7k
1.679 (1.783 in the bench of run 10). The signalled versions' waits are bounded: a
protocol fault ends the launch and shows as a RuntimeError at the next check
(`EpochKernel.check_signals`), never a hang. Before the row uses its version, setup runs one
epoch of it and one of v2 (the first kernel checked on a GPU) from the same weights and times v2
instead if they disagree (the prefetch rings run only over several steps).

Run alone:  python -m fasttrain bench --impl cuda-epoch
"""

from __future__ import annotations

import ctypes
import warnings

import torch

from fasttrain.ladder.common import Impl, LadderConfig, LadderData
from fasttrain.ladder.epoch_phases import PHASES, V7_CTAS, V7_HELPERS, V7_PHASES, v7_phases_us

SOURCE = "cuda_epoch.cu"
CTAS = 14  # 56 features a CTA: 8.3 µs/step against 9.8 with 7 CTAs (H100, v2)
VERSION = 7  # the row's kernel version on clusters (cross-checked against FALLBACK): H200,
# sync_cost.py 2026-11-28 (run 10): v7k in one launch 1.679 ms/epoch, v7f 1.742 (run 7: v7f 1.741,
# v7e 1.935, v7c 1.977, v7d 1.991, v6 (14 CTAs) 2.021; v6: 2.047 ms/epoch in the bench, v4 2.304,
# v5 2.497, 2026-11-27)
GRID_VERSION = 3  # the row's version without clusters (v4 is cluster-only)
FALLBACK = 2
VERSIONS = (2, 3, 4, 5, 6, 7)  # csrc/cuda_epoch.cu's changelog
CLUSTER_ONLY = (4, 5, 6, 7)  # versions with no cooperative-grid kernel (signals in clusters)
SIGNALLED = (4, 5, 6, 7)  # bounded waits that report a timeout via cuda_epoch_signal_status
PROFILED = (4, 5, 6, 7)  # versions with a phase-profiling build (v7: one of its own, its roles')
CTA_COUNTS = (7, 14)
V7_VARIANTS = ("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "m", "n")
"""v7's variants, in the library's order (`variant` 0 … 12 of its v7 entry points), each built on
the one named, its header(s) csrc/epoch_v7X.cuh (and _math.cuh), each run first on the CPU in a
host emulation for whole epochs (against float64, or bit for bit against its parent) with planted
bugs; ms/epoch on an H200 (2026-11-28, sync_cost.py), in one launch (and in two):

    a  the lagged-Gram step (two: 2.372)
    b  a: the worker partials as tagged 8-byte words, the softmax on 16 lanes a row (2.068; 2.185)
    c  b: the Gram terms j >= 2 on 8 helper warps a step ahead (1.960; 2.179)
    d  c: the workers fetch the next update's G during a step (1.998; 2.062)
    e  d: the workers' update and partials as m16n8k16 f16 products of hi/lo pieces (1.935)
    f  e: the partial tiles by st.async into their owners' inbox ring, no cluster barrier (1.741)
    g  f: the chain's helpers take the partials' poll, the producers' flags and labels (1.764)
    h  g: the workers' sample indices a step before their pixels, the credits first (1.690)
    i  h: G_t's store and the step counter's release by the helpers (1.872)
    j  i: the workers' mma fragments by ldmatrix from swizzled rows, W's pieces split once
       (1.655; one of ten runs of its fault test named another wait: a race the test accepts)
    k  j: two CTA barriers fewer a worker step, the counters read early (1.679: the row's)
    m  j: the chain's critical warps send their own rows after their softmax (1.694)
    n  k: no column sums in the chain's G exchange, the receivers sum the bias (NOT YET RUN ON
       A GPU; compiled and checked on the CPU)

Run 10 (2026-11-28) timed g-m in one call: j 1.655, k 1.679, h 1.690, m 1.694, f 1.742, g 1.764,
i 1.872 (k 1.694, f 1.769 in a second call). sync_cost.py times any of them in one call."""
V7_VARIANT = "k"  # version 7's: v7k in one launch, the fastest that passed its tests (H200, run 10)
LAUNCHES = {7: 2}  # where not 1: v7's Gram kernel, then its epoch kernel (1 in one launch)
V7_GRAMS = ("kernel", "launch")
"""Who makes v7's Grams (`EpochKernel(..., v7_grams=...)`, the entry points' `grams` 0, 1), for
every variant (V7_ONE_LAUNCH): "kernel", their own launch before the epoch kernel (two launches
an epoch), or "launch", 7 producer clusters of the epoch kernel itself (one launch of 120 CTAs:
csrc/epoch_v7l.cuh; the row's since its H200 run, 2026-11-28: every v7 GPU test passed in both
modes, and v7c, later v7f, in one launch was the fastest)."""
V7_ONE_LAUNCH = V7_VARIANTS  # the variants with a one-launch kernel (v7_grams="launch"): all
V7_GRAMS_DEFAULT = "launch"
V7_CLUSTERS = {"kernel": 8, "launch": 15}  # clusters of 8 CTAs one v7 epoch kernel launches
V7_GRAM_VERSIONS = (1, 2)
"""v7's Gram kernels (`EpochKernel.v7_grams`): 1 v7a's (a warp a 16 × 32 tile from L2; 493.8 µs a
launch on an H200, 2026-11-27), 2 a CTA a step's 64 rows for all 4 lags with its operands staged
in shared memory (csrc/gram_v2.cuh; H200, 2026-11-28: 211-237 µs an epoch, bit-equal to v1), the
epoch's."""
V7_GRAM_VERSION = 2
V7_FLAG_FLOATS = 64  # v7's scratch: its step counters (V7_FLAG_BYTES), then the Grams
CROSS_CHECK_ATOL = 1e-3
"""v3 or v4 against v2 after one epoch from the same weights: fp32 summation orders differ (a few
ulps a step, ~1e-5 after an epoch); a wrong batch, row or class moves weights by updates of
~1e-2."""
CROSS_CHECK_ATOL_V7 = 2e-5
"""v7 against v2: `check.FP32_ATOL`. A lagged-Gram bug moves the weights by less than 1e-3 (the bias
correction left out: 5.9e-4 after an MNIST epoch, docs/measurements/cuda-epoch-v7-design.md), while
the correct step stays within 1e-7 of float64 on the CPU (test_cuda_epoch_v7_math.py)."""
MAX_BATCH = 128  # one CTA thread pair per row of the batch
READ_LOSS_EVERY = 10
SIGNAL_TIMEOUT = 20001  # cuda_epoch_signal_status: a v4 wait timed out (not a cudaError_t)


def load_library() -> ctypes.CDLL:
    """Build (once, cached) and load the kernel library with its entry points typed."""
    from fasttrain.ladder import build

    lib = build.load(SOURCE)
    ptr, i32, f32 = ctypes.c_void_p, ctypes.c_int, ctypes.c_float
    # x, y, order, n, bs, lr, w, b, stats, scratch, ctas, cluster, version, stream
    lib.cuda_epoch_train.argtypes = [ptr, ptr, ptr, i32, i32, f32, ptr, ptr, ptr, ptr, i32, i32,
                                     i32, ptr]
    lib.cuda_epoch_train.restype = i32
    lib.cuda_epoch_scratch_bytes.argtypes = [i32]
    lib.cuda_epoch_scratch_bytes.restype = ctypes.c_longlong
    lib.cuda_epoch_v7_scratch_bytes.argtypes = [i32, i32]
    lib.cuda_epoch_v7_scratch_bytes.restype = ctypes.c_longlong
    # v7 variant, grams (V7_GRAMS's index), clusters out, needed out
    lib.cuda_epoch_v7_residency.argtypes = [i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.cuda_epoch_v7_residency.restype = i32
    lib.cuda_epoch_variant.argtypes = [i32, i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.cuda_epoch_variant.restype = i32
    lib.cuda_epoch_error_name.argtypes = [i32]
    lib.cuda_epoch_error_name.restype = ctypes.c_char_p
    lib.cuda_epoch_signal_status.argtypes = [ptr, ctypes.POINTER(i32)]
    lib.cuda_epoch_signal_status.restype = i32
    lib.cuda_epoch_signal_fault.argtypes = [i32]
    lib.cuda_epoch_signal_fault.restype = i32
    # x, y, order, n, bs, lr, w, b, stats, ctas, version, clocks out, span out, stream
    lib.cuda_epoch_phase_profile.argtypes = [ptr, ptr, ptr, i32, i32, f32, ptr, ptr, ptr, i32,
                                             i32, ptr, ptr, ptr]
    lib.cuda_epoch_phase_profile.restype = i32
    lib.cuda_epoch_v7_phase_shape.argtypes = [ctypes.POINTER(i32)] * 5
    lib.cuda_epoch_v7_phase_shape.restype = None
    # x, y, order, n, bs, lr, w, b, stats, scratch, v7 variant, grams, clocks out, span out, stream
    lib.cuda_epoch_v7_phase_profile.argtypes = [ptr, ptr, ptr, i32, i32, f32, ptr, ptr, ptr, ptr,
                                                i32, i32, ptr, ptr, ptr]
    lib.cuda_epoch_v7_phase_profile.restype = i32
    # x, y, order, n, bs, lr, w, b, stats, scratch, gram version, stream
    lib.cuda_epoch_v7_grams.argtypes = [ptr, ptr, ptr, i32, i32, f32, ptr, ptr, ptr, ptr, i32,
                                        ptr]
    lib.cuda_epoch_v7_grams.restype = i32
    lib.cuda_epoch_v7_gram_versions.argtypes = [ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.cuda_epoch_v7_gram_versions.restype = i32
    # x, y, order, n, bs, lr, w, b, stats, scratch, v7 variant, grams, stream
    lib.cuda_epoch_v7_train.argtypes = [ptr, ptr, ptr, i32, i32, f32, ptr, ptr, ptr, ptr, i32, i32,
                                        ptr]
    lib.cuda_epoch_v7_train.restype = i32
    lib.cuda_epoch_v7_variants.argtypes = []
    lib.cuda_epoch_v7_variants.restype = i32
    for name in ("cuda_epoch_bench_cluster_sync", "cuda_epoch_bench_grid_sync"):
        getattr(lib, name).argtypes = [i32, i32, ptr, ptr]
        getattr(lib, name).restype = i32
    return lib


def cta_counts(version: int) -> tuple[int, ...]:
    """The `ctas` a version runs on: 7 or 14 (features split), v7 its 8-CTA chain."""
    return (V7_CTAS,) if version == 7 else CTA_COUNTS


def fallback_ctas(ctas: int) -> int:
    """The CTAs FALLBACK runs on in place of a variant on `ctas` (v7's 8: CTAS)."""
    return ctas if ctas in CTA_COUNTS else CTAS


def variants(clusters: bool = True) -> list[tuple[int, bool, int]]:
    """(version, cluster, ctas) of every kernel variant, in the order sync_cost.py times them."""
    kinds = (True, False) if clusters else (False,)
    return [(v, c, n) for v in VERSIONS for c in kinds for n in cta_counts(v)
            if c or v not in CLUSTER_ONLY]


def launch_config(lib: ctypes.CDLL, ctas: int, version: int,
                  cluster: bool = True) -> tuple[int, int]:
    """(threads per CTA, dynamic shared memory bytes) of a variant, from the library itself."""
    threads, smem = ctypes.c_int(), ctypes.c_int()
    if not lib.cuda_epoch_variant(ctas, version, int(cluster), ctypes.byref(threads),
                                  ctypes.byref(smem)):
        kind = "" if cluster else " on a cooperative grid"
        raise ValueError(f"cuda-epoch has no version {version} on {ctas} CTAs{kind}")
    return threads.value, smem.value


def check(lib: ctypes.CDLL, code: int, what: str) -> None:
    if code:
        name = lib.cuda_epoch_error_name(code).decode()
        raise RuntimeError(f"{what} failed: CUDA error {code} ({name})")


def stream_handle() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def has_clusters() -> bool:
    return torch.cuda.get_device_capability()[0] >= 9


def default_version(cluster: bool) -> int:
    """The row's kernel version on a cluster or on a cooperative grid."""
    return VERSION if cluster else GRID_VERSION


class EpochKernel:
    """The device state of one run and the launch of one epoch."""

    def __init__(self, data: LadderData, cfg: LadderConfig, ctas: int | None = None,
                 cluster: bool | None = None, version: int | None = None,
                 v7_variant: str | None = None, v7_grams: str | None = None):
        """v7_variant: version 7's, one of V7_VARIANTS (default V7_VARIANT); v7_grams: who makes its
        Grams, one of V7_GRAMS (default V7_GRAMS_DEFAULT, one launch); only for version 7."""
        dev = torch.device("cuda")
        self.lib = load_library()
        self.cluster = has_clusters() if cluster is None else cluster
        self.version = default_version(self.cluster) if version is None else version
        if v7_variant is not None and (self.version != 7 or v7_variant not in V7_VARIANTS):
            raise ValueError(f"v7_variant is version 7's, one of {V7_VARIANTS}: not "
                             f"{v7_variant!r} of version {self.version}")
        if v7_grams is not None and (self.version != 7 or v7_grams not in V7_GRAMS):
            raise ValueError(f"v7_grams is version 7's, one of {V7_GRAMS}: not {v7_grams!r} of "
                             f"version {self.version}")
        self.v7_variant = (v7_variant or V7_VARIANT) if self.version == 7 else None
        self.v7_grams_by = (v7_grams or V7_GRAMS_DEFAULT) if self.version == 7 else None
        if self.v7_grams_by == "launch" and self.v7_variant not in V7_ONE_LAUNCH:
            raise ValueError(f"v7_grams='launch' is for v7 variants {V7_ONE_LAUNCH}: not "
                             f"{self.v7_variant!r}")
        ctas = cta_counts(self.version)[-1] if ctas is None else ctas  # v2-v6: CTAS, v7: 8
        self.n, self.cfg, self.ctas = data.n_train, cfg, ctas
        launch_config(self.lib, ctas, self.version, self.cluster)  # a bad variant: ValueError
        self.x = torch.from_numpy(data.train_x).to(dev).contiguous()  # uint8 [N, 784]
        self.y = torch.from_numpy(data.train_y).to(dev, torch.int32)
        self.orders = torch.from_numpy(data.orders).to(dev, torch.int32)  # [epochs, N]
        self.w = torch.from_numpy(data.w0).to(dev).contiguous()
        self.b = torch.from_numpy(data.b0).to(dev)
        self.stats = torch.zeros(2, device=dev)  # (loss sum, correct count) since the last read
        if self.version == 7:
            self.check_residency()
            scratch = self.lib.cuda_epoch_v7_scratch_bytes(self.n, cfg.batch_size)
        else:
            scratch = self.lib.cuda_epoch_scratch_bytes(ctas)
        if scratch == 0:
            raise ValueError(f"cuda-epoch runs on 7 or 14 CTAs, not {ctas}")
        # Zeroed: v7's one-launch path numbers its flags by the epoch from a ticket count that must
        # start at 0 (csrc/epoch_v7l_math.cuh); the other versions overwrite what they read.
        self.scratch = torch.zeros(scratch // 4, device=dev)

    def check_residency(self) -> None:
        """v7: its 8 clusters of 8 CTAs (15 in one launch) spin on each other, so all must be on
        the GPU at once; a setup error here, not a launch that never ends."""
        clusters, needed = ctypes.c_int(), ctypes.c_int()
        check(self.lib, self.lib.cuda_epoch_v7_residency(self.v7_index, self.v7_grams_index,
                                                         ctypes.byref(clusters),
                                                         ctypes.byref(needed)),
              "cuda_epoch_v7_residency")
        if clusters.value < needed.value:
            roles = ("one chain, 7 worker clusters" if self.v7_grams_by == "kernel" else
                     "one chain, 7 worker and 7 Gram producer clusters (v7_grams='launch')")
            raise RuntimeError(
                f"cuda-epoch v7 needs {needed.value} co-resident clusters of 8 CTAs ({roles}, "
                f"each CTA a whole SM) and this GPU holds {clusters.value} "
                f"(cudaOccupancyMaxActiveClusters; another process or MPS may hold SMs). Use "
                f"version {VERSION}" + (" or v7_grams='kernel'." if self.v7_grams_by == "launch"
                                        else "."))

    def run(self, epoch: int, w=None, b=None, stats=None, check_signals: bool = True) -> None:
        """One epoch in `orders[epoch]` order on (w, b, stats), by default the run's own.

        check_signals: for v4 to v7, wait for the epoch and raise if a signal wait timed out (a
        host sync; timed loops pass False and call check_signals() after)."""
        w, b, stats = (self.w, self.b, self.stats) if w is None else (w, b, stats)
        p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        common = (p(self.x), p(self.y), p(self.orders[epoch]), self.n, self.cfg.batch_size,
                  self.cfg.lr, p(w), p(b), p(stats), p(self.scratch))
        if self.version == 7:
            code = self.lib.cuda_epoch_v7_train(*common, self.v7_index, self.v7_grams_index,
                                                stream_handle())
        else:
            code = self.lib.cuda_epoch_train(*common, self.ctas, int(self.cluster), self.version,
                                             stream_handle())
        check(self.lib, code, f"cuda_epoch_train ({self.variant})")
        if check_signals:
            self.check_signals()

    def check_signals(self) -> None:
        """v4 to v7: raise if a bounded wait of any launch since the last check timed out (the
        kernel then gave up instead of hanging, and the launches after it did nothing). Syncs."""
        if self.version not in SIGNALLED:
            return
        detail = ctypes.c_int()
        code = self.lib.cuda_epoch_signal_status(stream_handle(), ctypes.byref(detail))
        if code == SIGNAL_TIMEOUT:
            d = detail.value
            what = {1: "its rows' partial logits", 2: "the rows' g",
                    3: "v7's worker partials (chain)", 4: "v7's G (worker)",
                    5: "v7's Grams from the producers (chain, one launch)",
                    6: "v7's counters reset by producer CTA 0 (one launch)",
                    7: "v7f's partial tiles or their credits (worker inbox)"}.get(
                        d & 15, f"kind {d & 15}")
            raise RuntimeError(
                f"cuda_epoch_train ({self.variant}): CTA {(d >> 4) & 255} waited too long for "
                f"{what} at step {d >> 12} and the kernel gave up (a protocol fault of the "
                f"point-to-point signals, not a slow GPU); the weights of that launch are not "
                f"valid. Use version 3 or {FALLBACK}.")
        check(self.lib, code, f"cuda_epoch_signal_status ({self.variant})")

    def phase_profile(self, epoch: int) -> dict:
        """v4, v5 or v6 on a cluster: one epoch in `orders[epoch]` order by the phase-profiling
        build of the kernel, from copies of this kernel's weights (they stay as they are), and the
        µs a step spent in each of PHASES: the mean over CTAs and the largest. Clocks become time
        by CTA 0's loop, timed both ways. v7: the same for each role, {role: that dict} with
        V7_PHASES's names (`v7_phase_profile`). Syncs."""
        if self.version not in PROFILED or not self.cluster:
            raise ValueError(
                f"the phase profile is of v4 to v7 on a cluster, not {self.variant}")
        if self.version == 7:
            return self.v7_phase_profile(epoch)
        w, b, stats = self.w.clone(), self.b.clone(), torch.zeros_like(self.stats)
        p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        clocks = (ctypes.c_ulonglong * (self.ctas * len(PHASES)))()
        span = (ctypes.c_longlong * 2)()
        code = self.lib.cuda_epoch_phase_profile(
            p(self.x), p(self.y), p(self.orders[epoch]), self.n, self.cfg.batch_size,
            self.cfg.lr, p(w), p(b), p(stats), self.ctas, self.version, clocks, span,
            stream_handle())
        check(self.lib, code, f"cuda_epoch_phase_profile ({self.variant})")
        per_cta = torch.tensor(list(clocks), dtype=torch.float64).view(self.ctas, len(PHASES))
        ns, steps = span[0], span[1]
        us = per_cta * (ns / per_cta[0].sum().item()) / steps / 1e3  # µs a step
        return {"step_us": ns / steps / 1e3,
                "mean_us": dict(zip(PHASES, us.mean(0).tolist(), strict=True)),
                "max_us": dict(zip(PHASES, us.max(0).values.tolist(), strict=True))}

    def v7_phase_profile(self, epoch: int) -> dict:
        """v7: one epoch (its Gram launch and its epoch kernel's phase-profiling build) from copies
        of the weights, and per role the µs a step each of its CTAs' thread 0 spent in each of
        V7_PHASES[role] (`v7_phases_us`). Raises if a bounded wait timed out. Syncs."""
        shape = [ctypes.c_int() for _ in range(5)]
        self.lib.cuda_epoch_v7_phase_shape(*map(ctypes.byref, shape))
        chain, workers, helpers, ctas, cols = (s.value for s in shape)
        if (chain, workers, helpers) != tuple(map(len, V7_PHASES.values())):
            raise RuntimeError(f"the library times {chain} chain, {workers} worker and {helpers} "
                               f"helper phases, not V7_PHASES's: a stale build of {SOURCE}?")
        w, b, stats = self.w.clone(), self.b.clone(), torch.zeros_like(self.stats)
        p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        clocks = (ctypes.c_uint * (ctas * cols))()
        span = (ctypes.c_longlong * (ctas + 1))()
        code = self.lib.cuda_epoch_v7_phase_profile(
            p(self.x), p(self.y), p(self.orders[epoch]), self.n, self.cfg.batch_size,
            self.cfg.lr, p(w), p(b), p(stats), p(self.scratch), self.v7_index,
            self.v7_grams_index, clocks, span,
            stream_handle())
        check(self.lib, code, f"cuda_epoch_v7_phase_profile ({self.variant})")
        self.check_signals()  # a timed-out wait: its CTAs wrote no figures
        roles = tuple(r for r in V7_PHASES if r != "helpers" or self.v7_variant in V7_HELPERS)
        return v7_phases_us(list(clocks), list(span), ctas, cols, roles)

    def v7_grams(self, epoch: int, gram_version: int) -> None:
        """v7: only the first launch of an epoch in `orders[epoch]` order, every Γ_{t,j} into the
        scratch (and the step counters zeroed) by Gram kernel `gram_version` (V7_GRAM_VERSIONS),
        on the current stream, not synced: what sync_cost.py times alone."""
        if self.version != 7 or gram_version not in V7_GRAM_VERSIONS:
            raise ValueError(f"the Gram kernels are v7's, versions {V7_GRAM_VERSIONS}: not "
                             f"{gram_version} of {self.variant}")
        p = lambda t: ctypes.c_void_p(t.data_ptr())  # noqa: E731
        code = self.lib.cuda_epoch_v7_grams(
            p(self.x), p(self.y), p(self.orders[epoch]), self.n, self.cfg.batch_size,
            self.cfg.lr, p(self.w), p(self.b), p(self.stats), p(self.scratch), gram_version,
            stream_handle())
        check(self.lib, code, f"cuda_epoch_v7_grams (Gram kernel v{gram_version})")

    def v7_gram_tensor(self) -> torch.Tensor:
        """v7: the Grams in the scratch, [steps][4][128][128] (a view: csrc/epoch_v7_math.cuh's
        layout, after its 256 bytes of step counters)."""
        steps = -(-self.n // self.cfg.batch_size)
        size = steps * 4 * MAX_BATCH * MAX_BATCH
        return self.scratch[V7_FLAG_FLOATS:V7_FLAG_FLOATS + size].view(steps, 4, MAX_BATCH,
                                                                       MAX_BATCH)

    @property
    def v7_index(self) -> int:
        """The library's `variant` of this version-7 kernel (V7_VARIANTS's order)."""
        return V7_VARIANTS.index(self.v7_variant)

    @property
    def launches(self) -> int:
        """Kernel launches an epoch: LAUNCHES's, v7 in one launch 1."""
        return 1 if self.v7_grams_by == "launch" else LAUNCHES.get(self.version, 1)

    @property
    def v7_grams_index(self) -> int:
        """The library's `grams` of this version-7 kernel (V7_GRAMS's order)."""
        return V7_GRAMS.index(self.v7_grams_by)

    @property
    def variant(self) -> str:
        if self.version == 7:
            if self.v7_grams_by == "launch":
                return (f"v7{self.v7_variant} in one launch, a chain cluster of 8 CTAs, 7 worker "
                        f"and 7 Gram producer clusters (120 CTAs)")
            return (f"v7{self.v7_variant}, a chain cluster of 8 CTAs and 7 worker clusters "
                    f"(64 CTAs)")
        kind = "cluster" if self.cluster else "cooperative grid"
        return f"v{self.version}, {kind} of {self.ctas} CTAs"


class CudaEpoch(Impl):
    name = "cuda-epoch"
    sources = ("csrc/cuda_epoch.cu",)  # the kernel its figures come from (and its headers)
    device = "cuda"

    @classmethod
    def unavailable(cls, env, cfg):
        if not torch.cuda.is_available():
            return "needs a CUDA GPU"
        if cfg.batch_size > MAX_BATCH:
            return f"one launch holds a batch of at most {MAX_BATCH} samples, not {cfg.batch_size}"
        from fasttrain.ladder import build

        return build.toolchain_reason()

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.kernel = EpochKernel(data, cfg)
        # Build, load and run one epoch now (setup time) on scratch copies of the weights: a
        # launch error shows here, and the first timed epoch is not the first launch. The same
        # epoch by the fallback version must agree (see the module docstring); where it does not,
        # the row times the fallback (verified on an H100) and says why in its details, so a
        # wrong new version costs the table its speed, never its correctness.
        self.fallback_reason = self.cross_check(data, cfg)
        if self.fallback_reason:
            warnings.warn(f"cuda-epoch: {self.fallback_reason}; timing v{FALLBACK} instead",
                          stacklevel=2)
            self.kernel = EpochKernel(data, cfg, ctas=fallback_ctas(self.kernel.ctas),
                                      cluster=self.kernel.cluster, version=FALLBACK)
            self.kernel.run(0, self.kernel.w.clone(), self.kernel.b.clone(),
                            self.kernel.stats.clone())
        torch.cuda.synchronize()
        self.epochs_summed = 0

    def cross_check(self, data: LadderData, cfg: LadderConfig) -> str | None:
        """Why the row's version cannot be trusted (it disagrees with FALLBACK after one epoch
        from the same weights), or None."""
        k = self.kernel
        w, b = k.w.clone(), k.b.clone()
        k.run(0, w, b, k.stats.clone())
        if k.version == FALLBACK:
            return None
        ref = EpochKernel(data, cfg, ctas=fallback_ctas(k.ctas), cluster=k.cluster,
                          version=FALLBACK)
        ref.run(0, ref.w, ref.b, ref.stats)
        err = max((w - ref.w).abs().max().item(), (b - ref.b).abs().max().item())
        atol = CROSS_CHECK_ATOL_V7 if k.version == 7 else CROSS_CHECK_ATOL
        if err <= atol:  # NaN fails too
            return None
        return (f"{k.variant} disagrees with v{FALLBACK} after one epoch: max |Δw| {err:.3g} > "
                f"{atol}")

    def details(self) -> dict:
        return {"variant": self.kernel.variant, "fallback_reason": self.fallback_reason,
                "launches_per_epoch": self.kernel.launches}

    def train_epoch(self, epoch: int) -> float | None:
        self.kernel.run(epoch, check_signals=False)  # v4: a sync, done at the loss read
        self.epochs_summed += 1
        if (epoch + 1) % READ_LOSS_EVERY and epoch + 1 != self.cfg.epochs:
            return None
        self.kernel.check_signals()
        stats = self.kernel.stats
        mean = stats[0].item() / (self.data.n_train * self.epochs_summed)  # the one host read
        stats.zero_()
        self.epochs_summed = 0
        return mean

    def params(self):
        self.kernel.check_signals()
        return self.kernel.w.cpu().numpy().copy(), self.kernel.b.cpu().numpy().copy()

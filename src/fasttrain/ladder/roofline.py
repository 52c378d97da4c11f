"""`roofline`: the floor of the ladder — an epoch's work divided by this machine's ceilings.

Not timed: computed. The work of one epoch of the ladder's model is
  FLOPs = 4 · N · 784 · 10    (forward x·Wᵀ and weight gradient Gᵀ·x, a multiply-add = 2 FLOPs;
                               softmax, bias and update are < 1% and left out)
  bytes = N · (784 + 8 + 8)   (each uint8 image, its int64 label and its int64 index in the
                               shuffle order read once from memory; the 31 KB of weights stay in
                               cache)
and the floor is max(FLOPs / peak FLOP/s, bytes / peak bandwidth) — the classic roofline. On a
CPU the peaks are measured at bench time (`fasttrain.peaks`, figures in the JSON's env); on a GPU
they come from the data sheet of the GPU torch reports. No row can beat this line at fp32; how far
above it a row sits is the headroom left.

Run alone:  python -m fasttrain bench --impl roofline
"""

from __future__ import annotations

from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData

LABEL_BYTES = 8  # int64 labels and order indices, as LadderData holds them
INDEX_BYTES = 8


def epoch_work(n: int, in_features: int = IN_FEATURES, classes: int = CLASSES) -> dict:
    """FLOPs and compulsory bytes of one epoch over `n` samples."""
    return {"flops": 4.0 * n * in_features * classes,
            "bytes": float(n * (in_features + LABEL_BYTES + INDEX_BYTES))}


def roofline_ms(flops: float, nbytes: float, peak_flops: float, bandwidth: float) -> dict:
    """Milliseconds the work needs at the compute and at the memory ceiling, and which binds."""
    compute_ms, memory_ms = 1e3 * flops / peak_flops, 1e3 * nbytes / bandwidth
    return {"compute_ms": compute_ms, "memory_ms": memory_ms,
            "epoch_ms": max(compute_ms, memory_ms),
            "bound": "compute" if compute_ms >= memory_ms else "memory"}


class Roofline(Impl):
    name = "roofline"
    trains = False
    computed = True
    """Its ms/epoch is computed from the machine's peaks, never timed."""

    def __init__(self, device: str = "cpu"):
        self.device = device

    @classmethod
    def unavailable(cls, env, cfg):
        if cfg.device.startswith("cuda"):
            from fasttrain.env import gpu_peaks

            return None if gpu_peaks(env.get("gpu")) else (
                f"no data-sheet peaks for GPU {env.get('gpu')!r}; add it to env.GPU_PEAKS")
        try:
            import numba  # noqa: F401  (the CPU microbenchmarks are compiled with it)
        except ImportError:
            return "numba is not installed (the CPU peaks are measured with it)"
        return None

    def estimate(self, data: LadderData, cfg: LadderConfig, peaks: dict) -> dict:
        work = epoch_work(data.n_train)
        return {**work, "peak_flops": peaks["fp32_flops"], "bandwidth": peaks["bandwidth"],
                **roofline_ms(work["flops"], work["bytes"], peaks["fp32_flops"],
                              peaks["bandwidth"])}

    def evaluate(self):
        return None, None  # learns nothing

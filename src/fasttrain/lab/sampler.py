"""GPU utilization and memory over time, sampled from NVML in a background thread.

    with DeviceSampler(torch.device("cuda", 0), period_s=0.05) as s:
        train()
    s.summary()            # {"available": True, "gpu_util_mean_pct": ..., "samples": [...]}
    plot_samples(s.summary(), "util.png")

The thread calls NVML only — never torch's CUDA API — so sampling adds no host–device sync and
nothing to the GPU's streams. NVML's utilization is the share of the driver's last sample window
(1/6 s to 1 s, by GPU) in which any kernel ran: a coarse "was the GPU busy", not SM occupancy.

Without a GPU, without the `nvidia-ml-py` module (imported only here, only if present) or without
a driver, the sampler is absent cleanly: `available` is False, `reason` says why in one line, and
entering and leaving it do nothing.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import asdict, dataclass

import torch


@dataclass
class Sample:
    t_s: float  # seconds since the sampler started
    gpu_util_pct: float  # % of the last driver window in which a kernel ran
    mem_util_pct: float  # % of that window in which device memory was read or written
    mem_used_gb: float  # GiB allocated on the device, by every process
    mem_total_gb: float  # GiB on the device


def nvml_index(cuda_index: int) -> int | str:
    """NVML numbers GPUs as the driver does; torch as CUDA_VISIBLE_DEVICES lists them. Returns
    the NVML index, or a 'GPU-…' UUID when the variable names GPUs that way."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")
               if v.strip()]
    if cuda_index < len(visible):
        entry = visible[cuda_index]
        return int(entry) if entry.isdigit() else entry
    return cuda_index


class DeviceSampler:
    """Samples one NVIDIA GPU every `period_s` seconds while the context is open."""

    def __init__(self, device: torch.device | int = 0, period_s: float = 0.05):
        if isinstance(device, int):
            device = torch.device("cuda", device)
        self.device, self.period_s = device, period_s
        self.samples: list[Sample] = []
        self.reason: str | None = None
        self._nvml = self._handle = self._thread = None
        self._stop = threading.Event()
        if device.type != "cuda":
            self.reason = f"the device is {device.type}: NVML samples NVIDIA GPUs only"

    @property
    def available(self) -> bool:
        return self.reason is None

    def __enter__(self) -> DeviceSampler:
        if self.reason:
            return self
        try:
            import pynvml  # provided by the nvidia-ml-py package
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return self
        try:
            pynvml.nvmlInit()
            index = nvml_index(self.device.index or 0)
            self._handle = (pynvml.nvmlDeviceGetHandleByUUID(index) if isinstance(index, str)
                            else pynvml.nvmlDeviceGetHandleByIndex(index))
        except pynvml.NVMLError as e:
            self.reason = f"NVML could not start ({e}): no NVIDIA driver, or the GPU is hidden"
            with contextlib.suppress(pynvml.NVMLError):  # init may have failed: nothing to undo
                pynvml.nvmlShutdown()
            return self
        self._nvml, self._t0 = pynvml, time.perf_counter()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="fasttrain-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        self._read()  # one last sample, so that a short run still has its end
        self._nvml.nvmlShutdown()

    def _run(self) -> None:
        while True:
            self._read()
            if self._stop.wait(self.period_s):
                return

    def _read(self) -> None:
        nvml = self._nvml
        try:
            util = nvml.nvmlDeviceGetUtilizationRates(self._handle)
            mem = nvml.nvmlDeviceGetMemoryInfo(self._handle)
        except nvml.NVMLError:
            return  # a sample lost (e.g. the GPU fell off the bus) must not kill the run
        self.samples.append(Sample(t_s=time.perf_counter() - self._t0,
                                   gpu_util_pct=float(util.gpu), mem_util_pct=float(util.memory),
                                   mem_used_gb=mem.used / 2**30, mem_total_gb=mem.total / 2**30))

    def summary(self) -> dict:
        """For the result JSON: availability (or why not), means and peaks, and every sample."""
        if not self.available:
            return {"available": False, "reason": self.reason, "samples": []}
        s = self.samples
        mean = (lambda xs: sum(xs) / len(xs)) if s else (lambda xs: None)
        return {
            "available": True, "reason": None, "period_s": self.period_s, "count": len(s),
            "gpu_util_mean_pct": mean([x.gpu_util_pct for x in s]),
            "gpu_util_max_pct": max((x.gpu_util_pct for x in s), default=None),
            "mem_used_max_gb": max((x.mem_used_gb for x in s), default=None),
            "mem_total_gb": s[0].mem_total_gb if s else None,
            "samples": [asdict(x) for x in s],
        }


def plot_samples(summary: dict, path: str | os.PathLike) -> str | None:
    """Utilization (%) and memory (GiB) over time as a PNG. Returns None once written, or the
    reason nothing was written (no GPU, no NVML, no samples)."""
    if not summary.get("available"):
        return f"unavailable: {summary.get('reason')}"
    samples = summary["samples"]
    if not samples:
        return "no samples were taken (the run was shorter than one period)"
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    t = [s["t_s"] for s in samples]
    fig, (util, mem) = plt.subplots(2, 1, figsize=(7, 5), sharex=True)
    util.plot(t, [s["gpu_util_pct"] for s in samples], label="GPU (kernel running)")
    util.plot(t, [s["mem_util_pct"] for s in samples], label="memory (read/write)")
    util.set_ylabel("utilization, %")
    util.set_ylim(0, 105)
    util.legend(loc="lower right")
    mem.plot(t, [s["mem_used_gb"] for s in samples], color="C2")
    mem.axhline(samples[0]["mem_total_gb"], color="grey", linestyle="--", label="device total")
    mem.set_ylabel("memory used, GiB")
    mem.set_xlabel("seconds")
    mem.legend(loc="lower right")
    for ax in (util, mem):
        ax.grid(alpha=0.3)
    fig.suptitle(f"NVML, every {summary['period_s'] * 1e3:.0f} ms")
    from fasttrain.files import write_png

    write_png(path, fig)
    return None

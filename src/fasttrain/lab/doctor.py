"""Which devices this machine has, what they run fast, and whether tensors land where they should:
`diagnose()` is what `fasttrain doctor` prints (fasttrain.commands.doctor).

It lists every device torch sees (CUDA, MPS, XPU, the CPU) with its name, memory and, for NVIDIA
GPUs, compute capability; the low-precision dtypes the device runs on fast hardware (tensor cores:
fp16 from sm_70, bf16 and TF32 from sm_80, fp8 from sm_89; on the CPU only what /proc/cpuinfo's
flags show: avx512_bf16 / amx_bf16 for bf16, avx512_fp16 / amx_fp16 for fp16 — without them
torch still computes in bf16, but by conversion, not faster than fp32); and torch, CUDA, cuDNN
and driver versions. Then, on the best device, two checks:

- placement: a small model (`resnet`, width 8: it has BatchNorm buffers as well as parameters)
  is moved there, every parameter and buffer is checked to be there, and a forward runs;
- mismatch: a CPU batch is fed to that model on purpose, and the error torch raises is shown
  with what it means and the fix. On a CPU-only machine there is nothing to mismatch: skipped.

Its exit status is 0 when a GPU (CUDA, MPS or XPU) was found and no check failed; 1 otherwise —
"no GPU here" is what a script calling `fasttrain doctor` most often needs to know.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

SCHEMA = "fasttrain.doctor/1"
# CPU flags that decide whether low-precision matmuls run on dedicated hardware.
_CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
              "amx_fp16", "amx_int8")


def tensor_core_dtypes(major: int, minor: int) -> list[str]:
    """Dtypes NVIDIA tensor cores run at compute capability major.minor."""
    cc, fast = (major, minor), []
    if cc >= (8, 0):
        fast += ["tf32", "bf16"]
    if cc >= (7, 0):
        fast.append("fp16")
    if cc >= (8, 9):
        fast.append("fp8")
    return fast


@functools.cache
def cpu_flags(cpuinfo: str | None = None) -> tuple[str, ...]:
    """The flags of `_CPU_FLAGS` this CPU has (from /proc/cpuinfo; none where it is absent)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return ()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            have = set(line.split(":", 1)[1].split())
            return tuple(f for f in _CPU_FLAGS if f in have)
    return ()


def cpu_dtypes(flags: tuple[str, ...]) -> list[str]:
    fast = []
    if {"avx512_bf16", "amx_bf16"} & set(flags):
        fast.append("bf16")
    if {"avx512_fp16", "amx_fp16"} & set(flags):
        fast.append("fp16")
    return fast


def fast_dtypes(device: torch.device) -> list[str]:
    """The low-precision dtypes `device` runs on dedicated hardware ([] where unknown)."""
    if device.type == "cuda" and not torch.version.hip:
        major, minor = torch.cuda.get_device_capability(device)
        return tensor_core_dtypes(major, minor)
    if device.type == "cpu":
        return cpu_dtypes(cpu_flags())
    return []  # ROCm, MPS, XPU: not mapped here; measure with `fasttrain profile`


def devices() -> list[dict]:
    """Every device torch sees, accelerators first."""
    from fasttrain.env import cpu_name

    found = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            found.append({"kind": "cuda", "device": f"cuda:{i}", "name": props.name,
                          "memory_gb": round(props.total_memory / 2**30, 1),
                          "compute_capability": f"{props.major}.{props.minor}",
                          "multiprocessors": props.multi_processor_count,
                          "fast_dtypes": fast_dtypes(torch.device("cuda", i))})
    if hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        limit = getattr(torch.mps, "recommended_max_memory", None)  # torch ≥ 2.5
        found.append({"kind": "mps", "device": "mps", "name": "Apple GPU (Metal)",
                      "memory_gb": round(limit() / 2**30, 1) if limit else None,
                      "fast_dtypes": []})
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        for i in range(torch.xpu.device_count()):
            props = torch.xpu.get_device_properties(i)
            found.append({"kind": "xpu", "device": f"xpu:{i}", "name": props.name,
                          "memory_gb": round(props.total_memory / 2**30, 1), "fast_dtypes": []})
    flags = cpu_flags()
    found.append({"kind": "cpu", "device": "cpu", "name": cpu_name(), "cores": os.cpu_count(),
                  "memory_gb": _host_memory_gb(), "cpu_flags": list(flags),
                  "fast_dtypes": cpu_dtypes(flags)})
    return found


def _host_memory_gb() -> float | None:
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):  # not POSIX
        return None


def versions() -> dict:
    from fasttrain.env import env_block

    env = env_block()
    return {"python": env["python"], "torch": torch.__version__, "cuda": torch.version.cuda,
            "hip": getattr(torch.version, "hip", None),
            "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available()
            else None, "driver": env["driver"]}


# -- checks --------------------------------------------------------------------------------------


def _small_model() -> torch.nn.Module:
    from fasttrain.models import build_model

    return build_model("resnet", in_shape=(3, 32, 32), num_classes=10, width=8)


def check_placement(device: torch.device) -> dict:
    """Move a small model to `device`; every parameter and buffer must be there after."""
    target = torch.empty(0, device=device).device  # canonical: 'cuda' → 'cuda:0'
    model = _small_model().to(target)
    tensors = dict(model.named_parameters()) | dict(model.named_buffers())
    stray = [f"{name} on {t.device}" for name, t in tensors.items() if t.device != target]
    if stray:
        return {"check": "placement", "device": str(target), "status": "failed",
                "detail": f"{len(stray)} of {len(tensors)} tensors are elsewhere: "
                          + ", ".join(stray[:3])}
    with torch.no_grad():
        out = model.eval()(torch.zeros(2, 3, 32, 32, device=target))
    n_params = sum(1 for _ in model.parameters())
    return {"check": "placement", "device": str(target),
            "status": "ok" if out.device == target else "failed",
            "detail": f"all {n_params} parameters and {len(tensors) - n_params} buffers are on "
                      f"{target}; a forward ran there (output on {out.device})"}


def provoke_mismatch(device: torch.device) -> dict:
    """Feed a CPU batch to a model on `device` and explain the error that follows."""
    if device.type == "cpu":
        return {"check": "mismatch", "device": "cpu", "status": "skipped",
                "detail": "no accelerator: every tensor lives on the CPU, so a device "
                          "mismatch cannot happen here"}
    target = torch.empty(0, device=device).device
    model = _small_model().to(target).eval()
    try:
        with torch.no_grad():
            model(torch.zeros(2, 3, 32, 32))  # on the CPU, on purpose
    except RuntimeError as e:
        return {"check": "mismatch", "device": str(target), "status": "ok",
                "error": str(e).strip().splitlines()[0],
                "detail": f"expected: the batch is on cpu and the weights on {target}; torch "
                          f"never moves tensors for you. Fix: x = x.to(device) before the "
                          f"forward (the engine's Batches does this for every batch)"}
    return {"check": "mismatch", "device": str(target), "status": "failed",
            "detail": f"a CPU batch ran on a model on {target} without an error: this "
                      f"backend copies implicitly, which hides a transfer in every step"}


def diagnose() -> dict:
    """Everything `fasttrain doctor` reports, as the JSON it prints."""
    from fasttrain.env import env_block, resolve_device

    found = devices()
    best = torch.device(resolve_device("auto"))  # what `--device auto` trains on
    checks = [check_placement(best), provoke_mismatch(best)]
    gpu = any(d["kind"] != "cpu" for d in found)
    return {"schema": SCHEMA, "env": env_block(), "gpu_found": gpu, "devices": found,
            "versions": versions(), "checks": checks,
            "exit_status": 0 if gpu and all(c["status"] != "failed" for c in checks) else 1}

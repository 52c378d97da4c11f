"""Facts about this machine: device choice, hardware names, library versions and the git commit.

Every result fasttrain writes carries `env_block()`, so that a number always travels with the
hardware and software that produced it. `fasttrain env` prints the same block.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import re
import subprocess
from pathlib import Path

from fasttrain.errors import UserError
from fasttrain.lab.cost import datasheet_peaks

DEVICES = ("auto", "cpu", "cuda", "mps", "xpu")

# Dense peak throughput (FLOP/s, no sparsity, per precision) and memory bandwidth ("bw", B/s) of
# the GPUs we know: the data sheets in fasttrain/lab/gpus.toml, the one home of these figures (the
# catalogue of `fasttrain plan` needs every GPU's, MFU and the roofline only some; one file keeps
# them from drifting apart). Unknown GPUs simply get no such figure.
GPU_PEAKS: dict[str, dict[str, float]] = datasheet_peaks()


def resolve_device(requested: str = "auto") -> str:
    """The device `requested` names, checked: 'auto' picks cuda, then mps, then xpu, else the
    CPU; asking for one that torch cannot use here is a UserError. The one device resolver."""
    import torch

    if requested not in DEVICES:
        raise UserError(f"unknown device {requested!r}: choose one of {', '.join(DEVICES)}")
    available = {
        "cuda": torch.cuda.is_available,
        "mps": lambda: hasattr(torch.backends, "mps") and torch.backends.mps.is_available(),
        "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
        "cpu": lambda: True,
    }
    if requested == "auto":
        return next(d for d in ("cuda", "mps", "xpu", "cpu") if available[d]())
    if not available[requested]():
        raise UserError(f"--device {requested}: not available on this machine; use --device "
                        f"auto or cpu (`fasttrain env` lists what torch sees)")
    return requested


def name_words(name: str) -> set[str]:
    """A device name's words, lower-cased ('NVIDIA A100-SXM4-80GB' → nvidia, a100, sxm4, 80gb)."""
    return set(re.split(r"[\s\-_]+", name.lower()))


def gpu_peaks(name: str | None) -> dict[str, float] | None:
    """Peak figures for a GPU name as torch reports it ('NVIDIA H100 80GB HBM3'), if known."""
    if not name:
        return None
    tokens = name_words(name)  # whole words: 'L4' is not in 'L40S'
    for key in sorted(GPU_PEAKS, key=len, reverse=True):  # 'H100 PCIe' before 'H100'
        if all(w.lower() in tokens for w in key.split()):
            return GPU_PEAKS[key]
    if "H100" in name:  # SXM parts report no form factor in their name
        return GPU_PEAKS["H100 SXM"]
    return None


@functools.cache
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.cache
def cpu_flags() -> str | None:
    """The CPU's feature flags as the kernel lists them (avx2, fma, avx512f, ...): which SIMD
    instructions compiled kernels could use, needed to reproduce a CPU figure."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def _numba_threads() -> int | None:
    """Numba's thread count. Asking starts numba's thread pool, whose OpenMP start resets
    torch's intra-op thread count: a caller's torch.set_num_threads is put back."""
    try:
        import numba
    except ImportError:
        return None
    import torch

    threads = torch.get_num_threads()
    try:
        return numba.get_num_threads()
    finally:
        torch.set_num_threads(threads)


@functools.cache
def git_commit() -> str | None:
    """The commit of the source tree fasttrain runs from ('+dirty' when it has local changes)."""
    here = Path(__file__).resolve().parent
    try:
        run = functools.partial(
            subprocess.run, cwd=here, capture_output=True, text=True, timeout=5, check=True
        )
        commit = run(["git", "rev-parse", "HEAD"]).stdout.strip()
        dirty = run(["git", "status", "--porcelain", "--untracked-files=no"]).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed, or broken: either way there is no version to report
        return None


def env_block() -> dict:
    """The "env" block of every result JSON."""
    import numpy as np
    import torch

    block = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "cpu_threads": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_flags": cpu_flags(),
        "torch_threads": torch.get_num_threads(),
        "numba_threads": _numba_threads(),
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": np.__version__,
        "numba": _version("numba"),
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "gpu": None,
        "gpu_count": 0,
        "gpu_memory_gb": None,
        "compute_capability": None,
        "driver": None,
        "cudnn": None,
        "git_commit": git_commit(),
        # The machine's 1-minute load when the block is taken (a bench: before any row runs):
        # figures from a loaded machine are not those of an idle one.
        "load_1min": _load_1min(),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        block.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gb=round(props.total_memory / 2**30, 1),
            compute_capability=f"{props.major}.{props.minor}",
            driver=_driver_version(),
            cudnn=torch.backends.cudnn.version(),
        )
    return block


def _load_1min() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):  # no getloadavg (Windows), or the load is unavailable
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return out.splitlines()[0].strip() or None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


def hardware_line(env: dict) -> str:
    """One line a reader can quote next to a time: what it ran on."""
    hw = f"{env['cpu']} ({env['cores']} cores)"
    if env.get("gpu"):
        hw = f"{env['gpu']} ({env['gpu_memory_gb']} GiB, driver {env['driver']}) + {hw}"
    versions = f"Python {env['python']}, torch {env['torch']}, numpy {env['numpy']}"
    if env.get("numba"):
        versions += f", numba {env['numba']}"
    return f"{hw}; {versions}; commit {(env.get('git_commit') or 'unknown')[:12]}"


def env_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("env", help="print hardware, versions and commit (the env block)")
    p.add_argument("--json", action="store_true", help="print the block as JSON")
    p.set_defaults(func=env)


def env(args: argparse.Namespace) -> int:
    block = env_block()
    if args.json:
        print(json.dumps(block, indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=False, box=None)
    for key, value in block.items():
        table.add_row(f"[bold]{key}[/bold]", "-" if value is None else str(value))
    Console().print(table)
    return 0

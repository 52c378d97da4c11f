"""Data-parallel scaling: a model of the data-parallel step that predicts multi-GPU and multi-node
speed-up for a model size and an interconnect before renting them, and its measurement, the
throughput and per-rank memory of 1…N processes. `fasttrain experiment scaling` prints both
(fasttrain.commands.scaling); `fasttrain plan` uses the model.

    params, flops = count(SPECS[5])                 # gpt-124m: on the meta device
    t = step_time(compute_s, 4 * params, n=16, via=link("ib-ndr", 5.0))
    row = predict(spec, 8, 2, link("nvlink4", 5), link("ib-ndr", 5), mfu=0.4, peak=989e12,
                  floor_s=3e-4)

Measured: for each process count N (--procs) and mode (--modes ddp,zero1,fsdp) it launches
`torchrun --standalone --nproc-per-node N -m fasttrain train --parallel MODE` with the engine
switches given, --batch-size B·N (weak scaling: --batch-size is the PER-PROCESS batch here),
--max-steps 2·S and --log-every S (S = --steps): the first S steps absorb start-up, the second
S are the timed interval. Throughput, step time and rank 0's parameter / gradient / optimizer
bytes come from its metrics.jsonl, with rank 0's peak memory (CUDA allocator, or peak RSS on the
CPU). torchrun gives each of N > 1 CPU processes one thread, so on the CPU all N share the
cores a 1-process run uses alone. `dp` (DataParallel) rows need N CUDA GPUs in one process.

Model of one step on N GPUs (weak scaling, per-GPU batch fixed):
  compute   t_c: FLOPs of one step (torch's FLOP counter on the meta device: exact for the
            model, no memory or time spent) / (peak × MFU), but never below --step-floor-ms
            (an eager PyTorch step's launch overhead); or, for this machine, the measured
            1-process step.
  all-reduce of the fp32 gradients G = 4·params bytes, ring algorithm, per bucket b:
            t(b) = 2(N−1)/N · b / bandwidth + 2(N−1) · latency.
  overlap   DDP buckets: 1 MiB first, then 25 MiB (DDP's defaults). Backward (2/3 of t_c: twice
            the forward's FLOPs) produces gradients at a constant rate in bytes; a bucket's
            all-reduce starts when its gradients exist and the previous one is done. Only what
            outlasts backward is exposed — at least the last bucket, which cannot start
            earlier.  step = t_c + exposed;  speed-up = N · t_c / step.
  links     nominal per-GPU, per-direction bandwidths: PCIe 4.0 x16 ~25 GB/s (32 GB/s raw),
            NVLink 4 (H100 SXM) ~450 GB/s (900 GB/s both ways), InfiniBand NDR 400 Gb/s ~50
            GB/s (one NIC per GPU, as in DGX/HGX H100 nodes; with one NIC per node divide by
            the GPUs per node). Across nodes the ring runs at the inter-node bandwidth (every
            NCCL ring crosses each node boundary). Latency: 5 µs per ring step (--latency-us).
It ignores ZeRO-1's extra parameter broadcast and FSDP's 1.5× traffic (all-gathers in forward
and backward, reduce-scatter of gradients): it is the DDP model.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from fasttrain.errors import UserError

if TYPE_CHECKING:
    from fasttrain.engine.config import TrainConfig

MODES = ("ddp", "zero1", "fsdp", "dp")
DDP_FIRST_BUCKET = 2**20  # bytes: DDP starts with a small bucket so that communication starts early
DDP_BUCKET = 25 * 2**20  # bytes: DDP's bucket_cap_mb default
BACKWARD_SHARE = 2 / 3  # backward ≈ 2 × forward FLOPs
H100_BF16 = 989e12  # FLOP/s, H100 SXM dense bf16 (env.GPU_PEAKS)

# Nominal per-GPU, per-direction bandwidths in bytes/s (vendors' figures, rounded).
LINKS = {
    "pcie4": (25e9, "PCIe 4.0 x16 (~25 GB/s of 32 GB/s raw)"),
    "nvlink4": (450e9, "NVLink 4, H100 SXM (450 GB/s per direction)"),
    "ib-ndr": (50e9, "InfiniBand NDR 400 Gb/s (50 GB/s, one NIC per GPU)"),
}


@dataclass(frozen=True)
class Spec:
    """A model to predict for: the engine's builder arguments and a per-GPU batch."""

    label: str
    model: str
    in_shape: tuple[int, ...]
    classes: int
    batch: int  # samples (sequences for gpt) per GPU per step
    options: dict = field(default_factory=dict)


# The bundled models at their defaults and engine-sized batches, then GPT-2/3-like sizes that
# show where communication starts to matter and where a model no longer fits one GPU
# (vocabulary 50257, GPT-2's).
SPECS = (
    Spec("logreg", "logreg", (1, 28, 28), 10, 128),
    Spec("mlp", "mlp", (1, 28, 28), 10, 128),
    Spec("cnn", "cnn", (1, 28, 28), 10, 128),
    Spec("resnet", "resnet", (3, 32, 32), 10, 128),
    Spec("gpt", "gpt", (128,), 65, 64),
    Spec("gpt-124m", "gpt", (1024,), 50257, 8, {"n_layer": 12, "n_head": 12, "n_embd": 768}),
    Spec("gpt-1.3b", "gpt", (2048,), 50257, 4, {"n_layer": 24, "n_head": 16, "n_embd": 2048}),
    Spec("gpt-13b", "gpt", (2048,), 50257, 1, {"n_layer": 40, "n_head": 40, "n_embd": 5120}),
)


def count(spec: Spec) -> tuple[int, float]:
    """(parameters, FLOPs of one forward + backward at the spec's batch), on the meta device:
    shapes only, no memory, no arithmetic."""
    import torch.nn.functional as F
    from torch.utils.flop_counter import FlopCounterMode

    from fasttrain.models import build_model, param_count

    with torch.device("meta"):
        model = build_model(spec.model, in_shape=spec.in_shape, num_classes=spec.classes,
                            **spec.options)
        if spec.model == "gpt":
            x = torch.randint(0, spec.classes, (spec.batch, *spec.in_shape))
            y = torch.randint(0, spec.classes, (spec.batch * spec.in_shape[0],))
        else:
            x = torch.rand(spec.batch, *spec.in_shape)
            y = torch.randint(0, spec.classes, (spec.batch,))
    counter = FlopCounterMode(display=False)
    with counter:
        logits = model(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y).backward()
    return param_count(model), float(counter.get_total_flops())


# -- the model of a step ------------------------------------------------------------------------


@dataclass(frozen=True)
class Link:
    """An interconnect as the ring all-reduce sees it (see `link` for the named ones)."""

    name: str
    bandwidth: float  # bytes/s per GPU per direction
    latency: float = 5e-6  # seconds per ring step


def link(spec: str, latency_us: float) -> Link:
    """A named link (LINKS) or a bandwidth in GB/s."""
    if spec in LINKS:
        return Link(spec, LINKS[spec][0], latency_us * 1e-6)
    try:
        gbs = float(spec)
    except ValueError:
        gbs = -1.0
    if not 0 < gbs < math.inf:
        raise UserError(f"interconnect {spec!r}: give one of {', '.join(LINKS)} or a bandwidth "
                        f"in GB/s (e.g. 100)")
    return Link(f"{gbs:g} GB/s", gbs * 1e9, latency_us * 1e-6)


def allreduce_s(nbytes: float, n: int, via: Link) -> float:
    """Ring all-reduce: a reduce-scatter and an all-gather, each N−1 steps of nbytes/N."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / via.bandwidth + 2 * (n - 1) * via.latency


def buckets(nbytes: int) -> list[int]:
    """DDP's buckets in the order they become ready (from the last layers back)."""
    out, left = [], nbytes
    for cap in [DDP_FIRST_BUCKET] + [DDP_BUCKET] * (nbytes // DDP_BUCKET + 1):
        if left <= 0:
            break
        out.append(min(cap, left))
        left -= out[-1]
    return out


def step_time(compute_s: float, grad_bytes: int, n: int, via: Link) -> dict[str, float]:
    """One data-parallel step on `n` GPUs whose one-GPU step takes `compute_s` seconds and whose
    gradients are `grad_bytes` (4 · params for fp32): {"compute_s", "allreduce_s" (all buckets),
    "exposed_s" (what outlasts backward), "step_s"}, seconds. The model for any compute estimate
    (a roofline's, a measured step's): `predict` feeds it the FLOP count of a bundled model."""
    backward = BACKWARD_SHARE * compute_s
    forward = compute_s - backward
    done = ready = 0.0
    total = 0.0
    produced = 0
    for b in buckets(grad_bytes):
        produced += b
        ready = forward + backward * produced / grad_bytes  # its gradients exist
        t = allreduce_s(b, n, via)
        done = max(ready, done) + t  # one bucket at a time, as on one NCCL stream
        total += t
    exposed = max(0.0, done - compute_s) if n > 1 else 0.0
    return {"compute_s": compute_s, "allreduce_s": total, "exposed_s": exposed,
            "step_s": compute_s + exposed}


def predict(spec: Spec, gpus_per_node: int, nodes: int, intra: Link, inter: Link, mfu: float,
            peak: float, floor_s: float) -> dict:
    """`predict_counted` for a bundled spec, counted on the meta device (`count`)."""
    params, flops = count(spec)
    return predict_counted(spec.label, spec.batch, params, flops, gpus_per_node, nodes, intra,
                           inter, mfu, peak, floor_s)


def predict_counted(label: str, batch: int, params: int, flops: float, gpus_per_node: int,
                    nodes: int, intra: Link, inter: Link, mfu: float, peak: float,
                    floor_s: float) -> dict:
    """One row of the prediction for the model `label` — `params` parameters, `flops` FLOPs of
    one forward + backward at `batch` samples per GPU — on `nodes` × `gpus_per_node` GPUs:
    compute time at `mfu` of `peak` FLOP/s (at least `floor_s` seconds), the all-reduce over
    `intra` within one node or `inter` across nodes, and (`step_time`) what of it is exposed.
    Seconds, bytes and FLOPs; speed-up and efficiency against one GPU at the same batch per GPU."""
    n = gpus_per_node * nodes
    via = inter if nodes > 1 else intra
    compute = max(flops / (peak * mfu), floor_s)
    t = step_time(compute, 4 * params, n, via)
    return {"model": label, "params": params, "batch_per_gpu": batch,
            "flops_per_step": flops, "gpus": n, "nodes": nodes, "interconnect": via.name,
            **t, "speedup": n * compute / t["step_s"], "efficiency": compute / t["step_s"]}


# -- measured -----------------------------------------------------------------------------------


def unavailable(mode: str, n: int, device: str) -> str | None:
    """Why `n` processes of `mode` cannot run here on `device` ("auto", "cuda", "cpu"), or None."""
    cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    if mode == "dp":
        if n < 2:
            return "DataParallel needs ≥ 2 GPUs (its 1-GPU row is --parallel none)"
        if gpus < n:
            return f"DataParallel needs {n} CUDA GPUs in one process; {gpus} here"
    elif cuda and gpus < n:
        return f"{n} processes need {n} CUDA GPUs (one each); {gpus} here"
    return None


def measure(cfg: TrainConfig, mode: str, n: int, steps: int, workdir: Path) -> dict:
    """One torchrun (or, for dp, one process) run; the row of its timed interval."""
    from fasttrain.engine.configfile import to_toml

    row = {"mode": mode, "procs": n, "status": "ok", "reason": None}
    reason = unavailable(mode, n, cfg.device)
    if reason:
        return {**row, "status": "unavailable", "reason": reason}
    out = workdir / f"{mode}-{n}"
    config = workdir / "config.toml"
    config.write_text(to_toml(cfg))
    train = ["-m", "fasttrain", "train", "--config", str(config), "--parallel", mode,
             "--batch-size", str(cfg.batch_size * n), "--max-steps", str(2 * steps),
             "--log-every", str(steps), "--checkpoint-every", "0", "--out", str(out),
             "--no-progress", "--epochs", str(max(cfg.epoch_limit(), 10**6))]
    env = dict(os.environ)
    if mode == "dp":
        cmd = [sys.executable, *train]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(n), *train]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        return {**row, "status": "failed",
                "reason": f"exit {proc.returncode}: {failure(proc.stderr or proc.stdout)}"}
    logs = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    timed = [r for r in logs if r["kind"] == "train"][-1]
    peak = timed.get("peak_memory_gb", timed.get("peak_rss_gb"))
    return {**row, "samples_per_s": timed["samples_per_s"], "step_ms": timed["step_ms"],
            "param_bytes": timed["param_bytes"], "grad_bytes": timed["grad_bytes"],
            "optimizer_bytes": timed["optimizer_bytes"],
            "peak_bytes": None if peak is None else int(peak * 2**30)}


def failure(output: str) -> str:
    """The line that says why a run failed: train's own `error: ...` line where it printed one
    (torchrun ends its output with a banner of '=' after it), else the last line."""
    lines = output.strip().splitlines()
    said = [line for line in lines if line.startswith("error: ")]
    return (said or lines or ["no output"])[-1]


def measure_all(cfg: TrainConfig, modes: tuple[str, ...], procs: tuple[int, ...],
                steps: int) -> list[dict]:
    """Every (mode, process count) row, then each ok row's speed-up and efficiency against the
    same mode's fewest processes (weak scaling)."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="fasttrain-scaling-") as tmp:
        for mode in modes:
            for n in procs:
                rows.append(measure(cfg, mode, n, steps, Path(tmp)))
    for mode in modes:  # speed-up against the same mode's smallest run
        ok = [r for r in rows if r["mode"] == mode and r["status"] == "ok"]
        for r in ok:
            base = ok[0]
            r["speedup"] = r["samples_per_s"] / base["samples_per_s"] * base["procs"]
            r["efficiency"] = r["speedup"] / r["procs"]
    return rows

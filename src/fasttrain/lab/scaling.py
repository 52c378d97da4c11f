"""`fasttrain experiment scaling`: throughput and per-rank memory on 1…N processes, measured, and
beside it a model of the data-parallel step that predicts multi-GPU and multi-node speed-up for
a model size and an interconnect before renting them.

    python -m fasttrain.lab.scaling --model mlp --data synthetic --procs 1,2 --json s.json
    python -m fasttrain.lab.scaling --predict-only             # the bundled models, 8 and 2×8 GPUs
    python -m fasttrain.lab.scaling --predict-only --intra pcie4 --gpus-per-node 4 --nodes 1

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

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from fasttrain.errors import UserError

SCHEMA = "fasttrain.experiment/1"
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


# The bundled models at their defaults and engine-sized batches, then two GPT-2-like sizes that
# show where communication starts to matter (vocabulary 50257, GPT-2's).
SPECS = (
    Spec("logreg", "logreg", (1, 28, 28), 10, 128),
    Spec("mlp", "mlp", (1, 28, 28), 10, 128),
    Spec("cnn", "cnn", (1, 28, 28), 10, 128),
    Spec("resnet", "resnet", (3, 32, 32), 10, 128),
    Spec("gpt", "gpt", (128,), 65, 64),
    Spec("gpt-124m", "gpt", (1024,), 50257, 8, {"n_layer": 12, "n_head": 12, "n_embd": 768}),
    Spec("gpt-1.3b", "gpt", (2048,), 50257, 4, {"n_layer": 24, "n_head": 16, "n_embd": 2048}),
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
    """Compute, total all-reduce, exposed all-reduce and step time (seconds) of one step."""
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
    params, flops = count(spec)
    n = gpus_per_node * nodes
    via = inter if nodes > 1 else intra
    compute = max(flops / (peak * mfu), floor_s)
    t = step_time(compute, 4 * params, n, via)
    return {"model": spec.label, "params": params, "batch_per_gpu": spec.batch,
            "flops_per_step": flops, "gpus": n, "nodes": nodes, "interconnect": via.name,
            **t, "speedup": n * compute / t["step_s"], "efficiency": compute / t["step_s"]}


# -- measured -----------------------------------------------------------------------------------


def unavailable(mode: str, n: int, device: str) -> str | None:
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


def measure(cfg, mode: str, n: int, steps: int, workdir: Path) -> dict:
    """One torchrun (or, for dp, one process) run; the row of its timed interval."""
    from fasttrain.engine.config import to_toml

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
             "--no-progress", "--epochs", str(max(cfg.epochs, 10**6))]
    env = dict(os.environ)
    if mode == "dp":
        cmd = [sys.executable, *train]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(n))
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node", str(n), *train]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        return {**row, "status": "failed", "reason": f"exit {proc.returncode}: {tail[0]}"}
    logs = [json.loads(line) for line in (out / "metrics.jsonl").open()]
    timed = [r for r in logs if r["kind"] == "train"][-1]
    peak = timed.get("peak_memory_gb", timed.get("peak_rss_gb"))
    return {**row, "samples_per_s": timed["samples_per_s"], "step_ms": timed["step_ms"],
            "param_bytes": timed["param_bytes"], "grad_bytes": timed["grad_bytes"],
            "optimizer_bytes": timed["optimizer_bytes"],
            "peak_bytes": None if peak is None else int(peak * 2**30)}


def measure_all(cfg, modes: tuple[str, ...], procs: tuple[int, ...], steps: int) -> list[dict]:
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


# -- output -------------------------------------------------------------------------------------


def _b(n) -> str:
    from fasttrain.report import fmt_bytes

    return "-" if n is None else fmt_bytes(n)


def measured_table(result: dict):
    from fasttrain import report

    cfg = result["config"]
    title = (f"measured: {cfg['model']} on {cfg['data']}, {cfg['batch_size']} samples per "
             f"process per step, {cfg['optimizer']}, {cfg['device']}")
    return report.rows_table(title, [
        ("mode", lambda r: r["mode"]), ("procs", lambda r: r["procs"]),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        ("ms/step", lambda r: f"{r['step_ms']:.3g}"),
        ("speed-up", lambda r: f"{r['speedup']:.2f}×"),
        ("weights/rank", lambda r: _b(r["param_bytes"])),
        ("grads/rank", lambda r: _b(r["grad_bytes"])),
        ("optimizer/rank", lambda r: _b(r["optimizer_bytes"])),
        ("peak rank 0", lambda r: _b(r["peak_bytes"])),
    ], result["rows"], caption="speed-up: samples/s against the same mode on the fewest "
        "processes, × their count (weak scaling). Bytes: rank 0's training state.",
        label_columns=2)


def predicted_table(result: dict):
    from fasttrain import report

    o = result["options"]
    return report.rows_table(
        f"predicted: DDP step on H100s at {o['mfu']:.0%} MFU of {o['peak_tflops']:g} TFLOP/s",
        _predicted_columns(), result["predicted"], caption=_predicted_caption(o),
        label_columns=2)


def _predicted_columns():
    return [
        ("model", lambda r: r["model"]), ("GPUs", lambda r: _gpus(r)),
        ("params", lambda r: _count(r["params"])),
        ("batch/GPU", lambda r: r["batch_per_gpu"]),
        ("compute ms", lambda r: f"{1e3 * r['compute_s']:.3g}"),
        ("all-reduce ms", lambda r: f"{1e3 * r['allreduce_s']:.3g}"),
        ("exposed ms", lambda r: f"{1e3 * r['exposed_s']:.3g}"),
        ("speed-up", lambda r: f"{r['speedup']:.2f}×"),
        ("efficiency", lambda r: f"{r['efficiency']:.0%}"),
    ]


def _count(n: int) -> str:
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def _gpus(r: dict) -> str:
    per = r["gpus"] // r["nodes"]
    where = f"{r['nodes']}×{per}" if r["nodes"] > 1 else str(per)
    return f"{where} ({r['interconnect']})"


def _predicted_caption(o: dict) -> str:
    return (f"compute: FLOPs of forward + backward (torch's counter) ÷ ({o['mfu']:.0%} × "
            f"{o['peak_tflops']:g} TFLOP/s), at least {o['step_floor_ms']:g} ms; all-reduce: "
            f"ring over fp32 gradients, {o['latency_us']:g} µs per ring step; exposed: what "
            f"outlasts backward with DDP's buckets (1 MiB, then 25 MiB). batch/GPU: images, or "
            f"sequences of the model's block size for gpt.")


def predicted_markdown(result: dict) -> str:
    """The prediction table as Markdown (docs/distributed.md)."""
    cols = _predicted_columns()
    lines = ["| " + " | ".join(h for h, _ in cols) + " |",
             "|" + "|".join("---" if i < 2 else "--:" for i in range(len(cols))) + "|"]
    lines += ["| " + " | ".join(str(f(r)) for _, f in cols) + " |" for r in result["predicted"]]
    return "\n".join(lines) + "\n\n" + _predicted_caption(result["options"]) + "\n"


# -- the command ----------------------------------------------------------------------------------


def _ints(flag: str, spec: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UserError(f"{flag} {spec!r}: give positive integers separated by commas, e.g. 1,2")
    return tuple(sorted(set(values)))


def _names(flag: str, spec: str, known) -> tuple[str, ...]:
    names = tuple(s.strip() for s in spec.split(",") if s.strip())
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise UserError(f"{flag} {spec!r}: choose from {', '.join(known)}")
    return names


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The scaling experiment's own flags (none clash with the engine's or `experiment`'s)."""
    g = p.add_argument_group("scaling")
    default_procs = ",".join(str(2**i) for i in range(8) if 2**i <= torch.cuda.device_count()) \
        if torch.cuda.is_available() else "1,2"
    g.add_argument("--procs", default=default_procs, metavar="LIST",
                   help="process counts to measure (default here: %(default)s)")
    g.add_argument("--modes", default="ddp,zero1,fsdp", metavar="LIST",
                   help=f"--parallel modes to measure, of {', '.join(MODES)} (default: "
                   "%(default)s)")
    g.add_argument("--predict-only", action="store_true", help="skip the measured runs")
    g.add_argument("--predict-models", default=",".join(s.label for s in SPECS), metavar="LIST",
                   help="models to predict for (default: %(default)s)")
    g.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                   help="GPUs per node of the prediction (default: 8)")
    g.add_argument("--nodes", default="1,2", metavar="LIST",
                   help="node counts of the prediction (default: 1,2)")
    g.add_argument("--intra", default="nvlink4", metavar="LINK",
                   help=f"link within a node: {', '.join(LINKS)} or GB/s (default: nvlink4)")
    g.add_argument("--inter", default="ib-ndr", metavar="LINK",
                   help="link between nodes, per GPU (default: ib-ndr)")
    g.add_argument("--latency-us", type=float, default=5.0, metavar="US",
                   help="latency per ring step (default: 5)")
    g.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilization assumed for "
                   "compute (default: 0.4)")
    g.add_argument("--peak-tflops", type=float, default=H100_BF16 / 1e12, metavar="TF",
                   help="peak FLOP/s of one GPU, in TFLOP/s (default: H100 SXM bf16, 989)")
    g.add_argument("--step-floor-ms", type=float, default=0.3, metavar="MS",
                   help="shortest step assumed: eager launch overhead (default: 0.3)")


def run(args: argparse.Namespace) -> int:
    """`fasttrain experiment scaling` (and `python -m fasttrain.lab.scaling`)."""
    from rich.console import Console

    from fasttrain import report
    from fasttrain.engine.config import from_args
    from fasttrain.env import env_block, hardware_line
    from fasttrain.models import MODEL_KINDS

    for flag in ("mfu", "peak_tflops", "step_floor_ms", "latency_us"):
        if not math.isfinite(getattr(args, flag)):
            raise UserError(f"--{flag.replace('_', '-')} must be a finite number, got "
                            f"{getattr(args, flag)}")
    if not 0 < args.mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {args.mfu}")
    for flag in ("gpus_per_node", "steps"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be ≥ 1, got {getattr(args, flag)}")
    if args.peak_tflops <= 0 or args.step_floor_ms < 0 or args.latency_us < 0:
        raise UserError("--peak-tflops must be > 0, --step-floor-ms and --latency-us ≥ 0")
    if args.json:
        report.check_writable(args.json, "--json")
    intra, inter = link(args.intra, args.latency_us), link(args.inter, args.latency_us)
    labels = _names("--predict-models", args.predict_models, [s.label for s in SPECS])
    nodes = _ints("--nodes", args.nodes)
    modes = _names("--modes", args.modes, MODES)
    procs = _ints("--procs", args.procs)
    cfg = from_args(args)
    if not args.predict_only:
        cfg.validate(MODEL_KINDS)  # the base switches; each run re-checks with its --parallel
    err = Console(stderr=True)
    env = env_block()
    err.print(f"[bold]fasttrain experiment scaling[/bold] on {hardware_line(env)}")
    options = {"steps": args.steps, "procs": procs, "modes": modes, "mfu": args.mfu,
               "peak_tflops": args.peak_tflops, "step_floor_ms": args.step_floor_ms,
               "latency_us": args.latency_us, "gpus_per_node": args.gpus_per_node,
               "nodes": nodes, "intra": asdict(intra), "inter": asdict(inter)}
    rows = [] if args.predict_only else measure_all(cfg, modes, procs, args.steps)
    predicted = [predict(s, args.gpus_per_node, k, intra, inter, args.mfu,
                         args.peak_tflops * 1e12, args.step_floor_ms / 1e3)
                 for s in SPECS if s.label in labels for k in nodes]
    result = {"schema": SCHEMA, "experiment": "scaling", "env": env, "config": cfg.to_dict(),
              "options": options, "rows": rows, "predicted": predicted}
    console = report.wide_console()
    if rows:
        console.print(measured_table(result))
    console.print(predicted_table(result))
    if args.json:
        report.write_json(args.json, result)
        err.print(f"wrote {args.json}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point until `fasttrain experiment` lists `scaling`."""
    from fasttrain.cli import _Parser
    from fasttrain.engine.config import add_arguments as engine_arguments

    p = _Parser(prog="python -m fasttrain.lab.scaling", description=__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20, metavar="S",
                   help="timed steps per measured run, after as many untimed (default: 20)")
    p.add_argument("--json", metavar="PATH", help="write the result JSON here")
    add_arguments(p)
    engine_arguments(p)
    try:
        return run(p.parse_args(argv))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return UserError.exit_code


if __name__ == "__main__":
    raise SystemExit(main())

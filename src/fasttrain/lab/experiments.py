"""`fasttrain experiment precision|memory|e2e`: the seed lab's exercises, measured on this machine.

    fasttrain experiment precision --model cnn --steps 50 --json p.json --plot p.png
    fasttrain experiment memory --model gpt --batches 16,32,64,128 --accum 4
    fasttrain experiment e2e                      # cnn on MNIST (synthetic when it is absent)

- precision: fp32, tf32, fp16 + GradScaler, bf16 on the same model, data and seed: ms/step,
  peak memory, final loss, test accuracy, loss-scale events. (--precision is the variable here.)
- memory: samples/s and peak memory per batch size (--batches, stopping at the first that does
  not fit); batch B against B/k × k accumulation (max |Δweights| after the same steps, memory of
  each); activation checkpointing off/on (memory saved, time lost).
- e2e: the seed lab's Exercise 4 — CPU vs GPU vs GPU + AMP (fp16 as in the lab, and bf16) —
  speed-ups, seconds per epoch (extrapolated from the timed steps) and memory, beside the lab's
  expected results. (--device and --precision are the variables here.)

Every row is built from the engine switches given (`fasttrain train --help` lists them). Times:
the median of `--steps` steps, each between two device syncs, after `--timing-warmup` untimed
steps that absorb allocation, cuDNN's choices and compilation. Peak memory is
`torch.cuda.max_memory_allocated` over the timed steps on CUDA; on the CPU, whose allocator keeps
no statistics, it is `fasttrain memory`'s hook-based count. Rows that cannot run here are listed
as unavailable, with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass

import torch

from fasttrain.commands.common import data_label, gib_arg, lab_config
from fasttrain.errors import UserError
from fasttrain.lab import memory as mem
from fasttrain.lab.batch_size import train_samples

SCHEMA = "fasttrain.experiment/1"
EXPERIMENTS = ("precision", "memory", "e2e")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# The seed lab's Exercise 4 "Expected Results" (its own, unnamed GPU; MNIST classifier).
SEED_E2E = {"cpu-fp32": {"s_per_epoch": 120.0},
            "cuda-fp32": {"s_per_epoch": 25.0, "speedup": 4.8, "memory_gb": 8.2},
            "cuda-fp16": {"s_per_epoch": 15.0, "speedup": 8.0, "memory_gb": 4.7}}


@dataclass(frozen=True)
class Options:
    steps: int = 30  # timed optimizer steps per row
    warmup: int = 3  # untimed steps before them
    batches: tuple[int, ...] = (16, 32, 64, 128, 256, 512)  # memory: the sweep
    accum: int = 4  # memory: k of B vs B/k × k
    memory_limit: int | None = None  # memory: bytes; the sweep stops above it


# -- one measured run ----------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None  # JSON has no NaN


@torch.no_grad()
def evaluate(trainer) -> tuple[float, float]:
    """(test loss, test accuracy) over the whole test split, under the run's autocast; token
    accuracy for language models."""
    from fasttrain.engine.callbacks import evaluate as engine_evaluate

    result = engine_evaluate(trainer, "test")  # the engine's own evaluation: one sync
    accuracy = next((v for k, v in result.items() if k.endswith("accuracy")), None)
    return result.get("test_loss", math.nan), accuracy


def measure_run(cfg, task, opts: Options, evaluate_after: bool = True,
                extra: Callable | None = None) -> dict:
    """Train `opts.warmup` untimed and `opts.steps` timed steps with `cfg`; the row's numbers.
    `extra(trainer)` adds fields before the trainer is let go (e.g. its weights)."""
    from fasttrain.engine.loop import endless_batches, step
    from fasttrain.engine.run import build
    from fasttrain.timing import synchronizer, time_call

    trainer = build(cfg, data=task, verbose=False)
    dev = trainer.device
    cuda = dev.type == "cuda"
    sync = synchronizer(dev.type)
    batches = endless_batches(trainer)
    for _ in range(opts.warmup):
        step(trainer, next(batches))
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(dev)  # the peak of the timed steps, data included
    tail = min(opts.steps, 10)  # final loss: the mean of the last (up to) 10 steps
    ms = []
    for i in range(opts.steps):
        if i == opts.steps - tail:
            trainer.loss_sum.zero_()
        # The next batch's gather is part of a step, as in the engine's own loop.
        ms.append(time_call(lambda: step(trainer, next(batches)), sync)[1])
    final_loss = trainer.loss_sum.item() / tail
    if cuda:
        peak, peak_by = torch.cuda.max_memory_allocated(dev), "cuda allocator"
        data = mem.resident_data(trainer)  # in the peak: the dataset on the GPU
    else:
        data = 0
        peak, peak_by = mem.breakdown(trainer, next(batches)).measured_peak, "hook count"
    median = statistics.median(ms)
    row = {"device": dev.type, "precision": cfg.precision, "batch_size": cfg.batch_size,
           "accum_steps": cfg.accum_steps, "ms_per_step": median, "ms_per_step_min": min(ms),
           "ms_per_step_max": max(ms), "samples_per_s": cfg.batch_size / (median / 1e3),
           "steps_per_epoch": trainer.batches.steps_per_epoch, "peak_bytes": peak,
           "peak_by": peak_by, "data_bytes": data, "final_loss": _finite(final_loss),
           "test_loss": None, "test_accuracy": None, "loss_scale": None, "skipped_steps": None}
    if trainer.scaler.is_enabled():
        row.update(loss_scale=trainer.scaler.get_scale(), skipped_steps=int(trainer.skipped))
    if evaluate_after:
        loss, acc = evaluate(trainer)
        row.update(test_loss=_finite(loss), test_accuracy=acc)
    if extra is not None:
        row.update(extra(trainer))
    return row


def guarded(label: dict, run: Callable[[], dict]) -> dict:
    """`run()` as a row: ok, unavailable (the engine refused the switches: its one line), or
    failed (out of memory, or an internal error, whose traceback is printed). Never raises."""
    failure = None
    try:
        return {**label, "status": "ok", "reason": None, **run()}
    except UserError as e:
        return {**label, "status": "unavailable", "reason": str(e)}
    except torch.OutOfMemoryError:
        failure = "out of memory"
    except Exception as e:  # one broken row must not take the others down
        traceback.print_exc(file=sys.stderr)
        failure = f"{type(e).__name__}: {e}".splitlines()[0]
    mem.free_memory()  # outside the except block: the traceback no longer pins the tensors
    return {**label, "status": "failed", "reason": failure}


def _no_gpu() -> str:
    built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"no CUDA GPU visible to torch (torch {torch.__version__}, {built})"


def unavailable(precision: str, device: torch.device) -> str | None:
    """Why `precision` cannot run on `device`, or None."""
    cuda = device.type == "cuda"
    if precision == "tf32":
        if not cuda:
            return (f"TF32 is a mode of NVIDIA tensor cores (Ampere and newer); this is "
                    f"{device.type}")
        major, minor = torch.cuda.get_device_capability(device)
        if major < 8:
            return f"this GPU (sm{major}{minor}) has no TF32 tensor cores: it would be fp32"
    if precision == "bf16" and cuda and not torch.cuda.is_bf16_supported():
        return "this GPU has no bf16 support"
    return None


def _note(precision: str, device: torch.device) -> str | None:
    if precision == "fp16" and device.type == "cpu":
        return "CPU: no fast fp16 kernels, runs emulated and slowly"
    return None


# -- the experiments -----------------------------------------------------------------------------


def run_precision(cfg, task, opts: Options) -> list[dict]:
    from fasttrain.env import resolve_device

    dev = torch.device(resolve_device(cfg.device))
    rows = []
    for p in PRECISIONS:
        label = {"precision": p, "device": dev.type, "note": _note(p, dev)}
        reason = unavailable(p, dev)
        if reason:
            rows.append({**label, "status": "unavailable", "reason": reason})
            continue
        rows.append(guarded(label, lambda p=p: measure_run(
            dataclasses.replace(cfg, precision=p), task, opts)))
        mem.free_memory()
    return rows


def _weights(trainer) -> dict:
    return {"_weights": {k: v.detach().float().cpu().clone()
                         for k, v in trainer.model.state_dict().items()}}


def run_memory(cfg, task, opts: Options) -> list[dict]:
    rows: list[dict] = []
    cap = train_samples(task, cfg.block_size)
    # 1. Throughput and peak per batch size: stop at the first that does not fit.
    for b in opts.batches:
        label = {"part": "sweep", "label": f"batch {b}", "batch_size": b}
        if b > cap or b % cfg.accum_steps:
            why = (f"more than the {cap} training samples" if b > cap
                   else f"not divisible by --accum-steps {cfg.accum_steps}")
            rows.append({**label, "status": "skipped", "reason": why})
            continue
        row = guarded(label, lambda b=b: measure_run(
            dataclasses.replace(cfg, batch_size=b), task, opts, evaluate_after=False))
        if row["status"] == "ok" and opts.memory_limit and row["peak_bytes"] > opts.memory_limit:
            row.update(status="over limit", reason=f"peak {row['peak_bytes']:,} B is over "
                       f"--memory-limit")
        rows.append(row)
        mem.free_memory()
        if row["status"] != "ok":
            break  # a larger batch will not fit either
    # 2. Gradient accumulation: the same update from B at once and from B/k, k times.
    B, k = cfg.batch_size, opts.accum
    pair = []
    for accum in (1, k):
        label = {"part": "accumulation", "label": f"{B // accum} × {accum}", "batch_size": B}
        pair.append(guarded(label, lambda accum=accum: measure_run(
            dataclasses.replace(cfg, accum_steps=accum), task, opts, evaluate_after=False,
            extra=_weights)))
        mem.free_memory()
    if all(r["status"] == "ok" for r in pair):
        w0, w1 = (r["_weights"] for r in pair)
        pair[0]["max_abs_dweight"] = 0.0
        pair[1]["max_abs_dweight"] = max((w0[n] - w1[n]).abs().max().item() for n in w0)
    for r in pair:
        r.pop("_weights", None)
    rows += pair
    # 3. Activation checkpointing: memory saved against time lost.
    ckpt = []
    for on in (False, True):
        label = {"part": "checkpointing", "label": "on" if on else "off",
                 "batch_size": cfg.batch_size}
        ckpt.append(guarded(label, lambda on=on: measure_run(
            dataclasses.replace(cfg, activation_checkpointing=on), task, opts,
            evaluate_after=False)))
        mem.free_memory()
    off, on = ckpt
    if off["status"] == on["status"] == "ok":
        on["memory_saved"] = 1 - on["peak_bytes"] / off["peak_bytes"]
        on["time_lost"] = on["ms_per_step"] / off["ms_per_step"] - 1
    return rows + ckpt


def run_e2e(cfg, task, opts: Options) -> list[dict]:
    rows = []
    for key, label, device, precision in (
        ("cpu-fp32", "CPU", "cpu", "fp32"),
        ("cuda-fp32", "GPU", "cuda", "fp32"),
        ("cuda-fp16", "GPU + AMP (fp16, GradScaler)", "cuda", "fp16"),
        ("cuda-bf16", "GPU + AMP (bf16)", "cuda", "bf16"),
    ):
        head = {"row": key, "label": label, "device": device, "precision": precision,
                "seed_expected": SEED_E2E.get(key)}
        reason = _no_gpu() if device == "cuda" and not torch.cuda.is_available() else (
            unavailable(precision, torch.device(device)))
        if reason:
            rows.append({**head, "status": "unavailable", "reason": reason})
            continue
        rows.append(guarded(head, lambda device=device, precision=precision: measure_run(
            dataclasses.replace(cfg, device=device, precision=precision), task, opts)))
        mem.free_memory()
    ok = {r["row"]: r for r in rows if r["status"] == "ok"}
    for r in ok.values():
        r["s_per_epoch"] = r["ms_per_step"] * r["steps_per_epoch"] / 1e3  # extrapolated
        if "cpu-fp32" in ok:
            r["speedup_vs_cpu"] = ok["cpu-fp32"]["ms_per_step"] / r["ms_per_step"]
        if "cuda-fp32" in ok and r["device"] == "cuda":
            # Training memory only: the resident dataset is the same in every GPU row.
            base = ok["cuda-fp32"]
            r["memory_vs_gpu_fp32"] = ((base["peak_bytes"] - base["data_bytes"])
                                       / max(1, r["peak_bytes"] - r["data_bytes"]))
    return rows


RUNNERS = {"precision": run_precision, "memory": run_memory, "e2e": run_e2e}


def check(name: str, cfg, opts: Options) -> None:
    """Reject what would fail part-way, before any work."""
    if name not in RUNNERS:
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    if name == "memory" and cfg.batch_size % opts.accum:
        raise UserError(f"--batch-size {cfg.batch_size} is not divisible by --accum "
                        f"{opts.accum}; choose a batch size that is a multiple of it")


def run(name: str, cfg, task, opts: Options) -> list[dict]:
    """The rows of experiment `name` (see the module docstring)."""
    check(name, cfg, opts)
    return RUNNERS[name](cfg, task, opts)


# -- tables and plots ----------------------------------------------------------------------------


def _ms(r: dict) -> str:
    ms = r.get("ms_per_step")
    return "-" if ms is None else f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _peak(r: dict) -> str:
    from fasttrain.report import fmt_bytes

    data = r.get("data_bytes")
    return fmt_bytes(r["peak_bytes"]) + (f" (data {fmt_bytes(data)})" if data else "")


def _num(v, fmt: str = "{:.4f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(result: dict):
    from fasttrain import report

    name, rows, cfg = result["experiment"], result["rows"], result["config"]
    data = cfg["data"] + (" (SYNTHETIC stand-in, not real data)" if cfg.get("synthetic") else "")
    title = (f"fasttrain experiment {name} — {cfg['model']} on {data}, batch "
             f"{cfg['batch_size']}, {cfg['optimizer']}, {result['options']['steps']} timed steps")
    peak_note = ("peak: CUDA allocator over the timed steps (the dataset kept on the GPU "
                 "included, shown apart); on the CPU the hook-based count (weights + gradients + "
                 "optimizer state + saved tensors + inputs)")
    if name == "precision":
        return report.rows_table(title, [
            ("precision", lambda r: r["precision"]), ("device", lambda r: r["device"]),
            ("ms/step", _ms), ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("peak", _peak),
            ("final loss", lambda r: _num(r["final_loss"])),
            ("test acc", lambda r: _num(r["test_accuracy"], "{:.2%}")),
            ("loss scale / skipped", lambda r: "-" if r["loss_scale"] is None
             else f"{r['loss_scale']:g} / {r['skipped_steps']}"),
            ("note", lambda r: r.get("note") or ""),
        ], rows, caption=f"ms/step: median. {peak_note}.", label_columns=2)
    if name == "memory":
        return report.rows_table(title, [
            ("part", lambda r: r["part"]), ("setting", lambda r: r["label"]),
            ("ms/step", _ms), ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("peak", _peak),
            ("max |Δw| vs batch B", lambda r: _num(r.get("max_abs_dweight"), "{:.2e}")),
            ("memory saved / time lost", lambda r: "-" if "memory_saved" not in r
             else f"{r['memory_saved']:.0%} / {r['time_lost']:+.0%}"),
        ], rows, caption=f"{peak_note}. Accumulation: weights compared after the same "
            f"{result['options']['warmup'] + result['options']['steps']} steps.",
            label_columns=2)
    return report.rows_table(title, [
        ("setup", lambda r: r["label"]),
        ("ms/step", _ms), ("s/epoch", lambda r: f"{r['s_per_epoch']:,.1f}"),
        ("speed-up vs CPU", lambda r: _num(r.get("speedup_vs_cpu"), "{:.1f}×")),
        ("peak", _peak),
        ("memory ÷ vs GPU fp32", lambda r: _num(r.get("memory_vs_gpu_fp32"), "{:.2f}×")),
        ("test acc", lambda r: _num(r["test_accuracy"], "{:.2%}")),
        ("seed lab expects", lambda r: _seed(r.get("seed_expected"))),
    ], rows, caption=f"s/epoch extrapolated from the median step × steps per epoch. "
        f"{peak_note}. Seed lab: its own GPU, 'CPU 120 s/epoch, GPU 4.8×, GPU+FP16 8×, "
        f"memory 8.2 → 4.7 GB'.")


def _seed(s: dict | None) -> str:
    if not s:
        return "-"
    bits = [f"{s['s_per_epoch']:g} s/epoch"]
    if "speedup" in s:
        bits.append(f"{s['speedup']:g}×")
    if "memory_gb" in s:
        bits.append(f"{s['memory_gb']:g} GB")
    return ", ".join(bits)


def plot(result: dict, path) -> None:
    from fasttrain import report

    name = result["experiment"]
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    mib = [r["peak_bytes"] / 2**20 for r in ok]
    if name == "precision":
        x = [r["precision"] for r in ok]
        panels = [{"title": "ms per step (lower is better)", "x": x,
                   "y": [r["ms_per_step"] for r in ok], "ylabel": "ms"},
                  {"title": "peak memory", "x": x, "y": mib, "ylabel": "MiB"},
                  {"title": "test accuracy", "x": x, "y": [r["test_accuracy"] for r in ok]}]
    elif name == "memory":
        sweep = [r for r in ok if r["part"] == "sweep"]
        others = [r for r in ok if r["part"] != "sweep"]
        bx = [r["batch_size"] for r in sweep]
        panels = [{"title": "throughput", "kind": "line", "x": bx, "logx": True,
                   "y": [r["samples_per_s"] for r in sweep], "xlabel": "batch size",
                   "ylabel": "samples/s"},
                  {"title": "peak memory", "kind": "line", "x": bx, "logx": True,
                   "y": [r["peak_bytes"] / 2**20 for r in sweep], "xlabel": "batch size",
                   "ylabel": "MiB"},
                  {"title": "accumulation and checkpointing: peak memory",
                   "x": [f"{r['part'][:5]} {r['label']}" for r in others],
                   "y": [r["peak_bytes"] / 2**20 for r in others], "ylabel": "MiB"}]
    else:
        x = [r["label"] for r in ok]
        panels = [{"title": "seconds per epoch (extrapolated)", "x": x, "logy": True,
                   "y": [r["s_per_epoch"] for r in ok], "ylabel": "s"},
                  {"title": "peak memory", "x": x, "y": mib, "ylabel": "MiB"}]
    env, cfg = result["env"], result["config"]
    data = cfg["data"] + (" (synthetic)" if cfg.get("synthetic") else "")
    report.panels_plot(path, f"experiment {name}: {cfg['model']} on {data} — "
                       f"{env.get('gpu') or env.get('cpu')}", panels)


# -- the command ---------------------------------------------------------------------------------


def _batches(spec: str) -> tuple[int, ...]:
    try:
        values = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UserError(f"--batches {spec!r}: give positive integers separated by commas, e.g. "
                        f"16,32,64")
    return tuple(sorted(set(values)))


def experiment_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.commands import scaling
    from fasttrain.engine.config import add_arguments

    p = sub.add_parser("experiment", help="the seed lab's exercises, measured: precision, "
                       "memory, e2e; and multi-process scaling", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=(*EXPERIMENTS, "scaling"),
                   metavar="{precision,memory,e2e,scaling}", help="which experiment")
    g = p.add_argument_group("experiment")
    g.add_argument("--steps", type=int, default=Options.steps, metavar="N",
                   help=f"timed optimizer steps per row (default: {Options.steps})")
    g.add_argument("--timing-warmup", type=int, default=Options.warmup, metavar="N",
                   help=f"untimed steps before them (default: {Options.warmup})")
    g.add_argument("--batches", default=",".join(map(str, Options.batches)), metavar="LIST",
                   help="memory: batch sizes of the sweep (default: %(default)s)")
    g.add_argument("--accum", type=int, default=Options.accum, metavar="K",
                   help="memory: compare --batch-size B with B/K × K accumulation "
                   f"(default: {Options.accum})")
    g.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="memory: stop the sweep at a peak above this many GiB")
    g.add_argument("--json", metavar="PATH", help="write the result JSON here")
    g.add_argument("--plot", metavar="PATH", help="write a PNG plot here")
    scaling.add_arguments(p)
    add_arguments(p)
    p.set_defaults(func=experiment)


def experiment(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.env import env_block, hardware_line

    if args.name == "scaling":  # torchrun launches and a step model: its own module
        from fasttrain.commands.scaling import scaling

        return scaling(args)
    if args.steps < 1:
        raise UserError(f"--steps must be ≥ 1, got {args.steps}")
    if args.timing_warmup < 0:
        raise UserError(f"--timing-warmup must be ≥ 0, got {args.timing_warmup}")
    if args.accum < 1:
        raise UserError(f"--accum must be ≥ 1, got {args.accum}")
    opts = Options(steps=args.steps, warmup=args.timing_warmup, batches=_batches(args.batches),
                   accum=args.accum,
                   memory_limit=gib_arg("--memory-limit", args.memory_limit))
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path:
            report.check_writable(path, flag)
    cfg, task = lab_config(args, "experiment")
    check(args.name, cfg, opts)
    err = Console(stderr=True)
    env = env_block()
    err.print(f"[bold]fasttrain experiment {args.name}[/bold] on {hardware_line(env)}")
    err.print(f"data: {data_label(task)} from {task.source}")
    rows = run(args.name, cfg, task, opts)
    result = {"schema": SCHEMA, "experiment": args.name, "env": env,
              "config": {**cfg.to_dict(), "data_source": task.source,
                         "synthetic": task.synthetic},
              "options": dataclasses.asdict(opts), "rows": rows}
    report.wide_console().print(table(result))
    if args.json:
        report.write_json(args.json, result)
        err.print(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        err.print(f"wrote {args.plot}")
    return 0

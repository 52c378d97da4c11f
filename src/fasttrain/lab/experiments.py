"""The course lab's exercises, measured on this machine: rows of runs that differ in one switch.
`run_experiment(name, cfg, task, opts)` returns them; `fasttrain experiment precision|memory|e2e`
prints them (fasttrain.commands.experiment).

- precision: fp32, tf32, fp16 + GradScaler, bf16 on the same model, data and seed: ms/step,
  peak memory, final loss, test accuracy, loss-scale events. (--precision is the variable here.)
- memory: samples/s and peak memory per batch size (--batches, stopping at the first that does
  not fit); batch B against B/k × k accumulation (max |Δweights| after the same steps, memory of
  each); activation checkpointing off/on: time lost, and memory saved twice over — in the bytes
  saved for backward (what checkpointing trades: exact, hook-counted) and in the step's peak
  (what a run needs), with a plain note when the two part (see `held_for_backward`).
- e2e: the course lab's Exercise 4 — CPU vs GPU vs GPU + AMP (fp16 as in the lab, and bf16) —
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

import dataclasses
import math
import statistics
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fasttrain.engine.loop import endless_batches, endless_steps, warm_up
from fasttrain.errors import UserCodeError, UserError
from fasttrain.lab import memory as mem
from fasttrain.lab.batch_size import train_samples
from fasttrain.lab.bytecount import count_saved, left_as_found, resident_data

if TYPE_CHECKING:
    from fasttrain.engine.config import TrainConfig
    from fasttrain.engine.run import Run

EXPERIMENTS = ("precision", "memory", "e2e")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
# The course lab's Exercise 4 "Expected Results" (its own, unnamed GPU; MNIST classifier).
LAB_E2E = {"cpu-fp32": {"s_per_epoch": 120.0},
            "cuda-fp32": {"s_per_epoch": 25.0, "speedup": 4.8, "memory_gb": 8.2},
            "cuda-fp16": {"s_per_epoch": 15.0, "speedup": 8.0, "memory_gb": 4.7}}


@dataclass(frozen=True)
class Options:
    steps: int = 30  # timed optimizer steps per row
    warmup: int = 3  # untimed steps before them
    batches: tuple[int, ...] = (16, 32, 64, 128, 256, 512)  # memory: the sweep
    accum: int = 4  # memory: k of B vs B/k × k
    memory_limit: int | None = None  # memory: bytes; the sweep stops above it
    say: Callable[[str], None] | None = None  # progress: a line as each row starts


# -- one measured run ----------------------------------------------------------------------------


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None  # JSON has no NaN


@torch.no_grad()
def evaluate(run: Run) -> tuple[float, float | None]:
    """(test loss, test accuracy) over the whole test split, under the run's autocast; token
    accuracy for language models."""
    from fasttrain.engine.callbacks import evaluate as engine_evaluate

    result = engine_evaluate(run, "test")  # the engine's own evaluation: one sync
    accuracy = next((v for k, v in result.items() if k.endswith("accuracy")), None)
    return result.get("test_loss", math.nan), accuracy


def measure_run(cfg: TrainConfig, task, opts: Options, evaluate_after: bool = True,
                extra: Callable | None = None) -> dict:
    """Train `opts.warmup` untimed and `opts.steps` timed steps with `cfg`; the row's numbers.
    `extra(run)` adds fields before the run is let go (e.g. its weights)."""
    from fasttrain.engine.run import build

    run = build(cfg, data=task, verbose=False)
    with mem.users_code(run):
        return _measured(run, cfg, opts, evaluate_after, extra)


def _measured(run, cfg: TrainConfig, opts: Options, evaluate_after: bool,
              extra: Callable | None) -> dict:
    from fasttrain.timing import synchronizer, time_call

    dev = run.device
    cuda = dev.type == "cuda"
    sync = synchronizer(dev.type)
    inputs = endless_steps(run)  # what run.train_step takes: the whole-step graph's, if any
    warm_up(run, inputs, opts.warmup)
    if cuda:
        sync()
        torch.cuda.reset_peak_memory_stats(dev)  # the peak of the timed steps, data included
    tail = min(opts.steps, 10)  # final loss: the mean of the last (up to) 10 steps
    ms = []
    for i in range(opts.steps):
        if i == opts.steps - tail:
            run.loss_sum.zero_()
        # The next batch's gather is part of a step, as in the engine's own loop.
        ms.append(time_call(lambda: run.train_step(run, next(inputs)), sync)[1])
    final_loss = run.loss_sum.item() / tail
    if cuda:
        peak, peak_by = torch.cuda.max_memory_allocated(dev), "cuda allocator"
        data = resident_data(run)  # in the peak: the dataset on the GPU
    else:
        data = 0
        peak, peak_by = mem.breakdown(run, next(endless_batches(run))).measured_peak, "hook count"
    median = statistics.median(ms)
    row = {"device": dev.type, "precision": cfg.precision, "batch_size": cfg.batch_size,
           "accum_steps": cfg.accum_steps, "ms_per_step": median, "ms_per_step_min": min(ms),
           "ms_per_step_max": max(ms), "samples_per_s": cfg.batch_size / (median / 1e3),
           "steps_per_epoch": run.batches.steps_per_epoch, "peak_bytes": peak,
           "peak_by": peak_by, "data_bytes": data, "final_loss": _finite(final_loss),
           "test_loss": None, "test_accuracy": None, "loss_scale": None, "skipped_steps": None}
    if run.scaler.is_enabled():
        row.update(loss_scale=run.scaler.get_scale(), skipped_steps=int(run.skipped))
    if evaluate_after:
        loss, acc = evaluate(run)
        row.update(test_loss=_finite(loss), test_accuracy=acc)
    if extra is not None:
        row.update(extra(run))
    return row


def guarded(label: dict, measure: Callable[[], dict], say=None) -> dict:
    """`measure()` as a row: ok, unavailable (the engine refused the switches: its one line), or
    failed (out of memory, or an internal error, whose traceback is printed). Never raises.
    `say`: told which row starts (progress)."""
    if say is not None:
        say("measuring " + ", ".join(f"{k} {v}" for k, v in label.items()
                                     if isinstance(v, str | int | float) and k != "note"))
    failure = None
    try:
        return {**label, "status": "ok", "reason": None, **measure()}
    except UserError as e:
        return {**label, "status": "unavailable", "reason": str(e), REFUSED: True}
    except torch.OutOfMemoryError:
        failure = "out of memory"
    except UserCodeError as e:  # the user's frames and line (lab.memory.users_code), as train's
        sys.stderr.write(e.report())
        failure = str(e)
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


def run_precision(cfg: TrainConfig, task, opts: Options) -> list[dict]:
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
            dataclasses.replace(cfg, precision=p), task, opts), say=opts.say))
        mem.free_memory()
    return rows


def held_for_backward(run: Run) -> dict:
    """What one micro-batch's forward leaves for backward, beside where the step peaks: the bytes
    saved for backward (hook count, any device) and, on CUDA, the allocator's rise over the
    forward (`after_forward_bytes`: activations and the loss, what checkpointing shrinks) and its
    highest point in backward (`backward_peak_bytes`: recomputed blocks, activation gradients,
    cuDNN workspaces, parameter gradients — which checkpointing does not shrink), both above
    what was allocated before the forward. One extra forward/backward after the timed steps; no
    gradients are left behind."""
    micro_batch = next(endless_batches(run))[0]
    saved = count_saved(run, micro_batch)
    row = {"saved_bytes": saved.activations + saved.weight_copies}
    dev = run.device
    if dev.type != "cuda":
        return row
    with left_as_found(run.model, dev):
        torch.cuda.synchronize(dev)
        start = torch.cuda.memory_allocated(dev)
        with run.autocast:
            loss = run.compute_loss(run.forward, micro_batch)[0] / run.cfg.accum_steps
        torch.cuda.synchronize(dev)
        row["after_forward_bytes"] = torch.cuda.memory_allocated(dev) - start
        torch.cuda.reset_peak_memory_stats(dev)
        run.scaler.scale(loss).backward()
        torch.cuda.synchronize(dev)
        row["backward_peak_bytes"] = torch.cuda.max_memory_allocated(dev) - start
        del loss
        run.opt.zero_grad(set_to_none=True)
    return row


def checkpointing_summary(off: dict, on: dict) -> dict:
    """The fields the "on" row gets: time lost, peak memory saved (fraction and bytes), the saved
    bytes' reduction, and a note saying why when the peak moved much less than they did."""
    out = {"time_lost": on["ms_per_step"] / off["ms_per_step"] - 1,
           "memory_saved": 1 - on["peak_bytes"] / off["peak_bytes"],
           "memory_saved_bytes": off["peak_bytes"] - on["peak_bytes"],
           "activations_saved": 1 - on["saved_bytes"] / max(off["saved_bytes"], 1)}
    cut = off["saved_bytes"] - on["saved_bytes"]
    if cut > 0 and out["memory_saved_bytes"] < cut / 2:
        where = ""
        if "backward_peak_bytes" in off:
            where = (f": the step peaks inside backward ({off['backward_peak_bytes']:,} B above "
                     f"the step's start without checkpointing, {on['backward_peak_bytes']:,} B "
                     f"with it, against {off['after_forward_bytes']:,} B and "
                     f"{on['after_forward_bytes']:,} B held when the forward ends) — where the "
                     f"first block's activations exist again, with activation gradients, "
                     f"parameter gradients and cuDNN's convolution workspaces")
        out["note"] = (f"checkpointing cut the bytes saved for backward by {cut:,} "
                       f"({out['activations_saved']:.0%}) but the peak by only "
                       f"{out['memory_saved_bytes']:,} B{where}; checkpointing lowers only "
                       f"what is held between forward and backward: for this model at this batch "
                       f"it buys little or no peak memory")
    return out


def _weights(run: Run) -> dict:
    return {"_weights": {k: v.detach().float().cpu().clone()
                         for k, v in run.model.state_dict().items()}}


def run_memory(cfg: TrainConfig, task, opts: Options) -> list[dict]:
    rows: list[dict] = []
    cap = train_samples(task, cfg.block_size, "the memory experiment's batch sweep")
    # 1. Throughput and peak per batch size: stop at the first that does not fit.
    for b in opts.batches:
        label = {"part": "sweep", "label": f"batch {b}", "batch_size": b}
        if b > cap or b % cfg.accum_steps:
            why = (f"more than the {cap} training samples" if b > cap
                   else f"not divisible by --accum-steps {cfg.accum_steps}")
            rows.append({**label, "status": "skipped", "reason": why})
            continue
        row = guarded(label, lambda b=b: measure_run(
            dataclasses.replace(cfg, batch_size=b), task, opts, evaluate_after=False), say=opts.say)
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
            extra=_weights), say=opts.say))
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
            evaluate_after=False, extra=held_for_backward), say=opts.say))
        mem.free_memory()
    off, on = ckpt
    if off["status"] == on["status"] == "ok":
        on.update(checkpointing_summary(off, on))
    return rows + ckpt


def run_e2e(cfg: TrainConfig, task, opts: Options) -> list[dict]:
    rows = []
    for key, label, device, precision in (
        ("cpu-fp32", "CPU", "cpu", "fp32"),
        ("cuda-fp32", "GPU", "cuda", "fp32"),
        ("cuda-fp16", "GPU + AMP (fp16, GradScaler)", "cuda", "fp16"),
        ("cuda-bf16", "GPU + AMP (bf16)", "cuda", "bf16"),
    ):
        head = {"row": key, "label": label, "device": device, "precision": precision,
                "lab_expected": LAB_E2E.get(key)}
        reason = _no_gpu() if device == "cuda" and not torch.cuda.is_available() else (
            unavailable(precision, torch.device(device)))
        if reason:
            rows.append({**head, "status": "unavailable", "reason": reason})
            continue
        rows.append(guarded(head, lambda device=device, precision=precision: measure_run(
            dataclasses.replace(cfg, device=device, precision=precision), task, opts),
            say=opts.say))
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
REFUSED = "_refused"  # a row the engine refused (its one line), popped before the rows go out


def check(name: str, cfg: TrainConfig, opts: Options) -> None:
    """Reject what would fail part-way, before any work."""
    if name not in RUNNERS:
        raise UserError(f"unknown experiment {name!r}; choose one of {', '.join(EXPERIMENTS)}")
    if name == "memory" and cfg.batch_size % opts.accum:
        raise UserError(f"--batch-size {cfg.batch_size} is not divisible by --accum "
                        f"{opts.accum}; choose a batch size that is a multiple of it")


def run_experiment(name: str, cfg: TrainConfig, task, opts: Options) -> list[dict]:
    """The rows of experiment `name` (see the module docstring)."""
    check(name, cfg, opts)
    rows = RUNNERS[name](cfg, task, opts)
    refused = [r["reason"] for r in rows if r.pop(REFUSED, False)]
    if refused and not any(r["status"] == "ok" for r in rows):
        # Not a row this machine cannot run: the switches or the data themselves are refused
        # (a batch larger than the data, a stream without --max-steps): bad input, exit 2.
        raise UserError(refused[0])
    return rows

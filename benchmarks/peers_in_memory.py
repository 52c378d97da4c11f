"""Data already in memory: samples/s of fasttrain, Lightning, Accelerate and two hand-written
loops training on the same tensors, each the way its documentation shows.

    FASTTRAIN_DATA=DIR PYTHONPATH=src python benchmarks/peers_in_memory.py [--rounds 7]
        [--models mlp cnn] [--batch-size 128] [--warmup 20] [--steps N] [--device cuda]
        [--max-seconds S] [--json PATH]

The data: Fashion-MNIST's 60,000 training images as float32 tensors in [0, 1] ([N, 1, 28, 28])
and int64 labels, made once per process before the clock (from $FASTTRAIN_DATA or --data-dir).
Every contender gets these tensors and trains the same model class from the same initial weights
with AdamW at a constant learning rate, cross-entropy, fp32, batch 128, a new shuffle each epoch:

  fasttrain      `fasttrain.build(model=, data=(x, y))`: tensors take its in-memory path (batches
                 gathered by index from the whole set, no per-sample Python)
  lightning      `Trainer.fit(module, DataLoader(TensorDataset(x, y), shuffle=True))` on the CPU,
                 progress bar, logger, checkpointing and model summary off
  accelerate     `Accelerator.prepare(model, optimizer, DataLoader(TensorDataset(x, y), ...))`
  hand-loader    `for x, y in DataLoader(TensorDataset(x, y), shuffle=True)`: the tutorial loop
                 (on a GPU: pinned batches, `.to(device, non_blocking=True)`)
  hand-indexed   `perm = torch.randperm(n)`; `x[perm[i:i + B]]`: a careful hand loop, what
                 fasttrain's in-memory path does, without anything else (on a GPU: the tensors
                 moved there once, the batches gathered there)

A DataLoader over a TensorDataset fetches each sample by a Python call and collates the batch
from them (no workers: the data is already in this process), which costs little against a cnn
step and much against a small mlp's. Regimes: the mlp (the step is cheap: what the loop costs
shows) and the cnn (compute-bound: the loops should tie).

Timing is benchmarks/input_pipeline.py's: each (round, contender) a fresh process; rounds
interleaved, the order rotated; the clock runs from the end of step --warmup to the end of the
last step; the main process's CPU time over the same window. Per contender: the median over
rounds, min, max, spread, the ratio of medians to hand-indexed and the median of the per-round
ratios (paired). JSON: benchmarks/results/DATE-HARDWARE-peers-in-memory.json by default.

Its time, by construction: rounds × models × contenders runs (gpu-check's: 2 × 1 × 5), each a
fresh process that imports torch (and Lightning or Accelerate), loads the 60,000 images, starts
CUDA, and trains --warmup + the model's steps: on the H200 (2026-11-27) 8 runs ended within the
126 s gpu-check gave the step, and the 9th was cut off with no JSON written. `--max-seconds`
starts no run that would end after it (the longest run so far as the guess), and the JSON is
rewritten after every run, so a run stopped early, or killed, still leaves the rounds it
finished (`runs_done`, `stopped_early`).
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from input_pipeline import (
    Settings,
    Window,
    attempt,
    run_child,
    train_accelerate,
    train_hand,
    train_lightning,
    unavailable,  # noqa: F401  (which peers are installed: attempt() asks, and so do the tests)
)
from input_pipeline_results import default_name, paired
from torch.utils.data import DataLoader, TensorDataset

SCHEMA = "fasttrain.peers_in_memory/1"
CONTENDERS = ("fasttrain", "lightning", "accelerate", "hand-loader", "hand-indexed")
REFERENCE = "hand-indexed"
MODELS = ("mlp", "cnn")
STEPS = {"mlp": 1000, "cnn": 120}  # timed per run: ~2 s of mlp steps, ~15 s of cnn ones here
RESULTS = Path(__file__).resolve().parent / "results"
_MARK = "peers_in_memory row: "


def tensors(data_dir: str | None, limit: int) -> tuple[torch.Tensor, torch.Tensor]:
    from fasttrain.data.sources import load_dataset

    ds = load_dataset("fashion-mnist", data_dir, download=False)
    x = torch.tensor(ds.train_x[:limit]).float().div_(255).unsqueeze(1)  # a copy: writable
    return x, torch.tensor(ds.train_y[:limit]).long()


def make_model(model: str, seed: int) -> torch.nn.Module:
    from fasttrain.models import build_model

    torch.manual_seed(seed)  # the same initial weights for every contender
    return build_model(model, in_shape=(1, 28, 28), num_classes=10)


def loader(x, y, s: Settings) -> DataLoader:
    return DataLoader(TensorDataset(x, y), batch_size=s.batch_size, shuffle=True,
                      drop_last=True, pin_memory=s.pin_memory,
                      generator=torch.Generator().manual_seed(s.seed))


def train_fasttrain(net, x, y, s: Settings, clock: Window) -> None:
    import contextlib
    import io

    import fasttrain

    class Tick:
        def on_step(self, run):
            clock.tick()

    with contextlib.redirect_stderr(io.StringIO()):
        run = fasttrain.build(model=net, data=(x, y), loss=F.cross_entropy,
                              batch_size=s.batch_size, lr=s.lr, optimizer="adamw",
                              weight_decay=0.0, schedule="constant", device=s.device,
                              seed=s.seed, epochs=math.ceil(clock.total * s.batch_size / len(y)),
                              max_steps=clock.total, log_every=10**9, progress=False)
    if run.batches.path != "in memory":
        raise RuntimeError(f"fasttrain took the {run.batches.path} path, not the in-memory one")
    fasttrain.fit(run, callbacks=[Tick()])


def train_hand_indexed(net, x, y, s: Settings, clock: Window) -> None:
    dev = torch.device(s.device)
    net, x, y = net.to(dev), x.to(dev), y.to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=s.lr, weight_decay=0.0)
    gen, n, b = torch.Generator().manual_seed(s.seed), len(y), s.batch_size

    def batches():
        while True:
            perm = torch.randperm(n, generator=gen).to(dev)
            for i in range(0, n - b + 1, b):
                idx = perm[i:i + b]
                yield x[idx], y[idx]

    for xb, yb in itertools.islice(batches(), clock.total):
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick()


def train_hand_loader(net, x, y, s: Settings, clock: Window) -> None:
    """The input-pipeline benchmark's hand loop, over a DataLoader of these tensors."""
    train_hand(net, loader(x, y, s), s, clock)


TRAIN = {"fasttrain": train_fasttrain, "hand-indexed": train_hand_indexed,
         "hand-loader": train_hand_loader,
         "lightning": lambda net, x, y, s, clock: train_lightning(net, loader(x, y, s), s, clock),
         "accelerate": lambda net, x, y, s, clock: train_accelerate(net, loader(x, y, s), s,
                                                                    clock)}


def measure(contender: str, model: str, s: Settings, data_dir: str | None, limit: int) -> dict:
    """One steady-state measurement of `contender` in this process."""
    x, y = tensors(data_dir, limit)
    clock = Window(s)
    TRAIN[contender](make_model(model, s.seed), x, y, s, clock)
    return clock.row(s.batch_size)


def measure_in_child(contender: str, model: str, s: Settings, data_dir, limit: int) -> dict:
    return run_child(__file__, {"contender": contender, "model": model, "data_dir": data_dir,
                                "limit": limit, "settings": dataclasses.asdict(s)}, _MARK)


def summarize(runs: list, models, contenders=CONTENDERS) -> list[dict]:
    """Per (model, contender): rounds, median, min, max, spread, and the ratios to REFERENCE
    (of medians, and paired per round)."""
    rows = []
    for model in models:
        mine = {c: [r for r in runs if r["model"] == model and r["contender"] == c]
                for c in contenders}
        ok = {c: [r["samples_per_s"] for r in v if r["status"] == "ok"] for c, v in mine.items()}
        ref = statistics.median(ok[REFERENCE]) if ok.get(REFERENCE) else None
        for c in contenders:
            row = {"model": model, "contender": c, "samples_per_s_rounds": ok[c],
                   "status": "ok" if ok[c] else next((r["status"] for r in mine[c]), "not run"),
                   "reason": next((r.get("reason") for r in mine[c] if r["status"] != "ok"),
                                  None)}
            if ok[c]:
                m = statistics.median(ok[c])
                cpu = [r["main_cpu_ms_per_step"] for r in mine[c] if r["status"] == "ok"]
                row.update(samples_per_s_median=m, samples_per_s_min=min(ok[c]),
                           samples_per_s_max=max(ok[c]), spread=(max(ok[c]) - min(ok[c])) / m,
                           main_cpu_ms_per_step_median=statistics.median(cpu),
                           vs_reference=m / ref if ref else None,
                           vs_reference_paired=paired(
                               [{**r, "regime": model} for r in mine[c] + mine[REFERENCE]],
                               model, c, REFERENCE))
            rows.append(row)
    return rows


def table(result: dict):
    from fasttrain.report import rows_table

    def num(key, fmt):
        return lambda r: "-" if r.get(key) is None else fmt.format(r[key])

    cfg, load = result["config"], result["load"]
    steps = ", ".join(f"{m} {n}" for m, n in cfg["steps"].items())
    done = ("" if not result.get("stopped_early") else
            f" (stopped after {result['runs_done']} of {result['runs_planned']} runs)")
    caption = (f"Fashion-MNIST train set as tensors, {cfg['device']}, batch {cfg['batch_size']}, "
               f"{cfg['rounds']} "
               f"interleaved rounds{done} of {steps} steps after {cfg['warmup']}, a fresh "
               f"process each; load {load['before'][0]:.2f} → {load['after'][0]:.2f} on "
               f"{load['cpu_count']} CPUs")
    return rows_table("data in memory: samples/s (median over rounds)", [
        ("model", lambda r: r["model"]), ("contender", lambda r: r["contender"]),
        ("samples/s", num("samples_per_s_median", "{:,.0f}")),
        ("min", num("samples_per_s_min", "{:,.0f}")), ("max", num("samples_per_s_max", "{:,.0f}")),
        ("spread", num("spread", "{:.1%}")), (f"× {REFERENCE}", num("vs_reference", "{:.3f}")),
        ("paired", num("vs_reference_paired", "{:.3f}")),
        ("main CPU ms/step", num("main_cpu_ms_per_step_median", "{:.2f}"))],
        result["rows"], caption, label_columns=2)


def run_all(s: Settings, rounds: int, models, data_dir, limit: int, contenders=CONTENDERS,
            measure_one=measure_in_child, echo=print, steps: dict | None = None,
            max_seconds: float | None = None, save=None, clock=time.monotonic) -> dict:
    """Every (model, round, contender); `steps` per model (default: s.steps for each). With
    `max_seconds`, no run starts that would end after it, judged by the longest run so far (the
    first always runs); `save(result)` gets the result so far after every run, so that a run
    killed from outside leaves its figures."""
    from fasttrain.env import env_block

    env, load_before, start = env_block(), os.getloadavg(), clock()
    plan = [(model, r, name) for model in models for r in range(rounds)
            for name in contenders[r % len(contenders):] + contenders[:r % len(contenders)]]
    # (the order rotated by round: no contender always runs first)
    runs, longest, stopped = [], 0.0, None

    def result() -> dict:
        rows = summarize(runs, models, contenders)
        for row in rows:
            if row["status"] == "not run" and stopped:
                row["reason"] = f"--max-seconds {max_seconds:g} reached first"
        return {"schema": SCHEMA, "env": env,
                "config": {**dataclasses.asdict(s), "rounds": rounds, "models": list(models),
                           "steps": {m: (steps or {}).get(m, s.steps) for m in models},
                           "images": limit, "data": "fashion-mnist train, float32 tensors",
                           "optimizer": "adamw", "precision": "fp32", "shuffle": True,
                           "max_seconds": max_seconds,
                           "isolation": "a fresh process per run" if measure_one is
                           measure_in_child else "in process"},
                "load": {"before": list(load_before), "after": list(os.getloadavg()),
                         "cpu_count": os.cpu_count()},
                "runs_planned": len(plan), "runs_done": len(runs), "stopped_early": stopped,
                "seconds": clock() - start,
                "rows": rows, "runs": runs}

    for model, r, name in plan:
        elapsed = clock() - start
        if max_seconds is not None and runs and elapsed + longest > max_seconds:
            stopped = (f"after {len(runs)} of {len(plan)} runs: another (~{longest:.0f} s, the "
                       f"longest so far) would end after --max-seconds {max_seconds:g} "
                       f"({elapsed:.0f} s spent)")
            echo(f"stopped {stopped}")
            break
        sm = dataclasses.replace(s, steps=(steps or {}).get(model, s.steps))
        load, t0 = os.getloadavg()[0], clock()
        got = attempt(measure_one, name, model, sm, data_dir, limit)
        longest = max(longest, clock() - t0)
        runs.append({"model": model, "round": r, "contender": name, "steps": sm.steps,
                     "load_1min_before": load, **got})
        said = (f"{got['samples_per_s']:,.0f} samples/s" if got["status"] == "ok"
                else f"{got['status']}: {got['reason']}")
        echo(f"{model:>4} round {r + 1}/{rounds} {name:>12}: {said}")
        if save:
            save(result())
    done = result()
    if save:
        save(done)
    return done


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", help="folder holding fashion-mnist/ (default: $FASTTRAIN_DATA)")
    ap.add_argument("--limit", type=int, default=60_000, help="train on the first N images")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=CONTENDERS)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    ap.add_argument("--steps", type=int, help=f"steps timed per run (default: {STEPS})")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--max-seconds", type=float,
                    help="start no run that would end after S seconds (the longest run so far "
                         "as the guess; the result says where it stopped); default: no limit")
    ap.add_argument("--json", help=f"result file (default: {RESULTS}/DATE-HW-peers-in-memory.json)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one run, in a fresh process
    return ap


def main(argv=None) -> int:
    ap = parser()
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        got = measure(job["contender"], job["model"], Settings(**job["settings"]),
                      job["data_dir"], job["limit"])
        print(_MARK + json.dumps(got))
        return 0

    from fasttrain.errors import UserError
    from fasttrain.report import wide_console, write_json

    if args.limit < args.batch_size:
        ap.error(f"--limit {args.limit} is less than one batch of {args.batch_size}")
    try:
        tensors(args.data_dir, args.batch_size)  # the data is there: one line now, not per run
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    contenders = tuple(args.contenders)
    if REFERENCE not in contenders:
        contenders += (REFERENCE,)
    s = Settings(images_dir="", batch_size=args.batch_size, workers=0, warmup=args.warmup,
                 device=args.device)
    steps = dict.fromkeys(MODELS, args.steps) if args.steps else STEPS
    def path(result: dict) -> Path:
        return Path(args.json) if args.json else RESULTS / default_name(result["env"]).replace(
            "input-pipeline", "peers-in-memory")

    result = run_all(s, args.rounds, tuple(args.models), args.data_dir, args.limit, contenders,
                     steps=steps, max_seconds=args.max_seconds,
                     save=lambda r: write_json(path(r), r))  # after every run
    wide_console().print(table(result))
    print(f"wrote {path(result)}" + (f"; stopped {result['stopped_early']}"
                                     if result["stopped_early"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The streamed data path against the in-memory path, where loading is not the bottleneck: does
a DataLoader (pinned memory, workers, no decoding or augmentation) train the cnn within 10% of the
same tensors given to build (the whole set on the device, batches gathered by index)?

Data: SYNTHETIC — `--samples` random MNIST-shaped uint8 images (1×28×28) and labels in [0, 10)
drawn from `--seed`: speed only (nothing is learnt) and no files needed. Both paths train the
bundled cnn with the same optimizer (the engine's default), learning rate, batch and seed, on
the same samples in the same order (the engine's seeded order serves both paths), the uint8
images scaled to [0, 1] on the device by both; `first_loss` in each row shows it.

Precision fp32 (no TF32, no compile): the cnn's longest step, so that a few workers reading a
TensorDataset sample by sample (~1–2 ms for 512 samples on a CPU core) stay well ahead of the
step, and what is compared is the two paths — the copy, its stream wait, the host's handling of
each batch — not the reader. No compile: nothing of the ~60 s goes to compilation, and the
streamed path's costs are the same under it. `--precision bf16` runs the harsher case.

Method: `--rounds` rounds, each a fresh build and fit of each path, the order alternating by
round; a run trains `--steps` steps logged every `--log-every`, and its figure is the median
samples/s of its logs after the first (the first holds cuDNN's algorithm choice and the workers'
start). The result: each path's median over rounds, their ratio, and the ratio within each round
(paired). With the defaults the steps stay inside one epoch (117 steps of 512), so a pass's
restart of the loader is not measured. The DataLoader alone (iterated, nothing trained) gives
the reading speed: `loading_headroom` = that ÷ the in-memory path's samples/s says how far
loading is from being the bottleneck. Rounds stop early, the reason recorded, where the next one
would end after `--max-seconds` (default 40: the gpu-check step has 60 s, process start and
CUDA's initialization included).

    PYTHONPATH=src python benchmarks/stream_vs_memory.py --json DATE-GPU-stream-vs-memory.json
    PYTHONPATH=src python benchmarks/stream_vs_memory.py --device cpu --rounds 1 --steps 6 \\
        --batch-size 32 --samples 1024 --log-every 2   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from fasttrain.engine import build, fit
from fasttrain.env import env_block, hardware_line

SCHEMA = "fasttrain.stream-vs-memory/1"
TARGET = 0.9  # streamed ≥ 0.9 × in-memory samples/s
PATHS = ("in memory", "streamed")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=100, help="steps of each run")
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument("--samples", type=int, default=60_000, help="synthetic MNIST-shaped samples")
    ap.add_argument("--workers", type=int, default=4, help="DataLoader workers of the streamed "
                    "path")
    ap.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16", "fp16"))
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=40,
                    help="start no round that would end after this (the first always runs)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    if args.steps < 2 * args.log_every:
        ap.error("--steps must hold at least two logs (the first is dropped as warm-up)")
    return args


def make_data(samples: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (samples, 1, 28, 28), dtype=torch.uint8, generator=g)
    return x, torch.randint(0, 10, (samples,), generator=g)


def loader(x: torch.Tensor, y: torch.Tensor, args) -> DataLoader:
    """The streamed path's data: what a user writes for tensors in a Dataset. Pinned on CUDA."""
    data = TensorDataset(x, y)
    data.classes = [str(c) for c in range(10)]  # what tells the bundled cnn its classes
    return DataLoader(data, batch_size=args.batch_size, shuffle=True,
                      num_workers=args.workers, pin_memory=args.device == "cuda",
                      persistent_workers=args.workers > 0)


def train(path: str, x: torch.Tensor, y: torch.Tensor, args) -> dict:
    """One fresh build and fit on `path`; its figure is the median of the logs after the first."""
    data = (x, y) if path == "in memory" else loader(x, y, args)
    placed = {"data_on_device": "on"} if path == "in memory" and args.device == "cuda" else {}
    run = build(model="cnn", data=data, device=args.device, batch_size=args.batch_size,
                max_steps=args.steps, epochs=10**6, log_every=args.log_every, lr=args.lr,
                seed=args.seed, precision=args.precision, progress=False, verbose=False,
                **placed)
    assert run.batches.path == ("streamed" if path == "streamed" else "in memory"), \
        run.batches.path
    fit(run)
    logs = [r for r in run.history if r["kind"] == "train"]
    steady = [r["samples_per_s"] for r in logs[1:]]
    return {"path": path, "data_on_device": bool(run.batches.on_device),
            "samples_per_s": statistics.median(steady),
            "ms_per_step": statistics.median(r["step_ms"] for r in logs[1:]),
            "logs_samples_per_s": steady, "first_loss": logs[0]["loss"]}


def loader_alone(x: torch.Tensor, y: torch.Tensor, args) -> float:
    """Samples/s of iterating the streamed path's DataLoader with nothing trained: its first
    2 × workers batches (the workers' start) are not timed."""
    batches = iter(loader(x, y, args))
    per_epoch = args.samples // args.batch_size
    skip = min(2 * max(args.workers, 1), per_epoch // 2)
    for _ in range(skip):
        next(batches)
    t0, read = time.perf_counter(), 0
    for _ in range(min(args.steps, per_epoch - skip)):
        read += len(next(batches)[0])
    return read / (time.perf_counter() - t0)


def summarize(rows: list[dict], loader_samples_per_s: float | None = None,
              target: float = TARGET) -> dict:
    """Each path's median samples/s over the rounds, streamed ÷ in memory, the per-round ratios,
    and the loader's headroom over the in-memory training speed."""
    per = {p: [r["samples_per_s"] for r in rows if r["path"] == p] for p in PATHS}
    medians = {p: statistics.median(v) if v else None for p, v in per.items()}
    by_round = {}
    for r in rows:
        by_round.setdefault(r["round"], {})[r["path"]] = r
    paired = [pair["streamed"]["samples_per_s"] / pair["in memory"]["samples_per_s"]
              for _, pair in sorted(by_round.items()) if len(pair) == 2]
    ratio = (medians["streamed"] / medians["in memory"]
             if medians["streamed"] and medians["in memory"] else None)
    loss_diff = [abs(pair["streamed"]["first_loss"] - pair["in memory"]["first_loss"])
                 / abs(pair["in memory"]["first_loss"]) for pair in by_round.values()
                 if len(pair) == 2]
    headroom = (loader_samples_per_s / medians["in memory"]
                if loader_samples_per_s and medians["in memory"] else None)
    return {"in_memory_samples_per_s": medians["in memory"],
            "streamed_samples_per_s": medians["streamed"],
            "ratio": ratio, "target": target,
            "meets_target": ratio >= target if ratio is not None else None,
            "paired_ratios": paired,
            "paired_ratio_median": statistics.median(paired) if paired else None,
            "first_loss_max_rel_diff": max(loss_diff) if loss_diff else None,
            "loader_alone_samples_per_s": loader_samples_per_s,
            "loading_headroom": headroom}


def measure(args) -> dict:
    """The whole benchmark: the result JSON's content."""
    start = time.perf_counter()
    env = env_block()
    print(hardware_line(env), flush=True)
    x, y = make_data(args.samples, args.seed)
    rows, stopped, last = [], None, 0.0
    for k in range(args.rounds):
        elapsed = time.perf_counter() - start
        if k and elapsed + last > args.max_seconds:
            stopped = (f"after {k} of {args.rounds} rounds: another (~{last:.0f} s) would end "
                       f"after --max-seconds {args.max_seconds:g} ({elapsed:.0f} s spent)")
            break
        t0 = time.perf_counter()
        for path in (PATHS if k % 2 == 0 else PATHS[::-1]):
            row = {"round": k, **train(path, x, y, args)}
            rows.append(row)
            print(json.dumps({key: row[key] for key in ("round", "path", "samples_per_s",
                                                          "ms_per_step", "first_loss")}),
                  flush=True)
        last = time.perf_counter() - t0
    reading = loader_alone(x, y, args)
    config = {k: v for k, v in vars(args).items() if k != "json"}
    config.update(model="cnn", data="synthetic: random uint8 1×28×28 images, 10 classes",
                  optimizer="the engine's default", target=TARGET,
                  steps_per_epoch=args.samples // args.batch_size,
                  streamed="DataLoader(TensorDataset, shuffle=True, pin_memory on CUDA, "
                           "persistent workers)",
                  in_memory="(x, y) tensors given to build" + (
                      ", data on the device" if args.device == "cuda" else ""))
    return {"schema": SCHEMA, "env": env, "config": config, "rows": rows,
            "rounds_done": len({r["round"] for r in rows}), "stopped_early": stopped,
            "seconds": time.perf_counter() - start, "summary": summarize(rows, reading)}


def main(argv: list[str] | None = None) -> dict:
    args = parse(argv)
    result = measure(args)
    s = result["summary"]
    print(f"in memory {s['in_memory_samples_per_s']:,.0f} samples/s, streamed "
          f"{s['streamed_samples_per_s']:,.0f}: ratio {s['ratio']:.3f} (target ≥ {TARGET}; "
          f"paired median {s['paired_ratio_median']:.3f}); loader alone "
          f"{s['loading_headroom']:.1f}× the in-memory speed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()

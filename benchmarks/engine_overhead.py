"""Engine overhead: `fasttrain train` against a minimal hand-written PyTorch loop, same settings.

Both train a model on MNIST (default the `cnn`, batch 64, AdamW, fp32, data already in memory)
in one process, alternating in rounds so that drift of a shared machine hits both alike. Each
round times WINDOW steps after warm-up; the figure is the median ms/step over rounds, the
overhead their ratio and their difference (µs per step: the host time the engine adds, which a
GPU pays in full when its step is bound by the host). The hand-written loop does the same work
as the engine's step: the same model, the engine's parameter groups, the same loss.

    PYTHONPATH=src python benchmarks/engine_overhead.py [--rounds 5] [--window 100] [--json PATH]
    PYTHONPATH=src python benchmarks/engine_overhead.py --model logreg --batch-size 16  # host-bound
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

from fasttrain.data.tasks import load_task
from fasttrain.engine import TrainConfig, build
from fasttrain.engine.batches import epoch_order
from fasttrain.engine.callbacks import standard
from fasttrain.engine.loop import notify, progress_bar, step, step_batches
from fasttrain.engine.optim import param_groups
from fasttrain.env import env_block, hardware_line
from fasttrain.models import build_model

BATCH, LR, SEED = 64, 1e-3, 0


def hand_written(task, model_name: str, batch: int):
    """The loop a careful user would write: nothing but the step, loss summed on the device."""
    torch.manual_seed(SEED)
    model = build_model(model_name, in_shape=task.in_shape, num_classes=task.num_classes)
    opt = torch.optim.AdamW(param_groups(model, False), lr=LR, weight_decay=0.0)
    x_all, y_all = task.train_x, task.train_y
    order = epoch_order(SEED, 0, len(y_all))
    loss_sum = torch.zeros(())

    def run(n: int, offset: int) -> float:
        nonlocal loss_sum
        t0 = time.perf_counter()
        for s in range(offset, offset + n):
            idx = order[s * batch:(s + 1) * batch]
            x, y = x_all[idx].float() / 255, y_all[idx]
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            loss_sum += loss.detach()
        loss_sum.item()
        return (time.perf_counter() - t0) * 1e3 / n

    return run


def engine(task, model_name: str, batch: int):
    cfg = TrainConfig(model=model_name, data="mnist", batch_size=batch, lr=LR, seed=SEED,
                      device="cpu", max_steps=10**9, log_every=10**9, progress=False)
    r = build(cfg, data=task, verbose=False)
    micro = step_batches(r, 0)
    r.bar, r.callbacks = progress_bar(False, 0, 0), standard(r)

    def run(n: int, offset: int) -> float:
        t0 = time.perf_counter()
        for _ in range(n):  # the engine's step with all of its bookkeeping, as fit() runs it
            step(r, next(micro))
            r.step += 1
            r.step_in_epoch += 1
            notify(r, "on_step")
        r.loss_sum.item()
        return (time.perf_counter() - t0) * 1e3 / n

    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=100, help="steps timed per round")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--batch-size", type=int, default=BATCH)
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    task = load_task("mnist")
    runners = {"hand-written": hand_written(task, args.model, args.batch_size),
               "engine": engine(task, args.model, args.batch_size)}
    offsets = dict.fromkeys(runners, 0)
    for name, run in runners.items():  # warm-up: first-touch allocations, oneDNN primitives
        run(20, 0)
        offsets[name] = 20
    times: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.rounds):
        for name, run in runners.items():
            times[name].append(run(args.window, offsets[name]))
            offsets[name] += args.window
    med = {k: statistics.median(v) for k, v in times.items()}
    overhead = med["engine"] / med["hand-written"] - 1
    env = env_block()
    print(hardware_line(env))
    for k, v in times.items():
        print(f"{k:>13}: median {med[k]:.3f} ms/step  (rounds: "
              f"{', '.join(f'{t:.3f}' for t in v)})")
    added_us = 1e3 * (med["engine"] - med["hand-written"])
    print(f"engine overhead: {100 * overhead:+.2f}% per step, {added_us:+.1f} µs per step "
          f"({args.model}, batch {args.batch_size})")
    if args.json:
        result = {"schema": "fasttrain.engine-overhead/1", "env": env,
                  "config": {"model": args.model, "data": "mnist",
                             "batch_size": args.batch_size, "lr": LR,
                             "optimizer": "adamw", "precision": "fp32", "rounds": args.rounds,
                             "window": args.window},
                  "rows": [{"loop": k, "ms_per_step_median": med[k], "ms_per_step_rounds": v}
                           for k, v in times.items()],
                  "overhead": overhead, "added_us_per_step": added_us}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

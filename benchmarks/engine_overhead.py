"""Engine overhead: fasttrain's step against a hand-written PyTorch loop, same settings, and the
host work (ops dispatched, Python) that each step costs.

Two pairs, each alternating in rounds in one process so that drift of a shared machine hits both
alike; each round times WINDOW steps after warm-up; the figure is the median ms/step over rounds,
the overhead their ratio and their difference (µs a step: the host time the engine adds, which a
GPU pays in full when its step is bound by the host):

  --against hand-written (default)  the engine on the bundled MNIST (uint8, scaled on the device)
      against a loop doing the same work: one parameter group (as the engine's AdamW takes them
      at weight decay 0), the loss summed on the device (default model the cnn, batch 64);
  --against hand-indexed   benchmarks/peers_in_memory.py's pair: `fasttrain.build(model=net,
      data=(x, y), loss=F.cross_entropy, ...)` on float tensors against its lean hand loop
      (randperm each epoch, x[perm[i:i+B]], AdamW over net.parameters(), nothing else). The
      engine's steps run as fit runs them (fit_steps: the batch pulled under usercode's try, the
      counters, the progress bar, the standard callbacks' on_step hooks).

--ops adds, per loop, the host work of one step: the aten ops that reach a kernel (counted by a
TorchDispatchMode below autograd, forward, backward and optimizer alike), the ops the engine adds
or saves by name, the function calls cProfile sees (Python's, and C functions called from
Python: a count, independent of load) and its time in Python frames (C calls excluded; its own
cost and other processes inflate it: compare the loops by frame, not the totals). Timed rounds
read this thread's CPU time too (preemption excluded), as medians and fastest rounds: on a shared
machine wall time swings by more than the host work compared. The ops are the same Python and
dispatcher path on a CPU tensor as on a CUDA one, so they are counted on the CPU; on CUDA each
one also launches kernels. On the CPU torch's AdamW takes its for-loop implementation and on
CUDA the foreach one: on the CPU both loops are given foreach=True, so that what is counted is
CUDA's path. With a tiny model (--hidden 8) the kernels vanish and the CPU step time is host work.

    PYTHONPATH=src python benchmarks/engine_overhead.py [--rounds 5] [--window 100] [--json PATH]
    PYTHONPATH=src python benchmarks/engine_overhead.py --model logreg --batch-size 16  # host-bound
    FASTTRAIN_DATA=DIR PYTHONPATH=src python benchmarks/engine_overhead.py --against hand-indexed \\
        --model mlp --batch-size 128 --threads 1 --ops [--hidden 8] [--device cuda]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import itertools
import json
import os
import pstats
import statistics
import time

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fasttrain
from fasttrain.data.tasks import load_task
from fasttrain.engine import TrainConfig, build, usercode
from fasttrain.engine.batches import epoch_order
from fasttrain.engine.callbacks import standard
from fasttrain.engine.loop import hooks, progress_bar
from fasttrain.env import env_block, hardware_line
from fasttrain.models import build_model

BATCH, LR, SEED = 64, 1e-3, 0


class OpCounter(TorchDispatchMode):
    """Counts the aten ops that reach a kernel (below autograd), by name."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model(name: str, task, device, hidden: int | None):
    torch.manual_seed(SEED)  # the same initial weights for both loops
    kw = {"hidden": hidden} if hidden else {}
    return build_model(name, in_shape=task.in_shape, num_classes=task.num_classes, **kw).to(device)


def _foreach(device: torch.device) -> bool | None:
    return True if device.type == "cpu" else None  # CUDA's own default is foreach


def hand_written(task, model_name: str, batch: int, device, hidden=None):
    """The loop a careful user would write: nothing but the step, loss summed on the device."""
    model = _model(model_name, task, device, hidden)
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.0, foreach=_foreach(device))
    x_all, y_all = task.train_x.to(device), task.train_y.to(device)
    order = epoch_order(SEED, 0, len(y_all)).to(device)
    loss_sum = torch.zeros((), device=device)
    steps = itertools.count()

    def one() -> None:
        s = next(steps) % (len(y_all) // batch)
        idx = order[s * batch:(s + 1) * batch]
        x, y = x_all[idx].float() / 255, y_all[idx]
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss_sum.add_(loss.detach())

    return one, lambda: loss_sum.item()


def hand_indexed(x, y, net, batch: int, device):
    """benchmarks/peers_in_memory.py's hand-indexed loop, step by step."""
    opt = torch.optim.AdamW(net.parameters(), lr=LR, weight_decay=0.0, foreach=_foreach(device))
    gen, n = torch.Generator().manual_seed(SEED), len(y)

    def batches():
        while True:
            perm = torch.randperm(n, generator=gen).to(device)
            for i in range(0, n - batch + 1, batch):
                idx = perm[i:i + batch]
                yield x[idx], y[idx]

    it = batches()

    def one() -> None:
        xb, yb = next(it)
        loss = F.cross_entropy(net(xb), yb)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return one, lambda: _sync(device)


def fit_steps(run):
    """The engine's steps as fit() runs them, one a next(): the input pulled under usercode's
    try, the step, the counters, the progress bar and every standard callback's on_step."""
    run.bar, run.callbacks = progress_bar(False, 0, 0), standard(run)
    on_step = hooks(run, "on_step")
    for epoch in itertools.count():
        for batch in usercode.pulled(run.step_inputs(run, epoch)):
            run.train_step(run, batch)
            run.step += 1
            run.step_in_epoch += 1
            run.bar.advance()
            for hook in on_step:
                hook(run)
            yield
        run.step_in_epoch = 0


def _engine_run(run, device):
    if device.type == "cpu":  # foreach, as CUDA takes it (see the docstring)
        for g in run.opt.param_groups:
            g["foreach"] = True
    steps = fit_steps(run)
    return lambda: next(steps), lambda: run.loss_sum.item()


def engine(task, model_name: str, batch: int, device, hidden=None):
    cfg = TrainConfig(model=model_name, data="mnist", batch_size=batch, lr=LR, seed=SEED,
                      device=str(device), max_steps=10**9, log_every=10**9, progress=False)
    kw = {"model": _model(model_name, task, "cpu", hidden)} if hidden else {}
    return _engine_run(build(cfg, data=task, verbose=False, **kw), device)


def engine_tensors(x, y, net, batch: int, device):
    """benchmarks/peers_in_memory.py's fasttrain contender."""
    run = fasttrain.build(model=net, data=(x, y), loss=F.cross_entropy, batch_size=batch, lr=LR,
                          optimizer="adamw", weight_decay=0.0, schedule="constant",
                          device=str(device), seed=SEED, epochs=10**6, max_steps=10**9,
                          log_every=10**9, progress=False, verbose=False)
    return _engine_run(run, device)


def loops(args, device) -> dict:
    """name -> (one step, finish: the device's work done)."""
    if args.against == "hand-written":
        task = load_task("mnist")
        return {"hand-written": hand_written(task, args.model, args.batch_size, device,
                                             args.hidden),
                "engine": engine(task, args.model, args.batch_size, device, args.hidden)}
    task = load_task(args.data)
    x = (task.train_x.float() / 255 if task.train_x.dtype == torch.uint8 else task.train_x)
    y = task.train_y
    return {"hand-indexed": hand_indexed(x.to(device), y.to(device),
                                         _model(args.model, task, device, args.hidden),
                                         args.batch_size, device),
            "engine": engine_tensors(x, y, _model(args.model, task, "cpu", args.hidden),
                                     args.batch_size, device)}


def timed(one, finish, n: int) -> tuple[float, float]:
    """ms per step of `n` steps, the device's work included, and the CPU time of this thread
    per step: what the host spent, without the time other processes took the core from it (the
    machine is shared; with --threads 1 a CPU step runs on this thread alone)."""
    finish()
    t0, c0 = time.perf_counter(), time.thread_time()
    for _ in range(n):
        one()
    finish()
    return (time.perf_counter() - t0) * 1e3 / n, (time.thread_time() - c0) * 1e3 / n


def host_work(one, finish, n: int) -> dict:
    """Per step: the aten ops that reach a kernel, by name, and cProfile's Python time."""
    with OpCounter() as counter:
        for _ in range(n):
            one()
        finish()
    prof = cProfile.Profile()  # (a thread_time timer: a syscall per call, ~5 µs, no use)
    prof.enable()
    for _ in range(n):
        one()
    finish()
    prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, name) -> (calls, _, tottime, cumtime, _)
    python = {f"{os.path.basename(k[0])}:{k[1]}({k[2]})": v[2] for k, v in stats.items()
              if k[0] != "~"}  # "~": C functions (torch's ops among them)
    return {"ops_per_step": sum(counter.ops.values()) / n,
            "calls_per_step": sum(v[1] for v in stats.values()) / n,  # Python's and C's
            "ops": {k: v / n for k, v in sorted(counter.ops.items())},
            "python_us_per_step": 1e6 * sum(python.values()) / n,
            "python_frames_us_per_step": {k: 1e6 * v / n for k, v in
                                          sorted(python.items(), key=lambda kv: -kv[1])}}


def print_host_work(work: dict) -> None:
    ref, eng = (work[k] for k in work)  # the hand loop, then the engine
    names = list(work)
    print(f"aten ops per step: {names[0]} {ref['ops_per_step']:.1f}, engine "
          f"{eng['ops_per_step']:.1f}; the engine's difference by op:")
    for op in sorted(set(ref["ops"]) | set(eng["ops"])):
        d = eng["ops"].get(op, 0) - ref["ops"].get(op, 0)
        if abs(d) >= 0.05:  # (the finishing .item() of a timed window is 1/n a step)
            print(f"  {d:+6.1f}  {op}")
    print("function calls a step (cProfile: Python functions and C ones called from Python): "
          + ", ".join(f"{k} {w['calls_per_step']:.0f}" for k, w in work.items()))
    print("time in Python frames (cProfile, C calls excluded; preemption included), µs/step: "
          + ", ".join(f"{k} {w['python_us_per_step']:.0f}" for k, w in work.items())
          + "; the engine's most over the hand loop's, by frame:")
    frames = {fn: us - ref["python_frames_us_per_step"].get(fn, 0.0)
              for fn, us in eng["python_frames_us_per_step"].items()}
    for fn, us in sorted(frames.items(), key=lambda kv: -kv[1])[:16]:
        print(f"    {us:+7.1f} µs  {fn}")


def parse(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", choices=("hand-written", "hand-indexed"),
                    default="hand-written")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--window", type=int, default=100, help="steps timed per round")
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--hidden", type=int, help="the model's width (mlp: hidden; tiny: host-bound)")
    ap.add_argument("--data", default="fashion-mnist", help="--against hand-indexed's dataset")
    ap.add_argument("--batch-size", type=int, default=BATCH)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--ops", action="store_true",
                    help="also count each loop's aten ops and Python time per step")
    ap.add_argument("--json", help="write the result here")
    return ap.parse_args(argv)


def main() -> None:
    args = parse()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    runners = loops(args, device)
    for one, finish in runners.values():  # warm-up: first-touch allocations, oneDNN primitives
        timed(one, finish, 20)
    work = {k: host_work(*r, n=200) for k, r in runners.items()} if args.ops else None
    times: dict[str, list[float]] = {k: [] for k in runners}
    cpu: dict[str, list[float]] = {k: [] for k in runners}
    loads = []
    for r in range(args.rounds):
        loads.append(os.getloadavg()[0])
        names = list(runners)[r % 2:] + list(runners)[:r % 2]  # neither always runs first
        for name in names:
            wall, thread = timed(*runners[name], args.window)
            times[name].append(wall)
            cpu[name].append(thread)
    loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    ref = next(iter(runners))
    overhead = med["engine"] / med[ref] - 1
    env = env_block()
    print(hardware_line(env))
    if work:
        print_host_work(work)
    for k, v in times.items():
        print(f"{k:>13}: median {med[k]:.3f} ms/step, this thread's CPU median {cpu_med[k]:.3f} "
              f"min {min(cpu[k]):.3f} ms/step  (rounds: {', '.join(f'{t:.3f}' for t in v)})")
    added_us = 1e3 * (med["engine"] - med[ref])
    added_cpu_us = 1e3 * (cpu_med["engine"] - cpu_med[ref])
    # The fastest round of each: the least disturbed by the other processes (cache, SMT)
    added_cpu_min_us = 1e3 * (min(cpu["engine"]) - min(cpu[ref]))
    paired = statistics.median(e / h for e, h in zip(times["engine"], times[ref], strict=True))
    print(f"engine overhead: {100 * overhead:+.2f}% per step ({100 * (paired - 1):+.2f}% paired "
          f"per round), {added_us:+.1f} µs per step, {added_cpu_us:+.1f} µs of this thread's "
          f"CPU by medians, {added_cpu_min_us:+.1f} by the fastest rounds ({args.model}"
          f"{f' hidden {args.hidden}' if args.hidden else ''}, batch {args.batch_size}, "
          f"{device.type}, threads {torch.get_num_threads()}); load "
          f"{loads[0]:.2f} → {loads[-1]:.2f}")
    if args.json:
        result = {"schema": "fasttrain.engine-overhead/2", "env": env,
                  "config": {"against": ref, "model": args.model, "hidden": args.hidden,
                             "data": "mnist" if ref == "hand-written" else args.data,
                             "batch_size": args.batch_size, "lr": LR, "device": device.type,
                             "threads": torch.get_num_threads(),
                             "optimizer": "adamw", "precision": "fp32", "rounds": args.rounds,
                             "window": args.window},
                  "rows": [{"loop": k, "ms_per_step_median": med[k], "ms_per_step_rounds": v,
                            "thread_cpu_ms_per_step_median": cpu_med[k],
                            "thread_cpu_ms_per_step_rounds": cpu[k]}
                           for k, v in times.items()],
                  "overhead": overhead, "overhead_paired": paired - 1,
                  "added_us_per_step": added_us, "added_thread_cpu_us_per_step": added_cpu_us,
                  "added_thread_cpu_us_per_step_fastest_rounds": added_cpu_min_us,
                  "host_work": work, "load_1min": loads}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()

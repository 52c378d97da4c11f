"""How well `fasttrain plan`'s step time predicts a measured one, on this CPU.

    PYTHONPATH=src python benchmarks/plan_accuracy.py       # writes benchmarks/results/…json

The model (fasttrain.lab.steptime): step = Σ_calls max(FLOPs/peak, bytes/bandwidth) / eff
+ calls × t_launch, with eff and t_launch fitted to measured steps. For logreg, mlp, cnn and gpt
at three batch sizes each (the two of the target, and a third between them), every point is
counted (one real step, every op call) and timed; then each point is PREDICTED from a fit that
did not see it:

- other batch sizes (cross-validated, leave one out): eff and t_launch fitted to the same
  model's two other batch sizes — what `plan --calibrate` does, here checked on a batch it did
  not measure (the smallest and largest are extrapolations, the middle one an interpolation);
- other models: fitted to the nine points of the three other models — a calibration carried
  to a model it never saw;
- one efficiency: the previous model (roofline of the step's totals over one efficiency, no
  per-op term), fitted to the model's two other batch sizes, for comparison.

Target: within ±30% of the measured step.

Timing on a shared, loaded machine: one torch thread, timed by that thread's CPU time (`--clock
cpu`: time.thread_time; peaks measured the same way, fasttrain.peaks.measure_cpu), so that
waiting for a core is not counted, and no op waits at a barrier for a descheduled helper thread.
The thread count is set AFTER env_block(): its numba query starts numba's OpenMP pool, which
raises the OpenMP thread count torch shares to 2 (the previous results of this benchmark ran so,
timed by process_time: every thread's CPU time, a spinning OpenMP worker's included — logreg at
batch 64 read 27 ms a step, 0.29 ms by one thread's clock). All points are built first and timed
in short interleaved rounds, each started once the machine has been quiet for a second
(`--quiet`: at most that many runnable tasks, this one included, in /proc/loadavg; waited for up
to `--patience` seconds, else the round runs anyway and is marked), so that load that comes and
goes falls on every point alike; a point's time is the MEDIAN of all its steps; the load is
recorded at every round.

glibc is told to keep freed memory (steptime.hold_freed_memory, as `plan --calibrate` on a CPU
does; `--malloc default` to measure without): otherwise it returns large blocks to the OS and
faults them back every step, a CPU-only cost that grows faster than the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from fasttrain.engine.config import TrainConfig
from fasttrain.engine.run import build
from fasttrain.env import env_block, hardware_line
from fasttrain.lab import classify, steptime

POINTS = {"logreg": ("synthetic", (64, 192, 512)), "mlp": ("synthetic", (64, 192, 512)),
          "cnn": ("synthetic", (32, 64, 128)), "gpt": ("synthetic-text", (8, 16, 32))}
TARGET = 0.3
SCHEMES = ("other batch sizes", "other models", "one efficiency")


def one_efficiency(points: list[steptime.Point], totals: list[float]) -> float:
    """The previous model's constant: eff minimizing Σ ((R/eff)/T − 1)², R the roofline of the
    step's totals (max(FLOPs/peak, bytes/bandwidth) of the whole step)."""
    x = np.array([r / p.measured_s for p, r in zip(points, totals, strict=True)])
    return float(x @ x / x.sum())


def predict(rows: list[dict]) -> None:
    """Adds each scheme's fit, predicted step and error to every row."""
    pts = [r["point"] for r in rows]
    for i, r in enumerate(rows):
        same = [j for j, o in enumerate(rows) if o["model"] == r["model"] and j != i]
        other = [j for j, o in enumerate(rows) if o["model"] != r["model"]]
        r["predictions"] = {}
        for scheme, idx in (("other batch sizes", same), ("other models", other)):
            eff, launch = steptime.fit([pts[j] for j in idx])
            pred = r["roofline_s"] / eff + r["ops"] * launch
            r["predictions"][scheme] = {
                "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in idx],
                "efficiency": eff, "launch_s": launch, "predicted_s": pred,
                "error": pred / r["measured_s"] - 1}
        eff = one_efficiency([pts[j] for j in same], [rows[j]["totals_roofline_s"] for j in same])
        pred = r["totals_roofline_s"] / eff
        r["predictions"]["one efficiency"] = {
            "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in same],
            "efficiency": eff, "launch_s": 0.0, "predicted_s": pred,
            "error": pred / r["measured_s"] - 1}


def runnable() -> int:
    """Tasks runnable on this machine now, this one included (/proc/loadavg's fourth field)."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0])


def wait_quiet(most: int, patience: float, every: float = 0.2, samples: int = 5) -> dict:
    """Wait until `samples` consecutive readings `every` seconds apart show at most `most`
    runnable tasks, or `patience` seconds have passed; what was seen."""
    t0, streak, seen = time.monotonic(), 0, []
    while streak < samples and time.monotonic() - t0 < patience:
        seen.append(runnable())
        streak = streak + 1 if seen[-1] <= most else 0
        time.sleep(every)
    return {"quiet": streak >= samples, "waited_s": time.monotonic() - t0,
            "runnable_last": seen[-samples:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per point per round")
    ap.add_argument("--quiet", type=int, default=2,
                    help="start a round when at most this many tasks are runnable (default 2)")
    ap.add_argument("--patience", type=float, default=30,
                    help="seconds to wait for a quiet machine before a round runs anyway")
    ap.add_argument("--json", help="default: benchmarks/results/DATE-cpu-NAME-plan-accuracy.json")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a loaded machine, a parallel op waits for "
                    "its slowest thread, and a descheduled one makes steps 100× slower)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu (default): steps timed in the thread's CPU time and peaks "
                    "measured as fasttrain.peaks does (rates over CPU time), so that time spent "
                    "waiting for a core is not counted (valid with --threads 1); wall: "
                    "perf_counter and classify.measure_peaks, as `plan --calibrate` times")
    ap.add_argument("--malloc", choices=("hold", "default"), default="hold",
                    help="hold (default): glibc keeps freed memory, as plan --calibrate on a CPU "
                    "and CUDA's caching allocator do; default: glibc's own trimming")
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu needs --threads 1 (CPU time sums over threads)")
    env = env_block()  # first: it raises OpenMP's thread count (module docstring)
    torch.set_num_threads(args.threads)
    env["torch_threads"] = torch.get_num_threads()
    held = args.malloc == "hold" and steptime.hold_freed_memory()
    t0 = time.time()
    if args.clock == "cpu":
        from fasttrain.peaks import measure_cpu

        p = measure_cpu(n_threads=1)
        peaks = classify.Peaks(p["fp32_flops"], p["bandwidth"], "fasttrain.peaks.measure_cpu")
        clock = time.thread_time  # autograd runs a CPU backward on the calling thread
    else:
        peaks = classify.measure_peaks(torch.device("cpu"))
        clock = time.perf_counter
    runs = {(m, b): build(TrainConfig(model=m, data=d, batch_size=b, device="cpu").validate(),
                          verbose=False)
            for m, (d, batches) in POINTS.items() for b in batches}
    times = {k: [] for k in runs}
    rounds = []
    for i in range(args.rounds):
        gate = wait_quiet(args.quiet, args.patience)
        rounds.append({"round": i, **gate, "loadavg": list(os.getloadavg()), "median_s": {}})
        for (m, b), run in runs.items():
            t = steptime.time_steps(run, args.steps, warmup=2 if i == 0 else 1, clock=clock)
            times[m, b] += t
            rounds[-1]["median_s"][f"{m}@{b}"] = statistics.median(t)
        print(f"round {i + 1}/{args.rounds} done ({'quiet' if gate['quiet'] else 'NOT quiet'} "
              f"after {gate['waited_s']:.0f} s), load {os.getloadavg()[0]:.2f}", flush=True)
    load_after = os.getloadavg()
    rows = []
    for (m, b), run in runs.items():
        work = steptime.count_run(run)
        roof = steptime.roofline_s(work, peaks.flops, peaks.bandwidth)
        point = steptime.Point(b, roof, work.ops, statistics.median(times[m, b]))
        rows.append({"model": m, "data": POINTS[m][0], "batch_size": b, "point": point,
                     "measured_s": point.measured_s, "step_times_s": times[m, b],
                     "spread_s": [min(times[m, b]), max(times[m, b])],
                     "flops": work.flops, "bytes": work.bytes, "ops": work.ops,
                     "roofline_s": roof, "totals_roofline_s": max(work.flops / peaks.flops,
                                                                  work.bytes / peaks.bandwidth)})
    predict(rows)
    loads = ", ".join(f"{r['loadavg'][0]:.2f}" for r in rounds)
    quiet = sum(r["quiet"] for r in rounds)
    print(hardware_line(env))
    print(f"peaks ({peaks.source}): {peaks.flops / 1e9:.0f} GFLOP/s, "
          f"{peaks.bandwidth / 1e9:.0f} GB/s; load average per round {loads}, after "
          f"{load_after[0]:.2f}; {quiet}/{len(rounds)} rounds started quiet; freed memory held: "
          f"{held}")
    for r in rows:
        e = {s: r["predictions"][s]["error"] for s in SCHEMES}
        print(f"{r['model']:>6} batch {r['batch_size']:>4}: measured {r['measured_s'] * 1e3:8.3f}"
              f" ms, roofline {r['roofline_s'] * 1e3:8.3f} ms, {r['ops']:4d} calls; errors: "
              + ", ".join(f"{s} {v:+.0%}" for s, v in e.items()), flush=True)
    within = {}
    for scheme in SCHEMES:
        errs = [r["predictions"][scheme]["error"] for r in rows]
        outer = [r["predictions"][scheme]["error"] for r in rows
                 if r["batch_size"] != POINTS[r["model"]][1][1]]
        within[scheme] = {"all": sum(abs(e) <= TARGET for e in errs), "of": len(errs),
                          "target_batches": sum(abs(e) <= TARGET for e in outer),
                          "of_target": len(outer)}
        print(f"{scheme:>17}: {within[scheme]['all']}/{len(errs)} within ±{TARGET:.0%} "
              f"({within[scheme]['target_batches']}/{len(outer)} at the target batch sizes)")
    for r in rows:
        del r["point"]
    result = {"schema": "fasttrain.plan-accuracy/2", "env": env,
              "config": {"points": {m: {"data": d, "batch_sizes": list(b),
                                        "target_batch_sizes": [b[0], b[2]]}
                                    for m, (d, b) in POINTS.items()},
                         "rounds": args.rounds, "steps_per_round": args.steps,
                         "quiet_runnable": args.quiet, "patience_s": args.patience,
                         "device": "cpu", "precision": "fp32", "target": TARGET,
                         "threads": args.threads, "clock": args.clock, "malloc": args.malloc,
                         "freed_memory_held": held, "schemes": list(SCHEMES),
                         "validation": "each point predicted from a fit that did not see it "
                         "(leave one batch size out; leave one model out)"},
              "load": {"rounds": rounds, "loadavg_after": list(load_after),
                       "note": "a machine shared with other work: a point's time is the median "
                       "of all its steps over interleaved rounds (min and max kept)"},
              "peaks": {"flops": peaks.flops, "bandwidth": peaks.bandwidth,
                        "source": peaks.source},
              "rows": rows, "within_target": within, "seconds": time.time() - t0}
    path = args.json
    if not path:
        cpu = re.sub(r"[^a-z0-9]+", "-", (env.get("cpu") or "cpu").lower()).strip("-")
        path = (Path(__file__).parent / "results" /
                f"{time.strftime('%Y-%m-%d')}-cpu-{cpu}-{env.get('cores')}core-plan-accuracy.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

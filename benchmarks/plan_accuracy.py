"""How well `fasttrain plan`'s step time predicts a measured one, on this CPU.

    PYTHONPATH=src python benchmarks/plan_accuracy.py            # writes benchmarks/results/…json

For logreg, mlp, cnn and gpt at two batch sizes each: the fastest of a few timed optimizer steps
(fasttrain.lab.steptime.time_steps), and the step's roofline on this CPU (counted FLOPs and bytes,
fasttrain.lab.steptime.count_run, at peaks measured once with classify.measure_peaks). The
efficiency of a point is roofline / measured; a prediction divides a point's roofline by an
efficiency calibrated elsewhere, in three ways:

- other batch: calibrated on the same model at its other batch size (what `plan --calibrate`
  relies on when the batch changes);
- other models: the median efficiency of the other three models (both batches): a calibration
  carried to a model it never saw;
- default: steptime.DEFAULT_EFFICIENCY.

Target: within ±30% of the measured step. Timing on a shared machine: a point's step time is the
fastest of its timed steps (other work only slows a step down; the median is kept too), and the
load average is recorded before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import time
from pathlib import Path

import torch

from fasttrain.engine.config import TrainConfig
from fasttrain.engine.run import build
from fasttrain.env import env_block, hardware_line
from fasttrain.lab import classify, steptime
from fasttrain.lab.memory import free_memory

POINTS = {"logreg": ("synthetic", (64, 512)), "mlp": ("synthetic", (64, 512)),
          "cnn": ("synthetic", (32, 128)), "gpt": ("synthetic-text", (8, 32))}
TARGET = 0.3


def measure(model: str, data: str, batch: int, steps: int, peaks: classify.Peaks,
            clock) -> dict:
    cfg = TrainConfig(model=model, data=data, batch_size=batch, device="cpu").validate()
    run = build(cfg, verbose=False)
    try:
        times = steptime.time_steps(run, steps, clock=clock)
        measured = min(times)
        work = steptime.count_run(run)
    finally:
        del run
        free_memory()
    roof = steptime.roofline_s(work, peaks.flops, peaks.bandwidth)
    return {"model": model, "data": data, "batch_size": batch, "measured_s": measured,
            "median_s": statistics.median(times), "step_times_s": times,
            "flops": work.flops, "bytes": work.bytes, "roofline_s": roof,
            "bound": "compute" if work.flops / peaks.flops >= work.bytes / peaks.bandwidth
            else "memory", "efficiency": steptime.efficiency(measured, roof)}


def predict(rows: list[dict]) -> None:
    """Adds each scheme's predicted step and its error to every row."""
    for r in rows:
        other_batch = next(o for o in rows if o["model"] == r["model"] and o is not r)
        others = statistics.median(o["efficiency"] for o in rows if o["model"] != r["model"])
        r["predictions"] = {}
        for scheme, eff in (("other batch", other_batch["efficiency"]), ("other models", others),
                            ("default", steptime.DEFAULT_EFFICIENCY)):
            pred = r["roofline_s"] / eff
            r["predictions"][scheme] = {"efficiency": eff, "predicted_s": pred,
                                        "error": pred / r["measured_s"] - 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="timed steps per point (after 2)")
    ap.add_argument("--json", help="default: benchmarks/results/DATE-cpu-NAME-plan-accuracy.json")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: on a loaded machine, a parallel op waits for "
                    "its slowest thread, and a descheduled one makes steps 100× slower)")
    ap.add_argument("--clock", choices=("cpu", "wall"), default="cpu",
                    help="cpu (default): steps timed in process CPU time and peaks measured as "
                    "fasttrain.peaks does (rates over CPU time), so that time spent waiting for a "
                    "core on a shared machine is not counted (valid with --threads 1); wall: "
                    "perf_counter and classify.measure_peaks, as `plan --calibrate` times")
    args = ap.parse_args()
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu needs --threads 1 (CPU time sums over threads)")
    torch.set_num_threads(args.threads)
    env = env_block()
    load_before = os.getloadavg()
    t0 = time.time()
    if args.clock == "cpu":
        from fasttrain.peaks import measure_cpu

        p = measure_cpu(n_threads=1)
        peaks = classify.Peaks(p["fp32_flops"], p["bandwidth"], "fasttrain.peaks.measure_cpu")
        clock = time.process_time
    else:
        peaks = classify.measure_peaks(torch.device("cpu"))
        clock = time.perf_counter
    # A throwaway point: the first steps of a process pay one-time costs (oneDNN primitives,
    # the allocator's first blocks, lazy imports) that a later point does not.
    measure("logreg", "synthetic", 64, args.steps, peaks, clock)
    rows = []
    for model, (data, batches) in POINTS.items():
        for b in batches:
            rows.append(measure(model, data, b, args.steps, peaks, clock))
            r = rows[-1]
            print(f"{model:>6} batch {b:>4}: measured {r['measured_s'] * 1e3:8.2f} ms, roofline "
                  f"{r['roofline_s'] * 1e3:8.3f} ms ({r['bound']}), efficiency "
                  f"{r['efficiency']:.3f}", flush=True)
    predict(rows)
    load_after = os.getloadavg()
    print(hardware_line(env))
    print(f"peaks ({peaks.source}): {peaks.flops / 1e9:.0f} GFLOP/s, "
          f"{peaks.bandwidth / 1e9:.0f} GB/s; "
          f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    within = {}
    for scheme in ("other batch", "other models", "default"):
        errs = [r["predictions"][scheme]["error"] for r in rows]
        within[scheme] = sum(abs(e) <= TARGET for e in errs)
        print(f"{scheme:>12}: errors {', '.join(f'{e:+.0%}' for e in errs)}; "
              f"{within[scheme]}/{len(errs)} within ±{TARGET:.0%}")
    result = {"schema": "fasttrain.plan-accuracy/1", "env": env,
              "config": {"points": {m: {"data": d, "batch_sizes": list(b)}
                                    for m, (d, b) in POINTS.items()},
                         "steps": args.steps, "warmup_steps": 2, "device": "cpu",
                         "precision": "fp32", "target": TARGET, "threads": args.threads,
                         "clock": args.clock},
              "load": {"loadavg_before": list(load_before), "loadavg_after": list(load_after),
                       "note": "a machine shared with other work: a point's time is its "
                       "fastest step (median kept), and the load average is what was running "
                       "beside them"},
              "peaks": {"flops": peaks.flops, "bandwidth": peaks.bandwidth,
                        "source": peaks.source},
              "rows": rows, "within_target": within, "seconds": time.time() - t0}
    path = args.json
    if not path:
        cpu = re.sub(r"[^a-z0-9]+", "-", (env.get("cpu") or "cpu").lower()).strip("-")
        path = (Path(__file__).parent / "results" /
                f"{time.strftime('%Y-%m-%d')}-cpu-{cpu}-{env.get('cores')}core-plan-accuracy"
                f"-{args.clock}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

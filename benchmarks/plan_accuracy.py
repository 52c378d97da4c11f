"""How well `fasttrain plan`'s step time predicts a measured one, on this CPU or a CUDA GPU.

    PYTHONPATH=src python benchmarks/plan_accuracy.py                # benchmarks/results/…json
    PYTHONPATH=src python benchmarks/plan_accuracy.py --device cuda  # the same on a CUDA GPU

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
  per-op term), fitted to the model's two other batch sizes, for comparison;
- overlapped (fasttrain.lab.overlap, what `plan` predicts a GPU's step with): step = max(R/eff,
  calls × t_issue), the host issuing while the device computes, ONE efficiency and ONE issue
  cost for the machine — fitted to the eleven other points ("overlapped, other points": leave
  one point out), or to the three other models' nine ("overlapped, other models"). Two fitted
  constants per machine, where the schemes above fit two per model. On a CPU the same thread
  computes and issues: there the sum, per model, is the model, and these two schemes are shown
  to say so.

`--from-json FILE` re-fits and re-scores a committed result's points (their counts and median
steps) without measuring anything: the same points, the present schemes.

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

On a GPU (`--device cuda`; without CUDA it exits 2 and measures nothing): each step timed by the
wall clock with the device synchronized before and after it (steptime.time_steps), peaks from the
GPU's data sheet (classify.device_peaks: what `plan --calibrate` uses there), fp32 (TF32 off, as
the engine runs fp32). None of the CPU's settings: no thread count, no malloc setting (CUDA's
caching allocator keeps its blocks), no quiet gate (a GPU has no other tenant here; the host's load
is still recorded per round). Other batch sizes: at the CPU's, an H100 step of logreg, mlp or
cnn is almost all issuing (logreg at 512: 31 calls of several µs each, 3.9 MB moved, ~1 µs at
3.35 TB/s), so the efficiency would be fitted to noise. The GPU's points go from issue-bound
towards roofline-bound (×8 apart for logreg and mlp, up to 32768 of the stand-in's 60000
images, where logreg's 0.25 GB is still only ~1/3 of its step; ×4 for cnn and gpt, cnn at 2048
0.23 TFLOP and gpt at 256 of its 1406 windows 0.16 TFLOP, several ms at fp32's 67 TFLOP/s), so
both terms are tested, and where their sum overstates a step whose host issues ahead of the
device (the overlapped schemes). Each step's issue time (the host's, until it returns from the
step, before the closing sync) and every call's FLOPs and bytes are kept per point, so that the
cost to issue a call can be measured rather than fitted, and a per-call model re-fitted offline
(`--from-json`). Run time on an H100: 33 steps a point (25 timed, 6 warm-up, 2 in
the count), ≤ ~20 ms each: under 10 s of steps for all twelve; building the runs (synthetic
data on the host) and CUDA's start dominate, ~30 s in all.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from plan_scoring import SCHEMES, TARGET, predict, refit, show, within_target

from fasttrain.engine.config import TrainConfig
from fasttrain.engine.run import build
from fasttrain.env import env_block, hardware_line
from fasttrain.errors import UserError
from fasttrain.lab import classify, steptime

if TYPE_CHECKING:
    from collections.abc import Callable

# device → model → (data, batch sizes): the target's two at the ends, one between (module docstring)
POINTS = {
    "cpu": {"logreg": ("synthetic", (64, 192, 512)), "mlp": ("synthetic", (64, 192, 512)),
            "cnn": ("synthetic", (32, 64, 128)), "gpt": ("synthetic-text", (8, 16, 32))},
    "cuda": {"logreg": ("synthetic", (512, 4096, 32768)),
             "mlp": ("synthetic", (512, 4096, 32768)),
             "cnn": ("synthetic", (128, 512, 2048)), "gpt": ("synthetic-text", (16, 64, 256))},
}
# The CPU's settings (module docstring) and their defaults; a GPU takes none of them.
CPU_ONLY = {"clock": "cpu", "threads": 1, "malloc": "hold", "quiet": 2, "patience": 30.0}
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


def measuring(device: str, clock: str) -> tuple[classify.Peaks, Callable[[], float]]:
    """The peaks and the step clock (module docstring). A GPU: its data sheet, the wall clock
    (time_steps synchronizes the device at both ends of every step)."""
    if device == "cuda":
        return classify.device_peaks(torch.device("cuda"), "fp32"), time.perf_counter
    if clock == "cpu":
        from fasttrain.peaks import measure_cpu

        p = measure_cpu(n_threads=1)
        peaks = classify.Peaks(p["fp32_flops"], p["bandwidth"], "fasttrain.peaks.measure_cpu")
        return peaks, time.thread_time  # autograd runs a CPU backward on the calling thread
    return classify.measure_peaks(torch.device("cpu")), time.perf_counter


def build_runs(points: dict, device: str) -> dict:
    """(model, batch size) → its Run on `device`; a Run that landed elsewhere is an error, so
    that a GPU result cannot be a CPU's."""
    runs = {}
    for m, (d, batches) in points.items():
        for b in batches:
            run = build(TrainConfig(model=m, data=d, batch_size=b, device=device).validate(),
                        verbose=False)
            if run.device.type != device:
                raise RuntimeError(f"{m} at batch {b} was built on {run.device}, not {device}")
            runs[m, b] = run
    return runs


def time_rounds(runs: dict, rounds: int, steps: int, clock,
                gate) -> tuple[dict, dict, list[dict]]:
    """Every point's step times over `rounds` interleaved rounds of `steps` steps (warm-up 2 in
    the first round, 1 after), and each step's issue time (the host's, until it returned from
    the step: steptime.time_steps); `gate()` before each round, recorded with the load average."""
    times, issued, log = {k: [] for k in runs}, {k: [] for k in runs}, []
    for i in range(rounds):
        seen = gate()
        log.append({"round": i, **seen, "loadavg": list(os.getloadavg()), "median_s": {}})
        for (m, b), run in runs.items():
            t = steptime.time_steps(run, steps, warmup=2 if i == 0 else 1, clock=clock,
                                    issued=issued[m, b])
            times[m, b] += t
            log[-1]["median_s"][f"{m}@{b}"] = statistics.median(t)
        state = (f" ({'quiet' if seen['quiet'] else 'NOT quiet'} after {seen['waited_s']:.0f} s)"
                 if "quiet" in seen else "")
        print(f"round {i + 1}/{rounds} done{state}, load {os.getloadavg()[0]:.2f}", flush=True)
    return times, issued, log


def point_rows(runs: dict, times: dict, peaks: classify.Peaks, points: dict,
               issued: dict | None = None) -> list[dict]:
    """One row per point: its count (one real step; every call's FLOPs and bytes kept, so that a
    per-call model can be re-fitted offline), roofline, median step, the host's issue times
    (`issued`) and every scheme's prediction (`predict`)."""
    rows = []
    for (m, b), run in runs.items():
        work = steptime.count_run(run)  # the optimizer's path as timed (foreach on CUDA)
        roof = steptime.roofline_s(work, peaks.flops, peaks.bandwidth)
        point = steptime.Point(b, roof, work.ops, statistics.median(times[m, b]),
                               tuple(times[m, b]))
        rows.append({"model": m, "data": points[m][0], "batch_size": b, "point": point,
                     "measured_s": point.measured_s, "step_times_s": times[m, b],
                     "spread_s": [min(times[m, b]), max(times[m, b])],
                     "issue_times_s": (issued or {}).get((m, b), []),
                     "calls": [[f, n_bytes, n] for (f, n_bytes), n in sorted(work.calls.items())],
                     "flops": work.flops, "bytes": work.bytes, "ops": work.ops,
                     "roofline_s": roof, "totals_roofline_s": max(work.flops / peaks.flops,
                                                                  work.bytes / peaks.bandwidth)})
    predict(rows)
    for r in rows:
        del r["point"]
    return rows


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def default_path(env: dict, device: str) -> Path:
    """benchmarks/results/DATE-cpu-NAME-Ncore-plan-accuracy.json on a CPU; DATE-GPU-plan-
    accuracy.json on a GPU, GPU its name as scripts/gpu-check names its results."""
    name = (slug(env.get("gpu") or torch.cuda.get_device_name()) if device == "cuda"
            else f"cpu-{slug(env.get('cpu') or 'cpu')}-{env.get('cores')}core")
    return (Path(__file__).parent / "results" /
            f"{time.strftime('%Y-%m-%d')}-{name}-plan-accuracy.json")


def parse(argv: list[str] | None) -> argparse.Namespace:
    """The flags, the CPU's settings resolved (CPU_ONLY: defaults on a CPU, refused on a GPU)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu (default) or cuda: the GPU's batch sizes, wall clock, data-sheet "
                    "peaks (module docstring)")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved timing rounds")
    ap.add_argument("--steps", type=int, default=5, help="timed steps per point per round")
    ap.add_argument("--from-json", metavar="FILE",
                    help="measure nothing: re-fit and re-score FILE's points (a committed result) "
                    "by the present schemes; with --json, write the re-scored result there")
    ap.add_argument("--json", help="default: benchmarks/results/DATE-cpu-NAME-Ncore-plan-"
                    "accuracy.json, or DATE-GPU-plan-accuracy.json with --device cuda")
    cpu = ap.add_argument_group("CPU only (a GPU takes none of these but --clock wall)")
    cpu.add_argument("--quiet", type=int,
                     help="start a round when at most this many tasks are runnable (default 2)")
    cpu.add_argument("--patience", type=float,
                     help="seconds to wait for a quiet machine before a round runs anyway "
                     "(default 30)")
    cpu.add_argument("--threads", type=int,
                     help="torch threads (default 1: on a loaded machine, a parallel op waits for "
                     "its slowest thread, and a descheduled one makes steps 100× slower)")
    cpu.add_argument("--clock", choices=("cpu", "wall"),
                     help="cpu (default; a GPU: wall, always): steps timed in the thread's CPU "
                     "time and peaks measured as fasttrain.peaks does (rates over CPU time), so "
                     "that time spent waiting for a core is not counted (valid with --threads "
                     "1); wall: perf_counter and classify.measure_peaks, as `plan --calibrate` "
                     "times")
    cpu.add_argument("--malloc", choices=("hold", "default"),
                     help="hold (default): glibc keeps freed memory, as plan --calibrate on a CPU "
                     "and CUDA's caching allocator do; default: glibc's own trimming")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        ap.error(f"--rounds {args.rounds} --steps {args.steps}: give at least 1 of each")
    given = [k for k in CPU_ONLY if getattr(args, k) not in (None, "wall")]
    if args.device == "cuda" and given:
        ap.error(f"--{given[0]} is for --device cpu: a GPU is timed by the wall clock, with no "
                 "thread, malloc or quiet-machine setting")
    for k, v in CPU_ONLY.items():
        if args.device == "cpu" and getattr(args, k) is None:
            setattr(args, k, v)
    args.clock = args.clock or "wall"
    if args.clock == "cpu" and args.threads != 1:
        ap.error("--clock cpu needs --threads 1 (CPU time sums over threads)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.from_json:
        try:
            result = refit(args.from_json)
        except UserError as e:
            print(f"plan_accuracy: {e}", file=sys.stderr)
            return 2
        print(f"re-fit of {args.from_json} (its measurements; nothing measured now)")
        show(result["rows"], result["within_target"])
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=2)
            print(f"wrote {args.json}")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        why = (f"built with CUDA {torch.version.cuda}, but no GPU is visible"
               if torch.version.cuda else "a CPU-only build")
        print(f"plan_accuracy: --device cuda: CUDA is not available (torch {torch.__version__}, "
              f"{why})", file=sys.stderr)
        return 2
    cpu = args.device == "cpu"
    points = POINTS[args.device]
    env = env_block()  # first: it raises OpenMP's thread count (module docstring)
    if cpu:
        torch.set_num_threads(args.threads)
    env["torch_threads"] = torch.get_num_threads()
    held = cpu and args.malloc == "hold" and steptime.hold_freed_memory()
    t0 = time.time()
    peaks, clock = measuring(args.device, args.clock)
    runs = build_runs(points, args.device)
    gate = (lambda: wait_quiet(args.quiet, args.patience)) if cpu else lambda: {}
    times, issued, rounds = time_rounds(runs, args.rounds, args.steps, clock, gate)
    load_after = os.getloadavg()
    rows = point_rows(runs, times, peaks, points, issued)
    within = within_target(rows, points)
    device_name = torch.cuda.get_device_name() if not cpu else env.get("cpu")
    print(hardware_line(env))
    loads = ", ".join(f"{r['loadavg'][0]:.2f}" for r in rounds)
    print(f"peaks ({peaks.source}): {peaks.flops / 1e9:.0f} GFLOP/s, "
          f"{peaks.bandwidth / 1e9:.0f} GB/s; load average per round {loads}, after "
          f"{load_after[0]:.2f}" + (f"; {sum(r['quiet'] for r in rounds)}/{len(rounds)} rounds "
                                    f"started quiet; freed memory held: {held}" if cpu else ""))
    show(rows, within)
    result = {"schema": "fasttrain.plan-accuracy/2", "env": env,
              "config": {"points": {m: {"data": d, "batch_sizes": list(b),
                                        "target_batch_sizes": [b[0], b[2]]}
                                    for m, (d, b) in points.items()},
                         "rounds": args.rounds, "steps_per_round": args.steps,
                         "quiet_runnable": args.quiet, "patience_s": args.patience,
                         "device": args.device, "device_name": device_name, "precision": "fp32",
                         "target": TARGET, "threads": args.threads,
                         "clock": args.clock, "malloc": args.malloc,
                         "timing": "the thread's CPU time" if args.clock == "cpu" else
                         "wall clock, the device synchronized before and after each step",
                         "freed_memory_held": held, "schemes": list(SCHEMES),
                         "validation": "each point predicted from a fit that did not see it "
                         "(leave one batch size out; leave one model out)"},
              "load": {"rounds": rounds, "loadavg_after": list(load_after),
                       "note": ("a machine shared with other work: " if cpu else "") +
                       "a point's time is the median of all its steps over interleaved rounds "
                       "(min and max kept)"},
              "peaks": {"flops": peaks.flops, "bandwidth": peaks.bandwidth,
                        "source": peaks.source},
              "rows": rows, "within_target": within, "seconds": time.time() - t0}
    path = args.json or default_path(env, args.device)
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Where a step's time goes in the CUDA C++ rungs: GPU busy (kernels, copies) against launch gaps.

Each rung is set up as `fasttrain bench` sets it up, trained WARMUP epochs untimed, then one more
epoch under the torch profiler (CUPTI sees the ctypes-loaded library's kernels and runtime calls:
it shares torch's CUDA runtime). From the trace: the epoch's span on the GPU, the time the GPU was
busy (the union of kernel, memcpy and memset intervals), the idle rest (launch gaps and host
waits), and per step the kernels launched and the busy µs, with the five costliest kernels.

    PYTHONPATH=src python benchmarks/cuda_step_profile.py [--impl cuda-baseline,+cuda-graphs]
        [--data mnist] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from fasttrain import ladder
from fasttrain.data import load_dataset
from fasttrain.env import env_block, hardware_line

WARMUP = 3
ROWS = [e.name for e in ladder.REGISTRY if e.target.startswith("cuda_rungs:")]
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def profile_row(name: str, data, cfg) -> dict:
    impl = ladder.entry(name).create("cuda")
    reason = impl.unavailable({}, cfg)
    if reason:
        return {"impl": name, "status": "unavailable", "reason": reason}
    impl.setup(data, cfg)
    for e in range(WARMUP):
        impl.train_epoch(e)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        impl.train_epoch(WARMUP)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    dev = [ev for ev in events if ev.get("cat") in DEVICE_CATS and "dur" in ev]
    spans = [(ev["ts"], ev["ts"] + ev["dur"]) for ev in dev]
    span = max(e for _, e in spans) - min(s for s, _ in spans)
    busy = busy_us(spans)
    steps = math.ceil(data.n_train / cfg.batch_size)
    kernels = [ev for ev in dev if ev["cat"] == "kernel"]
    by_kernel = Counter()
    for ev in kernels:
        by_kernel[ev["name"][:60]] += ev["dur"]
    return {
        "impl": name, "status": "ok", "steps": steps,
        "gpu_span_ms": span / 1e3, "gpu_busy_ms": busy / 1e3, "gap_ms": (span - busy) / 1e3,
        "busy_fraction": busy / span, "kernels_per_step": len(kernels) / steps,
        "busy_us_per_step": busy / steps, "span_us_per_step": span / steps,
        "top_kernels_us_per_step": {k: v / steps for k, v in by_kernel.most_common(5)},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--impl", default=",".join(ROWS))
    p.add_argument("--data", default="mnist", choices=("mnist", "fashion-mnist", "synthetic"))
    p.add_argument("--json", metavar="PATH")
    args = p.parse_args()
    cfg = ladder.LadderConfig(epochs=WARMUP + 1, device="cuda")
    data = ladder.make_ladder_data(load_dataset(args.data, None, seed=cfg.seed), cfg)
    env = env_block()
    print(f"cuda_step_profile on {hardware_line(env)}; {data.name}, batch {cfg.batch_size}")
    rows = [profile_row(n.strip(), data, cfg) for n in args.impl.split(",") if n.strip()]
    print(f"{'impl':<16}{'span ms':>9}{'busy ms':>9}{'gap ms':>9}{'busy %':>8}"
          f"{'kern/step':>10}{'busy µs/step':>13}")
    for r in rows:
        if r["status"] != "ok":
            print(f"{r['impl']:<16}unavailable: {r['reason']}")
            continue
        print(f"{r['impl']:<16}{r['gpu_span_ms']:>9.2f}{r['gpu_busy_ms']:>9.2f}{r['gap_ms']:>9.2f}"
              f"{100 * r['busy_fraction']:>7.0f}%{r['kernels_per_step']:>10.1f}"
              f"{r['busy_us_per_step']:>13.1f}")
        for k, us in r["top_kernels_us_per_step"].items():
            print(f"{'':<18}{us:>8.2f} µs/step  {k}")
    if args.json:
        Path(args.json).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()

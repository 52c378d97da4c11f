"""The host cost of torch-optimized's step: Python → arg parsing → dispatcher → kernel, per op, in
every way a PyTorch user can issue the step's 4 ops (mm, _log_softmax, _log_softmax_backward_data,
addmm_), on this machine's CPU.

On an H100 the row's step took 56 µs for ~15-20 µs of GPU work: it is bound by the host. That host
path is the same code for a CPU tensor up to the backend kernel, so it is measured here on CPU
tensors of the ops' smallest shapes (x [1, 1], W [1, 1]: the kernels do next to nothing, so what
is left is host cost; an upper bound, since the tiny kernels still run) and, for scale, of the row's
own shapes (B 128, 785 inputs, 10 classes: there the CPU kernels dominate). Meta tensors are
measured once to show why they are NOT used: on the 2-core EPYC these ops took 18 µs (mm) to
~0.5 ms (the other three) each on meta tensors, against ~1 µs on CPU ones (their meta path
probably runs Python registrations): nothing like a backend kernel's host path. What a CUDA
backend adds (device guard, stream, cuBLAS's host side, cudaLaunchKernel) cannot be measured
without a GPU: `--device cuda` runs every case on CUDA tensors too, interleaved with the CPU ones
(at the smallest shapes the GPU idles between the host's launches, so the CUDA figure is the host
path including the CUDA backend's part, and the CPU figure of the same host the part before it).

Variants (how the ops are called) × modes (the autograd state around the whole loop, entered once):
- out: as torch_optimized v3 wrote them (`torch.mm(..., out=)`, ..., `w.addmm_(g.T, ...)`);
- product: `torch_optimized.train_steps` itself, whatever version the tree holds;
- functional: the same ops returning new tensors (CPU malloc here, the caching allocator on CUDA);
- aten: `torch.ops.aten.<op>.<overload>(...)`, the dispatcher through pybind, not PythonArgParser;
- bound: functions in locals and `g.T` made once, the loop body only calls;
- partial: each step's 4 calls pre-bound with functools.partial, the loop only calls them;
- script: the whole loop compiled by `torch.jit.script` (deprecated in torch 2.13; no Python per
  op).
Modes: grad (the default), no_grad, inference (`torch.inference_mode()`), below-autograd
(`torch._C._AutoDispatchBelowAutograd`, private: skips the Autograd keys, as inference mode
does for normal tensors).

Every variant is first checked to compute bit-identical weights to `out` (row shapes, STEPS steps).
Then rounds: each round times every (variant, mode) once, in a rotated order: the fastest of REPS
calls of STEPS steps (a call at the smallest shapes is ~0.2 ms, short enough to escape most
preemption on a shared machine); the figure is the median over rounds of µs per step, with the min
and max. The 1-minute load average is read before each round: the machine is shared, and under load
the figures rise (the spread says how much).

    PYTHONPATH=src python benchmarks/dispatch_cost.py [--rounds 15] [--device cuda] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
import warnings
from types import SimpleNamespace

import torch

from fasttrain.env import env_block, hardware_line
from fasttrain.ladder.torch_optimized import Step, train_steps

STEPS, REPS = 50, 10
F32 = torch.float32
SHAPES = {"smallest": (1, 1, 1), "row": (128, 785, 10)}  # (batch, inputs, classes)
MODES = {"grad": torch.enable_grad, "no_grad": torch.no_grad, "inference": torch.inference_mode,
         "below-autograd": torch._C._AutoDispatchBelowAutograd}


def make_state(shape, device="cpu", seed=0):
    """One weight and STEPS steps' fixed views, as EpochState makes them (distinct x per step):
    `steps` in the product's Step layout, `v3` in v3's (x, -onehot, z, g, logp, alpha)."""
    b, k, c = shape
    gen = torch.Generator().manual_seed(seed)
    rows = torch.rand(STEPS * b, k + c, generator=gen).to(device)
    rows[:, k:] = -torch.nn.functional.one_hot(torch.randint(c, (STEPS * b,), generator=gen),
                                               c).to(device)
    w = (torch.rand(c, k, generator=gen) - 0.5).to(device)
    z, g = torch.empty(b, c, device=device), torch.empty(b, c, device=device)
    logp = torch.empty(STEPS * b, c, device=device)
    views = [{"x": rows[i * b:(i + 1) * b, :k], "neg_onehot": rows[i * b:(i + 1) * b, k:],
              "z": z, "g": g, "gt": g.T, "logp": logp[i * b:(i + 1) * b], "alpha": -0.1 / b}
             for i in range(STEPS)]
    steps = [Step(**{f: v[f] for f in Step._fields}) for v in views]
    v3 = [tuple(v[f] for f in ("x", "neg_onehot", "z", "g", "logp", "alpha")) for v in views]
    return SimpleNamespace(w=w, wt=w.T, steps=steps, v3=v3)


def out_variant(s):
    w, wt, steps = s.w, s.w.T, s.v3

    def run():
        for x, neg_onehot, z, g, logp, alpha in steps:
            torch.mm(x, wt, out=z)
            torch._log_softmax(z, 1, False, out=logp)
            torch._log_softmax_backward_data(neg_onehot, logp, 1, F32, out=g)
            w.addmm_(g.T, x, alpha=alpha)
    return run


def product_variant(s):
    return functools.partial(train_steps, s, s.steps)


def functional_variant(s):
    w, wt, steps = s.w, s.w.T, s.v3

    def run():
        for x, neg_onehot, _, _, _, alpha in steps:
            z = torch.mm(x, wt)
            logp = torch._log_softmax(z, 1, False)
            g = torch._log_softmax_backward_data(neg_onehot, logp, 1, F32)
            w.addmm_(g.T, x, alpha=alpha)
    return run


def aten_variant(s):
    aten = torch.ops.aten
    mm, lsm, lsm_bw, addmm_ = (aten.mm.out, aten._log_softmax.out,
                               aten._log_softmax_backward_data.out, aten.addmm_.default)
    w, wt, steps = s.w, s.w.T, s.v3

    def run():
        for x, neg_onehot, z, g, logp, alpha in steps:
            mm(x, wt, out=z)
            lsm(z, 1, False, out=logp)
            lsm_bw(neg_onehot, logp, 1, F32, out=g)
            addmm_(w, g.T, x, alpha=alpha)
    return run


def bound_variant(s):
    mm, lsm, lsm_bw, update = (torch.mm, torch._log_softmax, torch._log_softmax_backward_data,
                               s.w.addmm_)
    wt = s.w.T
    steps = [(x, n, z, g, g.T, lp, a) for x, n, z, g, lp, a in s.v3]

    def run():
        for x, neg_onehot, z, g, gt, logp, alpha in steps:
            mm(x, wt, out=z)
            lsm(z, 1, False, out=logp)
            lsm_bw(neg_onehot, logp, 1, F32, out=g)
            update(gt, x, alpha=alpha)
    return run


def partial_variant(s):
    p, wt = functools.partial, s.w.T
    calls = [f for x, n, z, g, lp, a in s.v3 for f in (
        p(torch.mm, x, wt, out=z), p(torch._log_softmax, z, 1, False, out=lp),
        p(torch._log_softmax_backward_data, n, lp, 1, F32, out=g), p(s.w.addmm_, g.T, x, alpha=a))]

    def run():
        for f in calls:
            f()
    return run


def _scripted_steps(w: torch.Tensor, xs: list[torch.Tensor], neg_onehots: list[torch.Tensor],
                    zs: list[torch.Tensor], gs: list[torch.Tensor], logps: list[torch.Tensor],
                    alphas: list[float]):
    wt = w.t()
    for i in range(len(xs)):
        torch.mm(xs[i], wt, out=zs[i])
        torch._log_softmax(zs[i], 1, False, out=logps[i])
        torch._log_softmax_backward_data(neg_onehots[i], logps[i], 1, 6, out=gs[i])  # 6: float32
        w.addmm_(gs[i].t(), xs[i], alpha=alphas[i])


def script_variant(s):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script is, in 2.13
        fn = torch.jit.script(_scripted_steps)
    columns = [list(c) for c in zip(*s.v3, strict=True)]
    return functools.partial(fn, s.w, *columns)


ROW_VARIANTS = ("out", "product", "script")
VARIANTS = {"out": out_variant, "product": product_variant, "functional": functional_variant,
            "aten": aten_variant, "bound": bound_variant, "partial": partial_variant,
            "script": script_variant}


def check_identical(device: str) -> dict:
    """Every (variant, mode)'s weights after STEPS steps at the row's shapes against `out`'s in the
    grad mode: bit-equal?"""
    ref = make_state(SHAPES["row"], device)
    out_variant(ref)()
    same = {}
    for name, make in VARIANTS.items():
        for mode, ctx in MODES.items():
            s = make_state(SHAPES["row"], device)
            with ctx():
                make(s)()
            same[f"{name}, {mode}"] = bool(torch.equal(s.w, ref.w))
    return same


def per_op(shape, device: str) -> dict:
    """Each op alone over STEPS steps, in the grad and inference modes: µs per call."""
    s = make_state(shape, device)
    wt = s.w.T
    x, n, z, g, lp, a = s.v3[0]
    gt = g.T
    ops = {"mm": lambda: torch.mm(x, wt, out=z),
           "_log_softmax": lambda: torch._log_softmax(z, 1, False, out=lp),
           "_log_softmax_backward_data":
               lambda: torch._log_softmax_backward_data(n, lp, 1, F32, out=g),
           "addmm_ (with its g.T view, as v3)": lambda: s.w.addmm_(g.T, x, alpha=a),
           "addmm_ (g.T made once)": lambda: s.w.addmm_(gt, x, alpha=a),
           "g.T alone (a view: aten::t)": lambda: g.T,
           "python call of a no-op lambda": lambda: None}

    def loop(op):
        def run():
            for _ in range(STEPS):
                op()
        return run
    return {name: loop(op) for name, op in ops.items()}


def best_us(run, reps=REPS, sync=lambda: None) -> float:
    """µs per step of `run` (STEPS steps a call): one warm-up call, then the fastest of `reps`
    calls. Each call is short (~0.2 ms at the smallest shapes), so on a loaded machine most escape
    preemption and the fastest is the op path's own cost, not the other processes'."""
    run()
    sync()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter_ns()
        run()
        sync()  # CUDA: the call's kernels done before the clock is read
        best = min(best, time.perf_counter_ns() - t0)
    return best / STEPS / 1e3


def load1() -> float:
    return os.getloadavg()[0]


def build_cases(dev: str) -> dict:
    """(device, shape, variant, mode) → (run, its mode's context), each on its own buffers."""
    cases = {}
    for name, make in VARIANTS.items():
        for mode in MODES:
            run = make(make_state(SHAPES["smallest"], dev))
            cases[(dev, "smallest", name, mode)] = (run, MODES[mode])
    for name in ROW_VARIANTS:  # for scale: the kernels' share at the row's shapes
        for mode in ("grad", "inference"):
            run = VARIANTS[name](make_state(SHAPES["row"], dev))
            cases[(dev, "row", name, mode)] = (run, MODES[mode])
    for op, run in per_op(SHAPES["smallest"], dev).items():
        for mode in ("grad", "inference"):
            cases[(dev, "smallest", f"op {op}", mode)] = (run, MODES[mode])
    return cases


def measure(cases: dict, rounds: int) -> tuple[dict, list[float]]:
    """Every case once a round, in a rotated order: its µs a step each round, and the load."""
    keys = list(cases)
    times = {k: [] for k in keys}
    loads = []
    for r in range(rounds):
        loads.append(load1())
        shift = r * len(keys) // rounds  # rotate the order: no case always runs first
        for k in keys[shift:] + keys[:shift]:
            run, ctx = cases[k]
            reps = REPS if k[1] == "smallest" else 3  # row shapes: ~0.3 ms a step of CPU kernels
            sync = torch.cuda.synchronize if k[0] == "cuda" else (lambda: None)
            with ctx():
                times[k].append(best_us(run, reps, sync))
        print(f"  round {r + 1}/{rounds}, load {loads[-1]:.2f}", flush=True)
    loads.append(load1())
    return times, loads


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="cuda: every case on CUDA tensors too, interleaved with the CPU ones "
                         "(host-bound at the smallest shapes: CUDA minus CPU is the host work "
                         "the CUDA backend adds)")
    ap.add_argument("--json", metavar="PATH", help="write the figures here")
    return ap.parse_args(argv)


def main() -> int:
    args = parse()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("dispatch_cost: --device cuda needs a CUDA GPU; leave it out to measure on the CPU",
              file=sys.stderr)
        return 2
    devices = ["cpu"] + (["cuda"] if args.device == "cuda" else [])
    torch.set_num_threads(1)  # the host path of one op is single-threaded; no pool wake-ups
    env = env_block()
    print(f"dispatch_cost on {hardware_line(env)}, {' and '.join(devices)} tensors, 1 CPU thread")
    same = {dev: check_identical(dev) for dev in devices}
    print("bit-identical weights to `out` after", STEPS, "steps:", same)
    meta = out_variant(make_state(SHAPES["smallest"], device="meta"))
    with torch.inference_mode():
        meta_us = best_us(meta, reps=1)
    print(f"meta tensors, `out` variant, smallest shapes: {meta_us:.0f} µs/step (not used)")

    times, loads = measure({k: v for dev in devices for k, v in build_cases(dev).items()},
                           args.rounds)
    rows = [{"device": k[0], "shape": k[1], "variant": k[2], "mode": k[3],
             "us_per_step_median": statistics.median(v), "us_per_step_min": min(v),
             "us_per_step_max": max(v), "us_per_step_rounds": v} for k, v in times.items()]
    base = {(r["device"], r["shape"]): r["us_per_step_median"] for r in rows
            if r["variant"] == "out" and r["mode"] == "grad"}
    print(f"\n{'device':6} {'shape':9} {'variant':34} {'mode':15} {'median µs':>9} {'min µs':>7} "
          f"{'max µs':>7} {'vs out':>7}")
    for r in rows:
        ratio = r["us_per_step_median"] / base[(r["device"], r["shape"])]
        print(f"{r['device']:6} {r['shape']:9} {r['variant']:34} {r['mode']:15} "
              f"{r['us_per_step_median']:9.2f} {r['us_per_step_min']:7.2f} "
              f"{r['us_per_step_max']:7.2f} {ratio:7.2f}")
    print(f"load (1 min) before each round and after: {loads}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "fasttrain.dispatch_cost/1", "env": env,
                       "config": {"steps_per_call": STEPS, "calls_per_sample": REPS,
                                  "statistic": "fastest call of a sample; median/min/max of rounds",
                                  "calls_per_sample_row_shapes": 3, "rounds": args.rounds,
                                  "threads": 1, "devices": devices, "shapes": SHAPES,
                                  "torch": torch.__version__},
                       "bit_identical_to_out": same, "meta_out_us_per_step": meta_us,
                       "load_1min": loads, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

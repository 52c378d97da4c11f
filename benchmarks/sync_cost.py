"""The floor under a 469-step epoch on this GPU: what the synchronization between dependent steps
costs, measured, and how the `cuda-epoch` variants compare.

- cluster barrier (`cluster.sync()`, thread-block cluster, sm_90+) and cooperative grid barrier
  (`grid.sync()`) over N CTAs: ns per barrier, from the GPU's global timer over ITERS barriers
  in one kernel;
- a dependent kernel inside a CUDA graph (what each of torch-graphs' ~7 kernels a step costs at
  least): µs per node, a graph of 469 one-element kernels replayed;
- `cuda-epoch` itself, every variant (`cuda_epoch.variants()`: kernel version 2 or 3 × cluster or
  cooperative grid × 7 or 14 CTAs, and versions 4 — point-to-point mbarrier signals, clusters
  only —, 5 — v4 with both GEMMs on tensor cores at fp32 accuracy — and 6 — v4 with W in
  registers and the partial logits and update register-tiled, the row's since the H200 — on 7 or 14
  CTAs, and version 7 — the lagged-Gram step: a Gram kernel and an epoch kernel of 64 CTAs (an
  8-CTA chain, 7 worker clusters), both launches inside the timed epoch, each of its variants
  (`cuda_epoch.V7_VARIANTS`: v7a; v7b with tagged partial words and a 16-lane softmax; v7c, v7b
  with the chain's Gram terms j >= 2 on helper warps; v7d, v7c with workers that fetch the next
  update's G a step ahead) in the same call, and v7b, v7c, v7d, v7e (v7c's chain, its workers'
  update and partials on the tensor cores), v7f (v7e, its partials reduce-scattered), v7g (v7f,
  its chain's helper warps polling the partials a step ahead) and v7h (v7g, its workers' x gather
  a step deeper and their reduce's stores after its credits) and v7i (v7h, G's global rows and
  the step counter by the chain's helper warps) and v7j (v7i, its workers' mma fragments by
  ldmatrix, W's fp16 pieces split once by the apply) and v7k (v7j, two barriers fewer a worker
  step, the chain counters read at its top) and v7m (v7j, its chain's critical warps sending their
  own rows at once, one barrier wait for warp 0 alone, the loss after) in ONE launch
  (`v7_grams="launch"`: their Grams made by 7 producer clusters of the epoch kernel itself, 120
  CTAs; `V7_TIMED`)): ms per epoch (CUDA
  events, median of the epochs after a warm-up one), and its weights after those epochs against
  version 2's on the same cluster/CTAs (v7: v2 on 14 CTAs; max |Δw|: v2 is the kernel the float64
  check passed), to pick the variant the row uses. The signalled versions' (4-7) bounded waits are
  checked once after their timed epochs (a timeout is printed, not a hang);
- v4's, v5's, v6's and v7's phases: one epoch by their phase-profiling build
  (`EpochKernel.phase_profile`), the µs a step each CTA's thread 0 spends in each phase (mean
  over CTAs and the slowest CTA), to show what the next version must shorten; v7 per role (its
  chain's, its workers' and (v7c-v7m) its chain's helper warps' phases, `epoch_phases.V7_PHASES`,
  the chain's "wait Γ" its wait for the producers' Grams in one launch), recorded as "<variant>:
  chain", "<variant>: workers" and "<variant>: helpers";
- v7's Gram launch alone, each Gram kernel (v1 v7a's, v2 operands staged in shared memory): "v7
  Grams: µs an epoch" (CUDA events, median over the epochs), and whether v2's Grams equal v1's bit
  for bit (recorded as "cuda_epoch_v7_grams_us");
- the hand-off and co-residency probes that set cuda-epoch v7's lag (`ladder/sync_probes.py`):
  ns per one-way release/acquire hand-off between two SMs through L2, bare and with a 1 or 5 KiB
  payload, a flag broadcast to 56 CTAs, and whether v7's 16 clusters of 8 can be resident
  (`cudaOccupancyMaxActiveClusters`, a cooperative cluster launch). `--probes-only`: just these.

    PYTHONPATH=src python benchmarks/sync_cost.py [--data mnist] [--epochs 10] [--json PATH]
                                                  [--probes-only] [--versions 6,7]
                                                  [--v7 c:launch,e,f]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys

import torch

from fasttrain.env import env_block, hardware_line

V7_TIMED = (("a", "kernel"), ("b", "kernel"), ("c", "kernel"), ("d", "kernel"),
            ("b", "launch"), ("c", "launch"), ("d", "launch"), ("e", "launch"), ("f", "launch"),
            ("g", "launch"), ("h", "launch"), ("i", "launch"), ("j", "launch"), ("k", "launch"),
            ("m", "launch"), ("n", "launch"))
"""v7's (variant, v7_grams) this script times and profiles: v7a-v7d in two launches, and v7b,
v7c and v7d (the fastest in two launches on an H200, 2026-11-28: 2.231, 2.179 and 2.062 ms) in
one; v7e (v7c's chain, the workers on the tensor cores) and v7f (v7e with the reduce-scatter; the
row's: 1.72-1.75 ms on an H200, 2026-11-28) in one launch; v7g (v7f with the chain's partials,
flags and labels handled by its helper warps a step ahead; not yet run on a GPU) and v7h (v7g,
its workers' order[] indices loaded a step before their pixels, their reduce's stores after its
credits; not yet run on a GPU) and v7i (v7h, G_t's global rows and the step counter by the
chain's helper warps; not yet run on a GPU) and v7j (v7i, its workers' mma fragments by ldmatrix
from swizzled rows, W's fp16 pieces split once by the apply; not yet run on a GPU) and v7k (v7j,
two barriers fewer a worker step, the chain counters read at its top and tested after the
partials; not yet run on a GPU) and v7m (v7j, its chain's critical warps sending their own rows of
G right after their softmax; not yet run on a GPU) and v7n (v7k, no column sums in its chain's G
exchange: the receivers' helper warps sum the rows for the bias; not yet run on a GPU) in one
launch, to be read against v7f's from the same call
(`--v7 f:launch,g:launch,h:launch,i:launch,j:launch,k:launch,m:launch,n:launch`)."""

ITERS = 10_000
STEPS = 469


def barrier_ns(lib, kind: str, ctas: int) -> float | str:
    """ns per barrier over `ctas` CTAs, or why it could not run."""
    from fasttrain.ladder.cuda_epoch import stream_handle

    fn = getattr(lib, f"cuda_epoch_bench_{kind}_sync")
    out = torch.zeros(1, dtype=torch.int64, device="cuda")
    code = fn(ctas, ITERS, ctypes.c_void_p(out.data_ptr()), stream_handle())
    if code:
        return lib.cuda_epoch_error_name(code).decode()
    fn(ctas, ITERS, ctypes.c_void_p(out.data_ptr()), stream_handle())  # the first was a warm-up
    return out.item() / ITERS


def graph_node_us() -> float:
    """µs per dependent one-element kernel in a replayed CUDA graph of STEPS kernels."""
    t = torch.zeros(1, device="cuda")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        t.add_(1)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(STEPS):
            t.add_(1)
    return epoch_ms(g.replay, 20) * 1e3 / STEPS


def epoch_ms(run, epochs: int) -> float:
    """Median ms of `run()` timed with CUDA events, after one warm-up call."""
    run()
    times = []
    for _ in range(epochs):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="mnist", choices=("mnist", "synthetic"))
    ap.add_argument("--epochs", type=int, default=10, help="timed epochs per cuda-epoch variant")
    ap.add_argument("--json", metavar="PATH", help="write the figures here")
    ap.add_argument("--probes-only", action="store_true",
                    help="only the hand-off and co-residency probes (seconds, no dataset)")
    ap.add_argument("--versions", metavar="V,...",
                    help="time only these cuda-epoch versions (2, the reference, always runs): "
                         "a short GPU loan's way to the ones that matter, e.g. --versions 6,7")
    ap.add_argument("--v7", metavar="VARIANT[:GRAMS],...",
                    help="only these of version 7's (variant, Grams) pairs, e.g. c:launch,e,f "
                         "(GRAMS kernel or launch; without it, both that V7_TIMED has)")
    args = ap.parse_args(argv)
    try:
        versions, v7_timed = parse_versions(args.versions), parse_v7(args.v7)
    except ValueError as e:
        print(f"sync_cost: {e}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("sync_cost: needs a CUDA GPU", file=sys.stderr)
        return 2

    from fasttrain.data import load_dataset
    from fasttrain.ladder import LadderConfig, make_ladder_data
    from fasttrain.ladder.cuda_epoch import (
        PROFILED,
        EpochKernel,
        fallback_ctas,
        has_clusters,
        launch_config,
        load_library,
        variants,
    )

    env = env_block()
    print(f"sync_cost on {hardware_line(env)}")
    probes = handoff_probes()
    if args.probes_only:
        if args.json:
            write_json(args.json, {"schema": "fasttrain.sync_cost/1", "env": env,
                                   "config": {"probes_only": True}, "handoff_probes": probes})
        return 0
    lib = load_library()
    kinds = ("cluster", "grid") if has_clusters() else ("grid",)
    barriers = {f"{k} {n}": barrier_ns(lib, k, n) for k in kinds for n in (2, 4, 7, 8, 14, 16)}
    for name, v in barriers.items():
        print(f"  {name:>11} CTAs: " + (f"{v:8.1f} ns per barrier" if isinstance(v, float) else v))
    node = graph_node_us()
    print(f"  CUDA graph: {node:.2f} µs per dependent kernel ({STEPS} nodes)")

    cfg = LadderConfig(epochs=args.epochs + 1)
    data = make_ladder_data(load_dataset(args.data, None, seed=0), cfg)
    times, deltas, finals, phases, grams = {}, {}, {}, {}, {}
    # Version 7 once each of V7_TIMED: all timed, profiled and recorded in this one call.
    kernels = [(v, c, n, *v7) for v, c, n in variants(has_clusters())
               if versions is None or v in versions
               for v7 in (v7_timed if v == 7 else ((None, None),))]
    for version, cluster, ctas, v7, v7_grams in kernels:
        threads, smem = launch_config(lib, ctas, version, cluster)
        epoch = iter(range(10**9))
        kind = "cluster" if cluster else "cooperative grid"
        one = " in one launch" if v7_grams == "launch" else ""
        name = f"v{version}{v7 or ''}{one}, {kind} of {ctas} CTAs"
        try:  # v4-v7's signal check syncs: once after the timed epochs, not inside them
            k = EpochKernel(data, cfg, ctas=ctas, cluster=cluster, version=version, v7_variant=v7,
                            v7_grams=v7_grams)
            name = k.variant  # v7's setup refuses a GPU that cannot hold its clusters at once
            ms = epoch_ms(lambda k=k, e=epoch: k.run(next(e) % cfg.epochs, check_signals=False),
                          args.epochs)
            k.check_signals()
        except RuntimeError as e:
            times[name] = str(e)
            print(f"  cuda-epoch, {name}: {e}")
            continue
        times[k.variant] = ms
        # Every variant ran the same epochs in the same order: v2's weights are the reference.
        finals[(version, cluster, ctas)] = k.w
        ref = finals.get((2, cluster, fallback_ctas(ctas)))
        delta = (k.w - ref).abs().max().item() if ref is not None else float("nan")
        deltas[k.variant] = delta
        # v4 runs v3's fp32 arithmetic in v3's order: a difference from v3 beyond a few ulps means
        # the signals let a step read a stale or half-written inbox.
        v3 = finals.get((3, cluster, ctas)) if version == 4 else None
        same = "" if v3 is None else f", max |w - w(v3)| {(k.w - v3).abs().max().item():.2g}"
        print(f"  cuda-epoch, {k.variant} ({threads} threads, {smem // 1024} KiB smem): "
              f"{ms:.3f} ms/epoch = {ms * 1e3 / STEPS:.2f} µs/step; max |w - w(v2)| {delta:.2g}"
              + same)
        if version in PROFILED:
            phases.update(profile_phases(k))
        if version == 7 and not grams:  # the Grams are the same launch for every variant
            grams = time_v7_grams(k, args.epochs)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "fasttrain.sync_cost/1", "env": env,
                       "config": {"iters": ITERS, "steps": STEPS, "data": args.data,
                                  "epochs": args.epochs,
                                  "versions": sorted(versions) if versions else "all",
                                  "v7": [f"{v}:{g}" for v, g in v7_timed]},
                       "barrier_ns": barriers, "graph_node_us": node,
                       "cuda_epoch_ms": times, "cuda_epoch_max_dw_vs_v2": deltas,
                       "cuda_epoch_phases_us": phases, "cuda_epoch_v7_grams_us": grams,
                       "handoff_probes": probes}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def profile_phases(k) -> dict:
    """One epoch of `k` by its phase-profiling build, printed: {label: profile}, v7 a label a role.
    A v7 profile that fails (it has not yet run on a GPU) is one line and its label's reason."""
    if k.version != 7:
        roles = {"": k.phase_profile(0)}
    else:
        try:
            roles = k.phase_profile(0)
        except RuntimeError as e:
            print(f"    its phase profile: {e}")
            return {k.variant: str(e)}
    for role, profile in roles.items():
        ghz = profile.get("clock_ghz")  # v7: each CTA's SM clock over its loop
        clock = f"; SMs at {ghz['min']:.2f}-{ghz['max']:.2f} GHz" if ghz else ""
        print(f"    its {role + ' ' if role else ''}phases (µs a step, mean over CTAs / the "
              f"slowest; the profiling build's step {profile['step_us']:.2f} µs{clock}): "
              + ", ".join(f"{name} {profile['mean_us'][name]:.2f}/{profile['max_us'][name]:.2f}"
                          for name in profile["mean_us"]))
    return {f"{k.variant}: {role}" if role else k.variant: p for role, p in roles.items()}


def time_v7_grams(k, epochs: int) -> dict:
    """v7's Gram launch alone, each Gram kernel (`cuda_epoch.V7_GRAM_VERSIONS`): µs an epoch (CUDA
    events, the median of `epochs` after a warm-up one, as epoch_ms), printed as "v7 Grams: …";
    then whether every kernel's Grams of epoch 0 equal v1's bit for bit (the scratch filled with
    -1 first: an entry one writes and the other does not differs too). A kernel that fails is its
    reason in place of its figure. {"v1": µs, "v2": µs, …, "equal_to_v1": {"v2": bool}}."""
    from fasttrain.ladder.cuda_epoch import V7_GRAM_VERSIONS

    out, grams = {}, {}
    for g in V7_GRAM_VERSIONS:
        epoch = iter(range(10**9))
        try:
            us = epoch_ms(lambda g=g, e=epoch: k.v7_grams(next(e) % k.cfg.epochs, g), epochs) * 1e3
            k.scratch.fill_(-1.0)
            k.v7_grams(0, g)
            grams[g] = k.v7_gram_tensor().clone()
        except RuntimeError as e:
            out[f"v{g}"] = str(e)
            print(f"    v7 Grams, kernel v{g}: {e}")
            continue
        out[f"v{g}"] = us
        print(f"    v7 Grams, kernel v{g}: {us:.1f} µs an epoch ({STEPS} steps x 4 lags)")
    if 1 in grams:
        out["equal_to_v1"] = {f"v{g}": bool(torch.equal(grams[g], grams[1]))
                              for g in grams if g != 1}
        print(f"    v7 Grams equal to v1's bit for bit: {out['equal_to_v1']}")
    return out


def parse_versions(spec: str | None) -> set[int] | None:
    """--versions "6,7" → {2, 6, 7} (version 2 is every variant's reference); None: all."""
    if spec is None:
        return None
    from fasttrain.ladder.cuda_epoch import VERSIONS

    try:
        chosen = {int(v) for v in spec.split(",")}
    except ValueError:
        chosen = set()
    if not chosen or not chosen <= set(VERSIONS):
        raise ValueError(f"--versions {spec!r}: name some of {', '.join(map(str, VERSIONS))}, "
                         "comma-separated")
    return chosen | {2}


def parse_v7(spec: str | None) -> tuple[tuple[str, str], ...]:
    """--v7 "c:launch,e" → those of V7_TIMED's (variant, Grams) pairs, in V7_TIMED's order."""
    if spec is None:
        return V7_TIMED
    chosen = set()
    for item in spec.split(","):
        variant, _, grams = item.partition(":")
        pairs = {p for p in V7_TIMED if p[0] == variant and grams in ("", p[1])}
        if not pairs:
            raise ValueError(f"--v7 {item!r}: not one of V7_TIMED's (variant:grams) pairs, "
                             + ", ".join(f"{v}:{g}" for v, g in V7_TIMED))
        chosen |= pairs
    return tuple(p for p in V7_TIMED if p in chosen)


def handoff_probes() -> dict:
    """The probes that set cuda-epoch v7's lag, printed as they are recorded; a library that
    cannot build is one line in their place, and the rest of the benchmark still runs."""
    from fasttrain.ladder import build, sync_probes

    try:
        probes = sync_probes.measure()
    except (build.Unavailable, RuntimeError, OSError) as e:
        probes = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
    for line in sync_probes.describe(probes):
        print(f"  {line}")
    return probes


def write_json(path: str, result: dict) -> None:
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())

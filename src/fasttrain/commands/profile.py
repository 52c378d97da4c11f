"""`fasttrain profile`: where a training step's time goes, what limits it, and the switch to try.

    fasttrain profile --model logreg --data synthetic --batch-size 128 --steps 20
    fasttrain profile --model cnn --data mnist --precision bf16 --compile --trace cnn.json \\
                      --json cnn-profile.json --plot cnn-util.png

Takes every `fasttrain train` switch (a user's --model pkg.module:factory too) and builds the Run
through `fasttrain.build`. Exit status: 0, or 2 for bad input. What it measures and how
(fasttrain.lab.profile):
"""

from __future__ import annotations

import argparse
from pathlib import Path

from fasttrain.errors import UserError
from fasttrain.lab import profile as profile_model


def profile_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.configfile import add_arguments

    p = sub.add_parser("profile", help="profile training steps: top ops, idle time, syncs, and "
                       "what bounds the step",
                       description=f"{__doc__}\n{profile_model.__doc__}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    g = p.add_argument_group("profiling")
    g.add_argument("--steps", type=int, default=10, help="optimizer steps traced (default: 10)")
    g.add_argument("--profile-warmup", type=int, default=3, metavar="N",
                   help="untraced steps first: compilation, allocator, caches (default: 3)")
    g.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace (JSON)")
    g.add_argument("--json", metavar="PATH", help="write the result as JSON")
    g.add_argument("--plot", metavar="PATH", help="GPU utilization and memory over time (PNG; "
                   "needs a GPU and nvidia-ml-py)")
    g.add_argument("--top", type=int, default=12, help="operators listed (default: 12)")
    p.set_defaults(func=profile)


def profile(args: argparse.Namespace) -> int:
    from fasttrain.commands.common import refuse_layouts, refuse_run_directory
    from fasttrain.engine.configfile import from_args
    from fasttrain.engine.run import build
    from fasttrain.report import check_outputs, write_json

    for flag, value, least in (("--steps", args.steps, 1), ("--profile-warmup",
                               args.profile_warmup, 0), ("--top", args.top, 1)):
        if value < least:
            raise UserError(f"{flag} must be ≥ {least}, got {value}")
    check_outputs(*((getattr(args, flag), f"--{flag}") for flag in ("trace", "json", "plot")))
    cfg = from_args(args)
    refuse_run_directory(cfg, "profile")  # it would rewrite a run's config.toml and model.json
    refuse_layouts(cfg, "profile")
    run = build(cfg, verbose=False)
    result = profile_model.profile_run(run, steps=args.steps, warmup=args.profile_warmup,
                                       trace=args.trace, top=args.top)
    print_report(result)
    if args.json:
        write_json(args.json, result)
    if args.plot:
        from fasttrain.lab.sampler import plot_samples

        why_not = plot_samples(result["device_sampler"], args.plot)
        print(f"--plot {args.plot}: " + (f"not written, {why_not}" if why_not else "written"))
    return 0


# -- the report ----------------------------------------------------------------------------------


def print_report(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console, cfg, v = Console(), result["config"], result["classification"]
    sh = v["shares"]
    untraced = result["untraced_step_ms"]
    console.print(f"[bold]fasttrain profile[/bold] — {cfg['model_class']} on {cfg['data']}, "
                  f"{cfg['resolved_device']}, {cfg['precision']}, batch {cfg['batch_size']}"
                  f"{' (compiled)' if cfg['compile'] else ''}; {cfg['steps']} steps traced, "
                  f"the faster {len(v['steps_classified'])} classified: "
                  f"{v['step_ms']:.3g} ms/step traced"
                  + (f", {untraced:.3g} untraced" if untraced else ""))
    if result["cpu_oversubscribed"]:
        threads = result["env"]["torch_threads"]
        console.print(f"[yellow]warning: load average {result['cpu_load_1min']:.1f} on "
                      f"{result['env']['cores']} cores with {threads} torch thread(s): other "
                      f"processes share the CPU and the times below include their share; "
                      f"profile on an idle machine"
                      + (", or with OMP_NUM_THREADS=1" if threads > 1 else "") + "[/yellow]")
    ops = Table(title="top operators by self time (per step, over the steps timed below)")
    for col in ("operator", "calls", "self ms", "of step"):
        ops.add_column(col, justify="left" if col == "operator" else "right")
    for r in result["ops"]:
        share = r["share_of_step"]
        ops.add_row(r["op"], f"{r['calls_per_step']:.3g}", f"{r['self_ms_per_step']:.3g}",
                    f"{share:.1%}" if share is not None else "-")
    console.print(ops)
    device = "GPU" if result["syncs_are_real"] else "CPU (in aten ops)"
    console.print(f"step {v['step_ms']:.3g} ms = input {v['input_ms']:.3g} + {device} busy "
                  f"{v['busy_ms']:.3g} + idle {v['idle_ms']:.3g}; {v['ops_per_step']:.0f} ops; "
                  f"issuing one costs {v['issue_us']:.2g} µs")
    p = v["peaks"]
    console.print(f"roofline: {v['flops_per_step'] / 1e9:.3g} GFLOP and "
                  f"{v['bytes_per_step'] / 1e6:.3g} MB per step → "
                  f"{v['intensity_flop_per_byte']:.3g} FLOP/B against a ridge of "
                  f"{p['ridge']:.3g} FLOP/B ({p['flops'] / 1e9:,.0f} GFLOP/s, "
                  f"{p['bandwidth'] / 1e9:,.1f} GB/s, {p['source']}); the roofline's time "
                  f"is {v['roofline_ms']:.3g} ms of {v['step_ms']:.3g}")
    syncs = result["syncs"]
    if syncs:
        t = Table(title="host–device syncs per step" + ("" if result["syncs_are_real"] else
                  " (CPU run: each would be a sync on a GPU)"))
        for col in ("per step", "call", "where", "code"):
            t.add_column(col, justify="right" if col == "per step" else "left")
        for s in syncs:
            t.add_row(f"{s['per_step']:.3g}", s["call"], s["where"], s["code"])
        console.print(t)
    else:
        console.print("host–device syncs per step: none")
    shares = ", ".join(f"{k} {sh[k]:.0%}" for k in sorted(sh, key=sh.get, reverse=True))
    console.print(f"[bold]{v['class']}-bound[/bold]"
                  + (f" (then {v['runner_up']})" if v["runner_up"] else "") + f": {shares}")
    for tip in v["next"]:
        console.print(f"  try {tip}")
    sampler = result["device_sampler"]
    if sampler["available"]:
        console.print(f"NVML: GPU busy {sampler['gpu_util_mean_pct'] or 0:.0f}% on average, "
                      f"{sampler['mem_used_max_gb'] or 0:.1f} GiB used at most")
    else:
        console.print(f"NVML sampler: {sampler['reason']}")
    if cfg["trace"]:
        console.print(f"trace: {Path(cfg['trace'])} (open in ui.perfetto.dev or chrome://tracing)")

"""`fasttrain experiment precision|memory|e2e|scaling`: the course lab's exercises, measured on this
machine (fasttrain.lab.experiments), and data-parallel scaling (fasttrain.commands.scaling).

    fasttrain experiment precision --model cnn --steps 50 --json p.json --plot p.png
    fasttrain experiment memory --model gpt --batches 16,32,64,128 --accum 4
    fasttrain experiment e2e                      # cnn on MNIST (synthetic when it is absent)
    fasttrain experiment scaling --predict-only   # DDP speed-up on 8 and 2×8 GPUs, predicted
    fasttrain experiment scaling --predict-only --model mypkg.net:build --data mypkg.data:load
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

from fasttrain.commands.common import data_label, gib_arg, lab_config, positive_ints
from fasttrain.errors import UserError
from fasttrain.lab import experiments as lab_experiments
from fasttrain.lab.experiments import EXPERIMENTS, Options, check, run_experiment

SCHEMA = "fasttrain.experiment/1"


# -- tables and plots ----------------------------------------------------------------------------


def _ms(r: dict) -> str:
    ms = r.get("ms_per_step")
    return "-" if ms is None else f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}"


def _peak(r: dict) -> str:
    from fasttrain.report import fmt_bytes

    data = r.get("data_bytes")
    return fmt_bytes(r["peak_bytes"]) + (f" (data {fmt_bytes(data)})" if data else "")


def _num(v, fmt: str = "{:.4f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(result: dict):
    from fasttrain import report

    name, rows, cfg = result["experiment"], result["rows"], result["config"]
    data = cfg["data"] + (" (SYNTHETIC stand-in, not real data)" if cfg.get("synthetic") else "")
    title = (f"fasttrain experiment {name} — {cfg['model']} on {data}, batch "
             f"{cfg['batch_size']}, {cfg['optimizer']}, {result['options']['steps']} timed steps")
    peak_note = ("peak: CUDA allocator over the timed steps (the dataset kept on the GPU "
                 "included, shown apart); on the CPU the hook-based count (weights + gradients + "
                 "optimizer state + saved tensors + inputs)")
    if name == "precision":
        return report.rows_table(title, [
            ("precision", lambda r: r["precision"]), ("device", lambda r: r["device"]),
            ("ms/step", _ms), ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("peak", _peak),
            ("final loss", lambda r: _num(r["final_loss"])),
            ("test acc", lambda r: _num(r["test_accuracy"], "{:.2%}")),
            ("loss scale / skipped", lambda r: "-" if r["loss_scale"] is None
             else f"{r['loss_scale']:g} / {r['skipped_steps']}"),
            ("note", lambda r: r.get("note") or ""),
        ], rows, caption=f"ms/step: median. {peak_note}.", label_columns=2)
    if name == "memory":
        return report.rows_table(title, [
            ("part", lambda r: r["part"]), ("setting", lambda r: r["label"]),
            ("ms/step", _ms), ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
            ("peak", _peak),
            ("max |Δw| vs batch B", lambda r: _num(r.get("max_abs_dweight"), "{:.2e}")),
            ("saved for backward", lambda r: "-" if "saved_bytes" not in r
             else report.fmt_bytes(r["saved_bytes"])),
            ("peak saved / time lost", lambda r: "-" if "memory_saved" not in r
             else f"{r['memory_saved']:.0%} / {r['time_lost']:+.0%}"),
        ], rows, caption=f"{peak_note}. Accumulation: weights compared after the same "
            f"{result['options']['warmup'] + result['options']['steps']} steps. Saved for "
            f"backward: one micro-batch's activations, hook-counted (what checkpointing "
            f"trades)." + "".join(f" Checkpointing: {r['note']}." for r in rows
                                   if r.get("part") == "checkpointing" and r.get("note")),
            label_columns=2)
    return report.rows_table(title, [
        ("setup", lambda r: r["label"]),
        ("ms/step", _ms), ("s/epoch", lambda r: f"{r['s_per_epoch']:,.1f}"),
        ("speed-up vs CPU", lambda r: _num(r.get("speedup_vs_cpu"), "{:.1f}×")),
        ("peak", _peak),
        ("memory ÷ vs GPU fp32", lambda r: _num(r.get("memory_vs_gpu_fp32"), "{:.2f}×")),
        ("test acc", lambda r: _num(r["test_accuracy"], "{:.2%}")),
        ("course lab expects", lambda r: _lab(r.get("lab_expected"))),
    ], rows, caption=f"s/epoch extrapolated from the median step × steps per epoch. "
        f"{peak_note}. Course lab: its own GPU, 'CPU 120 s/epoch, GPU 4.8×, GPU+FP16 8×, "
        f"memory 8.2 → 4.7 GB'.")


def _lab(s: dict | None) -> str:
    if not s:
        return "-"
    bits = [f"{s['s_per_epoch']:g} s/epoch"]
    if "speedup" in s:
        bits.append(f"{s['speedup']:g}×")
    if "memory_gb" in s:
        bits.append(f"{s['memory_gb']:g} GB")
    return ", ".join(bits)


def plot(result: dict, path) -> None:
    from fasttrain import report

    name = result["experiment"]
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    mib = [r["peak_bytes"] / 2**20 for r in ok]
    if name == "precision":
        x = [r["precision"] for r in ok]
        panels = [{"title": "ms per step (lower is better)", "x": x,
                   "y": [r["ms_per_step"] for r in ok], "ylabel": "ms"},
                  {"title": "peak memory", "x": x, "y": mib, "ylabel": "MiB"},
                  {"title": "test accuracy", "x": x, "y": [r["test_accuracy"] for r in ok]}]
    elif name == "memory":
        sweep = [r for r in ok if r["part"] == "sweep"]
        others = [r for r in ok if r["part"] != "sweep"]
        bx = [r["batch_size"] for r in sweep]
        panels = [{"title": "throughput", "kind": "line", "x": bx, "logx": True,
                   "y": [r["samples_per_s"] for r in sweep], "xlabel": "batch size",
                   "ylabel": "samples/s"},
                  {"title": "peak memory", "kind": "line", "x": bx, "logx": True,
                   "y": [r["peak_bytes"] / 2**20 for r in sweep], "xlabel": "batch size",
                   "ylabel": "MiB"},
                  {"title": "accumulation and checkpointing: peak memory",
                   "x": [f"{r['part'][:5]} {r['label']}" for r in others],
                   "y": [r["peak_bytes"] / 2**20 for r in others], "ylabel": "MiB"}]
    else:
        x = [r["label"] for r in ok]
        panels = [{"title": "seconds per epoch (extrapolated)", "x": x, "logy": True,
                   "y": [r["s_per_epoch"] for r in ok], "ylabel": "s"},
                  {"title": "peak memory", "x": x, "y": mib, "ylabel": "MiB"}]
    env, cfg = result["env"], result["config"]
    data = cfg["data"] + (" (synthetic)" if cfg.get("synthetic") else "")
    report.panels_plot(path, f"experiment {name}: {cfg['model']} on {data} — "
                       f"{env.get('gpu') or env.get('cpu')}", panels)


# -- the command ---------------------------------------------------------------------------------


def experiment_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.commands import scaling
    from fasttrain.engine.configfile import add_arguments

    p = sub.add_parser("experiment", help="the course lab's exercises, measured: precision, "
                       "memory, e2e; and multi-process scaling",
                       description=f"{__doc__}\n{lab_experiments.__doc__}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=(*EXPERIMENTS, "scaling"),
                   metavar="{precision,memory,e2e,scaling}", help="which experiment")
    g = p.add_argument_group("experiment")
    g.add_argument("--steps", type=int, default=Options.steps, metavar="N",
                   help=f"timed optimizer steps per row (default: {Options.steps})")
    g.add_argument("--timing-warmup", type=int, default=Options.warmup, metavar="N",
                   help=f"untimed steps before them (default: {Options.warmup})")
    g.add_argument("--batches", default=",".join(map(str, Options.batches)), metavar="LIST",
                   help="memory: batch sizes of the sweep (default: %(default)s)")
    g.add_argument("--accum", type=int, default=Options.accum, metavar="K",
                   help="memory: compare --batch-size B with B/K × K accumulation "
                   f"(default: {Options.accum})")
    g.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="memory: stop the sweep at a peak above this many GiB")
    g.add_argument("--json", metavar="PATH", help="write the result JSON here")
    g.add_argument("--plot", metavar="PATH", help="write a PNG plot here")
    own = _given_only(g._group_actions)
    theirs = _given_only(scaling.add_arguments(p)._group_actions)
    add_arguments(p)
    # Which flags apply to which experiment: a flag that does not is refused, not ignored.
    p.set_defaults(func=experiment, _flags_of={
        "scaling": theirs | {"steps": own["steps"], "json": own["json"]}, "other": own})


def _given_only(actions) -> dict[str, tuple[str, object]]:
    """dest → (flag, default) of each action, whose default is then SUPPRESSed: a flag the
    user gave is in the Namespace and one not given is not, whatever its value (a default may
    depend on the machine: --procs). `experiment` fills the defaults in."""
    found = {}
    for a in actions:
        if a.help and "%(default)s" in a.help:
            a.help = a.help.replace("%(default)s", str(a.default))
        found[a.dest] = (a.option_strings[0], a.default)
        a.default = argparse.SUPPRESS
    return found


def experiment(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.env import env_block, hardware_line

    flags = args._flags_of
    mine = flags["scaling"] if args.name == "scaling" else flags["other"]
    args._given = {dest for dest in mine if hasattr(args, dest)}  # before the defaults fill in
    for dest, (option, default) in {**flags["scaling"], **flags["other"]}.items():
        if not hasattr(args, dest):
            setattr(args, dest, default)
        elif dest not in mine:  # a flag of another experiment, given: refused, not ignored
            raise UserError(f"{option} does not apply to `fasttrain experiment {args.name}`; "
                            f"drop it (see `fasttrain experiment --help`)")
    if args.name == "scaling":  # torchrun launches and a step model: its own module
        from fasttrain.commands.scaling import scaling

        return scaling(args)
    if args.steps < 1:
        raise UserError(f"--steps must be ≥ 1, got {args.steps}")
    if args.timing_warmup < 0:
        raise UserError(f"--timing-warmup must be ≥ 0, got {args.timing_warmup}")
    if args.accum < 1:
        raise UserError(f"--accum must be ≥ 1, got {args.accum}")
    opts = Options(steps=args.steps, warmup=args.timing_warmup,
                   batches=positive_ints("--batches", args.batches, "16,32,64"),
                   accum=args.accum, memory_limit=gib_arg("--memory-limit", args.memory_limit))
    report.check_outputs((args.json, "--json"), (args.plot, "--plot"))
    cfg, task = lab_config(args, "experiment")
    if cfg.progress:  # flags or --config: a line as each row starts
        opts = dataclasses.replace(opts, say=lambda line: print(
            f"experiment {args.name}: {line}", file=sys.stderr, flush=True))
    check(args.name, cfg, opts)
    err = Console(stderr=True)
    env = env_block()
    err.print(f"[bold]fasttrain experiment {args.name}[/bold] on {hardware_line(env)}")
    err.print(f"data: {data_label(task)} from {task.source}")
    rows = run_experiment(args.name, cfg, task, opts)
    result = {"schema": SCHEMA, "experiment": args.name, "env": env,
              "config": {**cfg.to_dict(), "data_source": task.source,
                         "synthetic": task.synthetic},
              "options": {k: v for k, v in dataclasses.asdict(opts).items() if k != "say"},
              "rows": rows}
    report.wide_console().print(table(result))
    if args.json:
        report.write_json(args.json, result)
        err.print(f"wrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        err.print(f"wrote {args.plot}")
    return 0

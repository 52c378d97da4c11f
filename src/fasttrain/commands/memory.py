"""`fasttrain memory`: where a training step's memory goes, part by part, beside the measured peak,
and the batch size that trains fastest in the memory there is.

    fasttrain memory --model cnn --batch-size 64 --precision bf16
    fasttrain memory --model gpt --data synthetic-text --find-batch-size             # CUDA
    fasttrain memory --model cnn --find-batch-size --memory-limit 2                  # CPU, GiB

The search is fasttrain.lab.batch_size; what a breakdown counts and how (fasttrain.lab.memory):
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

import torch

from fasttrain.commands.common import data_label, gib_arg, lab_config
from fasttrain.errors import UserError
from fasttrain.lab import memory as memory_model
from fasttrain.lab.batch_size import Try, search, train_samples, try_batch
from fasttrain.lab.memory import Breakdown

SCHEMA = "fasttrain.memory/1"


# -- tables ------------------------------------------------------------------------------------


_PARTS = (("weights", "weights (parameters, buffers)"),
          ("weight_copies", "half weight copies (saved)"),
          ("gradients", "gradients"),
          ("optimizer", "optimizer state"),
          ("activations", "activations (saved for backward)"),
          ("inputs", "inputs (not saved)"),
          ("data", "dataset on the device"),
          ("workspace", "workspace (measured)"),
          ("step_temp", "optimizer step temporaries"))


def breakdown_table(b: Breakdown, title: str):
    """Parts as rows: this run's exact bytes beside the seed lab's fp32 and mixed formula."""
    from fasttrain import report

    seed = b.seed_formula()
    rows = [{"part": label, "ours": getattr(b, key), "fp32": seed["fp32"].get(key),
             "mixed": seed["mixed"].get(key)} for key, label in _PARTS]
    rows.append({"part": "predicted peak", "ours": b.predicted_peak,
                 "fp32": seed["fp32"]["total"], "mixed": seed["mixed"]["total"]})
    rows.append({"part": "measured peak", "ours": b.measured_peak, "fp32": None, "mixed": None})
    fmt = report.fmt_bytes
    measured = b.measured_by.startswith("torch.cuda")  # else the CPU's hook count
    error = (f"prediction error {b.error:+.1%} (the goal: within 10%)" if measured
             else "on the CPU the two differ only by the step temporaries")
    caption = (f"measured: {b.measured_by}. Predicted peak = weights + optimizer + data + "
               f"workspace + inputs + gradients + max(activations + copies, step temporaries); "
               f"{error}. Seed formula: P = {b.params:,} parameters, weights + "
               f"gradients + optimizer + activations (mixed: + half copy, half gradients, half "
               f"the fp32 activations; torch autocast keeps fp32 gradients). Micro-batch "
               f"{b.micro_batch} on {b.device}.")
    return report.rows_table(title, [
        ("part", lambda r: r["part"]),
        ("this run", lambda r: fmt(r["ours"])),
        ("seed formula, fp32", lambda r: fmt(r["fp32"])),
        ("seed formula, mixed", lambda r: fmt(r["mixed"])),
    ], rows, caption)


def search_table(tries: list[Try], cuda: bool, title: str):
    from fasttrain import report

    judged = "measured (CUDA allocator)" if cuda else "predicted (CPU: hook count)"
    return report.rows_table(title, [
        ("batch", lambda r: r["batch"]),
        ("fits", lambda r: "yes" if r["fits"] else f"no: {r['reason']}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] else "-"),
        ("peak", lambda r: report.fmt_bytes(r["peak"])),
        ("predicted", lambda r: report.fmt_bytes(r["predicted"])),
    ], [dataclasses.asdict(t) for t in tries], caption=f"fit judged on the peak {judged}; "
        f"each try: one warm-up step, then timed steps (median)")


# -- the command ---------------------------------------------------------------------------------


def memory_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.config import add_arguments

    p = sub.add_parser("memory", help="where a training step's memory goes, predicted part by "
                       "part beside the measured peak; --find-batch-size",
                       description=f"{__doc__}\n{memory_model.__doc__}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("memory")
    g.add_argument("--find-batch-size", action="store_true",
                   help="search for the batch size with the highest samples/s that fits")
    g.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="memory to fit in, GiB (required on the CPU for --find-batch-size; on "
                   "CUDA at most the device's memory, which is the default)")
    g.add_argument("--margin", type=float, default=0.1, metavar="FRACTION",
                   help="safety margin kept free, a fraction of the limit (default: 0.1)")
    g.add_argument("--floor", type=int, default=8, metavar="N",
                   help="first batch size of the search (default: 8)")
    g.add_argument("--try-steps", type=int, default=3, metavar="N",
                   help="timed steps per try, after one warm-up step (default: 3)")
    g.add_argument("--json", metavar="PATH", help="write the result JSON here")
    add_arguments(p)
    p.set_defaults(func=memory)


def memory(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.env import env_block, resolve_device

    limit = gib_arg("--memory-limit", args.memory_limit)
    if not 0 <= args.margin < 1:
        raise UserError(f"--margin must be a fraction in [0, 1), got {args.margin}")
    if args.json:
        report.check_writable(args.json, "--json")
    cfg, task = lab_config(args, "memory")
    cuda = resolve_device(cfg.device) == "cuda"
    if args.find_batch_size:
        if args.floor < 1 or args.floor % cfg.accum_steps:
            raise UserError(f"--floor {args.floor} must be a positive multiple of --accum-steps "
                            f"{cfg.accum_steps}")
        if args.try_steps < 1:
            raise UserError(f"--try-steps must be ≥ 1, got {args.try_steps}")
        if not cuda and limit is None:
            raise UserError("--find-batch-size on the CPU needs --memory-limit GiB: the CPU "
                            "allocator keeps no statistics, so fit is judged from the predicted "
                            "peak against the limit you give")
    out, err = report.wide_console(), Console(stderr=True)
    env = env_block()
    config = {**cfg.to_dict(), "data_source": task.source, "synthetic": task.synthetic,
              "find_batch_size": args.find_batch_size, "memory_limit_gib": args.memory_limit,
              "margin": args.margin}
    result = {"schema": SCHEMA, "env": env, "config": config, "rows": []}
    if args.find_batch_size:
        if cuda:
            total = torch.cuda.get_device_properties(0).total_memory
            limit = min(limit or total, total)
        usable = int(limit * (1 - args.margin))
        config.update(floor=args.floor, try_steps=args.try_steps, usable_bytes=usable)
        err.print(f"searching batch sizes for {cfg.model} on {data_label(task)}, {cfg.precision}, "
                  f"usable memory {report.fmt_bytes(usable)} "
                  f"({report.fmt_bytes(limit)} less {args.margin:.0%} margin)")

        def one(batch: int) -> Try:
            t = try_batch(cfg, task, batch, usable, args.try_steps)
            err.print(f"  batch {t.batch:>6}: {'fits' if t.fits else 'does not fit'}"
                      + (f", {t.samples_per_s:,.0f} samples/s" if t.samples_per_s else "")
                      + (f", peak {report.fmt_bytes(t.peak)}" if t.peak else "")
                      + (f" ({t.reason})" if t.reason else ""))
            return t

        unit = math.lcm(8, cfg.accum_steps)
        cap = train_samples(task, cfg.block_size)
        if args.floor > cap:
            raise UserError(f"--floor {args.floor} is more than the {cap} training samples of "
                            f"{task.name}; choose a smaller floor")
        best, tries = search(one, args.floor, unit, cap)
        result["rows"] = [{"kind": "try", **dataclasses.asdict(t)} for t in tries]
        result["best_batch_size"] = best.batch if best else None
        out.print(search_table(tries, cuda, f"fasttrain memory --find-batch-size — "
                               f"{cfg.model} on {data_label(task)}, {cfg.precision}"))
        if best is not None:
            out.print(f"best batch size: {best.batch} ({best.samples_per_s:,.0f} samples/s, "
                      f"peak {report.fmt_bytes(best.peak)})")
    else:
        b = memory_model.predict(cfg, data=task)
        result["rows"] = [{"kind": "breakdown", **b.to_dict()}]
        out.print(breakdown_table(b, f"fasttrain memory — {cfg.model} on {data_label(task)}, "
                                  f"batch {cfg.batch_size}, {cfg.precision}, {cfg.optimizer}"))
        if limit is not None:
            fits = b.predicted_peak <= limit * (1 - args.margin)
            out.print(f"fits in {report.fmt_bytes(limit)} less {args.margin:.0%} margin: "
                      f"{'yes' if fits else 'no'}")
    if args.json:
        report.write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.find_batch_size and result["best_batch_size"] is None:  # a search that found nothing
        raise UserError(f"even batch {args.floor} does not fit in "
                        f"{report.fmt_bytes(config['usable_bytes'])}: lower --floor, or try "
                        f"--activation-checkpointing / --precision bf16")
    return 0

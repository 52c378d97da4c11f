"""`fasttrain memory`: where a training step's memory goes, part by part, beside the measured peak,
and the batch size that trains fastest in the memory there is.

    fasttrain memory --model cnn --batch-size 64 --precision bf16
    fasttrain memory --model gpt --data synthetic-text --find-batch-size             # CUDA
    fasttrain memory --model cnn --find-batch-size --memory-limit 2                  # CPU, GiB
    fasttrain memory --model gpt --tp 2 --pp 2 --parallel fsdp --gpus 8     # per rank of a layout

The search is fasttrain.lab.batch_size; what a breakdown counts and how (fasttrain.lab.memory):
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from typing import TYPE_CHECKING

import torch

from fasttrain.commands.common import data_label, gib_arg, lab_config
from fasttrain.errors import UserError
from fasttrain.lab import layouts
from fasttrain.lab import memory as memory_model
from fasttrain.lab.batch_size import Try, refuse_fixed_batch, search, train_samples, try_batch
from fasttrain.lab.layouts import Layout, RankMemory
from fasttrain.lab.memory import Breakdown

if TYPE_CHECKING:
    from fasttrain.engine.config import TrainConfig

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
          ("conv_workspace", "convolution workspace (probed)"),
          ("step_temp", "optimizer step temporaries"))


def breakdown_table(b: Breakdown, title: str):
    """Parts as rows: this run's exact bytes beside the course lab's fp32 and mixed formula."""
    from fasttrain import report

    lab = b.lab_formula()
    rows = [{"part": label, "ours": getattr(b, key), "fp32": lab["fp32"].get(key),
             "mixed": lab["mixed"].get(key)} for key, label in _PARTS]
    rows.append({"part": "predicted peak", "ours": b.predicted_peak,
                 "fp32": lab["fp32"]["total"], "mixed": lab["mixed"]["total"]})
    rows.append({"part": "measured peak", "ours": b.measured_peak, "fp32": None, "mixed": None})
    if b.first_step_peak is not None:
        rows.append({"part": "first step's peak (warm-up)", "ours": b.first_step_peak,
                     "fp32": None, "mixed": None})
    fmt = report.fmt_bytes
    measured = b.measured_by.startswith("torch.cuda")  # else the CPU's hook count
    error = (f"prediction error {b.error:+.1%} (the goal: within 10%)" if measured
             else "on the CPU the two differ only by the step temporaries")
    caption = (f"measured: {b.measured_by}. Predicted peak = weights + optimizer + data + "
               f"workspace + inputs + gradients + max(activations + copies + convolution "
               f"workspace, step temporaries); {error}. Convolution workspace: the largest "
               f"scratch one cuDNN call takes, each convolution probed alone (CUDA only). "
               f"Lab formula: P = {b.params:,} parameters, weights + gradients + optimizer + "
               f"activations (mixed: + half copy, half gradients, half "
               f"the fp32 activations; torch autocast keeps fp32 gradients). Micro-batch "
               f"{b.micro_batch} on {b.device}.")
    return report.rows_table(title, [
        ("part", lambda r: r["part"]),
        ("this run", lambda r: fmt(r["ours"])),
        ("lab formula, fp32", lambda r: fmt(r["fp32"])),
        ("lab formula, mixed", lambda r: fmt(r["mixed"])),
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


def layout_table(rows: list[RankMemory], one: RankMemory, lay: Layout, b: Breakdown, title: str):
    """A row per rank role of the layout, beside one process holding everything."""
    from fasttrain import report

    fmt = report.fmt_bytes
    bubble = layouts.bubble(lay.pp, lay.microbatches, lay.virtual)
    caption = (f"{lay} on {lay.gpus} ranks; batch {b.batch_size} per data-parallel rank, "
               f"micro-batch {b.micro_batch}, {b.precision}, {b.optimizer_name}. Parameters, "
               f"gradients and optimizer state: exact bytes of the shards each rank holds "
               f"(the model's own tensor-parallel plan and pipeline cut, applied to a meta "
               f"copy); the heaviest rank where a role's ranks differ. Activations: the "
               f"one-process count × the share a tp rank keeps, counted on the model split by "
               f"its plan (fasttrain.lab.tp_saved); under a pipeline an estimate, taken stage "
               f"by stage, × the schedule's in-flight micro-batches (fasttrain.lab.layouts)."
               + (f" Pipeline bubble (p−1)/(v·m+p−1): {bubble:.0%} of the step idle."
                  if lay.pp > 1 else ""))
    return report.rows_table(title, [
        ("ranks", lambda r: r["role"]), ("of them", lambda r: r["ranks"]),
        ("parameters", lambda r: fmt(r["params"])), ("gradients", lambda r: fmt(r["grads"])),
        ("optimizer", lambda r: fmt(r["optimizer"])),
        ("activations (est.)", lambda r: fmt(r["activations"])),
        ("per-rank total", lambda r: fmt(r["total"])),
        ("state, exact B", lambda r: f"{_state(r):,}"),
        ("state vs one process", lambda r: f"{_state(r) / max(_state(one.as_dict()), 1):.3f}"),
    ], [r.as_dict() for r in [*rows, one]], caption)


def _state(r: dict) -> int:
    return r["params"] + r["grads"] + r["optimizer"]


def _layout_run(args: argparse.Namespace, given: TrainConfig, result: dict,
                limit: int | None) -> None:
    """`fasttrain memory --tp/--pp/--parallel/--gpus`: one process at one data-parallel rank's
    batch, predicted (the same `predict` as without a layout), then divided per rank role.
    `given`: the layout as flags or --config give it, before any check (`from_args`)."""
    from fasttrain import report

    tp, pp = given.tp, given.pp
    gpus = args.gpus or tp * pp
    # dp first; the pipeline's micro-batches are checked against the rank's batch below.
    lay = layouts.layout(gpus, tp, pp, given.parallel)
    if given.batch_size % (lay.dp * given.accum_steps):
        raise UserError(f"--batch-size {given.batch_size} is the global batch: it must divide "
                        f"by the {lay.dp} data-parallel ranks × --accum-steps "
                        f"{given.accum_steps}")
    one = argparse.Namespace(**{**vars(args), "parallel": "none", "tp": 1, "pp": 1,
                                "batch_size": given.batch_size // lay.dp})
    cfg, task = lab_config(one, "memory")
    lay = layouts.layout(gpus, tp, pp, given.parallel, given.pp_schedule,
                         given.pp_microbatches, rank_batch=cfg.batch_size)
    b, rows, whole = memory_model.predict_layout(cfg, lay, data=task)
    # The one process measured, then the layout it is divided over (its flags, as given).
    result["config"] = {**cfg.to_dict(), "data_source": task.source, "gpus": gpus, "tp": tp,
                        "pp": pp, "parallel": given.parallel, "batch_size": given.batch_size,
                        "rank_batch_size": cfg.batch_size, "pp_schedule": given.pp_schedule,
                        "pp_microbatches": lay.microbatches, "layout": str(lay)}
    result["rows"] = ([{"kind": "breakdown", **b.to_dict()}]
                      + [{"kind": "rank", **r.as_dict()} for r in rows]
                      + [{"kind": "one process", **whole.as_dict()}])
    result["bubble"] = layouts.bubble(lay.pp, lay.microbatches, lay.virtual)
    out = report.wide_console()
    out.print(layout_table(rows, whole, lay, b, f"fasttrain memory — {cfg.model} on "
                           f"{data_label(task)}, per rank of {lay} ({gpus} ranks), global "
                           f"batch {given.batch_size}"))
    if limit is not None:
        heaviest = max(r.total for r in rows)
        fits = heaviest <= limit * (1 - args.margin)
        out.print(f"the heaviest rank ({report.fmt_bytes(heaviest)}) fits in "
                  f"{report.fmt_bytes(limit)} less {args.margin:.0%} margin: "
                  f"{'yes' if fits else 'no'}")


# -- the command ---------------------------------------------------------------------------------


def memory_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.configfile import add_arguments

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
    g.add_argument("--gpus", type=int, metavar="W",
                   help="predict per rank of a layout of W ranks: with --tp, --pp, "
                   "--parallel ddp|fsdp|zero1, --pp-schedule, --pp-microbatches (default: "
                   "tp × pp; the ranks they leave form the data-parallel dimension)")
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
    if args.gpus is not None and args.gpus < 1:
        raise UserError(f"--gpus must be a number of ranks ≥ 1, got {args.gpus}")
    if args.json:
        report.check_writable(args.json, "--json")
    from fasttrain.engine.configfile import from_args

    given = from_args(args)  # parsed once: the layout's flags, as given
    if _layout_given(args, given):
        if args.find_batch_size:
            raise UserError("--find-batch-size searches one process's batch: drop --gpus, --tp, "
                            "--pp and --parallel")
        from fasttrain.env import env_block

        result = {"schema": SCHEMA, "env": env_block(), "config": {}, "rows": []}
        _layout_run(args, given, result, limit)
        return _write(args, result)
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
            # What this process may allocate: all of the device unless a cap was set
            # (torch.cuda.set_per_process_memory_fraction), beyond which it runs out early.
            total = torch.cuda.get_device_properties(0).total_memory
            fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda _: 1.0)(0)
            total = int(total * fraction)
            limit = min(limit or total, total)
        usable = int(limit * (1 - args.margin))
        config.update(floor=args.floor, try_steps=args.try_steps, usable_bytes=usable)
        refuse_fixed_batch(task, "--find-batch-size")
        err.print(f"searching batch sizes for {cfg.model} on {data_label(task)}, {cfg.precision}, "
                  f"usable memory {report.fmt_bytes(usable)} "
                  f"({report.fmt_bytes(limit)} less {args.margin:.0%} margin)")

        def one(batch: int) -> Try:
            t = try_batch(cfg, task, batch, usable, args.try_steps)
            err.print(f"  batch {t.batch:>6}: {'fits' if t.fits else 'does not fit'}"
                      + (f", {t.samples_per_s:,.0f} samples/s" if t.samples_per_s else "")
                      + (f", peak {report.fmt_bytes(t.peak)}" if t.peak else "")
                      + (f" ({t.reason})" if t.reason else "")
                      + (f"; {report.fmt_bytes(t.held_after)} still allocated after it (a "
                         f"leak: later tries have less memory)" if (t.held_after or 0) > 2**20
                         else ""))
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
    _write(args, result)
    if args.find_batch_size and result["best_batch_size"] is None:  # a search that found nothing
        raise UserError(f"even batch {args.floor} does not fit in "
                        f"{report.fmt_bytes(config['usable_bytes'])}: lower --floor, or try "
                        f"--activation-checkpointing / --precision bf16")
    return 0


def _layout_given(args: argparse.Namespace, given: TrainConfig) -> bool:
    return args.gpus is not None or given.tp * given.pp > 1 or given.parallel != "none"


def _write(args: argparse.Namespace, result: dict) -> int:
    from fasttrain import report

    if args.json:
        report.write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)
    return 0

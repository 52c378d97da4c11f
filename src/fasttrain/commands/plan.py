"""`fasttrain plan`: which GPU, will it fit, how long, what it costs — before renting anything.

    fasttrain plan --model gpt --data tinyshakespeare --batch-size 64 --precision bf16
    fasttrain plan --model cnn --gpus 4 --deadline 2 --preemption-rate 0.1 --plot plan.png
    fasttrain plan --model mypkg.net:build --data mypkg.data:load --catalog my_prices.toml

One row per GPU of the catalogue (fasttrain/lab/gpus.toml, or --catalog FILE). Every figure is an
ESTIMATE; the footer gives its basis:

- memory: fasttrain.lab.memory.predict — the model `fasttrain memory` prints — for one GPU's
  share of the batch, counted as CUDA holds tensors; fits in the card's memory less 10%. When it
  does not fit, the switches are tried in order, each verified by predicting with it: bf16,
  activation checkpointing, gradient accumulation (×2, ×4, ×8), the three together, FSDP over N
  GPUs (parameters, gradients and optimizer state sharded N ways: a formula on the breakdown,
  not a run). A card nothing fits says what the least needy attempt needed.
- largest batch: the peak is linear in the micro-batch; predicted at two sizes and extrapolated.
- step time: fasttrain.lab.steptime — every op call of one real step at the slower of the GPU's
  peak for the precision and its bandwidth, over an efficiency (default, or fitted by
  --calibrate here), or a cost per op issued (the catalogue's, or steptime's default) times
  the calls, whichever is slower: the host issues while the GPU computes (lab/overlap.py).
- cost: fasttrain.lab.cost — example list prices of the catalogue; spot with expected restarts.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys

from fasttrain.commands.common import data_label, lab_config
from fasttrain.errors import UserError
from fasttrain.lab import calibration, cost, fitting, scaling, steptime

SCHEMA = "fasttrain.plan/1"
# FSDP moves 1.5× DDP's bytes: an all-gather in forward, another in backward, a reduce-scatter.
FSDP_TRAFFIC = 1.5


def same_gpu(device: str, name: str) -> bool:
    """Whether the catalogue's GPU `name` is the one torch calls `device` (env.gpu_peaks's match,
    which knows that an SXM H100 does not say so; word by word for a user catalogue's names)."""
    from fasttrain.env import GPU_PEAKS, gpu_peaks, name_words

    if name in GPU_PEAKS:
        return gpu_peaks(device) is GPU_PEAKS[name]
    return all(w.lower() in name_words(device) for w in name.split())


def launch(gpu: cost.GPU, cfg, fit: steptime.Fit) -> tuple[float, str]:
    """Seconds to issue one op on `gpu`, and whence: nothing under CUDA graphs (the step is
    replayed, not issued), the fit where it was made on this very GPU, else the catalogue's
    figure, else the default. A CPU's fitted figure is never carried to a GPU."""
    if cfg.cuda_graphs:
        return 0.0, "CUDA graphs: the step is replayed, not issued"
    if fit.device and same_gpu(fit.device, gpu.name):
        return fit.launch_s, f"fitted on this {fit.device}"
    if gpu.launch_s is not None:
        return gpu.launch_s, gpu.launch_source
    return steptime.DEFAULT_LAUNCH_S, steptime.DEFAULT_LAUNCH_SOURCE


def gpu_row(models, cfg, per_gpu, gpu: cost.GPU, n: int, fit: steptime.Fit,
            steps_epoch: int | None, total_steps: int, spot: tuple[float, float, float],
            samples: int | None, fsdp: bool = False) -> dict:
    usable = gpu.memory_bytes * (1 - fitting.MARGIN)
    row = {"gpu": gpu.name, "memory_available": gpu.memory_bytes, "usable": int(usable),
           "status": "ok", "options": []}
    if cfg.precision not in gpu.peaks:
        return {**row, "status": "unsupported",
                "reason": f"no {cfg.precision} units on the {gpu.name}"}
    how, variant, used, needed, least, tried = fitting.fit(models, per_gpu, gpu, n, fsdp)
    largest, _, per_sample = fitting.largest_micro(models, variant, usable)  # the switched config
    row.update(fit=how, memory_needed=needed, gpus=used, per_sample_bytes=per_sample,
               largest_batch=min(largest * variant.accum_steps * used, samples or math.inf))
    if how == "does not fit":
        return {**row, "status": "does not fit",
                "reason": f"needs {_gib(needed)} at least ({least}) of {_gib(usable)} usable; "
                          f"tried {', '.join(tried) or 'no switch'}"}
    full = dataclasses.replace(variant, batch_size=cfg.batch_size)  # the whole step's work
    work = models.work(full)
    peak = gpu.peaks[variant.precision]
    launch_s, launch_source = launch(gpu, variant, fit)
    # Each of the `used` GPUs computes 1/used of the samples (the optimizer's bytes are not
    # shared under DDP: optimistic for tiny batches) and issues every op call, while its device
    # computes: the slower of the two (lab/overlap.py; a calibration on this very GPU read its
    # steps so too: lab/calibration.py).
    compute = steptime.predict_s(work, peak, gpu.bandwidth, fit.efficiency, launch_s,
                                 share=1 / used, overlapped=True)
    link = scaling.Link(gpu.interconnect, gpu.link_bandwidth)
    grad = int(work.grad_bytes * (FSDP_TRAFFIC if fsdp or used != n else 1))
    t = scaling.step_time(compute, grad, used, link)
    step_s = t["step_s"]
    hours = total_steps * step_s / 3600
    rate, interval_h, restart_h = spot
    row.update(step_s=step_s, epoch_s=steps_epoch * step_s if steps_epoch else None,
               total_s=total_steps * step_s,
               roofline_s=steptime.roofline_s(work, peak, gpu.bandwidth), flops=work.flops,
               bytes=work.bytes, ops=work.ops, launch_s=launch_s, launch_source=launch_source,
               allreduce_s=t["allreduce_s"], exposed_s=t["exposed_s"])
    row["options"] = cost.options(gpu, used, hours, rate, interval_h, restart_h)
    return row


# -- formatting -------------------------------------------------------------------------------


def _gib(n: float) -> str:
    from fasttrain.report import fmt_bytes

    return fmt_bytes(n)


def fmt_s(s: float | None) -> str:
    """Two significant figures, in the unit that reads best: estimates, not measurements."""
    if s is None or not math.isfinite(s):
        return "-"
    for unit, size, limit in (("ms", 1e-3, 1), ("s", 1, 120), ("min", 60, 7200),
                              ("h", 3600, 172800), ("d", 86400, math.inf)):
        v = float(f"{s / size:.2g}")
        if v * size < limit:
            return f"{v:g} {unit}"
    return "-"


def fmt_usd(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "-"
    return "< $0.01" if x < 0.01 else f"${float(f'{x:.2g}'):,g}"


def _launches(rows: list[dict]) -> str:
    """The per-op costs the rows used, each with its source once."""
    used = {}
    for r in rows:
        if "launch_s" in r:
            used.setdefault((r["launch_s"], r["launch_source"]), []).append(r["gpu"])
    if not used:
        return "no GPU computed"
    if len(used) == 1:
        (s, src), = used
        return f"{s * 1e6:.2g} µs: {src}"
    return "; ".join(f"{', '.join(g)}: {s * 1e6:.2g} µs, {src}" for (s, src), g in used.items())


def _held(fit: steptime.Fit) -> str:
    """The efficiency, where the calibration held it at its bound or could not identify it,
    marked where it is used (the why and the whole fit follow in fit.source)."""
    if "efficiency" in fit.unidentified:
        return " (NOT IDENTIFIED by the calibration: the default within its bound)"
    if "efficiency" not in fit.held:
        return ""
    return f" (HELD AT ITS BOUND: the unbounded fit was {fit.unbounded[0]:.3g})"


def _option(row: dict, tier: str):
    return next((o for o in row["options"] if o.tier == tier), None)


def _cell(row: dict, tier: str) -> str:
    o = _option(row, tier)
    if o is None:
        return "no price"
    text = fmt_usd(o.usd) + (f" ({fmt_s(o.hours * 3600)})" if tier == "spot" else "")
    return text + "".join(f" ◀ {m}" for m in o.marks)


def _deadline(deadline_h: float | None, opts: list) -> str:
    """The footer's deadline, saying so where no option meets it (the table has no mark then)."""
    if deadline_h is None:
        return ""
    finite = [o.hours for o in opts if math.isfinite(o.hours)]
    if not finite or any("cheapest by deadline" in o.marks for o in opts):
        return f" Deadline {deadline_h:g} h."
    return (f" Deadline {deadline_h:g} h: NO option finishes within it; the fastest takes "
            f"{fmt_s(min(finite) * 3600)}.")


def plan_table(rows: list[dict], title: str, caption: str, samples: int | None):
    from fasttrain import report

    return report.rows_table(title, [
        ("GPU", lambda r: r["gpu"] + (f" ×{r['gpus']}" if r.get("gpus", 1) > 1 else "")),
        ("memory need / have", lambda r: f"{_gib(r['memory_needed'])} / "
         f"{_gib(r['memory_available'])}"),
        ("fits", lambda r: r["fit"]),
        ("largest batch", lambda r: f"~{r['largest_batch']:,}"
         + (" (all)" if r["largest_batch"] == samples else "")),
        ("step", lambda r: fmt_s(r["step_s"])),
        ("epoch", lambda r: fmt_s(r["epoch_s"])),
        ("total", lambda r: fmt_s(r["total_s"])),
        ("on-demand", lambda r: _cell(r, "on_demand")),
        ("spot (wall time)", lambda r: _cell(r, "spot")),
    ], rows, caption)


def plot(path: str, rows: list[dict], title: str) -> None:
    """Cost against time of every option that fits; the Pareto front drawn through."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fasttrain.files import write_png

    opts = [o for r in rows for o in r["options"] if math.isfinite(o.hours)]
    front = cost.pareto(opts)
    fig, ax = plt.subplots(figsize=(7, 4.6))
    for tier, marker in (("on_demand", "o"), ("spot", "^")):
        pts = [o for o in opts if o.tier == tier]
        ax.scatter([o.hours for o in pts], [o.usd for o in pts], marker=marker, color="0.55",
                   label=tier.replace("_", "-"))
        for o in pts:
            ax.annotate(o.gpu + (f" ×{o.n}" if o.n > 1 else ""), (o.hours, o.usd), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
    ax.plot([o.hours for o in front], [o.usd for o in front], "-o", color="tab:red",
            label="Pareto front (nothing cheaper and faster)")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("estimated total time, hours")
    ax.set_ylabel("estimated cost, USD (example prices)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    write_png(path, fig)


# -- the command --------------------------------------------------------------------------------


def plan_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.configfile import add_arguments

    p = sub.add_parser("plan", help="which GPU, will it fit, how long, what it costs (estimates)",
                       description=f"{__doc__}\n{cost.__doc__}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("plan")
    g.add_argument("--catalog", metavar="FILE", help="your own GPU catalogue (TOML, the form of "
                   "fasttrain/lab/gpus.toml): your prices")
    g.add_argument("--gpus", type=int, default=1, metavar="N",
                   help="data-parallel GPUs per run; the batch is split over them (default: 1)")
    g.add_argument("--deadline", type=float, metavar="HOURS",
                   help="mark the cheapest option that finishes within HOURS")
    g.add_argument("--preemption-rate", type=float, default=0.05, metavar="PER_HOUR",
                   help="spot preemptions per hour (default: 0.05, an assumption)")
    g.add_argument("--checkpoint-minutes", type=float, default=30.0, metavar="MIN",
                   help="checkpoint interval on spot (default: 30)")
    g.add_argument("--restart-minutes", type=float, default=10.0, metavar="MIN",
                   help="time from a preemption to training again (default: 10)")
    g.add_argument("--calibrate", action="store_true",
                   help="time the configuration here at two batch sizes, fit the efficiency "
                   "and the cost per op issued, and carry the efficiency over (default: "
                   f"{steptime.DEFAULT_EFFICIENCY})")
    g.add_argument("--plot", metavar="PATH", help="cost against time, PNG")
    g.add_argument("--json", metavar="PATH", help="write the result JSON here")
    add_arguments(p)
    p.set_defaults(func=plan)


def _check(args) -> None:
    if args.gpus < 1:
        raise UserError(f"--gpus must be ≥ 1, got {args.gpus}")
    for flag, v in (("--deadline", args.deadline), ("--preemption-rate", args.preemption_rate),
                    ("--checkpoint-minutes", args.checkpoint_minutes),
                    ("--restart-minutes", args.restart_minutes)):
        if v is not None and not (math.isfinite(v) and v >= 0):
            raise UserError(f"{flag} must be a number ≥ 0, got {v}")


def _length(task, cfg, train_samples) -> tuple[int | None, int | None, int]:
    """(samples an epoch, steps an epoch, steps in all) as `train` runs them; a stream without
    length has neither epoch figure, and its run is --max-steps long (train asks for it too)."""
    if getattr(task, "splits", None) is not None:  # streamed: its length, if it has one
        try:
            len(task.splits["train"])
        except TypeError:
            if not cfg.max_steps:
                raise UserError("the training data is a stream without length: give "
                                "--max-steps N, the run's length (train needs it too)") from None
            return None, None, cfg.max_steps
    samples = train_samples(task, cfg.block_size)
    steps_epoch = samples // cfg.batch_size
    if steps_epoch == 0:
        raise UserError(f"--batch-size {cfg.batch_size} is more than one epoch of {task.name}")
    total = cfg.epoch_limit() * steps_epoch
    return samples, steps_epoch, min(total, cfg.max_steps) if cfg.max_steps else total


def plan(args: argparse.Namespace) -> int:
    from fasttrain import report
    from fasttrain.env import env_block
    from fasttrain.lab.batch_size import rebatchable, train_samples

    _check(args)
    report.check_outputs((args.json, "--json"), (args.plot, "--plot"))
    gpus = cost.load(args.catalog)  # before building anything: a bad catalogue fails fast
    # --parallel names how the --gpus share the work; plan models it rather than launching it.
    parallel = vars(args).pop("parallel", "none")
    if parallel not in ("none", "ddp", "fsdp"):
        raise UserError(f"fasttrain plan models --parallel ddp or fsdp over --gpus N, not "
                        f"--parallel {parallel}")
    fsdp = parallel == "fsdp" and args.gpus > 1
    cfg, task = lab_config(args, "plan")
    n = args.gpus
    if cfg.batch_size % (n * cfg.accum_steps):
        raise UserError(f"--batch-size {cfg.batch_size} must split over --gpus {n} × "
                        f"--accum-steps {cfg.accum_steps}; choose a multiple of "
                        f"{n * cfg.accum_steps}")
    per_gpu = dataclasses.replace(cfg, batch_size=cfg.batch_size // n)
    task = rebatchable(task, per_gpu.micro_batch)  # predicted at other batches too
    samples, steps_epoch, total = _length(task, cfg, train_samples)
    models = fitting.Models(task)
    fit, basis = (calibration.calibrate(fitting.counted_here(cfg), data=task) if args.calibrate
                  else (steptime.default(), None))
    spot = (args.preemption_rate, args.checkpoint_minutes / 60, args.restart_minutes / 60)
    rows = [gpu_row(models, cfg, per_gpu, g, n, fit, steps_epoch, total, spot, samples, fsdp)
            for g in gpus.values()]
    opts = [o for r in rows for o in r["options"]]
    cost.mark(opts, args.deadline)
    dates = sorted({p.read for g in gpus.values() for p in g.prices.values()})
    caption = (
        f"ESTIMATES. Memory: fasttrain.lab.memory.predict (as `fasttrain memory`), one GPU's "
        f"micro-batch {per_gpu.micro_batch}, counted as CUDA holds it, vs the card's memory "
        f"less {fitting.MARGIN:.0%}; switches verified by predicting with each (FSDP: sharding "
        f"formula). Largest batch: linear extrapolation from two predicted sizes (all: the "
        f"whole epoch). Step: Σ over the op calls of one counted step of max(FLOPs / "
        f"{cfg.precision} peak, bytes / bandwidth) ÷ efficiency {fit.efficiency:.2g}"
        f"{_held(fit)}, or calls × "
        f"the cost to issue one ({_launches(rows)}), the slower — {fit.source}"
        + (f"; {n} GPUs {'FSDP' if fsdp else 'data parallel'}, ring collectives over the "
           f"catalogue's link" if n > 1 else "")
        + (f". {steps_epoch:,} steps/epoch, {total:,} steps" if steps_epoch else
           f". A stream without length: {total:,} steps (--max-steps)")
        + ". Cost: EXAMPLE list prices per GPU-hour "
        f"(read {', '.join(dates)}; sources in the catalogue), spot with "
        f"{args.preemption_rate:g} preemptions/h, each losing half of a "
        f"{args.checkpoint_minutes:g}-min checkpoint interval + {args.restart_minutes:g} min "
        f"restart." + _deadline(args.deadline, opts)
        + (" Spot never finishes at that rate: each hour loses more than an hour of work to "
           "preemptions; lower --preemption-rate, --checkpoint-minutes or --restart-minutes."
           if math.isinf(cost.spot_hours(1.0, *spot)) else ""))
    title = (f"fasttrain plan — {cfg.model} on {data_label(task)}, batch {cfg.batch_size}, "
             f"{cfg.precision}" + (f", {n} GPUs" if n > 1 else ""))
    report.wide_console().print(plan_table(rows, title, caption, samples))
    if args.plot:
        plot(args.plot, rows, title)
        print(f"wrote {args.plot}", file=sys.stderr)
    if args.json:
        out = [{**r, "options": [dataclasses.asdict(o) for o in r["options"]]} for r in rows]
        report.write_json(args.json, {
            "schema": SCHEMA, "env": env_block(),
            "config": {**cfg.to_dict(), "data_source": task.source, "synthetic": task.synthetic,
                       "gpus": n, "deadline_h": args.deadline,
                       "preemption_rate": args.preemption_rate,
                       "checkpoint_minutes": args.checkpoint_minutes,
                       "restart_minutes": args.restart_minutes, "catalog": args.catalog},
            "efficiency": {"value": fit.efficiency, "source": fit.source, "basis": basis,
                           "held": list(fit.held),  # bounds the fit was held at (steptime.fit)
                           "unidentified": list(fit.unidentified), "model": fit.model,
                           "unbounded": (dict(zip(("efficiency", "launch_s"), fit.unbounded,
                                                  strict=True)) if fit.unbounded else None)},
            "launch": {"fitted_s": fit.launch_s if args.calibrate else None,
                       "fitted_on": fit.device, "default_s": steptime.DEFAULT_LAUNCH_S,
                       "default_source": steptime.DEFAULT_LAUNCH_SOURCE},
            "memory": models.memory(per_gpu).to_dict(),
            "steps_per_epoch": steps_epoch, "total_steps": total, "rows": out,
            "pareto": [dataclasses.asdict(o) for o in cost.pareto(opts)]})
        print(f"wrote {args.json}", file=sys.stderr)
    return 0

"""`fasttrain experiment scaling`: throughput and per-rank memory on 1…N processes, measured, and
beside it the model of the data-parallel step (fasttrain.lab.scaling) for multi-GPU and multi-node
speed-up before renting them.

    fasttrain experiment scaling --model mlp --data synthetic --procs 1,2 --json s.json
    fasttrain experiment scaling --predict-only          # the bundled models, 8 and 2×8 GPUs
    fasttrain experiment scaling --predict-only --intra pcie4 --gpus-per-node 4 --nodes 1
    fasttrain experiment scaling --predict-only --predict-models gpt-13b --gpu-memory-gb 80
    fasttrain experiment scaling --predict-only --model mypkg.net:build --data mypkg.data:load

--predict-only predicts the --model you give (a flag or --config's; yours or a bundled one, with
your flags: --batch-size is the batch per GPU), counted in one real step here as `plan` counts
it (fasttrain.lab.configured); without --model, the --predict-models list of bundled reference
sizes, counted on the meta device. Both at once is refused: one of them would be ignored.

The measured mode predicts the model it measures (the --model, default or given), counted the
same way: each measured row shows beside rank 0's bytes the training state one rank of that
mode and process count holds by the lab's count (lab/layouts: exact shards, ZeRO-1's
partition, FSDP's dim-0 chunks) and their ratio, and the GPU tables below are for that model
at its --batch-size per process. --predict-models there is refused (it would be ignored). A
model whose one step fails here is measured without a prediction, saying why.

Beside the DDP prediction, the layout each model should use on those GPUs (data → FSDP → TP
inside a node → PP across nodes: fasttrain.lab.layout_choice) with its memory per GPU, pipeline
bubble and tensor-parallel traffic, and the reason.

This module is the command's flags, checks and tables; `fasttrain experiment` adds the flags to
its parser and hands `scaling` over here.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import asdict

import torch

from fasttrain.commands.common import lab_config, positive_ints, refuse_run_directory
from fasttrain.commands.experiment import SCHEMA
from fasttrain.errors import UserError
from fasttrain.lab import layout_choice
from fasttrain.lab.scaling import (
    H100_BF16,
    LINKS,
    MODES,
    SPECS,
    link,
    measure_all,
    predict_counted,
)

# -- output -------------------------------------------------------------------------------------


def _b(n) -> str:
    from fasttrain.report import fmt_bytes

    return "-" if n is None else fmt_bytes(n)


def measured_table(result: dict):
    from fasttrain import report

    cfg = result["config"]
    title = (f"measured: {cfg['model']} on {cfg['data']}, {cfg['batch_size']} samples per "
             f"process per step, {cfg['optimizer']}, {cfg['device']}")
    return report.rows_table(title, [
        ("mode", lambda r: r["mode"]), ("procs", lambda r: r["procs"]),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}"),
        ("ms/step", lambda r: f"{r['step_ms']:.3g}"),
        ("speed-up", lambda r: f"{r['speedup']:.2f}×"),
        ("weights/rank", lambda r: _b(r["param_bytes"])),
        ("grads/rank", lambda r: _b(r["grad_bytes"])),
        ("optimizer/rank", lambda r: _b(r["optimizer_bytes"])),
        ("state predicted", lambda r: _b(r.get("predicted_state_bytes"))),
        ("measured ÷ predicted", lambda r: "-" if r.get("state_ratio") is None
         else f"{r['state_ratio']:.3f}"),
        ("peak rank 0", lambda r: _b(r["peak_bytes"])),
    ], result["rows"], caption="speed-up: samples/s against the same mode on the fewest "
        "processes, × their count (weak scaling). Bytes: rank 0's training state; its peak: "
        "the allocator's on CUDA, the process's resident memory (RSS) on a CPU. State "
        "predicted: weights + grads + optimizer of one rank of that mode and process count, "
        "counted for this --model in one real step here and divided as the layout divides it "
        "(fasttrain.lab.layouts; ZeRO-1: its heaviest rank); the ratio is rank 0's measured "
        "state over it." + _counted_note(result["options"]), label_columns=2)


def predicted_table(result: dict):
    from fasttrain import report

    o = result["options"]
    return report.rows_table(
        f"predicted: DDP step on H100s at {o['mfu']:.0%} MFU of {o['peak_tflops']:g} TFLOP/s",
        _predicted_columns(), result["predicted"], caption=_predicted_caption(o),
        label_columns=2)


def _counted_note(o: dict) -> str:
    """Where the figures of the configured model came from, or "" for the bundled specs."""
    c = o.get("counted")
    if not c or "error" in c:
        return ""
    data = c["data"] + (" (SYNTHETIC stand-in)" if c["synthetic"] else "")
    return (f" {c['model']}: parameters, FLOPs and saved bytes counted in one real step of "
            f"--batch-size {c['batch_size']} on {data} here, as `fasttrain plan` counts it.")


def _predicted_columns():
    return [
        ("model", lambda r: r["model"]), ("GPUs", lambda r: _gpus(r)),
        ("params", lambda r: _count(r["params"])),
        ("batch/GPU", lambda r: r["batch_per_gpu"]),
        ("compute ms", lambda r: f"{1e3 * r['compute_s']:.3g}"),
        ("all-reduce ms", lambda r: f"{1e3 * r['allreduce_s']:.3g}"),
        ("exposed ms", lambda r: f"{1e3 * r['exposed_s']:.3g}"),
        ("speed-up", lambda r: f"{r['speedup']:.2f}×"),
        ("efficiency", lambda r: f"{r['efficiency']:.0%}"),
    ]


def _count(n: int) -> str:
    return f"{n / 1e9:.3g} B" if n >= 1e9 else f"{n / 1e6:.3g} M"


def _gpus(r: dict) -> str:
    per = r["gpus"] // r["nodes"]
    where = f"{r['nodes']}×{per}" if r["nodes"] > 1 else str(per)
    return f"{where} ({r['interconnect']})"


def _predicted_caption(o: dict) -> str:
    return (f"compute: FLOPs of forward + backward (torch's counter) ÷ ({o['mfu']:.0%} × "
            f"{o['peak_tflops']:g} TFLOP/s), at least {o['step_floor_ms']:g} ms; all-reduce: "
            f"ring over fp32 gradients, {o['latency_us']:g} µs per ring step; exposed: what "
            f"outlasts backward with DDP's buckets (1 MiB, then 25 MiB). batch/GPU: samples "
            f"(images; sequences of the block size for gpt; --batch-size for your --model)."
            + _counted_note(o))


def layouts_table(result: dict):
    from fasttrain import report

    o = result["options"]
    return report.rows_table(
        f"which layout: {o['gpu_memory_gb']:g} GiB GPUs, global batch = batch/GPU × GPUs",
        _layout_columns(), result["layouts"], caption=_layouts_caption(o), label_columns=2)


def _layout_columns():
    def p(key, f):
        return lambda r: "-" if r["pick"] is None else f(r["pick"][key])

    return [
        ("model", lambda r: r["model"]), ("GPUs", lambda r: _gpus(r)),
        ("pick", p("layout", str)), ("memory/GPU", p("memory", _b)),
        ("micro-batch", p("micro_batch", str)),
        ("step ms", p("step_s", lambda v: f"{1e3 * v:.3g}")),
        ("bubble", p("bubble", lambda v: f"{v:.0%}")),
        ("TP all-reduced/step", p("tp_bytes", _b)),
        ("why", lambda r: r["reason"]),
        ("left out", lambda r: "; ".join(
            f"{k}: {'no plan' if ' has no ' in v else 'plan not modelled'}"
            for k, v in r["left_out"].items()) or "-"),
    ]


def _layouts_caption(o: dict) -> str:
    return (f"memory/GPU: 16 B per parameter (fp32 weights, gradients, AdamW) divided as the "
            f"layout divides it, plus fp32 activations counted on the meta device for the "
            f"micro-batch (per data-parallel rank; a pipeline's micro-batch), the largest power "
            f"of 2 that fits {layout_choice.USABLE * o['gpu_memory_gb']:g} GiB. step: compute at "
            f"{o['mfu']:.0%} MFU, the data-parallel traffic DDP's buckets leave exposed "
            f"(FSDP 1.5×), tensor parallel's 4 all-reduces per block of the tp group's "
            f"batch × seq × width in bf16 (not overlapped), ÷ (1 − bubble), bubble "
            f"(p−1)/(m+p−1). Candidates in the rule's order (ddp, fsdp, fsdp × tp, then pp "
            f"across nodes); all of them in the JSON. left out: tensor (tp) and pipeline (pp) "
            f"parallelism of a model with no plan for them (a parallelize(tp_mesh) or "
            f"pipeline_split(n_stages) method: what --tp and --pp need), or with a plan whose "
            f"traffic is modelled for gpt only; the JSON's left_out says which." + _counted_note(o))


def layouts_markdown(result: dict) -> str:
    """The layout table as Markdown (docs/distributed.md)."""
    cols = _layout_columns()
    lines = ["| " + " | ".join(h for h, _ in cols) + " |",
             "|" + "|".join("---" if i < 3 else "--:" for i in range(len(cols) - 2))
             + "|---|---|"]
    lines += ["| " + " | ".join(str(f(r)) for _, f in cols) + " |" for r in result["layouts"]]
    return "\n".join(lines) + "\n\n" + _layouts_caption(result["options"]) + "\n"


def predicted_markdown(result: dict) -> str:
    """The prediction table as Markdown (docs/distributed.md)."""
    cols = _predicted_columns()
    lines = ["| " + " | ".join(h for h, _ in cols) + " |",
             "|" + "|".join("---" if i < 2 else "--:" for i in range(len(cols))) + "|"]
    lines += ["| " + " | ".join(str(f(r)) for _, f in cols) + " |" for r in result["predicted"]]
    return "\n".join(lines) + "\n\n" + _predicted_caption(result["options"]) + "\n"


# -- the command ----------------------------------------------------------------------------------


def _names(flag: str, spec: str, known) -> tuple[str, ...]:
    names = tuple(s.strip() for s in spec.split(",") if s.strip())
    bad = [s for s in names if s not in known]
    if bad or not names:
        raise UserError(f"{flag} {spec!r}: choose from {', '.join(known)}")
    return names


def _model_given(args: argparse.Namespace) -> bool:
    """Whether --model was given, as a flag or in --config (the engine's default is not)."""
    from fasttrain.engine.configfile import load_toml

    return "model" in vars(args) or bool(args.config and "model" in load_toml(args.config))


def _configured(args: argparse.Namespace, cfg):
    """--predict-only: with a --model, (its validated config, [(label, batch per GPU,
    layout_choice.Model)] counted here, the JSON's note of how); without one, (cfg, None, None).
    With --predict-models as well, one line: predicting either would silently drop the other."""
    from fasttrain.lab.configured import describe

    if not _model_given(args):
        return cfg, None, None
    if "predict_models" in getattr(args, "_given", ()):
        raise UserError(f"--predict-only predicts either --model {cfg.model} (counted here) or "
                        f"--predict-models {args.predict_models} (bundled reference sizes), not "
                        f"both: drop one")
    cfg, task = lab_config(args, "experiment scaling")
    label, batch, m = describe(cfg, task)
    note = {"model": label, "batch_size": batch, "data": task.name, "data_source": task.source,
            "synthetic": task.synthetic}
    return cfg, [(label, batch, m)], note


def _measured_model(args: argparse.Namespace, modes, procs):
    """The measured mode: the model it measures, counted here as --predict-only --model counts
    it — ([(label, batch per process, layout_choice.Model)], the JSON's note of how,
    {(mode, processes): layouts.RankMemory}) — or, where its one step fails here, (None,
    {"error": the line}, {}): the measured rows still run, and say train's own error."""
    from fasttrain.lab import layouts
    from fasttrain.lab.configured import describe_ranks

    if "predict_models" in getattr(args, "_given", ()):
        raise UserError(f"--predict-models {args.predict_models} is for --predict-only; the "
                        f"measured mode predicts the --model it measures: drop "
                        f"--predict-models, or add --predict-only")
    lays = {(mode, n): (layouts.layout(n, parallel=mode) if mode != "dp" and n > 1
                        else layouts.Layout()) for mode in modes for n in procs}
    try:
        cfg, task = lab_config(args, "experiment scaling")
        label, batch, m, ranks = describe_ranks(cfg, task, lays)
    except UserError as e:
        return None, {"error": str(e)}, {}
    note = {"model": label, "batch_size": batch, "data": task.name, "data_source": task.source,
            "synthetic": task.synthetic}
    return [(label, batch, m)], note, ranks


def _beside(rows: list[dict], ranks: dict) -> None:
    """Each measured row gets its prediction (`_measured_model`) and the ratio."""
    for r in rows:
        held = ranks.get((r["mode"], r["procs"]))
        if r["status"] != "ok" or held is None:
            continue
        r["predicted_param_bytes"], r["predicted_grad_bytes"] = held.params, held.grads
        r["predicted_optimizer_bytes"] = held.optimizer
        r["predicted_state_bytes"] = predicted = held.params + held.grads + held.optimizer
        state = r["param_bytes"] + r["grad_bytes"] + r["optimizer_bytes"]
        r["state_ratio"] = state / predicted if predicted else None


def add_arguments(p: argparse.ArgumentParser):
    """The scaling experiment's own flags (none clash with the engine's or `experiment`'s); the
    argument group."""
    g = p.add_argument_group("scaling")
    default_procs = ",".join(str(2**i) for i in range(8) if 2**i <= torch.cuda.device_count()) \
        if torch.cuda.is_available() else "1,2"
    g.add_argument("--procs", default=default_procs, metavar="LIST",
                   help="process counts to measure (default here: %(default)s)")
    g.add_argument("--modes", default="ddp,zero1,fsdp", metavar="LIST",
                   help=f"--parallel modes to measure, of {', '.join(MODES)} (default: "
                   "%(default)s)")
    g.add_argument("--predict-only", action="store_true",
                   help="skip the measured runs; predict the --model given (yours or bundled, "
                   "counted in one step here), else the --predict-models")
    g.add_argument("--predict-models", default=",".join(s.label for s in SPECS), metavar="LIST",
                   help="bundled reference sizes to predict for; with --predict-only, not with "
                   "--model (default: %(default)s); the measured mode predicts the model it "
                   "measures")
    g.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                   help="GPUs per node of the prediction (default: 8)")
    g.add_argument("--nodes", default="1,2", metavar="LIST",
                   help="node counts of the prediction (default: 1,2)")
    g.add_argument("--intra", default="nvlink4", metavar="LINK",
                   help=f"link within a node: {', '.join(LINKS)} or GB/s (default: nvlink4)")
    g.add_argument("--inter", default="ib-ndr", metavar="LINK",
                   help="link between nodes, per GPU (default: ib-ndr)")
    g.add_argument("--latency-us", type=float, default=5.0, metavar="US",
                   help="latency per ring step (default: 5)")
    g.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilization assumed for "
                   "compute (default: 0.4)")
    g.add_argument("--peak-tflops", type=float, default=H100_BF16 / 1e12, metavar="TF",
                   help="peak FLOP/s of one GPU, in TFLOP/s (default: H100 SXM bf16, 989)")
    g.add_argument("--step-floor-ms", type=float, default=0.3, metavar="MS",
                   help="shortest step assumed: eager launch overhead (default: 0.3)")
    g.add_argument("--gpu-memory-gb", type=float, default=80.0, metavar="GIB",
                   help="memory of one GPU for the layout choice, GiB (default: 80, H100 SXM)")
    return g


def scaling(args: argparse.Namespace) -> int:
    """`fasttrain experiment scaling`: the measured rows (unless --predict-only), then the
    predicted ones; tables, and the JSON with --json."""
    from rich.console import Console

    from fasttrain import report
    from fasttrain.engine.configfile import from_args
    from fasttrain.env import env_block, hardware_line
    from fasttrain.models import MODEL_KINDS

    for flag in ("mfu", "peak_tflops", "step_floor_ms", "latency_us", "gpu_memory_gb"):
        if not math.isfinite(getattr(args, flag)):
            raise UserError(f"--{flag.replace('_', '-')} must be a finite number, got "
                            f"{getattr(args, flag)}")
    if not 0 < args.mfu <= 1:
        raise UserError(f"--mfu must be in (0, 1], got {args.mfu}")
    for flag in ("gpus_per_node", "steps"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be ≥ 1, got {getattr(args, flag)}")
    if args.peak_tflops <= 0 or args.step_floor_ms < 0 or args.latency_us < 0:
        raise UserError("--peak-tflops must be > 0, --step-floor-ms and --latency-us ≥ 0")
    if args.gpu_memory_gb <= 0:
        raise UserError(f"--gpu-memory-gb must be > 0, got {args.gpu_memory_gb}")
    if args.json:
        report.check_writable(args.json, "--json")
    intra, inter = link(args.intra, args.latency_us), link(args.inter, args.latency_us)
    labels = _names("--predict-models", args.predict_models, [s.label for s in SPECS])
    nodes = positive_ints("--nodes", args.nodes, "1,2")
    modes = _names("--modes", args.modes, MODES)
    procs = positive_ints("--procs", args.procs, "1,2")
    cfg = from_args(args)
    refuse_run_directory(cfg, "experiment scaling")
    ranks: dict = {}
    if args.predict_only:
        cfg, configured, counted = _configured(args, cfg)
    else:
        cfg.validate(MODEL_KINDS)  # the base switches; each run re-checks with its --parallel
        configured, counted, ranks = _measured_model(args, modes, procs)
    err = Console(stderr=True)
    env = env_block()
    err.print(f"[bold]fasttrain experiment scaling[/bold] on {hardware_line(env)}")
    options = {"steps": args.steps, "procs": procs, "modes": modes, "mfu": args.mfu,
               "peak_tflops": args.peak_tflops, "step_floor_ms": args.step_floor_ms,
               "latency_us": args.latency_us, "gpus_per_node": args.gpus_per_node,
               "nodes": nodes, "intra": asdict(intra), "inter": asdict(inter),
               "gpu_memory_gb": args.gpu_memory_gb, "counted": counted}
    if counted and "error" in counted:
        err.print(f"no prediction for the measured model: {counted['error']}")
    rows = [] if args.predict_only else measure_all(cfg, modes, procs, args.steps)
    _beside(rows, ranks)
    # (label, batch per GPU, layout_choice.Model): the configured or measured model, or (with
    # --predict-only alone) the bundled specs
    models = configured or ([] if rows else [(s.label, s.batch, layout_choice.model_of(s))
                                             for s in SPECS if s.label in labels])
    peak, floor_s = args.peak_tflops * 1e12, args.step_floor_ms / 1e3
    predicted = [predict_counted(label, batch, m.params, m.flops_per_sample * batch,
                                 args.gpus_per_node, k, intra, inter, args.mfu, peak, floor_s)
                 for label, batch, m in models for k in nodes]
    choices = [layout_choice.choose(label, batch, m, args.gpus_per_node, k, intra, inter,
                                    args.mfu, peak, floor_s, int(args.gpu_memory_gb * 2**30))
               for label, batch, m in models for k in nodes]
    result = {"schema": SCHEMA, "experiment": "scaling", "env": env, "config": cfg.to_dict(),
              "options": options, "rows": rows, "predicted": predicted, "layouts": choices}
    console = report.wide_console()
    if rows:
        console.print(measured_table(result))
    if models:
        console.print(predicted_table(result))
        console.print(layouts_table(result))
    if args.json:
        report.write_json(args.json, result)
        err.print(f"wrote {args.json}")
    return 0

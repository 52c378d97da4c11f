"""Which cut of a GPU row to run: every Variant in a row's `SWEEP`, through the bench's own
harness, one table a row.

- `triton-fused` (15): pixels a program (32, 64 or 128: 25, 13 or 7 programs a step), 4 or 8
  warps, tl.dot in exact fp32 ("ieee") or fp32 emulated on tensor cores ("tf32x3"); three
  launched with programmatic dependent launch (Hopper+: a step's kernel starts while the one
  before ends, its batch gathered before it waits).
- `torch-graphs` (20): the BLAS library PyTorch calls for the step's two GEMMs (cuBLAS or
  cuBLASLt, whose heuristics pick different kernels at these shapes) and the weight's storage
  order ([10, 785] or [785, 10]: the operands' transposes, which the heuristics also read); and
  10 steps torch.compile generates (Inductor's kernels in the same epoch graph: the GEMMs
  autotuned against Triton templates, the products as broadcast-multiply + sum reductions, 3
  kernels a step, or as one reduction a class, 2 kernels a step; W or Wᵀ storage; two with
  Inductor's programmatic dependent launch); and the
  lagged-Gram blocks of L = 4, 8, 16 steps (torch_lagged.py), eager ops or one compiled call a
  block.
- `torch-optimized` (6): eager v4 and torch.compile(mode="reduce-overhead") of 7, 34 or 67
  steps a call, replayed by CUDA graph trees (torch_compiled.py).

The compiled variants spend their setup compiling (and autotuning): seconds to minutes each on
a GPU host, where the others take well under a second. `--steps eager` sweeps the others alone;
`--steps compiled` the compiled ones; each with every row's default to compare them with.

Each variant is a row of `fasttrain bench` in all but name: checked first against the float64
reference step (a variant that fails is reported failed and never timed), then set up (compiled,
the epoch captured as a CUDA graph), timed over every epoch with the device synchronized at each
clock read, and evaluated on the test set. Each table's speed-up column is against that row's
current variant (its module's `DEFAULT`); the fastest that passes becomes the next default.
A variant that faults the device (a sticky CUDA error: the rest of the process cannot use CUDA)
is reported failed, and the variants not yet finished are swept again in a fresh process
(`--variant TAG`, repeatable, sweeps only those). `--json` is rewritten after each variant, so a
sweep cut short (gpu-check's time limit) keeps the variants it finished. Its config names each
swept Variant's arguments (`variants`), so that a winner can be written back as its row's
`DEFAULT` (scripts/gpu-loan does).

    FASTTRAIN_DATA=DIR PYTHONPATH=src python benchmarks/variant_sweep.py \\
        [--rows triton-fused,torch-graphs,torch-optimized] [--steps all|eager|compiled]
        [--variant TAG ...] [--epochs 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass, fields
from itertools import zip_longest

import torch

from fasttrain import ladder
from fasttrain.env import env_block, hardware_line

# The rows whose module has DEFAULT, SWEEP and a Variant (`compiled` where torch.compile makes it).
ROWS = ("triton-fused", "torch-graphs", "torch-optimized")
STEPS = ("all", "eager", "compiled")


@dataclass(frozen=True)
class VariantEntry(ladder.Entry):
    """A row with another Variant, named by it."""

    variant: object = None

    def load(self):
        base = super().load()
        return type(base.__name__, (base,), {"variant": self.variant, "name": self.name,
                                             "__module__": base.__module__})


def module(row: str):
    """The module of a swept row (its DEFAULT and SWEEP)."""
    return importlib.import_module(ladder.entry(row).load().__module__)


def label(row: str, variant) -> str:
    return f"{row} [{variant.tag}]"


def picked(row: str, v, steps: str) -> bool:
    """Whether `steps` ("all", "eager" or "compiled") sweeps `v`: each keeps the row's DEFAULT
    too, the baseline of its table."""
    compiled = getattr(v, "compiled", False)
    return steps == "all" or compiled == (steps == "compiled") or v == module(row).DEFAULT


def entries(rows=ROWS, tags=None, steps="all") -> list[VariantEntry]:
    """Every variant of `rows` that `steps` picks, or those whose tag is in `tags` (each then
    runs alone, so that a variant that faults the device cannot take the others down with
    it), in the order they run: every row's DEFAULT first (each table's baseline), then the
    rows taken in turn, each in its SWEEP's order. A sweep cut by its time limit (minutes of
    compiling a variant) thus keeps the baselines and the first of every row's SWEEP, not one
    row's whole SWEEP and nothing of the next."""
    chosen = {row: [v for v in module(row).SWEEP
                    if (v.tag in tags if tags is not None else picked(row, v, steps))]
              for row in rows}
    first = [(row, v) for row in rows for v in chosen[row] if v == module(row).DEFAULT]
    rest = [[(row, v) for v in chosen[row] if v != module(row).DEFAULT] for row in rows]
    turns = [pair for turn in zip_longest(*rest) for pair in turn if pair is not None]
    return [VariantEntry(label(row, v), ladder.entry(row).target,
                         picks_device=ladder.entry(row).picks_device, variant=v)
            for row, v in first + turns]


def variant_args(todo: list[VariantEntry]) -> dict[str, dict]:
    """{row label: {"row", "args"}}: each swept Variant's fields that differ from their
    defaults, so that a winner can be written back as its module's DEFAULT
    (scripts/gpu-loan: `Variant(**args)`)."""
    return {e.name: {"row": e.name.split(" [", 1)[0],
                     "args": {f.name: getattr(e.variant, f.name) for f in fields(e.variant)
                              if getattr(e.variant, f.name) != f.default}}
            for e in todo}


def fresh_process(todo: list[VariantEntry], rows: list[str], args) -> list[dict]:
    """`todo` swept again in a new process (after a variant left this one's CUDA unusable),
    their rows read from its JSON; one that faults there too is handed on the same way."""
    from fasttrain import bench

    argv = [sys.executable, __file__, "--rows", ",".join(rows), "--data", args.data,
            "--epochs", str(args.epochs),
            *(a for e in todo for a in ("--variant", e.variant.tag))]
    return bench.child_rows(argv, todo)[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default=",".join(ROWS),
                    help=f"comma-separated rows to sweep (default: {','.join(ROWS)})")
    ap.add_argument("--data", default="mnist", choices=("mnist", "synthetic"))
    ap.add_argument("--epochs", type=int, default=10, help="timed epochs of each variant")
    ap.add_argument("--json", metavar="PATH", help="write the rows here (the bench's schema)")
    ap.add_argument("--steps", default="all", choices=STEPS,
                    help="all variants, the eager ones (no torch.compile: quick to set up), or "
                         "the compiled ones and each row's default")
    ap.add_argument("--variant", action="append", metavar="TAG",
                    help="sweep only the variant of this tag, e.g. '64, 8w, ieee' (repeatable)")
    args = ap.parse_args(argv)
    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown or not rows:
        ap.error(f"--rows {args.rows}: the rows with variants are {', '.join(ROWS)}")
    if args.epochs < 1:
        ap.error(f"--epochs {args.epochs}: needs at least 1 timed epoch")
    tags = set(args.variant) if args.variant else None
    known = {v.tag for row in rows for v in module(row).SWEEP}
    if tags and not tags <= known:
        ap.error(f"--variant {', '.join(sorted(tags - known))}: the tags of {args.rows} are "
                 + "; ".join(sorted(known)))
    from fasttrain import report
    from fasttrain.errors import UserError

    try:
        report.check_outputs((args.json, "--json"))  # before the GPU time, not after
    except UserError as e:
        ap.error(str(e))
    if not torch.cuda.is_available():
        print("variant_sweep: needs a CUDA GPU (each variant's epoch is a CUDA graph)",
              file=sys.stderr)
        return 2
    from rich.console import Console

    from fasttrain import bench
    from fasttrain.data import load_dataset

    console = Console(stderr=True)
    env = env_block()
    console.print(f"variant_sweep on {hardware_line(env)}")
    cfg = ladder.LadderConfig(epochs=args.epochs, device="cuda")
    dataset = load_dataset(args.data, None, seed=0)
    data = ladder.make_ladder_data(dataset, cfg)
    defaults = {row: label(row, module(row).DEFAULT) for row in rows}
    result = {"schema": bench.SCHEMA, "env": env,
              "config": {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                         "seed": cfg.seed, "data": dataset.name, "synthetic": dataset.synthetic,
                         "data_source": dataset.source, "device": "cuda", "repeats": 1,
                         "sweep": [f"{module(row).__name__}.SWEEP" for row in rows],
                         "steps": args.steps if tags is None else None,
                         "defaults": defaults},
              "rows": []}
    results = result["rows"]
    todo = entries(rows, tags, args.steps)
    result["config"]["variants"] = variant_args(todo)
    # One variant at a time, the JSON rewritten after each: minutes of compiling each, so a run
    # cut short by its caller's time limit (gpu-check's) keeps the variants it finished.
    while todo:
        if not bench.device_usable("cuda"):  # a variant before left the context faulted
            results += fresh_process(todo, rows, args)
            todo = []
        else:
            results += bench.run_rows(todo[:1], data, cfg, env, repeats=1, console=console,
                                      quiet=True, rerun=lambda t: fresh_process(t, rows, args))
            todo = todo[1:]
        if args.json:
            report.write_json(args.json, result)
    out = report.wide_console()
    for row in rows:
        mine = [r for r in results if r["impl"].startswith(f"{row} [")]
        out.print(report.bench_table({**result, "rows": mine}, baseline=defaults[row]))
    if args.json:
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

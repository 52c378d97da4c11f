"""Which cut of `triton-fused` to run: every Variant in `triton_fused.SWEEP` — pixels a program
(32, 64 or 128: 25, 13 or 7 programs a step), 4 or 8 warps, tl.dot in exact fp32 ("ieee") or
fp32 emulated on tensor cores ("tf32x3") — through the bench's own harness, one table.

Each variant is a row of `fasttrain bench` in all but name: checked first against the float64
reference step (a variant that fails is reported failed and never timed, tf32x3 included), then
set up (Triton compiles it; the epoch is captured as a CUDA graph), timed over every epoch with
the device synchronized at each clock read, and evaluated on the test set. The speed-up column is
against the row's current variant (`triton_fused.DEFAULT`); the winner becomes the next default.

    FASTTRAIN_DATA=DIR PYTHONPATH=src python benchmarks/triton_sweep.py [--epochs 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

from fasttrain import ladder
from fasttrain.env import env_block, hardware_line

NAME = "triton-fused"


@dataclass(frozen=True)
class VariantEntry(ladder.Entry):
    """The triton-fused row with another Variant, named by it."""

    variant: object = None

    def load(self):
        base = super().load()
        return type(base.__name__, (base,), {"variant": self.variant, "name": self.name,
                                             "__module__": base.__module__})


def entries() -> list[VariantEntry]:
    from fasttrain.ladder import triton_fused as tf

    target = ladder.entry(NAME).target
    return [VariantEntry(label(v), target, variant=v) for v in tf.SWEEP]


def label(v) -> str:
    return f"{NAME} [{v.block_k}, {v.num_warps}w, {v.precision}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="mnist", choices=("mnist", "synthetic"))
    ap.add_argument("--epochs", type=int, default=10, help="timed epochs of each variant")
    ap.add_argument("--json", metavar="PATH", help="write the rows here (the bench's schema)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("triton_sweep: needs a CUDA GPU (each variant's epoch is a CUDA graph)",
              file=sys.stderr)
        return 2
    from rich.console import Console

    from fasttrain import bench, report
    from fasttrain.data import load_dataset
    from fasttrain.ladder import triton_fused as tf

    console = Console(stderr=True)
    env = env_block()
    console.print(f"triton_sweep on {hardware_line(env)}")
    cfg = ladder.LadderConfig(epochs=args.epochs, device="cuda")
    data = ladder.make_ladder_data(load_dataset(args.data, None, seed=0), cfg)
    rows = bench.run_rows(entries(), data, cfg, env, repeats=1, console=console, quiet=True)
    result = {"schema": bench.SCHEMA, "env": env,
              "config": {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                         "seed": cfg.seed, "data": args.data, "device": "cuda", "repeats": 1,
                         "sweep": "triton_fused.SWEEP", "default": label(tf.DEFAULT)},
              "rows": rows}
    report.wide_console().print(report.bench_table(result, baseline=label(tf.DEFAULT)))
    if args.json:
        report.write_json(args.json, result)
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

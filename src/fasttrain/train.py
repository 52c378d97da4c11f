"""`fasttrain train`: train any model with any switch; never lose a run.

    fasttrain train --model cnn --data mnist --epochs 2 --precision bf16 --compile --out runs/cnn
    fasttrain train --config run.toml --lr 3e-4          # flags override the file
    fasttrain train --out runs/cnn --resume auto         # continue after preemption

Exit codes: 0 done; 2 bad input; 3 the loss became non-finite (last good checkpoint kept);
75 preempted by SIGTERM/SIGUSR1 after saving a checkpoint (requeue with --resume auto); 130
stopped by Ctrl-C after saving a checkpoint (a second Ctrl-C aborts at once).

One --out holds one run: an --out that already holds one is refused unless --resume is given,
and two processes never write the same --out at once (see engine/rundir.py).
"""

from __future__ import annotations

import argparse
import sys


def train_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.config import add_arguments

    p = sub.add_parser("train", help="train a model with any combination of speed switches",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=train)


def train(args: argparse.Namespace) -> int:
    from fasttrain.engine import Trainer
    from fasttrain.engine.config import from_args
    from fasttrain.engine.signals import StopSignals

    with StopSignals() as stop:  # from before setup: a signal during setup stops cleanly too
        return _fit(Trainer(from_args(args), stop=stop))


def _fit(trainer) -> int:
    from fasttrain.engine import Diverged, Preempted

    say = print if trainer.world.main else (lambda *a, **k: None)  # rank 0 speaks for all
    say(f"training {trainer.cfg.model} on {trainer.task.name}"
          f"{' (synthetic)' if trainer.task.synthetic else ''} on {trainer.device}, "
          f"{trainer.cfg.precision}, {trainer.total_steps} steps of {trainer.cfg.batch_size}",
          file=sys.stderr)
    try:
        last = trainer.fit()
    except (Preempted, Diverged) as e:
        print(f"stopped: {e}", file=sys.stderr)
        return e.exit_code
    evals = [r for r in trainer.history if r["kind"] == "eval"]
    if evals:
        summary = ", ".join(f"{k} {v:.4g}" for k, v in evals[-1].items()
                            if k.startswith("test_"))
        say(f"done at step {trainer.step}: {summary}")
    elif last:
        say(f"done at step {trainer.step}: loss {last.get('loss', float('nan')):.4g}")
    return 0

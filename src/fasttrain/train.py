"""`fasttrain train`: train any model with any switch; never lose a run.

    fasttrain train --model cnn --data mnist --epochs 2 --precision bf16 --compile --out runs/cnn
    fasttrain train --model mynets:make_net --data mydata:load --loss mse --out runs/mine
    fasttrain train --model mynets:make_lm --data mydata:load --step mysteps:lm_step \\
                    --optimizer mysteps:make_opt --scheduler mysteps:make_sched
    fasttrain train --config run.toml --lr 3e-4          # flags override the file
    fasttrain train --out runs/cnn --resume auto         # continue after preemption
    fasttrain train --out runs/cnn --resume auto --epochs 4   # extend a finished run
                                         # (the run's settings from runs/cnn/config.toml)

Exit codes: 0 done; 1 an exception in your own code (your frames and one line naming the model,
loss, step, dataset or factory that raised, and the batch; under torchrun, the other ranks
then say in one line that another process failed first); 2 bad input; 3 the loss became
non-finite (last good checkpoint kept); 75 preempted by SIGTERM/SIGUSR1 after saving a
checkpoint (requeue with --resume auto); 130 stopped by Ctrl-C after saving a checkpoint (a
second Ctrl-C aborts at once).

One --out holds one run: an --out that already holds one is refused unless --resume is given,
and two processes never write the same --out at once (see engine/rundir.py).
"""

from __future__ import annotations

import argparse
import sys

EXIT_PEER_FAILED = 1  # the run failed, as the rank that failed first: not bad input (2)


def train_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.configfile import add_arguments

    p = sub.add_parser("train", help="train a model with any combination of speed switches",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(func=train)


def train(args: argparse.Namespace) -> int:
    from fasttrain.engine.configfile import from_args
    from fasttrain.engine.distributed import peer_failure
    from fasttrain.engine.loop import Diverged, Preempted, fit
    from fasttrain.engine.run import build
    from fasttrain.engine.signals import StopSignals

    # Handlers from before setup: a signal during setup stops cleanly too.
    with StopSignals() as stop:
        try:
            run = build(from_args(args), signals=stop)  # prints what it resolved (rank 0)
            last = fit(run)
        except (Preempted, Diverged) as e:
            print(f"stopped: {e}", file=sys.stderr)
            return e.exit_code
        except Exception as e:  # under torchrun: another rank failed first, and said why
            line = peer_failure(e)
            if line is None:
                raise
            sys.stderr.write(f"error: {line}\n")  # one write: the ranks share stderr
            return EXIT_PEER_FAILED
    say = print if run.main else (lambda *a, **k: None)  # rank 0 speaks for all
    # With progress on, fit() has said it; with nothing to train, its one line said it.
    if run.stop and last and not run.cfg.progress:
        say(run.stop, file=sys.stderr)
    evals = [r for r in run.history if r["kind"] == "eval"]
    if evals:
        summary = ", ".join(f"{k} {v:.4g}" for k, v in evals[-1].items()
                            if k.startswith(("test_", "val_")))
        say(f"done at step {run.step}: {summary}")
    elif last:
        say(f"done at step {run.step}: loss {last.get('loss', float('nan')):.4g}")
    return 0

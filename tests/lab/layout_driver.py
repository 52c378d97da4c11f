"""Builds gpt (with --user, tests/engine/userblocks.py's residual MLP) through the engine under
torchrun (--tp or --pp from the flags), takes one optimizer step, then runs one more forward
and backward so that gradients exist beside the optimizer state, and writes what this rank
holds to DIR/rank<r>.json, for tests/lab/test_layout_memory.py:

    torchrun --standalone --nproc-per-node 2 tests/lab/layout_driver.py DIR --tp 2
    torchrun --standalone --nproc-per-node 4 tests/lab/layout_driver.py DIR --tp 2 --parallel fsdp
    torchrun --standalone --nproc-per-node 2 tests/lab/layout_driver.py DIR --tp 2 --user

Several layouts of one process count run one after the other in one launch (each built from
the seed, into DIR/NAME/): `--case NAME "FLAGS"`, repeated, e.g.

    torchrun --standalone --nproc-per-node 2 tests/lab/layout_driver.py DIR \\
        --case tp2 "--tp 2" --case fsdp2 "--parallel fsdp"

The driver then holds the process group itself and every build joins it (a torchrun launch
costs its processes' start-up and torch import: seconds each on a busy 2-core machine).
`case(["DIR", *FLAGS])` measures one layout into DIR, as a command of the session's shared
launch (tests/engine/launch.py, runs_driver.py's "call"): what test_layout_memory runs.

Bytes are the storages of this rank's local tensors (a DTensor's shard, not its global shape),
each storage counted once: parameters, gradients, and every tensor of the optimizer state
(AdamW's moments and its 0-dim step counters). The same figures by numel × element size are
written beside them, so that a shard that kept its whole tensor's storage would show.
"""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import torch

from fasttrain.engine import build
from fasttrain.engine.loop import endless_batches, step

CONFIG = dict(model="gpt", data="synthetic-text", block_size=32, batch_size=8,
              optimizer="adamw", seed=0, device="cpu", deterministic=True)
# `--user`: a model of a user's with a plain parallelize (no sequence parallelism)
USER = dict(model="tests.engine.userblocks:make", data="tests.engine.userblocks:data",
            batch_size=32, optimizer="sgd", seed=0, device="cpu", deterministic=True)


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def held(tensors) -> dict[str, int]:
    tensors = [local(t) for t in tensors if t is not None]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return {"storage": sum(storages.values()),
            "numel": sum(t.numel() * t.element_size() for t in tensors)}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--parallel", default="none")
    ap.add_argument("--pp-schedule", default="1f1b")
    ap.add_argument("--user", action="store_true", help="tests/engine/userblocks.py, not gpt")
    return ap


def main() -> None:
    ap = parser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--case", nargs=2, action="append", metavar=("NAME", "FLAGS"),
                    help="a layout of its own, into OUT/NAME (its flags as one argument)")
    args = ap.parse_args()
    torch.set_num_threads(1)  # two processes on a shared 2-core machine
    if not args.case:
        measure(args, args.out)
        return
    import torch.distributed as dist

    dist.init_process_group("gloo")  # held here: each build joins it, none destroys it
    for name, flags in args.case:
        measure(parser().parse_args(shlex.split(flags)), args.out / name)
    dist.barrier()
    dist.destroy_process_group()


def case(argv: list[str]) -> int:
    """One layout, `argv` = [DIR, *FLAGS], measured into DIR (in a process group that is
    already there: runs_driver's)."""
    out, *flags = argv
    measure(parser().parse_args(flags), Path(out))
    return 0


def measure(args: argparse.Namespace, out: Path) -> None:
    """Build the layout of `args`, take a step and a forward/backward, write out/rank<r>.json."""
    run = build(tp=args.tp, pp=args.pp, parallel=args.parallel, pp_schedule=args.pp_schedule,
                verbose=False, **(USER if args.user else CONFIG))
    batches = endless_batches(run)
    step(run, next(batches))  # the optimizer state exists after a real step
    owned = {local(t).untyped_storage().data_ptr()
             for t in [*run.model.parameters(), *run.model.buffers()]}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = local(t).untyped_storage()
        if s.data_ptr() not in owned:
            saved.setdefault(s.data_ptr(), s.nbytes())
        return t

    # The gradients after a backward; and what the forward saved for it (storages, each once,
    # parameters aside: as lab/memory counts one process). Under a pipeline the schedule runs
    # its m micro-batches here: gpipe runs every forward before any backward, so all of them
    # are alive at once and the count is what the stage holds at its peak; under 1f1b a freed
    # storage's address can come back for a later micro-batch, which a count by address merges.
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run.forward_backward(run, next(batches))
    inner = getattr(run.opt, "optim", run.opt)  # ZeRO-1: this rank's partition's optimizer
    params = list({id(p): p for p in run.model.parameters()}.values())
    result = {"params": held(params), "grads": held(p.grad for p in params),
              "optimizer": held(v for s in inner.state.values() for v in s.values()
                                if torch.is_tensor(v)),
              "saved": sum(saved.values())}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{run.world.rank}.json").write_text(json.dumps(result))
    run.world.close()  # destroys the group only where this run created it
    run.restore_flags()  # --deterministic's, as a run that ends puts them back (loop.fit)


if __name__ == "__main__":
    main()

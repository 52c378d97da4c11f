"""Runs several `fasttrain train` commands one after the other in the processes of one torchrun
launch, for tests/engine/test_distributed.py:

    torchrun --standalone --nproc-per-node 2 -m tests.engine.runs_driver \\
        '["train", "--parallel", "ddp", ...]' '["train", "--parallel", "fsdp", ...]'

Each argument is one command's argv (JSON). The driver holds the process group (gloo) and each
run joins it, as under a launcher that set it up (engine/distributed.init: the engine closes
only a group it created), so a run is built, trained, checkpointed and written as it would be
alone, from its seed. What is shared is only the processes: a torchrun launch costs the start-up
and torch import of each of them, seconds on a busy 2-core machine (CI runs close to its 20
minutes). The exit code is the first non-zero command's, after which nothing more runs.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from fasttrain.cli import main


def run(commands: list[list[str]]) -> int:
    dist.init_process_group("gloo")
    for argv in commands:
        code = main(argv)
        if code:
            return code  # the peers fail alike (the same command), or time out in a collective
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(run([json.loads(a) for a in sys.argv[1:]]))

"""Runs several `fasttrain train` commands one after the other in the processes of one torchrun
launch, for tests/engine/test_distributed.py (and, with --record, tests/engine/launch.py's
shared launches):

    torchrun --standalone --nproc-per-node 2 -m tests.engine.runs_driver \\
        '["train", "--parallel", "ddp", ...]' '["train", "--parallel", "fsdp", ...]'

Each argument is one command's argv (JSON), or {"argv": argv, "env": {NAME: value}} for one
that runs with those environment variables set (and then restored), as a launch of its own
with them would (a test dataset that writes what it reads to $FT_SEEN, say). The driver holds
the process group (gloo) and each run joins it, as under a launcher that set it up
(engine/distributed.init: the engine closes only a group it created), so a run is built,
trained, checkpointed and written as it would be alone, from its seed. What is shared is only
the processes: a torchrun launch costs the start-up and torch import of each of them, seconds
on a busy 2-core machine (CI runs close to its 20 minutes). The exit code is the first
non-zero command's, after which nothing more runs.

With `--record DIR` (first), each command's outcome is written to DIR/<i>/rank<r>.json: its
exit code, what it printed, what torch.compile did (dynamo's counters: frames and graphs
captured, graph breaks, AOTAutograd graphs) and its seconds. Each command compiles afresh
(torch._dynamo.reset), as in a launch of its own; the flags a run sets process-wide
(--deterministic's) it puts back itself as it ends (engine/switches.process_flags). One that
stops with a UserError (exit 2) does not stop the ones after it: that error is raised on every
rank at the same point (engine/agree.py), so the ranks go on in step. Any other failure still
ends the launch.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
from pathlib import Path

import torch.distributed as dist

from fasttrain.cli import main
from fasttrain.errors import UserError


def run(commands: list[list[str] | dict], record: Path | None = None) -> int:
    dist.init_process_group("gloo")
    for i, command in enumerate(commands):
        argv, env = ((command["argv"], command["env"]) if isinstance(command, dict)
                     else (command, {}))
        with environ(env):
            code = main(argv) if record is None else recorded(argv, record / str(i))
        if code and not (record is not None and code == UserError.exit_code):
            return code  # the peers fail alike (the same command), or time out in a collective
    dist.barrier()
    dist.destroy_process_group()
    return 0


@contextlib.contextmanager
def environ(env: dict[str, str]):
    """os.environ with `env` set, as before afterwards."""
    before = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def groups():
    """The process groups a command makes (its DeviceMesh's) are destroyed after it, and the
    count torch names unnamed groups by ("1", "2", ...) is put back: the next command's groups
    get the names they would get in a launch of their own. A compiled graph holds the names of
    the groups its collectives use (--tp's funcol), and Inductor's on-disk caches key on the
    graph: with a name that grew with every command, no compiled command of a shared launch
    ever found a graph compiled before (AOTAutograd's cache: 2 misses in each --tp --compile
    run; with the names put back, the 2nd of two identical runs hits both)."""
    from torch.distributed import distributed_c10d as c10d

    before, count = set(c10d._world.pg_names), c10d._world.group_count
    try:
        yield
    finally:
        made = [pg for pg in c10d._world.pg_names if pg not in before]
        if made:
            dist.barrier()  # no rank is still in a collective of one of them
            for pg in made:
                dist.destroy_process_group(pg)
        c10d._world.group_count = count


def recorded(argv: list[str], out: Path) -> int:
    """main(argv), its output captured (and still printed) and written with its exit code."""
    if "torch._dynamo" in sys.modules:  # what earlier commands compiled is forgotten
        from torch import _dynamo
        from torch._dynamo.utils import counters

        _dynamo.reset()
        counters.clear()
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), groups():
            code = main(argv)
    finally:  # the launch's log has it too (and then the traceback, if main raised)
        sys.stdout.write(stdout.getvalue())
        sys.stderr.write(stderr.getvalue())
    seen = {}
    if "torch._dynamo" in sys.modules:
        from torch._dynamo.utils import counters

        seen = {group: dict(values) for group, values in counters.items()}
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ['RANK']}.json").write_text(json.dumps({
        "code": code, "stdout": stdout.getvalue(), "stderr": stderr.getvalue(), "dynamo": seen,
        "seconds": time.perf_counter() - start}))
    return code


if __name__ == "__main__":
    args, record = sys.argv[1:], None
    if args[:1] == ["--record"]:
        args, record = args[2:], Path(args[1])
    raise SystemExit(run([json.loads(a) for a in args], record))

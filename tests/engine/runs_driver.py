"""Runs several `fasttrain train` commands one after the other in the processes of one torchrun
launch, for tests/engine/launch.py's shared launches (with --record):

    torchrun --standalone --nproc-per-node 2 -m tests.engine.runs_driver \\
        '["train", "--parallel", "ddp", ...]' '["train", "--parallel", "fsdp", ...]'

Each argument is one command's argv (JSON), or {"argv": argv, "env": {NAME: value}} for one
that runs with those environment variables set (and then restored), as a launch of its own
with them would (a test dataset that writes what it reads to $FT_SEEN, say); with "call":
"pkg.module:function" in it, that function(argv) → exit code runs instead of fasttrain's main
(tests/lab/layout_driver.case: a build measured, not trained). The driver holds
the process group (gloo) and each run joins it, as under a launcher that set it up
(engine/distributed.init: the engine closes only a group it created), so a run is built,
trained, checkpointed and written as it would be alone, from its seed. What is shared is only
the processes: a torchrun launch costs the start-up and torch import of each of them, seconds
on a busy 2-core machine (CI runs close to its 20 minutes). The exit code is the first
non-zero command's, after which nothing more runs.

With `--record DIR` (first), each command's outcome is written to DIR/<i>/rank<r>.json: its
exit code, what it printed, what torch.compile did (dynamo's counters: frames and graphs
captured, graph breaks, AOTAutograd graphs) and its seconds. Each command compiles afresh
(torch._dynamo.reset), as in a launch of its own; the flags a command sets process-wide
(--deterministic's) are put back after it (engine/switches.process_flags: a run does it itself as
it ends, the driver does it for every command, a "call"'s function included). One that
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
from fasttrain.engine.inputs import import_object
from fasttrain.engine.switches import process_flags
from fasttrain.errors import UserError


def run(commands: list[list[str] | dict], record: Path | None = None) -> int:
    dist.init_process_group("gloo")
    for i, command in enumerate(commands):
        if isinstance(command, dict):
            argv, env = command["argv"], command.get("env", {})
            entry = import_object(command["call"], "call") if command.get("call") else main
        else:
            argv, env, entry = command, {}, main
        restore = process_flags()  # a called function's flags too: the next command's are its own
        try:
            with environ(env):
                code = entry(argv) if record is None else recorded(argv, record / str(i), entry)
        finally:
            restore()
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


def recorded(argv: list[str], out: Path, entry=main) -> int:
    """entry(argv) (fasttrain's main), its output captured (and still printed) and written
    with its exit code."""
    if "torch._dynamo" in sys.modules:  # what earlier commands compiled is forgotten
        from torch import _dynamo
        from torch._dynamo.utils import counters

        _dynamo.reset()
        counters.clear()
    stdout, stderr = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = entry(argv)
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

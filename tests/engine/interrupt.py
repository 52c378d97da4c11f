"""`python -m tests.engine.interrupt SIGNAL STEP -- <fasttrain train args>`: run `fasttrain train`
and interrupt it at a known point, with no timing involved (a test helper, not part of the
product):

  SIGTERM / SIGUSR1 / SIGINT: the process signals itself right after checkpoint STEP is complete
    (the run then stops at that step boundary, as with a scheduler's warning);
  SIGINT2: two Ctrl-C in a row there (the second aborts at once);
  SIGKILL: the process kills itself in the middle of writing the checkpoint after STEP, leaving
    that write's temp file half-written, as a power cut or the OOM killer would.
"""

import os
import signal
import sys

from fasttrain.engine import checkpoint
from fasttrain.files import write_atomic


def main() -> int:
    name, step, argv = sys.argv[1], int(sys.argv[2]), sys.argv[sys.argv.index("--") + 1:]
    sent: list[str] = []

    def write(path, data):
        number = int(path.name[5:13])
        if name == "SIGKILL" and number > step:
            def cut_short(f):
                f.write(b"PK\x03\x04 cut short")
                f.flush()
                os.kill(os.getpid(), signal.SIGKILL)
            return write_atomic(path, cut_short)
        write_atomic(path, data)
        if number == step and name != "SIGKILL" and not sent:  # once: the stop saves STEP again
            sent.append(name)
            for s in ("SIGINT", "SIGINT") if name == "SIGINT2" else (name,):
                os.kill(os.getpid(), getattr(signal, s))

    checkpoint.write_atomic = write  # the checkpoint writer's own reference
    from fasttrain.cli import main as cli

    return cli(["train", *argv])


if __name__ == "__main__":
    raise SystemExit(main())

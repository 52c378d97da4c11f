"""`python -m tests.engine.interrupt SIGNAL STEP [--rank R | --launcher N] -- <train args>`: run
`fasttrain train` and interrupt it at a known point, with no timing involved (a test helper, not
part of the product).

One process (no option):
  SIGTERM / SIGUSR1 / SIGINT: the process signals itself right after checkpoint STEP is complete
    (the run then stops at that step boundary, as with a scheduler's warning);
  SIGINT2: two Ctrl-C in a row there (the second aborts at once);
  SIGKILL: the process kills itself in the middle of writing the checkpoint after STEP, leaving
    that write's temp file half-written, as a power cut or the OOM killer would.

Under torchrun (this module is the worker: `torchrun ... -m tests.engine.interrupt ...`), at the
end of step STEP on every rank — after that step's checkpoint if it has one, before the ranks
check for a stop:
  --rank R: rank R sends SIGNAL to itself (SIGKILL: it dies there, as a crashed worker would);
    in the first attempt only (TORCHELASTIC_RESTART_COUNT 0), so a group torchrun restarts runs
    on undisturbed;
  --launcher N: rank 0 sends SIGNAL to its N-th ancestor (1: torchrun; 2: what started torchrun,
    e.g. a batch script), and every rank waits there until the signal, forwarded, has reached it.
    STEP being a log step, the ranks then agree to stop at STEP itself. A signal that never comes
    (a launcher that died of it, or does not forward it) fails the test rather than hanging it:
    the ranks go on once the launcher is gone, or after WAIT seconds, and the run ends unstopped.
"""

import os
import signal
import sys
import time
from pathlib import Path

from fasttrain.engine import callbacks, checkpoint
from fasttrain.files import write_atomic

WAIT = 120  # s: a hang guard only; a forward takes milliseconds, and no passing run reaches it


def parent(pid: int) -> int:
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def alive(pid: int) -> bool:
    """`pid` runs (not exited, not a zombie waiting for its parent to reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def one_process(name: str, step: int) -> None:
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


def under_torchrun(name: str, step: int, how: str, value: int) -> None:
    sig, stop_check = getattr(signal, name), callbacks.Preemption.on_step
    launcher = os.getpid()
    for _ in range(value if how == "--launcher" else 0):
        launcher = parent(launcher)  # found now, while every ancestor still runs

    def on_step(self, run) -> None:
        if run.step == step:
            if how == "--rank":
                if run.world.rank == value and run.world.restarts == 0:
                    os.kill(os.getpid(), sig)
            else:
                if run.world.main:
                    os.kill(launcher, sig)
                deadline = time.monotonic() + WAIT
                # Waits for an event (the handler's flag, signals.py); the poll interval only
                # sets how soon it is seen.
                while (not run.signals.requested and alive(launcher)
                       and time.monotonic() < deadline):
                    time.sleep(0.01)
        stop_check(self, run)

    callbacks.Preemption.on_step = on_step  # runs after the Checkpointer's on_step


def main() -> int:
    name, step, argv = sys.argv[1], int(sys.argv[2]), sys.argv[sys.argv.index("--") + 1:]
    options = sys.argv[3:sys.argv.index("--")]
    if options:
        how, value = options
        assert how in ("--rank", "--launcher"), options
        under_torchrun(name, step, how, int(value))
    else:
        one_process(name, step)
    from fasttrain.cli import main as cli

    return cli(["train", *argv])


if __name__ == "__main__":
    raise SystemExit(main())

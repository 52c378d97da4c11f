"""`python -m tests.engine.interrupt STEP SIGNAL <fasttrain args>`: `fasttrain` whose process
sends itself SIGNAL right after optimizer step STEP — a preemption or a kill at a chosen step,
delivered the same way on a fast or a slow machine (no sleeps)."""

import os
import signal
import sys

from fasttrain.cli import main
from fasttrain.engine import callbacks


class SignalAt:
    def __init__(self, step: int, signum: int):
        self.step, self.signum = step, signum

    def on_step(self, run) -> None:
        if run.step == self.step:
            os.kill(os.getpid(), self.signum)


if __name__ == "__main__":
    at, signum = int(sys.argv[1]), getattr(signal, sys.argv[2])
    standard = callbacks.standard
    callbacks.standard = lambda run: [*standard(run), SignalAt(at, signum)]
    raise SystemExit(main(sys.argv[3:]))

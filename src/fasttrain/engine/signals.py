"""Stop requests from outside: a scheduler's SIGTERM / SIGUSR1, a user's Ctrl-C (SIGINT).

    stop = StopSignals()
    with stop:                       # install (re-entrant: nested `with` is a no-op)
        ...                          # build the run, train
        if stop.requested: ...       # checked at step boundaries, where the state is consistent

A handler only records the signal: the loop checkpoints at the next step boundary and exits
(75 for SIGTERM/SIGUSR1, so a scheduler requeues; 130 for Ctrl-C). A second Ctrl-C means "now":
it raises KeyboardInterrupt at once (the last complete checkpoint is kept, nothing half-written
is ever resumed from). Installed before the run is built, so a signal that arrives during
setup, before the first step, stops the run cleanly too instead of killing it.
"""

from __future__ import annotations

import signal

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: "try again later"
EXIT_INTERRUPTED = 130  # 128 + SIGINT, what shells report for Ctrl-C
WANTED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGUSR1", "SIGINT") if hasattr(signal, n))


class StopSignals:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}
        self._depth = 0

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def exit_code(self) -> int:
        return EXIT_INTERRUPTED if self.signum == signal.SIGINT else EXIT_PREEMPTED

    def _handle(self, signum: int, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # the second Ctrl-C: abort at once
        if self.signum is None or signum == signal.SIGINT:
            self.signum = signum

    def __enter__(self) -> StopSignals:
        self._depth += 1
        if self._depth == 1:
            try:
                self._previous = {s: signal.signal(s, self._handle) for s in WANTED}
            except ValueError:  # not the main thread: leave signals to the caller
                self._previous = {}
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for s, handler in self._previous.items():
                signal.signal(s, handler)
            self._previous = {}

    def message(self, step: int, saved: bool) -> str:
        """What a stopped run tells the user: where it stopped and whether it can continue."""
        name = f"signal {signal.Signals(self.signum).name}" if self.signum else "a stop request"
        if step == 0:
            return f"{name}: stopped before the first step; nothing to save yet"
        if saved:
            return (f"{name}: checkpoint saved at step {step}; run again with --resume auto to "
                    f"continue")
        return (f"{name}: stopped at step {step}; nothing was saved (no --out was given) — give "
                f"--out DIR to be able to resume")

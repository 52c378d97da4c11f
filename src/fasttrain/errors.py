"""The exception types the CLI turns into short output: bad input, and a crash in user code.

A `UserError` carries a single line that names what is wrong and how to fix it. The CLI prints it
and exits with status 2, without a traceback; every other exception is an internal error and keeps
its traceback.
"""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config, a checkpoint): one line, exit code 2."""

    exit_code = 2


class UserCodeError(Exception):
    """An exception raised in the user's own code (model, loss, step, dataset, factories): str()
    is one line naming the callable and the batch; `frames` the user's frames as text, which
    the CLI prints before it (engine/usercode.py). Exit code 1, as a crashed Python program."""

    exit_code = 1

    def __init__(self, line: str, frames: str):
        super().__init__(line)
        self.frames = frames

    def report(self) -> str:
        return f"{self.frames}{self}\n"


def first_line(error: BaseException) -> str:
    """The first line of `error`'s message for a one-line report, or its type's name when the
    message is empty (a bare `KeyError()`, some of torch's errors)."""
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__

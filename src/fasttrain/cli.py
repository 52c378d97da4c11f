"""The one entry point: `fasttrain <command>` and `python -m fasttrain <command>`.

Each command lives in its own module and exposes two functions, `<cmd>_parser(subparsers)`
which adds its sub-parser, and `<cmd>(args) -> int` which runs it. This root only registers them,
parses, and turns a `UserError` into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from fasttrain import __version__
from fasttrain.errors import UserCodeError, UserError


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 and a usage block on bad flags; keep the status, make it one
    line so that every kind of bad input reads the same."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message} (see '{self.prog} --help')")


# (module, command, one-line help): each module defines `<command>_parser(subparsers)` and
# `<command>(args)`. Only the module of the command being run is imported (the lab's import
# torch); the others are listed by their help line, so that `fasttrain --help` stays fast.
COMMANDS = (
    ("fasttrain.bench", "bench", "train MNIST logistic regression every way the ladder knows "
     "and time each"),
    ("fasttrain.train", "train", "train a model with any combination of speed switches"),
    ("fasttrain.env", "env", "print hardware, versions and commit (the env block)"),
    ("fasttrain.commands.doctor", "doctor", "devices, fast dtypes, versions, placement checks"),
    ("fasttrain.commands.profile", "profile", "profile training steps: top ops, idle time, syncs, "
     "and what bounds the step"),
    ("fasttrain.commands.memory", "memory", "where a training step's memory goes; "
     "--find-batch-size"),
    ("fasttrain.commands.experiment", "experiment", "the course lab's exercises, measured: "
     "precision, memory, e2e; and multi-process scaling"),
    ("fasttrain.commands.plan", "plan", "which GPU, will it fit, how long, what it costs "
     "(estimates)"),
)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser; with `argv`, only the command it names is built in full (None: all)."""
    import importlib

    parser = _Parser(
        prog="fasttrain",
        description="Train neural networks fast on GPUs, correctly on CPUs, and measure what "
        "every optimization buys.",
    )
    parser.add_argument("--version", action="version", version=f"fasttrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_Parser)
    sub.required = True
    chosen = next((a for a in argv if not a.startswith("-")), None) if argv is not None else None
    for module, name, summary in COMMANDS:
        if argv is None or name == chosen:
            getattr(importlib.import_module(module), f"{name}_parser")(sub)
        else:
            sub.add_parser(name, help=summary)
    return parser


def main(argv: list[str] | None = None) -> int:
    code = 0
    try:
        argv = sys.argv[1:] if argv is None else argv
        args = build_parser(argv).parse_args(argv)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe fails here, where it is caught, not at the exit
        return code
    except UserCodeError as e:
        # The user's program crashed: their frames and one line naming what failed (usercode.py).
        sys.stderr.write(e.report())
        return e.exit_code
    except UserError as e:
        # One write: under torchrun the ranks share stderr, and print's separate newline
        # would let their lines run together.
        sys.stderr.write(f"error: {e}\n")
        return UserError.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # `fasttrain env --json | head`: the reader has gone; stop quietly, as `cat` does,
        # with stdout pointed at /dev/null so that the exit's own flush cannot fail again.
        # A command that had ended otherwise (75 preempted, 3 diverged) keeps its status.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return code or 1


if __name__ == "__main__":
    raise SystemExit(main())

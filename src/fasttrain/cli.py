"""The one entry point: `fasttrain <command>` and `python -m fasttrain <command>`.

Each command lives in its own module and exposes two functions, `<cmd>_parser(subparsers)`
which adds its sub-parser, and `<cmd>(args) -> int` which runs it. This root only registers them,
parses, and turns a `UserError` into one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from fasttrain import __version__
from fasttrain.errors import UserError


class _Parser(argparse.ArgumentParser):
    """argparse exits with status 2 and a usage block on bad flags; keep the status, make it one
    line so that every kind of bad input reads the same."""

    def error(self, message: str):  # noqa: D401 - argparse API
        raise UserError(f"{self.prog}: {message} (see '{self.prog} --help')")


# (module, command): each module defines `<command>_parser(subparsers)` and `<command>(args)`.
COMMANDS = (
    ("fasttrain.bench", "bench"),
    ("fasttrain.train", "train"),
    ("fasttrain.env", "env"),
    ("fasttrain.lab.doctor", "doctor"),
    ("fasttrain.lab.profile", "profile"),
    ("fasttrain.lab.memory", "memory"),
    ("fasttrain.lab.experiments", "experiment"),
)


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = _Parser(
        prog="fasttrain",
        description="Train neural networks fast on GPUs, correctly on CPUs, and measure what "
        "every optimization buys.",
    )
    parser.add_argument("--version", action="version", version=f"fasttrain {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>", parser_class=_Parser)
    sub.required = True
    for module, name in COMMANDS:
        getattr(importlib.import_module(module), f"{name}_parser")(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        return int(args.func(args) or 0)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return UserError.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

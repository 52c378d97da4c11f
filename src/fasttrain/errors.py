"""The one exception type for bad user input.

A `UserError` carries a single line that names what is wrong and how to fix it. The CLI prints it
and exits with status 2, without a traceback; every other exception is an internal error and keeps
its traceback.
"""


class UserError(Exception):
    """Bad input from the user (a file, a flag, a config, a checkpoint): one line, exit code 2."""

    exit_code = 2

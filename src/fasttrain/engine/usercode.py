"""An exception raised in the user's code, shown as the user's code: their frames, then one line.

    Traceback (most recent call last):
      File "/home/me/mynets.py", line 12, in forward
        return self.head(h.view(len(h), 10))
    error in your model's forward (Net) on batch (float32[64, 784], int64[64]): RuntimeError: ...

The user's model forward, loss and step (called from the step loop), their dataset (where fit pulls
the next batch; a DataLoader worker's error arrives re-raised with the worker's traceback as
text, which is filtered the same way) and their optimizer and scheduler factories (called at build)
are wrapped. Frames of fasttrain, torch and the standard library are dropped; every other frame is
the user's (their scripts, and libraries such as transformers that their model calls into). An
exception without a single user frame is an internal error and keeps its whole traceback.

Cost: one try/except around each step and each batch pulled (free unless something raises); the
frames are read only once an exception is on its way out. The CLI prints the frames and the line
and exits with status 1 (a crash in the user's program, as Python's own); UserError (bad input,
exit 2) and out-of-memory (explained by memory.py) pass through untouched.
"""

from __future__ import annotations

import os
import re
import sysconfig
import traceback
import types
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

import fasttrain
from fasttrain.engine.tree import shapes
from fasttrain.errors import UserCodeError, UserError

EXIT_USER_CODE = UserCodeError.exit_code
_STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"]) + os.sep
_OURS = tuple(os.path.realpath(os.path.dirname(m.__file__)) + os.sep for m in (fasttrain, torch))
# A frame of a traceback printed as text: '  File "path", line N, in name' then its code line(s).
_TEXT_FRAME = re.compile(r'^  File "(?P<path>[^"]+)", line \d+, in (?P<name>.+)$')
_PASS = (UserError, torch.OutOfMemoryError, KeyboardInterrupt)


def is_users(path: str) -> bool:
    if path.startswith("<frozen"):
        return False
    path = os.path.realpath(path) if not path.startswith("<") else path
    if path.startswith(_OURS):
        return False
    return not path.startswith(_STDLIB) or "-packages" in path  # site-/dist-packages: theirs


def explain(run, error: BaseException, micro_batches: list | None) -> BaseException:
    """What to raise for `error`, raised by a training step on `micro_batches`: a UserCodeError
    naming the callable that failed (step, loss or model) when user code is in the traceback,
    else `error` itself."""
    from fasttrain.engine.distributed import peer_failure

    # A collective that found another rank gone may fail inside the user's forward (tensor
    # parallel ops): that rank's error is the story, not this one's model.
    if isinstance(error, _PASS) or peer_failure(error):
        return error
    frames = _user_tbs(error.__traceback__)
    if not frames:
        return error
    batch = _failing_micro_batch(error.__traceback__, micro_batches)
    return failure(error, _culprit(run, frames[0].tb_frame), frames,
                   None if batch is None else shapes(batch))


def call(fn: Callable, what: str, *args: Any) -> Any:
    """`fn(*args)` for a user callable run once (a factory): its exception explained."""
    try:
        return fn(*args)
    except Exception as e:
        if isinstance(e, _PASS):
            raise
        frames = _user_tbs(e.__traceback__)
        raise (failure(e, what, frames, None) if frames else e) from None


def pulled(batches: Iterable) -> Iterator:
    """`batches`, each pulled under a try: an exception in the user's dataset (or a DataLoader
    worker's, re-raised here with the worker's traceback as text) is shown as theirs."""
    it = iter(batches)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except Exception as e:
            _stop_workers(it)
            if isinstance(e, UserError) and "Original Traceback" in str(e):
                # raised in a DataLoader worker (sampling.Collate): torch re-raises it with the
                # worker's traceback as text, its last line the original one
                raise UserError(str(e).rstrip().splitlines()[-1].partition("UserError: ")[2]
                                ) from None
            if isinstance(e, _PASS):
                raise
            raise _dataset_failure(e) from None
        yield batch


def _stop_workers(it) -> None:
    """A DataLoader iterator's workers stopped now (a few ms). Left to the garbage collector,
    which frees the iterator with the error's traceback, their shutdown waits out torch's 5 s
    status timeout: every error in a dataset read by workers cost 5 s more before the exit."""
    stop = getattr(it, "_shutdown_workers", None)  # torch's _MultiProcessingDataLoaderIter
    if callable(stop):
        stop()


def failure(error: BaseException, culprit: str, frames: list[types.TracebackType],
            batch: str | None) -> UserCodeError:
    text = "".join(traceback.format_list(traceback.extract_tb(_chain(frames))))
    on = f" on batch {batch}" if batch is not None else ""
    what = f"{type(error).__name__}: {_first_line(error)}"
    return UserCodeError(f"error in {culprit}{on}: {what}",
                         f"Traceback (most recent call last):\n{text}").with_traceback(
                             _chain(frames))


def _dataset_failure(error: BaseException) -> BaseException:
    frames = _user_tbs(error.__traceback__)
    if frames:  # read in this process (no workers): the frames are real ones
        name = frames[0].tb_frame.f_code.co_qualname
        return failure(error, f"your dataset ({name})", frames, None)
    message = str(error)
    if "Original Traceback" not in message:
        return error
    # torch re-raises a worker's exception as the same type with the worker's traceback as
    # text; its last line is the original "Type: message".
    head, _, worker = message.partition("Original Traceback (most recent call last):\n")
    kept, names, keep = [], [], False
    lines = worker.rstrip("\n").splitlines()
    for line in lines[:-1]:
        m = _TEXT_FRAME.match(line)
        if m:
            keep = is_users(m["path"])
            if keep:
                names.append(m["name"])
        if keep:
            kept.append(line)
    if not names:
        return error
    worker_no = head.strip().rstrip(".").split()[-1] if head.strip() else "?"
    return UserCodeError(f"error in your dataset ({names[0]}) in DataLoader worker {worker_no}: "
                         f"{lines[-1]}",
                         "Traceback (most recent call last, in the DataLoader worker):\n"
                         + "".join(f"{line}\n" for line in kept))


def _user_tbs(tb: types.TracebackType | None) -> list[types.TracebackType]:
    return [t for t in _walk(tb) if is_users(t.tb_frame.f_code.co_filename)]


def _walk(tb: types.TracebackType | None) -> Iterator[types.TracebackType]:
    while tb is not None:
        yield tb
        tb = tb.tb_next


def _chain(frames: list[types.TracebackType]) -> types.TracebackType | None:
    """A traceback of `frames` alone (outermost first), as Python prints it."""
    tb = None
    for t in reversed(frames):
        tb = types.TracebackType(tb, t.tb_frame, t.tb_lasti, t.tb_lineno)
    return tb


def _failing_micro_batch(tb, micro_batches: list | None):
    """The micro-batch being processed when it failed: the accumulation loop's local, else the
    first."""
    from fasttrain.engine.loop import accumulate_micro_batches

    for t in _walk(tb):
        if t.tb_frame.f_code is accumulate_micro_batches.__code__:
            return t.tb_frame.f_locals.get("micro_batch")
    return micro_batches[0] if micro_batches else None


def _culprit(run, frame: types.FrameType) -> str:
    """Which of the user's callables the outermost user frame belongs to."""
    step = getattr(run.compute_loss, "step", None)
    code = frame.f_code
    if step is not None and code is _code(step):
        return f"your step function {run.step_name}"
    if code is _code(run.loss_fn):
        return f"your loss function {name_of(run.loss_fn, run.cfg.loss)}"
    owner = frame.f_locals.get("self")
    if isinstance(owner, torch.nn.Module):
        return f"your model's {code.co_name} ({type(owner).__qualname__})"
    return f"your code ({code.co_qualname})"


def _code(fn: Any):
    fn = getattr(fn, "__wrapped__", fn)  # the loss as inputs.scalar_loss checks it
    fn = getattr(fn, "func", fn)  # functools.partial
    call = type(fn).__dict__.get("__call__")  # a callable object: its method's code
    return getattr(fn, "__code__", None) or getattr(call, "__code__", None)


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [""])[0]


def name_of(fn: Any, given: str | None = None) -> str:
    """'pkg.mod:fn' for messages: the import path given, else the callable's own."""
    if given and ":" in given and not given.startswith("python:"):
        return given
    fn = getattr(fn, "__wrapped__", fn)
    fn = getattr(fn, "func", fn)
    qual = getattr(fn, "__qualname__", type(fn).__qualname__)
    return f"{getattr(fn, '__module__', '?')}:{qual}"

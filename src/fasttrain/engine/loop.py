"""`step(run, micro_batches)` and `fit(run, callbacks)`: the training loop, straight-line.

Each switch became an object at build (a context manager, a scaler that may be disabled, a clip
function that may do nothing); the step's one branch is whether fp16's scaler counts skips.
`fit` runs steps and tells the callbacks (callbacks.py) what happened; logging, evaluation,
checkpoints, preemption, early stopping and the run directory's files are callbacks, in that
order.

Accumulation divides each micro-batch's mean loss by --accum-steps (DDP/FSDP then average over
ranks): the big batch's mean where micro-batches hold as many targets. Token sequences your
collate_fn pads per batch do not (targets -100 where padded): for them the default step's
cross-entropy is weighed by the tokens each micro-batch holds (accumulate_tokens, chosen at build).

Host–device syncs happen only at log steps (the loss is summed on the device in between, and
all-reduced over ranks at the log), at evaluation, and at checkpoints.

An exception in the user's code (model, loss, step, dataset) leaves fit as a UserCodeError
holding only the user's frames (usercode.py): one try around each step and each batch pulled.

Exit codes of `fasttrain train` (for schedulers that requeue): 0 done; 1 an exception in the
user's code; 2 bad input; 3 the loss became non-finite (the last good checkpoint is kept); 75
preempted by SIGTERM/SIGUSR1, 130 stopped by Ctrl-C, a checkpoint saved at the step boundary —
run again with `--resume auto` (signals.py). Under torchrun every rank exits the same way
(torchrun itself reports any non-zero worker exit as its own failure).
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Iterator

import torch

from fasttrain.engine import usercode
from fasttrain.engine.signals import EXIT_PREEMPTED
from fasttrain.engine.steps import IGNORE_INDEX, accumulate_extras
from fasttrain.errors import UserError

EXIT_DIVERGED = 3
_NO_CONTEXT = contextlib.nullcontext()  # reusable: entered once per final micro-step


class Preempted(Exception):
    """Stopped by a signal at a step boundary (75 SIGTERM/SIGUSR1, 130 Ctrl-C)."""

    def __init__(self, message: str, exit_code: int = EXIT_PREEMPTED):
        super().__init__(message)
        self.exit_code = exit_code


class Diverged(Exception):
    exit_code = EXIT_DIVERGED


def accumulate(run, micro_batches: list, forward=None) -> None:
    """Forward and backward over one optimizer step's micro-batches (trees), gradients summed;
    the detached loss (and a user step's extras) added to run.loss_sum on the device. The
    default `run.forward_backward`. `forward` replaces run.forward (the lab counts on the eager
    module)."""
    accumulate_micro_batches(run, micro_batches, forward, None)


def accumulate_tokens(run, micro_batches: list, forward=None) -> None:
    """`accumulate` for the default step's cross-entropy over token sequences that your
    collate_fn pads per batch (targets IGNORE_INDEX where padded; steps.weighs_tokens): each
    micro-batch's summed token loss over the tokens counted in the whole step on every rank, so
    the update is the big batch's mean over its tokens. A mean per micro-batch, divided by
    --accum-steps (and averaged over ranks), would weigh a token of a short micro-batch more
    than one of a long one: accumulation and processes would change the update."""
    counted = torch.stack([(y != IGNORE_INDEX).sum() for _, y in micro_batches]).sum()
    counted = run.world.all_sum(counted.float())  # every rank's: one tiny collective, no sync
    # run.compute_loss is steps.token_sums (the summed loss); DDP/FSDP average over ranks.
    scale = run.world.dp_size / counted.clamp(min=1)
    accumulate_micro_batches(run, micro_batches, forward, scale)


def accumulate_micro_batches(run, micro_batches: list, forward,
                             scale: torch.Tensor | None) -> None:
    """The micro-steps of `accumulate` and `accumulate_tokens`: each loss times `scale`, or
    (None) divided by --accum-steps."""
    forward = run.forward if forward is None else forward
    accum, last = run.cfg.accum_steps, len(micro_batches) - 1
    for i, micro_batch in enumerate(micro_batches):
        # Gradients are averaged over ranks once per step: the micro-steps before the last
        # only accumulate locally (DDP/FSDP no_sync; nothing to skip for one process).
        with run.no_sync() if i < last else _NO_CONTEXT:
            with run.autocast:
                loss, extras = run.compute_loss(forward, micro_batch)
                if scale is not None:
                    loss = loss * scale
                elif accum > 1:  # dividing by 1 would be two more kernels (and their launches)
                    loss = loss / accum
            run.scaler.scale(loss).backward()
        run.loss_sum += loss.detach()
        accumulate_extras(run.extra_sums, extras, accum)  # nothing for the default step


def step(run, micro_batches: list, forward=None) -> None:
    """One optimizer step on `micro_batches`: a list of `accum_steps` micro-batches (trees).
    `forward` replaces run.forward for this step (the lab counts on the eager module)."""
    if forward is None:
        run.forward_backward(run, micro_batches)
    elif run.forward_backward is accumulate_tokens:
        accumulate_tokens(run, micro_batches, forward)
    else:  # the default, or (under --pp) the schedule's: the lab's eager module accumulates
        accumulate(run, micro_batches, forward)
    run.scaler.unscale_(run.opt)  # so that clipping sees true gradients (no-op unless fp16)
    run.clip()
    if run.scaler.is_enabled():
        # A skipped step shows as a smaller scale after update(); compared on the device (the
        # scaler's own scale tensor) so that counting adds no sync.
        before = run.scaler._scale.clone()
        run.scaler.step(run.opt)  # skips the update if fp16 gradients overflowed
        run.scaler.update()
        run.skipped.add_((run.scaler._scale < before).to(torch.int64))
    else:
        run.opt.step()
    run.opt.zero_grad(set_to_none=run.grads_to_none)
    run.sched.step()


def step_batches(run, epoch: int) -> Iterator[list]:
    """The micro-batches of each remaining optimizer step of `epoch`, one list per step."""
    group: list = []
    for batch in run.batches.micro_batches(epoch, run.step_in_epoch):
        group.append(batch)
        if len(group) == run.cfg.accum_steps:
            yield group
            group = []


def endless_batches(run) -> Iterator[list]:
    """Optimizer steps' micro-batches, epoch after epoch, for as many steps as wanted (the lab)."""
    epoch = 0
    while True:
        yield from step_batches(run, epoch)
        epoch += 1


def endless_steps(run) -> Iterator:
    """Each optimizer step's input, epoch after epoch, for as many steps as wanted (the lab):
    what `run.train_step` takes — micro-batches, or a whole-step CUDA graph's sample indices."""
    epoch = 0
    while True:
        yield from run.step_inputs(run, epoch)
        epoch += 1


def warm_up(run, inputs: Iterator, steps: int) -> None:
    """`steps` training steps before a measurement; a whole-step graph run (graphed.py) takes at
    least enough to be captured, so that what is measured next is replays."""
    for _ in range(max(steps, getattr(run.graph, "steps_to_capture", 0))):
        run.train_step(run, next(inputs))


def notify(run, event: str, *args) -> None:
    """Call `event` on every callback of the running fit (in order)."""
    for cb in run.callbacks:
        getattr(cb, event, _ignore)(run, *args)


def hooks(run, event: str) -> list:
    """The callbacks' bound `event` methods, in order (what notify calls)."""
    return [getattr(cb, event) for cb in run.callbacks if hasattr(cb, event)]


def _ignore(*_):
    return None


def fit(run, callbacks=(), standard: bool = True) -> dict:
    """Train to the end, an early stop, a preemption or a divergence; returns the last record.

    `callbacks` run after the standard ones (log, evaluate, early stop, checkpoint, preempt,
    run files); `standard=False` runs only yours."""
    from fasttrain.engine import callbacks as cb

    run.callbacks = [*(cb.standard(run) if standard else []), *callbacks]
    run.bar = bar = progress_bar(run.cfg.progress and run.main, run.total_steps, run.step)
    run.last_log = (time.perf_counter(), run.last_log[1])
    together = False  # did every rank get here the same way (the end, or an agreed stop)?
    try:
        # Your EarlyStop callbacks' metrics checked; resumed, their counts (may set run.stop)
        cb.restore_early_stops(run)
        if run.cfg.resume and run.step and (run.stop is not None or not _steps_left(run)):
            # A finished run resumed as it was (a requeued job, a script that always resumes):
            # nothing to train, so nothing is evaluated, logged or written again. One that
            # stopped early stays stopped (its early stop was restored: callbacks.EarlyStop).
            if run.main:
                ours = run.early_stop is not None and run.stop == run.early_stop.reason()
                how = (_longer(run) if run.stop is None
                       else f"{run.stop}; give a larger "
                            f"{'--patience' if ours else 'patience to your EarlyStop'} to go on")
                print(f"nothing to train: the run finished at step {run.step} (epoch "
                      f"{run.epoch}); {how}", file=sys.stderr)
            together = True
            return {}
        with bar, run.signals:  # SIGTERM/SIGUSR1/SIGINT only set a flag (signals.py)
            notify(run, "on_start")
            on_step = hooks(run, "on_step")  # looked up once: they run every step
            while _steps_left(run) and run.stop is None:
                ran_out = True  # the epoch's batches ran out (a stream's pass may end early)
                # loop.step_batches and loop.step, or the whole-step CUDA graph's (graphed.py)
                for batch in usercode.pulled(run.step_inputs(run, run.epoch)):
                    try:
                        run.train_step(run, batch)
                    except Exception as e:  # free unless raised: user code's own frames
                        raise usercode.explain(run, e, batch) from None
                    run.step += 1
                    run.step_in_epoch += 1
                    bar.advance()
                    for hook in on_step:
                        hook(run)
                    if run.step >= run.total_steps or run.stop is not None:
                        ran_out = False
                        break
                if ran_out or run.step_in_epoch >= (run.batches.steps_per_epoch or math.inf):
                    run.epoch += 1
                    run.step_in_epoch = 0
                    notify(run, "on_epoch_end")
            notify(run, "on_end")
        together = True
        if run.stop is not None and run.cfg.progress and run.main:
            print(run.stop, file=sys.stderr)  # why it ended before its steps (early stop)
    except (Preempted, Diverged):
        together = True  # raised on every rank at the same step
        raise
    except torch.OutOfMemoryError:
        from fasttrain.engine.memory import explain_oom

        raise UserError(explain_oom(run)) from None
    finally:
        run.batches.close()  # persistent DataLoader workers would hold the run directory's lock
        run.rundir.close()
        run.world.close(together)
        run.restore_flags()  # --deterministic's and --precision's process-wide flags
    return run.history[-1] if run.history else {}


def _longer(run) -> str:
    """How to extend a finished run: raise the limit that ended it. --max-steps may be kept
    from the run's config.toml, and then ends a run that more --epochs alone do not extend."""
    cfg, ended, raise_ = run.cfg, [], []
    if cfg.max_steps and run.step >= cfg.max_steps:
        ended.append(f"--max-steps {cfg.max_steps}")
        # 0 leaves --epochs the length, which a stream without length does not have
        raise_.append("a larger --max-steps" + (" (0: no limit)" if run.epochs < math.inf
                                                else ""))
    if run.epoch >= run.epochs:  # never for a stream without length (inf)
        ended.append(f"--epochs {run.epochs}{'' if cfg.epochs else ' (the default)'}")
        raise_.append("more --epochs")
    return (f"{' and '.join(ended) or 'its length'} ended it; give "
            f"{' and '.join(raise_) or 'more --epochs or --max-steps'} to extend it")


def _steps_left(run) -> bool:
    return run.epoch < run.epochs and run.step < run.total_steps


class _Bar:
    """A rich progress bar driven from the loop. It only counts steps and shows the text of the
    last log: it never reads a device tensor, so it adds no sync."""

    def __init__(self, enabled: bool, total: int, done: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.description}"),
                                 disable=not enabled, transient=False)
        self.task = self.progress.add_task("", total=total, completed=done)
        if not enabled:  # nothing is shown: a step costs no lock and no task update
            self.advance = _ignore

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)


def progress_bar(enabled: bool, total: int, done: int) -> _Bar:
    return _Bar(enabled and sys.stderr.isatty(), total, done)

"""The step's loss: `run.compute_loss(forward, micro_batch) -> (loss, extras)`, built once.

Two kinds, chosen at build (the step loop never asks which):

    default   x, y = micro_batch; loss_fn(forward(x), y)             extras: none
    yours     step(forward, micro_batch) -> loss | {"loss": loss, "name": scalar, ...}

`forward` is what the step should call: the model as wrapped by activation checkpointing, DDP /
FSDP and compile (run.forward), so that a user step gets every switch by calling it. A user step
returns a 0-dim tensor or a dict holding one under "loss"; its other entries are extra scalar
metrics, summed on the device like the loss (no host sync), averaged at log steps and evaluated
as val_<name>/test_<name>. Accuracy and `metrics=` (functions of output and target) need the
model's output, so they apply to the default step only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

from fasttrain.errors import UserError

NO_EXTRAS: dict[str, torch.Tensor] = {}  # shared and never written: the default step's extras
ComputeLoss = Callable[[Any, Any], tuple[torch.Tensor, dict[str, torch.Tensor]]]
Metric = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (output, target) -> scalar mean


def compute_loss(run, step: Callable | None, name: str) -> ComputeLoss:
    """`run.compute_loss` for the user's `step` (named `name` in messages), or the default."""
    if step is None:
        def default(forward, batch):
            x, y = batch  # only the default step knows the batch's structure
            # run.loss_fn read at call time: the lab wraps it to audit the loss it calls.
            return run.loss_fn(forward(x), y), NO_EXTRAS
        return default

    def yours(forward, batch):
        return split(step(forward, batch), name)
    yours.step = step  # usercode.py names the failing callable by it
    return yours


def evaluate_loss(run) -> ComputeLoss:
    """The evaluation's (loss, metrics) of one batch, under the run's autocast. The default step
    adds accuracy and the user's metrics(output, target), computed in float32 on the output."""
    user = getattr(run.compute_loss, "step", None) is not None

    def yours(forward, batch):
        with run.autocast:
            return run.compute_loss(forward, batch)

    def default(forward, batch):
        x, y = batch
        with run.autocast:
            out = forward(x)
        out = out.float()
        return run.loss_fn(out, y), {name: torch.as_tensor(f(out, y), device=out.device)
                                     for name, f in run.metrics.items()}
    return yours if user else default


def weighs_tokens(run, user_step) -> bool:
    """Whether each step's loss must be weighed by tokens (loop.accumulate_tokens): the default
    step's built-in cross-entropy on token sequences your collate_fn pads per batch (their
    tokens per micro-batch differ), split over micro-batches or data-parallel processes (tensor
    and pipeline parallel compute the loss their own way)."""
    from fasttrain.engine.inputs import cross_entropy

    return (user_step is None and run.loss_fn is cross_entropy
            and getattr(run.batches, "counting", False)
            and (run.cfg.accum_steps > 1 or run.world.dp_size > 1)
            and run.world.tp * run.world.pp == 1)


def token_sums(run) -> ComputeLoss:
    """The default step's loss where it is weighed by tokens (weighs_tokens): the cross-entropy
    summed over the micro-batch's counted tokens (a micro-batch of padding alone adds 0, where
    its mean would be nan); loop.accumulate_tokens divides it by the step's tokens."""
    import torch.nn.functional as F

    def summed(forward, batch):
        x, y = batch
        out = forward(x)
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1),
                               ignore_index=IGNORE_INDEX, reduction="sum"), NO_EXTRAS
    return summed


def marking_steps(fn: ComputeLoss) -> ComputeLoss:
    """`fn`, each call (one micro-batch) begun as a new step of torch.compile's CUDA graphs
    (reduce-overhead), so that they never take two micro-batches (accumulation) or an evaluation
    batch and a training one for one step and replay over outputs still in use. Marked per
    micro-batch, not per model call: a user step that calls the model twice keeps both outputs."""
    @functools.wraps(fn)  # keeps `.step` (usercode.py names the failing callable by it)
    def marked(forward, batch):
        torch.compiler.cudagraph_mark_step_begin()
        return fn(forward, batch)
    return marked


def split(out: Any, name: str) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(loss, extras) from what a user step returned; anything else is one line naming the fix.
    Reads only shapes and types (metadata): no host sync."""
    if torch.is_tensor(out):
        return _scalar(out, name, "its loss"), NO_EXTRAS
    if isinstance(out, dict) and "loss" in out:
        loss = _scalar(out["loss"], name, "its 'loss'")
        extras = {k: _scalar(torch.as_tensor(v, device=loss.device), name, f"its {k!r}")
                  for k, v in out.items() if k != "loss"}
        return loss, extras
    what = f"a dict with keys {sorted(out)}" if isinstance(out, dict) else type(out).__name__
    raise UserError(f"your step {name} returned {what}; return the loss as a scalar tensor, or "
                    f"a dict holding it under 'loss' (plus extra scalar metrics)")


def _scalar(t: Any, name: str, what: str) -> torch.Tensor:
    if not torch.is_tensor(t) or t.dim() != 0:
        got = f"shape {list(t.shape)}" if torch.is_tensor(t) else type(t).__name__
        raise UserError(f"your step {name}: {what} must be a scalar (0-dim) tensor, got {got}; "
                        f"reduce it (e.g. .mean())")
    return t


def accumulate_extras(sums: dict[str, torch.Tensor], extras: dict[str, torch.Tensor],
                      accum: int) -> None:
    """Add a micro-step's extras (mean over the step's micro-batches) into `sums`, on the
    device, in float32 whatever autocast computed them in."""
    for k, v in extras.items():
        v = v.detach().float() / accum
        if k in sums:
            sums[k] += v
        else:
            sums[k] = v.clone()


def default_metrics(task) -> dict[str, Metric]:
    """Accuracy for integer targets (classes, or tokens for language); none for float targets
    or for batches that are not (input, target) pairs."""
    if task.kind not in ("classification", "language"):
        return {}
    return {"token_accuracy" if task.kind == "language" else "accuracy": accuracy}


IGNORE_INDEX = -100  # cross-entropy's: padding or masked tokens, which are no prediction


def accuracy(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Share of the targets predicted, those marked IGNORE_INDEX left out (as the loss does)."""
    counted = target != IGNORE_INDEX
    return ((output.argmax(-1) == target) & counted).sum() / counted.sum().clamp(min=1)

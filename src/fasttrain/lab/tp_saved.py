"""What one tensor-parallel rank saves for backward, counted on the model split as the engine
splits it, in this one process: the share of the one-process activations a tp rank keeps.

    share = tp_share(run, micro_batch, tp=2)       # 0.69 for tests/engine/userblocks.py
    per_rank_activations = round(one_process_activations * share)
    tp_stage_saved(run, micro_batch, tp=2, n_stages=2)   # under a pipeline: per stage

A plan does not divide every saved tensor by tp. A column-wise layer saves its whole input (its
all-gathered sequence under sequence parallelism, the replicated activation without it); what
is computed from its split output up to the row-wise layer's input is split; the row-wise
layer's output is whole unless the plan shards the sequence after it, and so is everything the
plan leaves alone (a LayerNorm without sequence parallelism, the residual stream, the input
and output layers). Which of them a model's plan splits only its forward knows, so the count
runs it: a real copy of the model (not the Run's), split by `engine/tensor_parallel.apply`
over a DeviceMesh of tp ranks in a one-process group of torch's "fake" backend (its testing
backend: every collective returns at once with its output unwritten, the shapes are real),
then one forward and loss of `micro_batch` as tp rank 0 runs it, counting the storages it
saves for backward (lab/bytecount.saved_bytes; a DTensor's are its local shard's). The same
forward on the copy unsplit gives the denominator. Both copies are the model as built,
activation checkpointing's wrappers off; the share then scales the one-process count, which
keeps them.

Measured on gloo ranks (each rank's saved storages, tests/lab/layout_driver.py): under --tp 2
gpt (block 32, batch 8) saves 4,952,324 B per rank and a user's residual MLP with a plain
parallelize (tests/engine/userblocks.py, batch 32) 74,244 B; the count here is the same to the
byte for both (8,720,644 and 107,012 B in one process).
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from fasttrain.lab.bytecount import left_as_found, saved_bytes

if TYPE_CHECKING:
    from torch import nn

    from fasttrain.engine.run import Run


def _saved(run: Run, model: nn.Module, micro_batch, sharded_loss: bool) -> int:
    """Bytes `model`'s forward and loss of `micro_batch` save for backward (the run's step,
    autocast and loss; under `sharded_loss`, the vocab-sharded logits' loss parallel)."""
    from torch.distributed.tensor.parallel import loss_parallel

    def forward_loss():
        with run.autocast, (loss_parallel() if sharded_loss else contextlib.nullcontext()):
            return run.compute_loss(model, micro_batch)[0]

    owned = [*model.parameters(), *model.buffers()]
    with left_as_found(model, run.device):
        _, saved = saved_bytes(forward_loss, owned)
    return saved.parts.get(None, 0)


def tp_saved(run: Run, micro_batch, tp: int, plan: dict | None = None) -> tuple[int, int]:
    """(bytes tp rank 0 saves, bytes one process saves) for one forward and loss of
    `micro_batch`, on copies of the run's model (module docstring). The same refusals as
    training: no plan, a layer that does not split evenly."""
    from fasttrain.engine import tensor_parallel
    from fasttrain.lab.layouts import fake_mesh, meta_copy

    whole = _saved(run, meta_copy(run.model, meta=False), micro_batch, False)
    if tp == 1:
        return whole, whole
    model = meta_copy(run.model, meta=False)
    with fake_mesh(tp, run.device.type) as mesh:
        sharded_loss = tensor_parallel.wants_loss_parallel(run, model, plan)
        tensor_parallel.apply(model, mesh, plan, loss_parallel=sharded_loss)
        return _saved(run, model, micro_batch, sharded_loss), whole


def tp_share(run: Run, micro_batch, tp: int, plan: dict | None = None) -> float:
    """The fraction of one process's saved bytes that one rank of `tp` keeps (1 at tp 1)."""
    mine, whole = tp_saved(run, micro_batch, tp, plan)
    return mine / whole if whole else 1 / tp


def tp_stage_saved(run: Run, micro_batch, tp: int, n_stages: int,
                   plan: dict | None = None) -> list[int]:
    """Bytes each of `n_stages` pipeline stages saves for backward on tp rank 0, `micro_batch`
    run stage after stage (the last also the loss's), each stage split over tp as the engine
    splits it (cut first, then each stage's plan: its own `parallelize`, or the plan's entries
    that name its modules): layouts.stage_activations on a copy split over a fake group. The
    default (input, target) step, as under --pp; no loss parallel there."""
    from fasttrain.engine import tensor_parallel
    from fasttrain.engine.pipeline import stage_plan
    from fasttrain.lab.layouts import fake_mesh, meta_copy

    model = meta_copy(run.model, meta=False)
    stages = model.pipeline_split(n_stages)
    running = [0]  # the stage whose forward is running: its part of the count

    def forward():
        x, y = micro_batch
        with run.autocast:
            for running[0], stage in enumerate(stages):
                x = stage(x)
            return run.loss_fn(x, y)

    with fake_mesh(tp, run.device.type) as mesh:
        for stage in stages:
            tensor_parallel.apply(stage, mesh, stage_plan(stage, plan))
        owned = [t for m in (model, *stages) for t in (*m.parameters(), *m.buffers())]
        with left_as_found(model, run.device):
            _, saved = saved_bytes(forward, owned, part=lambda t: running[0])
    return [saved.parts.get(i, 0) for i in range(n_stages)]

"""Tensor parallelism (`--tp N`): each layer's weights split over the N ranks of a tp group, with
torch.distributed.tensor.parallel's styles; no collective of ours.

The Megatron pattern for a transformer block, which is what `gpt`'s plan is (models/gpt.py):
the first linear of a pair column-wise (ColwiseParallel: its output features, hence the
attention heads or the MLP's hidden units, are split; the input is whole), the second
row-wise (RowwiseParallel: its input features are split, each rank computes a partial sum).
Everything between the pair is local: attention runs on heads / N heads per rank, the GELU on
hidden / N units. gpt adds sequence parallelism around the pairs: the residual stream, its
LayerNorms and dropouts hold T / N positions per rank; a pair starts with an all-gather of the
sequence and ends with a reduce-scatter of the partial sums (together the bytes of the plain
all-reduce: two per block in forward, two in backward). The embedding and the tied head are
split by vocabulary rows, and under loss parallel (below) the logits stay split too.

Loss parallel: where the model's own plan offers it and the loss is the built-in cross-entropy
of the default step (`wants_loss_parallel`), the logits come out as a DTensor sharded over the
vocabulary and `attach_loss_parallel` runs the step and evaluation under torch's
loss_parallel(), which computes log-softmax and the target's logit on the shards (all-reduces of
[B·T] values instead of an all-gather of [B, T, vocab]). A user's step or loss gets whole
logits: it may do anything with them.

A model brings its plan in one of two ways, looked up in this order:
- `build(..., tp_plan={"blocks.0.fc": ColwiseParallel(), ...})`: a dict for
  torch.distributed.tensor.parallel.parallelize_module (module names relative to the model);
- a method `model.parallelize(tp_mesh)` that parallelizes the model in place (gpt's; with a
  `loss_parallel` keyword it is asked for vocab-sharded logits where they fit).
A model with neither is refused under --tp (splitting a layer changes what its forward must do
with local shapes, which only the model knows).

Gradient clipping over DTensor and plain gradients side by side: engine/clipping.py.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from fnmatch import fnmatch

import torch
from torch import nn

from fasttrain.errors import UserError, first_line


def apply(model: nn.Module, tp_mesh, plan: dict | None = None,
          loss_parallel: bool = False) -> None:
    """Split `model`'s layers over `tp_mesh` in place, by `plan` or the model's own
    `parallelize(tp_mesh)` (`parallelize(tp_mesh, loss_parallel=True)` where `loss_parallel`,
    which `wants_loss_parallel` decided). Same on every rank: a refusal is the same line
    everywhere."""
    if plan is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        try:
            parallelize_module(model, tp_mesh, plan)
        except (AttributeError, ValueError, KeyError) as e:  # a name the model does not have
            raise UserError(f"--tp: tp_plan does not fit {type(model).__name__} "
                            f"({first_line(e)}); name its "
                            f"nn.Linear submodules as model.named_modules() does") from None
        _check_even(model, tp_mesh.size())
        return
    hook = getattr(model, "parallelize", None)
    if not callable(hook):
        raise UserError(f"--tp {tp_mesh.size()}: {type(model).__name__} has no tensor-parallel "
                        f"plan; give it a method parallelize(self, tp_mesh) (see "
                        f"fasttrain/models/gpt.py), pass build(..., tp_plan={{...}}), or drop "
                        f"--tp")
    if loss_parallel:
        hook(tp_mesh, loss_parallel=True)
    else:  # a user's hook need not take the keyword
        hook(tp_mesh)
    _check_even(model, tp_mesh.size())


def _check_even(model: nn.Module, tp: int) -> None:
    """A linear layer split over tp ranks needs the split dimension to divide by tp: torch's
    RowwiseParallel rebuilds its input from the local shards as if they were even (a 63-unit
    hidden layer over 2 ranks failed inside DTensor, "a and b must have same reduction dim,
    but got [B, 64] X [63, 32]", torch 2.13). Refused here, naming the layer, on every rank."""
    from torch.distributed.tensor import DTensor, Shard

    for name, module in model.named_modules():
        w = getattr(module, "weight", None)
        if not isinstance(module, nn.Linear) or not isinstance(w, DTensor):
            continue
        for placement in w.placements:
            if isinstance(placement, Shard) and w.shape[placement.dim] % tp:
                side = "out_features" if placement.dim == 0 else "in_features"
                raise UserError(f"--tp {tp}: {name or 'the model'} (nn.Linear, {side} "
                                f"{w.shape[placement.dim]}) does not split evenly over {tp} "
                                f"ranks; make its {side} a multiple of {tp}, or leave it out "
                                f"of the tensor-parallel plan")


def resolves(module: nn.Module, key: str) -> bool:
    """Whether plan key `key` (a module name relative to `module`, `*` allowed per component,
    "" for `module` itself) names a submodule, as parallelize_module matches it."""
    def walk(m: nn.Module, parts: list[str]) -> bool:
        return not parts or any(walk(child, parts[1:]) for name, child in m.named_children()
                                if fnmatch(name, parts[0]))
    return walk(module, key.split(".") if key else [])


def check_plan(model: nn.Module, plan: dict | None) -> None:
    """A tp_plan key that names no submodule of the whole model is refused: torch's
    parallelize_module only warns and skips it (torch 2.13), leaving that layer whole on every
    rank, which trains, but not split as asked."""
    for key in plan or {}:
        if not resolves(model, key):
            raise UserError(f"--tp: tp_plan key {key!r} names no submodule of "
                            f"{type(model).__name__}; name its submodules as "
                            f"model.named_modules() does (`*` for any one name)")


# -- loss parallel ---------------------------------------------------------------------------


def wants_loss_parallel(run, model: nn.Module, plan: dict | None) -> bool:
    """Loss parallel where it computes the same loss: the model's own plan offers vocab-sharded
    logits (a `loss_parallel` parameter of its parallelize), and the loss is the built-in
    cross-entropy of the default step, which torch's loss_parallel() computes on the shards.
    A user's step or loss gets whole logits (it may do anything with them)."""
    from fasttrain.engine.inputs import cross_entropy

    hook = getattr(model, "parallelize", None)
    return (plan is None and callable(hook)
            and "loss_parallel" in inspect.signature(hook).parameters
            and not run.step_name and run.loss_fn is cross_entropy)


def attach_loss_parallel(run) -> None:
    """Make the run's step and evaluation take vocab-sharded logits (DTensor [B, T, vocab],
    Shard(-1)): cross-entropy under torch's loss_parallel(), which must hold over the backward
    too, so it wraps the whole forward_backward. Each rank then computes log-softmax over its
    vocab/tp columns, with two all-reduces of [B·T] (the row max and the sum of exponentials)
    and one for the target's logit, instead of all-gathering [B, T, vocab]."""
    from torch.distributed.tensor.parallel import loss_parallel

    loss_fn, forward_backward, evaluate = run.loss_fn, run.forward_backward, run.evaluate_loss

    def sharded_loss(logits, target):
        # A replicated DTensor scalar: its local value is the loss, a plain tensor as the step
        # sums it (to_local is differentiable; backward passes the gradient through).
        return loss_fn(logits, target).to_local()

    def forward_backward_lp(run, micro_batches):
        with loss_parallel():
            forward_backward(run, micro_batches)

    def evaluate_lp(forward, batch):
        with loss_parallel():
            return evaluate(forward, batch)

    run.loss_fn, run.forward_backward, run.evaluate_loss = (sharded_loss, forward_backward_lp,
                                                            evaluate_lp)
    # Accuracy and the user's metrics compare whole rows: gathered, at evaluation only.
    run.metrics = {name: _on_whole_logits(f) for name, f in run.metrics.items()}


def _on_whole_logits(metric: Callable) -> Callable:
    return lambda logits, target: metric(logits.full_tensor(), target)


def compile_blocks(blocks: list[tuple]) -> bool:
    """Under --tp, torch.compile each block's forward in place (names, hooks, state_dict keys
    unchanged; the checkpoint and FSDP wrappers applied later call it from eager code), as
    torchtitan does; embedding, final norm and head stay eager. False without blocks
    (`models.units`): the whole model is then compiled, which works for --tp alone.
    The whole wrapped model fails (torch 2.13, gloo): under FSDP at the vocab-parallel
    embedding ("Mixing fake modes NYI": its _MaskPartial keeps a mask tensor outside what
    AOTAutograd traces, pytorch/pytorch#185356); with a checkpoint traced by dynamo, the
    partitioner saves a DeviceMesh for backward as if a tensor ("expected all
    tensors_saved_with_vc_check to be Tensors"). Compiled inside the (eager) checkpoint, a
    block is one compiled region that backward runs again."""
    for parent, key in blocks:
        block = parent.get_submodule(key)
        block.forward = torch.compile(block.forward)
    return bool(blocks)

"""Tensor parallelism (`--tp N`): each layer's weights split over the N ranks of a tp group, with
torch.distributed.tensor.parallel's styles; no collective of ours.

The Megatron pattern for a transformer block, which is what `gpt`'s plan is (models/gpt.py):
the first linear of a pair column-wise (ColwiseParallel: its output features, hence the
attention heads or the MLP's hidden units, are split; the input is replicated), the second
row-wise (RowwiseParallel: its input features are split, each rank computes a partial sum, one
all-reduce makes the output whole again). So a block costs two all-reduces in forward and two in
backward, and everything between the pair is local: attention runs on heads / N heads per rank,
the GELU on hidden / N units. Everything outside the pairs (embeddings, LayerNorms, the tied
output head) is replicated: each rank of the group holds and updates the same copy, from the same
gradient (their inputs and outputs are whole on every rank), so the copies never drift apart.

A model brings its plan in one of two ways, looked up in this order:
- `build(..., tp_plan={"blocks.0.fc": ColwiseParallel(), ...})`: a dict for
  torch.distributed.tensor.parallel.parallelize_module (module names relative to the model);
- a method `model.parallelize(tp_mesh)` that parallelizes the model in place (gpt's).
A model with neither is refused under --tp (splitting a layer changes what its forward must do
with local shapes, which only the model knows).

Gradient clipping over DTensor and plain gradients side by side: engine/clipping.py.
"""

from __future__ import annotations

from torch import nn

from fasttrain.errors import UserError


def apply(model: nn.Module, tp_mesh, plan: dict | None = None) -> None:
    """Split `model`'s layers over `tp_mesh` in place, by `plan` or the model's own
    `parallelize(tp_mesh)`. Same on every rank: a refusal is the same line everywhere."""
    if plan is not None:
        from torch.distributed.tensor.parallel import parallelize_module

        try:
            parallelize_module(model, tp_mesh, plan)
        except (AttributeError, ValueError, KeyError) as e:  # a name the model does not have
            raise UserError(f"--tp: tp_plan does not fit {type(model).__name__} "
                            f"({(str(e).splitlines() or [type(e).__name__])[0]}); name its "
                            f"nn.Linear submodules as model.named_modules() does") from None
        return
    hook = getattr(model, "parallelize", None)
    if not callable(hook):
        raise UserError(f"--tp {tp_mesh.size()}: {type(model).__name__} has no tensor-parallel "
                        f"plan; give it a method parallelize(self, tp_mesh) (see "
                        f"fasttrain/models/gpt.py), pass build(..., tp_plan={{...}}), or drop "
                        f"--tp")
    hook(tp_mesh)


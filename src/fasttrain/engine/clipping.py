"""Gradient clipping to --grad-clip under tensor and pipeline parallelism: the norm of the whole
model's gradient, as one process computes it, from whatever pieces this rank holds.

    clip = clipper(params, 1.0, counted=pipe.counted, group=pp_group)   # switches.clipper, once
    total = clip()                                                       # every step

What a rank holds, and how its share of the norm is made whole:
- tensor-parallel shards (DTensors on the tp mesh), FSDP shards (on the dp mesh) and both
  (FSDP × TP: on the 2-D mesh): torch's foreach norm of a list of DTensors on one mesh is a
  partial norm; `full_tensor` all-reduces it over that mesh. DTensor ops refuse operands on
  different meshes (under FSDP × TP the split weights live on (dp, tp), the replicated ones on
  dp alone), so the parameters are grouped by mesh and each group gives one norm;
- plain tensors (replicated over tp, or no data-parallel sharding at all) are whole already;
- pipeline stages hold different layers: the squared norm of this stage is summed over the
  pipeline group (one all-reduce of a scalar). A weight tied across stages is held by two of
  them with the same (summed) gradient: `counted` leaves out the later copies so that it is
  counted once.
Everything stays on the device: no host sync (the total is returned as a tensor). Then every
gradient, of every group, is scaled by the same factor max_norm / total (if below 1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn


def _by_mesh(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    from torch.distributed.tensor import DTensor

    groups: dict = {}
    for p in params:
        groups.setdefault(p.device_mesh if isinstance(p, DTensor) else None, []).append(p)
    return list(groups.values())


def clipper(params: list[nn.Parameter], max_norm: float, *,
            counted: list[nn.Parameter] | None = None,
            group=None) -> Callable[[], torch.Tensor]:
    """clip_grad_norm_ of this rank's `params` over the layout: the norm of `counted` (default:
    all of `params`) reduced over each DTensor's mesh and, if `group` (the pipeline's process
    group) is given, summed in squares over it."""
    from torch.distributed.tensor import DTensor
    from torch.nn.utils import clip_grads_with_norm_, get_total_norm

    norm_groups = _by_mesh(params if counted is None else counted)
    clip_groups = _by_mesh(params)
    device = params[0].device

    def clip() -> torch.Tensor:
        squares = []
        for held in norm_groups:
            grads = [p.grad for p in held if p.grad is not None]
            if grads:
                norm = get_total_norm(grads, foreach=True)
                # A DTensor norm is this rank's partial: full_tensor all-reduces it (no sync).
                squares.append((norm.full_tensor() if isinstance(norm, DTensor) else norm)
                               .square())
        sq = torch.stack(squares).sum() if squares else torch.zeros((), device=device)
        if group is not None:
            dist.all_reduce(sq, group=group)
        total = sq.sqrt()
        for held in clip_groups:
            clip_grads_with_norm_(held, max_norm, total, foreach=True)
        return total

    return clip

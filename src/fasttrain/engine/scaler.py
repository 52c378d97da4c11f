"""fp16's loss scaler where each rank holds part of the gradients: FSDP shards, tensor-parallel
shards, a pipeline's stages.

An overflow may then show on one rank only, so the decision to skip a step must be taken over
all of them: torch's ShardedGradScaler all-reduces the found-inf flag over every rank in
unscale_ (asynchronously, no host sync), so all ranks skip the same steps and their scales stay
equal. One addition: tensor parallelism leaves some parameters plain (gpt's position table,
its LayerNorms without FSDP) beside DTensor shards, and torch's unscale (one foreach call per
device and dtype) refuses such a mix ("got mixed torch.Tensor and DTensor", torch 2.13), so the
gradients are unscaled in groups of one kind (plain, or DTensors of one mesh) and the found-inf
flags of the groups added before the all-reduce.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler


class ShardScaler(ShardedGradScaler):
    """ShardedGradScaler whose unscale takes plain and DTensor gradients together."""

    def _unscale_grads_(self, optimizer, inv_scale, found_inf, allow_fp16=True):
        kinds: dict[object, list] = {}
        for group in optimizer.param_groups:
            for p in group["params"]:
                kinds.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
        found: dict[torch.device, torch.Tensor] = {}
        for params in kinds.values():
            one = SimpleNamespace(param_groups=[{"params": params}])
            for device, flag in super()._unscale_grads_(one, inv_scale, found_inf,
                                                        allow_fp16).items():
                found[device] = found[device] + flag if device in found else flag
        return found


def sharded_scaler(device: torch.device) -> ShardScaler:
    scaler = ShardScaler(device.type)
    # The scale tensor is made on the first scale(); a pipeline's first stages never call it
    # (the loss is on the last), and every rank's unscale_ needs it.
    scaler.scale(torch.zeros((), device=device))
    return scaler

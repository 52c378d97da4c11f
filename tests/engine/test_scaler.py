"""engine/scaler.py: fp16's scaler for sharded layouts unscales plain and DTensor gradients
together (tensor parallelism leaves some parameters plain) and skips a step when any of them
overflowed. One process, a gloo group of one, a 1-rank mesh: the DTensor path without torchrun."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

# engine/scaler.py is imported by the test, not with the module: it imports torch's FSDP, DTensor
# and sympy (~1 s of CPU), which every pytest process that collects this module would pay (the
# engine itself imports it only for fp16 on sharded layouts).


@pytest.fixture
def mesh(tmp_path):
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0,
                            world_size=1)
    try:
        yield init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def params(mesh, bad: bool):
    """A DTensor (sharded) parameter and a plain one, their gradients scaled by 2**16."""
    from torch.distributed.tensor import Shard, distribute_tensor

    shard = torch.nn.Parameter(distribute_tensor(torch.ones(4, 2), mesh, [Shard(0)]))
    plain = torch.nn.Parameter(torch.ones(3))
    shard.grad = distribute_tensor(torch.full((4, 2), 2.0**16), mesh, [Shard(0)])
    plain.grad = torch.full((3,), float("inf") if bad else 2.0**17)
    return shard, plain


@pytest.mark.parametrize("bad", [False, True])
def test_plain_and_dtensor_gradients_unscale_together_and_skip_together(mesh, bad):
    shard, plain = params(mesh, bad)
    opt = torch.optim.SGD([shard, plain], lr=0.5)
    from fasttrain.engine.scaler import sharded_scaler

    scaler = sharded_scaler(torch.device("cpu"))
    assert scaler.get_scale() == 2.0**16
    scaler.unscale_(opt)
    if not bad:  # unscaled: the true gradients, 1 and 2
        assert torch.equal(shard.grad.full_tensor(), torch.ones(4, 2))
        assert torch.equal(plain.grad, torch.full((3,), 2.0))
    scaler.step(opt)
    scaler.update()
    if bad:  # an overflow in either kind skips the whole step and halves the scale
        assert torch.equal(shard.full_tensor(), torch.ones(4, 2))
        assert torch.equal(plain.detach(), torch.ones(3))
        assert scaler.get_scale() == 2.0**15
    else:
        assert torch.equal(shard.full_tensor(), torch.full((4, 2), 0.5))
        assert torch.equal(plain.detach(), torch.zeros(3))
        assert scaler.get_scale() == 2.0**16

"""engine/clipping.py in one process (plain tensors): the layouts' clipper is clip_grad_norm_ when
nothing is sharded, and a tied weight's later copy (`counted` leaves it out) is scaled but not
counted. DTensor shards and the sum over stages are checked end to end with --tp/--pp
(test_tensor_parallel.py, test_pipeline_layouts.py: --grad-clip 1.0 against one process)."""

from __future__ import annotations

import torch
from torch import nn

from fasttrain.engine.clipping import clipper


def grads(seed: int) -> list[nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    params = [nn.Parameter(torch.zeros(n)) for n in (7, 3, 11)]
    for p in params:
        p.grad = torch.randn(p.shape, generator=g)
    return params


def test_without_shards_it_is_clip_grad_norm():
    mine, ref = grads(0), grads(0)
    total = clipper(mine, 0.5)()
    expected = torch.nn.utils.clip_grad_norm_(ref, 0.5, foreach=True)
    torch.testing.assert_close(total, expected, rtol=1e-6, atol=0)
    assert total > 0.5  # it did clip
    for a, b in zip(mine, ref, strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0)


def test_a_later_copy_is_scaled_but_not_counted():
    params = grads(1)
    before = [p.grad.clone() for p in params]
    counted = params[:2]  # params[2]: the copy a stage before this one counted already
    total = clipper(params, 0.1, counted=counted)()
    norm = torch.linalg.vector_norm(torch.cat([g for g in before[:2]]))
    torch.testing.assert_close(total, norm, rtol=1e-6, atol=0)
    for p, g in zip(params, before, strict=True):
        torch.testing.assert_close(p.grad, g * 0.1 / (norm + 1e-6), rtol=1e-5, atol=0)

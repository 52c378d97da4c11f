"""The engine's step does the work of a hand-written step and nothing more (loop.py, optim.py).

On a GPU every tensor op is a kernel launch of ~5–15 µs of host time, and a small model's step is
bound by them: an op the engine adds to every step costs that much per step. So the ops that one
`step` dispatches (forward, backward and optimizer alike, counted by a dispatch mode) must be
those of the loop a careful user writes with the same model, optimizer and loss: loss, backward,
optimizer step, zero_grad, the loss summed on the device.
"""

from __future__ import annotations

import types

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fasttrain.engine import TrainConfig, build, optim
from fasttrain.engine.loop import step, step_batches
from tests.engine.conftest import image_task


class Ops(TorchDispatchMode):
    """The aten ops dispatched while active, in order (backward's included: on the CPU the
    autograd engine runs them on this thread)."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func.overloadpacket.__name__))
        return func(*args, **(kwargs or {}))


def _run(**kw):
    cfg = TrainConfig(model="mlp", batch_size=16, max_steps=10, device="cpu", progress=False,
                      **kw)
    return build(cfg, data=image_task(), verbose=False)


def engine_ops(run, batch) -> list[str]:
    with Ops() as ops:
        step(run, batch)
    return ops.names


def hand_ops(run, batch) -> list[str]:
    """The same work, written by hand on the same (freshly built) model and optimizer."""
    (x, y), = batch
    with Ops() as ops:
        with run.autocast:
            loss = run.loss_fn(run.model(x), y)  # the same loss (fasttrain.engine.inputs)
        loss.backward()
        run.loss_sum += loss.detach()
        run.opt.step()
        run.opt.zero_grad(set_to_none=True)
    return ops.names


@pytest.mark.parametrize("kw", [{}, {"precision": "bf16"}, {"weight_decay": 0.1},
                                {"optimizer": "sgd", "momentum": 0.9}],
                         ids=["adamw", "bf16", "decay", "sgd"])
def test_a_step_dispatches_only_the_ops_of_a_hand_written_step(kw):
    engine, hand = _run(**kw), _run(**kw)
    batch = next(step_batches(engine, 0))
    for _ in range(2):  # the first step makes the optimizer's state: compare the second too
        assert engine_ops(engine, batch) == hand_ops(hand, batch)
    for a, b in zip(engine.model.parameters(), hand.model.parameters(), strict=True):
        assert torch.equal(a, b)  # and computes the same


def test_accumulation_still_averages_over_micro_batches():
    run = _run(accum_steps=2)
    names = engine_ops(run, next(step_batches(run, 0)))
    assert names.count("div") >= 2  # each micro-batch's loss / 2 (and its backward)


def _opt(**kw):
    """The built-in optimizer as build() would make it, for a CUDA run (CPU parameters: the
    fused kernels exist on the CPU too, so this runs anywhere)."""
    cfg = TrainConfig(model="mlp", device="cpu", **kw)
    world = types.SimpleNamespace(device=torch.device("cuda"), parallel=cfg.parallel, tp=1,
                                  pp=1, size=1, dp_size=1)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.LayerNorm(3))
    return optim.optimizer(cfg, model, world)


def test_compile_and_cuda_graphs_take_the_fused_optimizer_on_cuda():
    # foreach AdamW reads each parameter's step count on the host (.item(), 2 per parameter
    # per step) and launches ~8 kernels per group; the fused kernel does neither. compile
    # already trades bitwise equality with eager for speed, so it takes this too.
    assert _opt(compile=True).defaults["fused"] is True
    assert _opt(cuda_graphs=True, compile=True).defaults["fused"] is True
    assert _opt(compile=True, optimizer="sgd").defaults["fused"] is True
    assert not _opt().defaults["fused"]  # eager fp32: bit-identical to what it always was

"""The engine's step does the work of a hand-written step and nothing more (loop.py, optim.py).

On a GPU every tensor op is a kernel launch of ~5–15 µs of host time, and a small model's step is
bound by them: an op the engine adds to every step costs that much per step. So the ops that one
`step` dispatches (forward, backward and optimizer alike, counted by a dispatch mode) must be
those of the loop a careful user writes with the same model, optimizer and loss: loss, backward,
optimizer step, zero_grad, the loss summed on the device.
"""

from __future__ import annotations

import functools
import itertools
import types
from collections import Counter

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import fasttrain
from fasttrain.engine import TrainConfig, build, optim
from fasttrain.engine.loop import step, step_batches
from tests.engine.conftest import fit, image_task


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


# -- against the lean loop of benchmarks/peers_in_memory.py ------------------------------------

# What fit may dispatch a step beyond the lean loop: the loss summed on the device for the log
# (detach, add_), so that logging reads it without a sync every step.
ALLOWED = Counter({"detach": 1, "add_": 1})
LEAN = dict(batch_size=32, lr=1e-3, optimizer="adamw", weight_decay=0.0, schedule="constant",
            seed=0, device="cpu", progress=False, verbose=False)


def _tensors():
    task = image_task()
    return task.train_x.float() / 255, task.train_y


def _net(task_shape=(1, 28, 28)):
    from fasttrain.models import build_model

    torch.manual_seed(0)
    return build_model("mlp", in_shape=task_shape, num_classes=10)


class CountSteps:
    """A callback: the ops of fit's steps after step `first` to the end of step `last` (each
    step's batch, the step, the counters and the callbacks' on_step), foreach as on CUDA."""

    def __init__(self, first: int, last: int):
        self.first, self.last, self.mode = first, last, Ops()

    def on_start(self, run):
        for g in run.opt.param_groups:  # the CPU's default is a loop over the parameters
            g["foreach"] = True

    def on_step(self, run):
        if run.step == self.first:
            self.mode.__enter__()
        elif run.step == self.last:
            self.mode.__exit__(None, None, None)


def lean_ops(first: int, last: int) -> list[str]:
    """benchmarks/peers_in_memory.py's hand-indexed loop: the ops of its steps first+1..last."""
    x, y = _tensors()
    net = _net()
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0, foreach=True)
    perm, b, ops = torch.randperm(len(y)), LEAN["batch_size"], Ops()
    for s in range(last):
        if s == first:
            ops.__enter__()
        idx = perm[s * b:(s + 1) * b]
        loss = F.cross_entropy(net(x[idx]), y[idx])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    ops.__exit__(None, None, None)
    return ops.names


def test_fit_dispatches_the_lean_hand_loops_ops_and_only_the_loss_sum_more():
    # The peers' benchmark on an H200: fasttrain 0.82x the lean loop, host-bound, 0.33 ms a
    # step of host work more; a second AdamW group of equal settings was 8 foreach launches of it.
    first, last = 2, 6  # within the first epoch (8 steps): no new permutation in the window
    counter = CountSteps(first, last)
    run = fasttrain.build(model=_net(), data=_tensors(), loss=F.cross_entropy, max_steps=last,
                          log_every=10**6, **LEAN)
    fasttrain.fit(run, callbacks=[counter])
    extra = Counter(counter.mode.names) - Counter(lean_ops(first, last))
    allowed = Counter({k: v * (last - first) for k, v in ALLOWED.items()})
    assert not extra - allowed, f"ops a step beyond the lean loop's: {dict(extra - allowed)}"


@pytest.mark.parametrize("kw", [{"optimizer": "adamw", "foreach": None},
                                {"optimizer": "adamw", "foreach": True},
                                {"optimizer": "sgd", "momentum": 0.9, "foreach": True}],
                         ids=["adamw", "adamw-foreach", "sgd-foreach"])
def test_equal_groups_are_one_and_train_as_the_two_did(kw):
    foreach = kw.pop("foreach")
    run = _run(schedule="constant", **kw)
    assert len(run.opt.param_groups) == 1  # weight decay 0: both groups alike
    for g in run.opt.param_groups:
        g["foreach"] = foreach
    twin = _run(schedule="constant", **kw)  # the same initial weights
    groups = optim.param_groups(twin.model, False)  # the two groups, as before the merge
    make = (torch.optim.AdamW if kw["optimizer"] == "adamw"
            else functools.partial(torch.optim.SGD, momentum=0.9))
    two = make(groups, lr=run.cfg.lr, weight_decay=0.0, foreach=foreach)
    assert len(two.param_groups) == 2
    for batch in itertools.islice(step_batches(run, 0), 4):
        step(run, batch)
        (x, y), = batch
        run.loss_fn(twin.model(x), y).backward()
        two.step()
        two.zero_grad(set_to_none=True)
    for a, b in zip(run.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("scheduler", [None, "tests.engine.userstep:warmup"],
                         ids=["schedule", "user-lambda"])
def test_a_checkpoint_of_the_two_groups_resumes_into_one(tmp_path, scheduler):
    # Written before equal groups were merged: the same state in two groups of equal settings.
    kw = dict(model="mlp", batch_size=32, max_steps=6, checkpoint_every=3, log_every=3,
              seed=1, device="cpu", progress=False, scheduler=scheduler)
    whole = fit(out=str(tmp_path / "a"), **kw)
    saved = torch.load(tmp_path / "a" / "checkpoints" / "step-00000003.pt", weights_only=True)
    (group,) = saved["optimizer"]["param_groups"]
    assert group["params"] == list(range(6))  # the 3 weights, then the 3 biases
    saved["optimizer"]["param_groups"] = [{**group, "params": [0, 1, 2]},
                                          {**group, "params": [3, 4, 5]}]
    for key in ("base_lrs", "_last_lr", "lr_lambdas"):  # a list an optimizer group
        if key in saved["scheduler"]:
            saved["scheduler"][key] = saved["scheduler"][key] * 2
    (tmp_path / "b" / "checkpoints").mkdir(parents=True)
    torch.save(saved, tmp_path / "b" / "checkpoints" / "step-00000003.pt")
    resumed = fit(out=str(tmp_path / "b"), resume="auto", **kw)
    assert resumed.step == 6 and len(resumed.opt.param_groups) == 1
    for a, b in zip(whole.model.parameters(), resumed.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_constant_schedule_saves_the_state_lambdalr_saved():
    # Its step only counts (LambdaLR's recomputed and set an lr that never changes, every step).
    run, twin = _run(schedule="constant"), _run(schedule="constant")
    assert isinstance(run.sched, optim.Constant)
    lambdalr = torch.optim.lr_scheduler.LambdaLR(twin.opt, lambda s: 1.0)
    for batch in itertools.islice(step_batches(run, 0), 3):
        step(run, batch)
        twin.opt.step()
        lambdalr.step()
    assert run.sched.state_dict() == lambdalr.state_dict()
    assert run.opt.param_groups[0]["lr"] == run.cfg.lr
    assert type(_run(schedule="constant", warmup_steps=2).sched) is not optim.Constant

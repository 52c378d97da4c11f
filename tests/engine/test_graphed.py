"""--cuda-graphs' whole-step path (engine/graphed.py), checked on the CPU.

The captured function `graph_step` is a plain function over static buffers; on the CPU the
GraphStep runs it eagerly every step (`capture=False`), so what the graph would replay is
checked here against the engine's ordinary step: the same weights bit for bit, tensors updated
only in place, the learning rate taken from the device tensor, the partial batch, resume, and
the start line's account of the path taken. Capturing and replaying need CUDA:
tests/gpu/test_graphed.py.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fasttrain.engine import TrainConfig, build, checkpoint, fit, graphed, switches
from fasttrain.engine import run as run_module
from tests.engine.conftest import image_task, text_task, weights

BASE = dict(device="cpu", progress=False, batch_size=32, seed=3, fused_optimizer=True)
CASES = {  # what the whole-step graph holds: accumulation, clipping, a schedule, both optimizers
    "adamw-cosine-clip-accum": dict(model="cnn", accum_steps=2, grad_clip=0.5,
                                    schedule="cosine", warmup_steps=3, weight_decay=0.1),
    "sgd-onecycle-bf16": dict(model="mlp", optimizer="sgd", lr=0.05, schedule="onecycle",
                              precision="bf16", channels_last=False),
    "gpt-language": dict(model="gpt", data="synthetic-text", block_size=16, grad_clip=1.0),
}


def _build(case: str, task=None, **kw):
    cfg = TrainConfig(**{**BASE, "epochs": 2, "log_every": 3, **CASES[case], **kw})
    task = task or (text_task() if cfg.model == "gpt" else image_task(n_train=200))
    return build(cfg, data=task, verbose=False)


def _graph_run(case: str, **kw):
    run = _build(case, **kw)
    graphed.attach(run, capture=False)
    return run


def _losses(run) -> list:
    return [(r["step"], r["loss"]) for r in run.history if r["kind"] == "train"]


@pytest.mark.parametrize("case", CASES)
def test_the_graph_step_run_eagerly_equals_the_engine_step_bit_for_bit(case):
    plain, graph = _build(case), _graph_run(case)
    fit(plain)
    fit(graph)
    assert graph.step == plain.step == 2 * plain.batches.steps_per_epoch
    assert _losses(graph) == _losses(plain)
    a, b = weights(plain), weights(graph)
    assert all(torch.equal(a[k], b[k]) for k in a), case
    for p, q in zip(plain.model.parameters(), graph.model.parameters(), strict=True):
        for key, t in plain.opt.state[p].items():
            assert torch.equal(t, graph.opt.state[q][key]), key


def _state_tensors(run, s) -> dict[str, int]:
    """data_ptr of every tensor a replay reads or writes."""
    ptrs = {f"param{i}": p.data_ptr() for i, p in enumerate(run.model.parameters())}
    ptrs.update({f"buffer{i}": b.data_ptr() for i, b in enumerate(run.model.buffers())})
    for i, p in enumerate(run.model.parameters()):
        ptrs.update({f"opt{i}.{k}": t.data_ptr() for k, t in run.opt.state[p].items()})
    ptrs.update(idx=s.idx.data_ptr(), lr=s.lr.data_ptr(), loss_sum=run.loss_sum.data_ptr())
    return ptrs


def _steps(run, s, n: int) -> None:
    inputs = s.inputs(run, run.epoch)
    for _ in range(n):
        run.train_step(run, next(inputs))
        run.step += 1
        run.step_in_epoch += 1


@pytest.mark.parametrize("case", CASES)
def test_a_step_updates_the_static_tensors_in_place_and_reads_nothing_on_the_host(case):
    run = _graph_run(case, max_steps=8)
    s = run.graph
    _steps(run, s, 1)  # the first step makes the optimizer's state (the warm-up, on CUDA)
    before = _state_tensors(run, s)
    params = [p.detach().clone() for p in run.model.parameters()]
    _steps(run, s, 2)
    assert _state_tensors(run, s) == before
    assert not all(torch.equal(a, b) for a, b in zip(params, run.model.parameters(),
                                                       strict=True))  # it did train

    class HostReads(TorchDispatchMode):  # what would sync a CUDA step, or break its capture
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket.__name__ in ("_local_scalar_dense", "is_nonzero", "equal"):
                self.seen.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    s._load(run, next(s.inputs(run, run.epoch)))
    with HostReads() as reads:
        graphed.graph_step(s)
    assert reads.seen == []


@pytest.mark.filterwarnings("ignore:Seems like `optimizer.step\\(\\)` has been overridden")
def test_the_schedule_reaches_the_update_through_the_lr_tensor():
    run = _graph_run("adamw-cosine-clip-accum", max_steps=6)
    s, seen, step = run.graph, [], run.opt.step

    def spy(*a, **k):  # every group reads the one device tensor, holding the schedule's lr
        assert all(g["lr"] is s.lr for g in run.opt.param_groups)
        seen.append(s.lr.item())
        return step(*a, **k)

    run.opt.step = spy
    expected = []
    for _ in range(5):
        expected.append(run.sched.get_last_lr()[0])
        _steps(run, s, 1)
    del run.opt.step  # the class's own again
    assert seen == expected and len(set(seen)) == 4  # warming up 3 steps, then decaying
    assert all(isinstance(g["lr"], float) for g in run.opt.param_groups)  # saved and logged

    # The update takes the tensor, not the group's float: a wrong float changes nothing.
    twin = _graph_run("adamw-cosine-clip-accum", max_steps=6)
    _steps(twin, twin.graph, 5)
    idx = next(s.inputs(run, run.epoch))
    for r in (run, twin):
        r.graph._load(r, idx)
    for g in twin.opt.param_groups:
        g["lr"] = 123.0
    for r in (run, twin):
        graphed.graph_step(r.graph)
    for p, q in zip(run.model.parameters(), twin.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_every_step_is_whole_and_the_partial_batch_is_dropped_as_on_the_eager_path():
    run = _graph_run("adamw-cosine-clip-accum")  # 200 samples, batch 32: 6 steps, 8 left out
    shapes = [tuple(i.shape) for i in run.graph.inputs(run, 0)]
    assert shapes == [(2, 16)] * 6 == [(run.batches.accum, run.batches.micro)] * 6
    eager = [torch.cat([x for x, _ in step]) for step in run_module.step_batches(run, 0)]
    gathered = [torch.cat([run.batches.gather(i)[0] for i in idx])
                for idx in run.graph.inputs(run, 0)]
    assert all(torch.equal(a, b) for a, b in zip(eager, gathered, strict=True))


def test_resume_restores_into_the_static_tensors_and_continues_exactly(tmp_path):
    whole = _graph_run("adamw-cosine-clip-accum", max_steps=9, schedule="constant")
    fit(whole)
    first = _graph_run("adamw-cosine-clip-accum", max_steps=4, out=str(tmp_path),
                       schedule="constant")
    fit(first)
    second = _build("adamw-cosine-clip-accum", max_steps=9, out=str(tmp_path), resume="auto",
                    schedule="constant")
    graphed.attach(second, capture=False)
    fit(second)
    a, b = weights(whole), weights(second)
    assert all(torch.equal(a[k], b[k]) for k in a)

    # Restoring into a run that already stepped (a graph may hold its tensors) copies in place.
    s = second.graph
    before = _state_tensors(second, s)
    _, path = checkpoint.complete(tmp_path / "checkpoints")[0]  # step 4's: other values
    saved = checkpoint.load(path)
    checkpoint.restore(second, saved, path)
    assert second.step == 4 and _state_tensors(second, s) == before
    p = next(second.model.parameters())
    assert torch.equal(second.opt.state[p]["exp_avg"],
                       saved["optimizer"]["state"][0]["exp_avg"])


# -- which path, and why: the start line ------------------------------------------------------


@pytest.fixture
def cpu_graphs(monkeypatch):
    """build(cuda_graphs=True) on the CPU: the device check set aside, the rest as on CUDA
    (where eligible the step then runs eagerly: capture=False off CUDA)."""
    precision = switches.precision
    monkeypatch.setattr(switches, "precision", lambda cfg, dev, sharded=False: precision(
        dataclasses.replace(cfg, cuda_graphs=False), dev, sharded))


def test_an_eligible_run_says_so_and_trains_through_the_graph_step(cpu_graphs, capsys):
    cfg = TrainConfig(**{**BASE, **CASES["adamw-cosine-clip-accum"], "max_steps": 5,
                         "log_every": 5, "cuda_graphs": True})
    run = build(cfg, data=image_task(n_train=200))
    assert "step: one CUDA graph of the whole step (gather, forward, loss, backward, clip, " \
           "adamw update), replayed after 3 eager warm-up steps" in capsys.readouterr().err
    assert run.graph is not None and run.forward is run.model  # no reduce-overhead compile
    assert all(g["fused"] for g in run.opt.param_groups)
    fit(run)
    plain = _build("adamw-cosine-clip-accum", max_steps=5, log_every=5)
    fit(plain)
    assert _losses(run) == _losses(plain)
    assert [r["graph_replays"] for r in run.history if r["kind"] == "train"] == [0]


def _user_step(model, batch):
    x, y = batch
    return torch.nn.functional.cross_entropy(model(x), y)


INELIGIBLE = [
    (dict(step=_user_step), "a step of yours may do host work"),
    (dict(optimizer=lambda groups: torch.optim.SGD(groups, lr=0.1)), "an optimizer of yours"),
    (dict(scheduler=lambda opt: torch.optim.lr_scheduler.OneCycleLR(opt, 0.1, total_steps=9)),
     "a scheduler of yours may set more than the learning rate"),
    (dict(augment="flip"), "--augment seeds each batch's random draws on the host"),
    (dict(activation_checkpointing=True), "activation checkpointing saves and restores"),
    (dict(data="streamed"), "the data is streamed"),
]


@pytest.mark.parametrize(("given", "reason"), INELIGIBLE,
                         ids=["step", "optimizer", "scheduler", "augment", "checkpointing",
                              "streamed"])
def test_an_ineligible_run_names_the_fallback_and_why(cpu_graphs, capsys, given, reason):
    given = dict(given)
    task = image_task(n_train=200)
    if given.pop("data", None) == "streamed":
        task = torch.utils.data.TensorDataset(task.train_x.float() / 255, task.train_y)
        task.classes = list(range(10))  # what the model needs to know (ImageFolder has it)
    cfg_kw = {k: v for k, v in given.items() if k in ("augment", "activation_checkpointing")}
    user = {k: v for k, v in given.items() if k not in cfg_kw}
    cfg = TrainConfig(**{**BASE, "model": "cnn", "max_steps": 2, "cuda_graphs": True, **cfg_kw})
    run = build(cfg, data=task, **user)
    line = capsys.readouterr().err
    assert ("step: CUDA graphs of the model only (torch.compile reduce-overhead; loss, "
            "optimizer and schedule eager), not the whole step: " + reason) in line, line
    assert run.graph is None and run.graph_why.startswith(reason)
    assert run.train_step is run_module.step  # the ordinary step, around the model's graphs


def test_data_held_on_the_host_is_not_captured():
    run = build(TrainConfig(**{**BASE, "model": "mlp", "data_on_device": "off"}),
                data=image_task(), verbose=False)
    assert graphed.why_not(run).startswith("the data is held on the host")


def test_without_cuda_graphs_the_start_line_is_unchanged(capsys):
    build(TrainConfig(**{**BASE, "model": "mlp"}), data=image_task())
    assert "step:" not in capsys.readouterr().err


def test_a_failed_capture_goes_on_eagerly_and_says_why(monkeypatch):
    """A capture that raises (an op the graph cannot hold, say) must neither stop the run nor
    pass for graphed: the step goes on eagerly, the same training, with a warning and the
    reason in run.graph_why."""

    class Refused:
        def __enter__(self):
            raise RuntimeError("operation not permitted when stream is capturing")

        def __exit__(self, *exc):
            return False

    run = _graph_run("adamw-cosine-clip-accum", max_steps=5, log_every=5)
    run.graph.capture, run.graph.warm = True, graphed.WARMUP_STEPS  # capture at the first step
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", lambda g: Refused())
    with pytest.warns(RuntimeWarning, match="the capture failed .*runs eagerly"):
        fit(run)
    assert run.graph.graph is None and "not permitted" in run.graph_why
    plain = _build("adamw-cosine-clip-accum", max_steps=5, log_every=5)
    fit(plain)
    assert _losses(run) == _losses(plain)


def test_the_lab_measures_the_step_a_graph_run_trains_with():
    """profile, experiments, the batch-size search and plan's calibration time
    run.train_step: on a whole-step graph run that is the graph (after enough warm-up steps to
    capture it), not loop.step around an uncompiled model."""
    from fasttrain.lab import steptime

    run = _graph_run("adamw-cosine-clip-accum")
    times = steptime.time_steps(run, steps=2, warmup=1)
    assert len(times) == 2
    assert run.graph.warm == run.graph.steps_to_capture + 2  # on the CPU: every step eager


def test_the_models_graphs_fallback_marks_each_micro_batch_and_zeroes_gradients_in_place(
        monkeypatch):
    """Where the whole step is not captured, --cuda-graphs runs the model as torch.compile's
    CUDA graphs, whose outputs the next replay overwrites: each micro-batch (and evaluation
    batch) begins a new graph step, and the gradients persist, zeroed in place, so that no
    .grad is a graph output (pytorch#169545). On the CPU, without compile: the same weights as
    the ordinary step, and one mark per micro-batch."""
    marks = []
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    plain, fallback = _build("adamw-cosine-clip-accum"), _build("adamw-cosine-clip-accum")
    graphed.model_graphs_only(fallback, fallback.model)
    grads = [p.grad for p in fallback.model.parameters()]
    assert all(g is not None and not g.any() for g in grads)
    fit(plain)
    fit(fallback)
    assert all(p.grad is g for p, g in zip(fallback.model.parameters(), grads, strict=True))
    assert weights(plain).keys() == weights(fallback).keys()
    for k, v in weights(plain).items():
        assert torch.equal(v, weights(fallback)[k]), k
    micro_batches = fallback.step * fallback.cfg.accum_steps
    eval_batches = len(marks) - micro_batches
    assert micro_batches > 0 and 0 < eval_batches < micro_batches, marks

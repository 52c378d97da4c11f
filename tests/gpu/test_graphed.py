"""The whole-step CUDA graph (engine/graphed.py) on a GPU.

1. Replays compute what the same step computes eagerly: a run whose step is captured after the
   warm-up against the same run whose GraphStep never captures (graph_step eager every step,
   which tests/engine/test_graphed.py checks against the engine's ordinary step on the CPU);
   mlp in fp32 (deterministic kernels), with accumulation, clipping and a decaying schedule, so
   that a stale index buffer, a frozen learning rate or a lost micro-batch would show. One
   replay per step after the warm-up, and no memory allocated by a replay.
2. Resume across the capture: stopped at a checkpoint and resumed (its first steps eager again,
   then a new capture), the run ends where the uninterrupted one does.
3. A run that cannot be captured whole says why on its start line and trains through the
   model's own graphs (torch.compile reduce-overhead), with no replays counted.
"""

from __future__ import annotations

import pytest
import torch

from fasttrain.engine import TrainConfig, build, fit, graphed
from tests.engine.conftest import image_task, weights
from tests.gpu.common import GPU

pytestmark = GPU

STEPS = 12
SETTINGS = dict(model="mlp", device="cuda", batch_size=64, accum_steps=2, grad_clip=0.5,
                schedule="cosine", warmup_steps=2, max_steps=STEPS, epochs=100, log_every=4,
                lr=3e-3, weight_decay=0.1, progress=False, seed=1, cuda_graphs=True)


class Allocated:
    """The allocator's bytes in use after each step (a host-side counter: no sync)."""

    def __init__(self):
        self.bytes: list[int] = []

    def on_step(self, run):
        self.bytes.append(torch.cuda.memory_allocated(run.device))


def _run(capture: bool, **kw):
    run = build(TrainConfig(**{**SETTINGS, **kw}), data=image_task(n_train=1024), verbose=False)
    assert run.graph is not None, run.graph_why
    if not capture:
        graphed.attach(run, capture=False)
    return run


def _assert_same(a: dict, b: dict, rtol: float = 1e-6) -> None:
    for k in a:
        err = ((a[k].float() - b[k].float()).abs().max() / a[k].float().abs().max()).item()
        assert err <= rtol, f"{k}: relative difference {err:.2e}"


def test_replays_compute_what_the_eager_step_computes():
    eager, graph = _run(capture=False), _run(capture=True)
    fit(eager)
    memory = Allocated()
    fit(graph, callbacks=[memory])
    assert graph.graph.graph is not None
    assert sum(r["graph_replays"] for r in graph.history if r["kind"] == "train") \
        == STEPS - graphed.WARMUP_STEPS
    assert eager.graph.graph is None
    losses = [[r["loss"] for r in run.history if r["kind"] == "train"] for run in (eager, graph)]
    assert losses[0] == pytest.approx(losses[1], rel=1e-6)
    _assert_same(weights(eager), weights(graph))
    after_capture = memory.bytes[graphed.WARMUP_STEPS:]
    assert len(set(after_capture)) == 1, f"a replay allocated: {after_capture}"


def test_resume_across_the_capture_ends_where_the_uninterrupted_run_does(tmp_path):
    whole = _run(capture=True, schedule="constant")
    fit(whole)
    first = _run(capture=True, schedule="constant", max_steps=6, out=str(tmp_path))
    fit(first)
    second = _run(capture=True, schedule="constant", out=str(tmp_path), resume="auto")
    assert second.step == 6
    fit(second)
    assert second.graph.graph is not None  # captured again after its own warm-up
    _assert_same(weights(whole), weights(second))


def test_an_ineligible_run_falls_back_to_the_models_graphs_and_says_why(capsys):
    cfg = TrainConfig(**{**SETTINGS, "augment": "flip", "max_steps": 6})
    run = build(cfg, data=image_task(n_train=1024))
    assert "not the whole step: --augment seeds each batch's random draws on the host" \
        in capsys.readouterr().err
    assert run.graph is None and run.forward is not run.model  # compiled, reduce-overhead
    fit(run)
    assert all("graph_replays" not in r for r in run.history)

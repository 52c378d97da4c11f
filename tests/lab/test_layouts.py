"""lab/layouts.py: per-rank memory and costs of a layout, against hand arithmetic and the bytes
measured on gloo ranks (docs/distributed.md)."""

from __future__ import annotations

import pytest

from fasttrain.lab.layouts import Layout, bubble, rank_memory, tp_bytes_per_step

P = 801_280  # gpt at block 32, 30 symbols (the docs' measured model)


def test_one_process_holds_everything():
    m = rank_memory(P, 1000, Layout())
    assert m.as_dict() == {"params": 4 * P, "grads": 4 * P, "optimizer": 8 * P,
                           "activations": 1000, "total": 16 * P + 1000}


@pytest.mark.parametrize("layout, measured", [
    (Layout(tp=2), 4_875_264),  # measured parameter + AdamW bytes per rank (tp rank 0)
    (Layout(pp=2, microbatches=4), 4_853_760),  # pipeline stage 0
])
def test_tp_and_pp_halve_weights_and_state_within_what_stays_replicated(layout, measured):
    m = rank_memory(P, 0, layout)
    assert m.params + m.optimizer == 12 * P // 2
    # The prediction splits everything; embeddings and norms stay whole: ≤ 2% of the model here.
    assert abs(measured - (m.params + m.optimizer)) / measured < 0.02


def test_fsdp_divides_again_and_ddp_does_not():
    assert rank_memory(P, 0, Layout(tp=2, dp=2, fsdp=True)).params == 4 * P // 4
    assert rank_memory(P, 0, Layout(tp=2, dp=2)).params == 4 * P // 2


def test_pipeline_in_flight_microbatches():
    act = 8000  # one process, whole batch
    assert rank_memory(P, act, Layout(pp=2, microbatches=4, schedule="gpipe")).activations \
        == act // 2  # all 4 quarters of the stage's activations in flight
    assert rank_memory(P, act, Layout(pp=2, microbatches=4)).activations == act // 2 // 4 * 2


def test_bubble_and_tp_traffic():
    assert bubble(1, 8) == 0.0
    assert bubble(2, 4) == pytest.approx(1 / 5)
    assert bubble(4, 4) == pytest.approx(3 / 7)
    assert bubble(4, 4, stages_per_rank=2) < bubble(4, 4)
    assert tp_bytes_per_step(1, 4, 256, 128) == 0
    assert tp_bytes_per_step(2, 4, 256, 128) == 4 * 4 * 256 * 128 * 4  # 2(t-1)/t = 1 at t=2

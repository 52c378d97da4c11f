"""lab/tp_saved.py: the bytes a tensor-parallel rank saves for backward, counted on the model
split over a fake group, against a hand count of which saved tensors the plan splits. The
comparison with gloo ranks is tests/lab/test_layout_memory.py (74,244 B per rank for the
residual MLP below, 4,952,324 for gpt)."""

from __future__ import annotations

from fasttrain.engine.config import TrainConfig
from fasttrain.lab.layouts import layout
from fasttrain.lab.memory import predict_layout

B, H, BLOCKS = 32, 64, 4  # tests/engine/userblocks.py: batch, hidden units, blocks
USER = dict(model="tests.engine.userblocks:make", data="tests.engine.userblocks:data",
            batch_size=B, optimizer="sgd", seed=0, device="cpu")


def test_a_plain_tp_plan_splits_only_the_hidden_activations():
    """Each block's up is column-wise and down row-wise, without sequence parallelism: only
    up's output and the GELU's (the down's input), [B, H] fp32 each, are split; the input,
    LayerNorms, residual stream, each up's whole input and the head stay whole on every rank.
    Dividing the whole count by tp gave 53,506 B against the 74,244 counted on gloo ranks."""
    cfg = TrainConfig(**USER)
    b, (row,), one = predict_layout(cfg, layout(2, tp=2))
    whole = b.activations + b.weight_copies
    split = BLOCKS * 2 * B * H * 4  # up's output and the GELU's, per block
    assert one.activations == whole == 107_012
    assert row.activations == whole - split // 2 == 74_244
    assert row.params < one.params  # the same plan splits the weights (exact elsewhere)


def test_under_a_pipeline_each_stage_splits_its_own_hidden_activations():
    """pp 2 × tp 2 under gpipe (all m micro-batches alive at once, B samples in all): each stage
    holds 2 blocks, and keeps what the pipeline alone keeps less half of its blocks' hidden
    activations. Counted on gloo ranks: 35,328 and 38,928 B (predicted 35,328 and 38,916: the
    last stage's 12 B are pp 2's own, test_layout_memory)."""
    cfg = TrainConfig(**USER)
    _, rows, _ = predict_layout(cfg, layout(4, tp=2, pp=2, schedule="gpipe", rank_batch=B))
    _, alone, _ = predict_layout(cfg, layout(2, pp=2, schedule="gpipe", rank_batch=B))
    split = BLOCKS // 2 * 2 * B * H * 4  # a stage's up and GELU outputs, all micro-batches
    assert [r.activations for r in rows] == [a.activations - split // 2 for a in alone]
    assert [r.activations for r in rows] == [35_328, 38_916]

"""lab/layouts.py: per-rank memory of a layout, against hand counts of gpt's shards, and its
costs (bubble, tensor-parallel traffic) against hand arithmetic. The comparison with bytes
measured on gloo ranks is tests/lab/test_layout_memory.py."""

from __future__ import annotations

import json

import pytest
import torch

from fasttrain.errors import UserError
from fasttrain.lab.layouts import (
    Layout,
    bubble,
    layout,
    per_rank,
    stage_names,
    tp_bytes_sent,
    tp_shapes,
    tp_volume,
)
from fasttrain.models.gpt import GPT

V, T, C = 30, 32, 128  # gpt's defaults: 4 blocks, 4 heads, width 128


def gpt_and_adamw(**kw) -> tuple[GPT, torch.optim.Optimizer]:
    """A gpt whose AdamW state exists (one step), in the engine's two param groups."""
    torch.manual_seed(0)
    model = GPT((T,), V, **kw)
    groups = [{"params": [p for p in model.parameters() if p.ndim >= 2]},
              {"params": [p for p in model.parameters() if p.ndim < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups)
    model(torch.zeros(1, T, dtype=torch.long)).sum().backward()
    opt.step()
    return model, opt


def by_hand(tp: int = 1, blocks: int = 4, embed: bool = True, head: bool = True) -> int:
    """gpt's parameter count on one rank: Megatron-split blocks, the tied token table split by
    vocabulary rows (V = 30: 15 each under tp 2), the position table and the norms whole."""
    split = (3 * C * C + 3 * C) + C * C + (4 * C * C + 4 * C) + 4 * C * C  # qkv, proj, fc, proj
    whole = 4 * C + C + C  # two LayerNorms; the row-wise layers' biases
    n = blocks * (split // tp + whole)
    n += (V * C // tp + T * C) if embed else 0  # token and position tables
    n += (V * C // tp + 2 * C) if head else 0  # the head's copy of the tied table, final norm
    return n


def test_one_process_holds_everything_and_adamw_twice_plus_counters():
    model, opt = gpt_and_adamw()
    (row,) = per_rank(model, opt, [1000], Layout())
    P = by_hand() - V * C  # one process: one tied table
    assert sum(p.numel() for p in model.parameters()) == P
    assert (row.params, row.grads, row.activations) == (4 * P, 4 * P, 1000)
    assert row.optimizer == 8 * P + 4 * len(list(model.parameters()))  # moments + step counters


def test_tp_splits_the_plan_and_leaves_the_rest_whole():
    model, opt = gpt_and_adamw()
    shapes = tp_shapes(model, 2)
    assert shapes["blocks.0.attn.qkv.weight"] == (3 * C // 2, C)
    assert shapes["blocks.0.attn.proj.weight"] == (C, C // 2)
    assert shapes["blocks.0.attn.proj.bias"] == (C,) and shapes["wte.weight"] == (V // 2, C)
    assert shapes["wpe.weight"] == (T, C)
    (row,) = per_rank(model, opt, [1000], Layout(tp=2))
    assert row.params == 4 * (by_hand(tp=2) - V * C // 2) and row.activations == 500


def test_pp_holds_each_stage_and_the_tied_copy_on_the_last():
    model, opt = gpt_and_adamw()
    first, last = stage_names(model, 2)
    assert "wte.weight" in first and "wte.weight" in last and "wpe.weight" not in last
    rows = per_rank(model, opt, [3000, 5000], Layout(pp=2, microbatches=4), accum=1)
    assert rows[0].params == 4 * by_hand(blocks=2, head=False)
    assert rows[1].params == 4 * by_hand(blocks=2, embed=False)
    # 1f1b: a pipeline micro-batch is 1/4 of the accumulation micro-batch counted; stage 0
    # holds 2 in flight, stage 1 one
    assert [r.activations for r in rows] == [3000 // 4 * 2, 5000 // 4]
    gpipe = per_rank(model, opt, [3000, 5000], Layout(pp=2, microbatches=4, schedule="gpipe"))
    assert [r.activations for r in gpipe] == [3000, 5000]  # every micro-batch in flight
    # interleaved: rank 0 runs stages 0 and 2 (the mean of their counts per chunk), 5 chunks
    inter = per_rank(model, opt, [1000, 2000, 3000, 4000],
                     Layout(pp=2, microbatches=4, schedule="interleaved-1f1b"), accum=1)
    assert [r.activations for r in inter] == [2000 // 4 * 5, 3000 // 4 * 3]


def test_activation_checkpointing_wrappers_change_no_share():
    from fasttrain.models import apply_activation_checkpointing

    model, opt = gpt_and_adamw()
    plain = [per_rank(model, opt, [0], Layout(tp=2)), per_rank(model, opt, [0, 0], Layout(pp=2))]
    apply_activation_checkpointing(model)  # blocks.0._checkpoint_wrapped_module.attn...
    assert any("._checkpoint_wrapped_module." in n for n, _ in model.named_parameters())
    assert [per_rank(model, opt, [0], Layout(tp=2)), per_rank(model, opt, [0, 0], Layout(pp=2))] \
        == plain


def test_fsdp_shards_again_zero1_only_the_optimizer():
    model, opt = gpt_and_adamw()
    (tp,) = per_rank(model, opt, [0], Layout(tp=2))
    (two_d,) = per_rank(model, opt, [0], Layout(tp=2, dp=2, data="fsdp"))
    # FSDP chunks dim 0 of each local shard; the 15 vocabulary rows of a tp rank's token table
    # go 8 + 7, and the heavier rank (shown) holds 8 of them
    assert two_d.params == tp.params // 2 + C * 4 // 2
    (ddp,) = per_rank(model, opt, [0], Layout(dp=2, data="ddp"))
    (zero1,) = per_rank(model, opt, [0], Layout(dp=2, data="zero1"))
    assert ddp.params == zero1.params == 4 * (by_hand() - V * C)
    assert ddp.optimizer / 2 <= zero1.optimizer < ddp.optimizer


def test_bad_layouts_say_how_to_fix_them():
    with pytest.raises(UserError, match="--gpus 6 is not a multiple of --tp 4"):
        layout(6, tp=4)
    with pytest.raises(UserError, match="attention heads do not split over 3"):
        tp_shapes(GPT((T,), V), 3)
    with pytest.raises(UserError, match="cannot be cut into 5 pipeline stages"):
        stage_names(GPT((T,), V), 5)
    assert layout(8, tp=2, pp=2, parallel="fsdp", rank_batch=8) == Layout(
        tp=2, pp=2, dp=2, data="fsdp", microbatches=4)


def test_bubble_and_tp_traffic_by_hand():
    assert bubble(1, 8) == 0.0
    assert bubble(2, 4) == pytest.approx(1 / 5)
    assert bubble(4, 4) == pytest.approx(3 / 7)
    assert bubble(4, 4, virtual=2) == pytest.approx(3 / 11)
    # gpt-124m-like: 12 blocks, batch 8 × 1024 tokens, width 768, bf16: per block 2 all-reduces
    # forward + 2 backward of 8·1024·768·2 B = 12 MiB each: 48 MiB a block, 576 MiB a step
    assert tp_volume(1, 12, 8 * 1024, 768, 2) == 0
    assert tp_volume(4, 12, 8 * 1024, 768, 2) == 12 * 4 * 12 * 2**20
    assert tp_bytes_sent(4, 12, 8 * 1024, 768, 2) == 12 * 4 * 12 * 2**20 * 3 // 2  # 2·3/4
    assert tp_bytes_sent(2, 12, 8 * 1024, 768, 2) == 12 * 4 * 12 * 2**20  # 2·1/2 = 1


GPT_ARGS = ("memory", "--model", "gpt", "--data", "synthetic-text", "--block-size", "32",
            "--device", "cpu")


def test_memory_command_prints_a_row_per_pipeline_rank(capsys, tmp_path):
    from tests.conftest import run_cli

    path = tmp_path / "m.json"
    code, out, err = run_cli(capsys, *GPT_ARGS, "--batch-size", "16", "--tp", "2", "--pp", "2",
                             "--parallel", "fsdp", "--gpus", "8", "--memory-limit", "0.001",
                             "--json", str(path))
    assert code == 0, err
    assert "pipeline rank 0 (first)" in out and "bubble" in out
    assert "less 10% margin: no" in out  # 1 MiB: the heaviest rank holds more
    result = json.loads(path.read_text())
    assert result["config"]["layout"] == "dp 2 fsdp × tp 2 × pp 2 1f1b, m 4"
    assert result["config"]["rank_batch_size"] == 8  # one process at one dp rank's batch
    assert "one process, batch 8" in out  # a rank's batch, not "(this batch)": the global is 16
    first, last = (r for r in result["rows"] if r["kind"] == "rank")
    one = next(r for r in result["rows"] if r["kind"] == "one process")
    assert first["ranks"] == last["ranks"] == 4
    assert first["params"] < one["params"] / 7  # tp, pp and fsdp each halve most of it
    assert result["bubble"] == pytest.approx(1 / 5)


@pytest.mark.parametrize("argv, words", [
    (("--tp", "4", "--gpus", "6"), ("--gpus 6", "multiple of --tp 4")),
    (("--gpus", "0"), ("--gpus must be a number of ranks ≥ 1, got 0",)),
    (("--tp", "2", "--gpus", "4"), ("2 data-parallel groups", "--parallel fsdp")),
    # the engine's own rules (engine/mesh.check_data_mode), not a copy that could drift
    (("--tp", "2", "--gpus", "4", "--parallel", "ddp"), ("DTensor shards", "--parallel fsdp")),
    (("--pp", "2", "--gpus", "2", "--parallel", "zero1"), ("ZeroRedundancyOptimizer",
                                                          "fsdp (shards the optimizer state "
                                                          "too) or ddp")),
    (("--parallel", "dp", "--gpus", "2"), ("--parallel dp", "ddp, fsdp, zero1")),
    (("--tp", "3"), ("--tp 3", "heads")),
    (("--pp", "8"), ("cannot be cut into 8",)),
    (("--tp", "2", "--find-batch-size"), ("--find-batch-size",)),
    (("--parallel", "fsdp", "--gpus", "3", "--batch-size", "8"), ("global batch", "3 data")),
])
def test_memory_command_refuses_bad_layouts_in_one_line(capsys, argv, words):
    from tests.conftest import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, *GPT_ARGS, *argv)
    assert_one_line_error(code, err, *words)


def test_memory_command_without_torch_testing_says_what_is_missing(capsys, monkeypatch):
    import sys

    from tests.conftest import assert_one_line_error, run_cli

    # A torch build without its testing package: the fake backend's module cannot be imported.
    monkeypatch.setitem(sys.modules, "torch.testing._internal.distributed.fake_pg", None)
    code, _, err = run_cli(capsys, *GPT_ARGS, "--tp", "2")
    assert_one_line_error(code, err, "torch.testing._internal.distributed.fake_pg",
                          "fasttrain memory --tp/--pp")


def test_out_of_memory_message_names_the_layout_and_says_per_rank(capsys):
    from types import SimpleNamespace

    from fasttrain.engine.memory import explain_oom

    model = torch.nn.Linear(4, 4)
    cfg = SimpleNamespace(parallel="fsdp", tp=2, pp=1, batch_size=8, accum_steps=1,
                          activation_checkpointing=False, precision="fp32")
    run = SimpleNamespace(cfg=cfg, model=model, opt=torch.optim.SGD(model.parameters()),
                          device=torch.device("cpu"), step=3, batches=SimpleNamespace(micro=4))
    explain_oom(run)
    err = capsys.readouterr().err
    assert "this rank's share under --parallel fsdp --tp 2;" in err
    assert "`fasttrain memory` with the same flags" in err
    assert "4 samples per data-parallel rank" in err

"""The pipeline composed with tensor and data parallelism (engine/pipeline.py: each stage split
over tp, then DDP or fully_shard over dp, after the cut): `fasttrain train` with pp × tp,
pp × fsdp and pp × ddp on 4 gloo processes and pp × dp × tp on 8, against one process; a pp × tp
checkpoint resumed by one process; per-rank bytes of pp × tp; bad layouts refused alike on every
rank.

Tolerance as in test_tensor_parallel.py: the layouts add partial sums in other orders than one
process (row-wise all-reduces, FSDP's reduce-scatter, the tied embedding's two gradients), so
fp32 results differ in the last bits; SGD with momentum carries that through as is. Measured
here (torch 2.13, gloo, 2026-11-28), the largest difference from one process over pp2-tp2,
pp2-fsdp2, pp2-ddp2 and test_tensor_parallel's tp2 and fsdp2xtp2: after 20 steps, losses
7.2e-7 and weights 1.2e-7; after 6 (TP_STEPS), the same 7.2e-7 and 1.2e-7. The tests allow
1e-5. They train 6 steps, not 20 (14 steps fewer of 5 runs on 2-4 busy processes: 120 s of
CPU less for this module and test_tensor_parallel together): with the loss bug planted in
tensor_parallel's sharded loss (1e-4 too big from the third step on) or the tied
embedding's gradient left unsummed from the third step on, every 6-step comparison failed.
"""

from __future__ import annotations

import pytest
import torch

from fasttrain.engine import pipeline
from fasttrain.errors import UserError
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import (
    ARGS,
    TP_STEPS,
    assert_refused_alike,
    assert_same_run,
    records,
    train,
    train_here,
)

LAYOUTS = {  # name: (processes, flags)
    "pp2-tp2": (4, ["--pp", "2", "--tp", "2"]),
    "pp2-fsdp2": (4, ["--pp", "2", "--parallel", "fsdp"]),
    # gpipe: m backwards in a row, where DDP's bucket rebuild tripped (distributed.parallelize)
    "pp2-ddp2": (4, ["--pp", "2", "--parallel", "ddp", "--pp-schedule", "gpipe"]),
    # two stages per rank (interleaved): each one split over tp, then sharded over dp
    "pp2-dp2-tp2": (8, ["--pp", "2", "--tp", "2", "--parallel", "fsdp", "--pp-schedule",
                        "interleaved-1f1b"]),
}


BAD = {  # the line every rank prints: the flags of a layout refused on 4 processes
    "--tp 2 × --pp 4 = 8 does not divide the 4 processes": ["--pp", "4", "--tp", "2"],
    "--tp 2: gpt's 3 attention heads do not split over 2 ranks":
        ["--pp", "2", "--tp", "2", "--model", "tests.engine.layoutmodels:three_heads"],
    "gpt has 1 blocks and cannot be cut into 2 pipeline stages":
        ["--pp", "2", "--parallel", "fsdp", "--model", "tests.engine.layoutmodels:one_block"],
    "Regressor names no split points":
        ["--pp", "2", "--tp", "2", "--model", "tests.engine.usermodel:make", "--data",
         "tests.engine.usermodel:data", "--loss", "mse"],
}


# This module's 4-process commands, in the session's shared 4-process launch (launch.Part):
# the layouts over TP_STEPS steps (pp2-tp2's 1-step case added nothing to them but 21 s of CI's
# budget), the first half of the resumed run, then the refusals.
FOUR = Part(__name__, 4, ARGS)
for _name, (_procs, _flags) in LAYOUTS.items():
    if _procs == 4:
        FOUR.add(_name, "--max-steps", str(TP_STEPS), *_flags)
FOUR.add("pp2-tp2-checkpointed", "--max-steps", "2", "--checkpoint-every", "2",
         "--activation-checkpointing", *LAYOUTS["pp2-tp2"][1])
for _says, _flags in BAD.items():
    FOUR.add(_says, *_flags, "--max-steps", "1", refused=True)
# pipeline_driver.py's pp × tp run (its bytes), in the same launch: a call, not a train command.
DRIVEN = Part(__name__, 4, [])
DRIVEN.add("pp2-tp2-bytes", "--pp", "2", "--tp", "2", "--steps", str(TP_STEPS),
           call="tests.engine.pipeline_driver:case")


@pytest.fixture(scope="module")
def four(shared) -> Part:
    return FOUR.bound(shared)


@pytest.fixture(scope="module")
def driven(shared) -> Part:
    return DRIVEN.bound(shared)


@pytest.mark.slow
# The 8-process layout trains 1 step, in a launch of its own.
@pytest.mark.parametrize("name, steps", [("pp2-tp2", TP_STEPS), ("pp2-fsdp2", TP_STEPS),
                                         ("pp2-ddp2", TP_STEPS),
                                         ("pp2-dp2-tp2", 1)])
def test_a_pipeline_over_tp_and_dp_trains_as_one_process(tmp_path, one, four, name, steps):
    """Losses (logged from the last stage), gradient clipping (the norm over stages, tp and
    dp shards, the tied embedding once), the tied embedding split by FSDP on two stages, and
    the final weights gathered from every shard: one process's, within 1e-5."""
    procs, flags = LAYOUTS[name]
    if procs == four.procs:
        four(name).ok()
        out = four.root / name
    else:
        out = tmp_path / name
        proc = train(out, "--max-steps", str(steps), *flags, procs=procs)
        assert proc.returncode == 0, proc.stdout + proc.stderr
    reference = one(steps)
    if steps == TP_STEPS:  # the weights moved: the loss fell (3.462 -> 3.430 here)
        first, *_, last = (r["loss"] for r in records(reference) if r["kind"] == "train")
        assert last < first - 0.02
    assert_same_run(reference, out)
    evals = [[r["test_loss"] for r in records(d) if r["kind"] == "eval"]
             for d in (reference, out)]
    assert evals[1] == pytest.approx(evals[0], rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_pp_tp_checkpoint_resumes_in_one_process_as_an_uninterrupted_run(one, four):
    """DCP reshards on load: the pp × tp shards (each stage's blocks split in rows, the two
    copies of the tied embedding under one name) are read into one process's whole tensors,
    which continues as the process that was never split. Saved with activation checkpointing
    on (its wrappers invisible in the checkpoint's names), resumed with it off."""
    four("pp2-tp2-checkpointed").ok()
    run = four.root / "pp2-tp2-checkpointed"
    second = train_here(run, "--max-steps", "4", "--resume", "auto")
    assert second.returncode == 0 and "step-00000002" in second.stdout, second.stdout
    assert_same_run(one(4), run)


@pytest.mark.slow
def test_pp_tp_ranks_hold_a_quarter_of_each_block_and_their_stages_embeddings(driven,
                                                                            pipeline_runs):
    """Exact bytes (pipeline_driver.py's gpt: 4 blocks of 32 wide, 2 heads, 65 tokens, 16
    positions; SGD momentum = one buffer per parameter), pp 2 × tp 2 against one process:
    one process 213,888 + 213,888; ranks 0-1 (embeddings, blocks 0-1) 57,856 and 57,728 (each
    + as many); ranks 2-3 (blocks 2-3, final norm, the head's copy of the embedding) 56,064 and
    55,936. A block holds 12,704 values, 6,448 of them per tp rank: half of every split matrix
    and of the column-wise biases, the row-wise biases and the LayerNorms whole; the tied
    embedding's 65 rows are split 33 + 32 over tp, alike on both stages. The weights after
    TP_STEPS (6) steps equal one process's within 1e-5 (20 steps until 2026-11-28: 1.1 s a
    step on 4 busy processes, for the same check). In the session's shared 4-process launch (a
    launch of its own cost the start-up and imports of 4 processes)."""
    driven("pp2-tp2-bytes").ok()
    ranks = [torch.load(p) for p in sorted((driven.root / "pp2-tp2-bytes").glob("rank*.pt"))]
    (whole,) = pipeline_runs(None, TP_STEPS)  # the driver in one process
    assert (whole["param_bytes"], whole["optimizer_bytes"]) == (213_888, 213_888)
    assert [(r["param_bytes"], r["optimizer_bytes"]) for r in ranks] == \
        [(b, b) for b in (57_856, 57_728, 56_064, 55_936)]
    held = set()
    for r in ranks:
        assert r["losses"] == pytest.approx(whole["losses"], rel=1e-5, abs=1e-5)
        for k, v in r["state"].items():
            torch.testing.assert_close(v, whole["state"][k], rtol=1e-5, atol=1e-5, msg=k)
        held |= r["state"].keys()
    assert held == whole["state"].keys()


@pytest.mark.slow
@pytest.mark.parametrize("says", BAD)
def test_a_bad_pipeline_layout_is_the_same_line_on_every_rank(four, says):
    """In the module's 4-process launch: every rank's main() returned 2, which `python -m
    fasttrain` exits with (test_tensor_parallel checks that through torchrun)."""
    refused = four(says)
    assert refused.codes == [2] * 4, refused.log
    assert_refused_alike(refused.errors, 4, says, refused.log)


def test_tied_copies_split_differently_are_refused_not_untied():
    """The check `_tied` makes on what every pipeline rank gathered: a copy of a tied weight
    that one stage holds whole and another as tensor-parallel rows cannot be summed shard by
    shard, and is refused with one line (the model is never untied silently)."""
    whole = ((65, 32), torch.float32, "whole")
    rows = ((33, 32), torch.float32, "(Shard(dim=0),)")
    assert pipeline.split_alike("wte.weight", [{"wte.weight": rows}, {}, {"wte.weight": rows}]) \
        == rows  # a middle rank (nothing held) sends zeros of this shape
    with pytest.raises(UserError, match="'wte.weight' is tied across pipeline stages and split "
                                        "differently on them .*untie it in the model"):
        pipeline.split_alike("wte.weight", [{"wte.weight": whole}, {"wte.weight": rows}])


def test_a_tp_plan_dict_is_applied_to_the_stages_that_hold_its_modules():
    from fasttrain.models.gpt import GPT

    torch.manual_seed(0)
    first, last = GPT((8,), 11, n_layer=4, n_head=2, n_embd=16).pipeline_split(2)
    plan = {"blocks.*.attn.qkv": "col", "blocks.3.mlp.fc": "col", "wte": "row", "": "root"}
    assert pipeline.stage_plan(first, plan) == {"blocks.*.attn.qkv": "col", "wte": "row",
                                               "": "root"}
    assert pipeline.stage_plan(last, plan) == plan

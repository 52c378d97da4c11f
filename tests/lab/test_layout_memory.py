"""`fasttrain memory`'s per-rank prediction (lab/memory.predict_layout) against what gloo ranks
hold after a real step (tests/lab/layout_driver.py): parameters, gradients and optimizer state,
exact to the byte, for each rank role.

Measured here (gpt at its defaults, block 32, 30 tokens: 801,280 parameters; AdamW; torch 2.13 CPU):
one process holds 3,205,120 B of parameters, as many of gradients and 6,410,448 B of optimizer state
(two moments + 52 four-byte step counters); --tp 2: 1,617,408 / 1,617,408 / 3,235,024 on each rank;
--pp 2: 1,617,920 / 1,617,920 / 3,235,944 on the first stage and 1,602,560 / 1,602,560 / 3,205,228
on the last; --tp 2 --parallel fsdp on 4: 808,960 / 808,960 / 1,618,128 (storage; FSDP pads an
uneven shard); --parallel fsdp on 2: 1,602,560 / 1,602,560 / 3,205,328; --parallel zero1 on 2:
3,205,120 / 3,205,120 / 3,205,228 on the heavier rank (3,205,220 on the other). The predicted
figures are the same.

Activations cannot be measured on the CPU: its allocator keeps no statistics. What can be
counted is what lab/memory counts for one process, the storages a forward saves for backward,
here on each rank: one process 8,720,644 B at batch 8 (the same as lab/memory's count); --tp 2
4,952,324 B per rank, predicted 4,952,324 (lab/tp_saved: the count on the model split over a
fake group; one process ÷ tp had said 4,360,322, 12% low, because each column-wise linear saves
its all-gathered, whole input for backward). A user's residual MLP with a plain plan
(tests/engine/userblocks.py, batch 32, SGD; `user-tp2`): 74,244 B per rank, predicted 74,244
(÷ tp: 53,506, 28% low). The test allows 1%. Its pp 2 × tp 2 under gpipe: 35,328 and 38,928 B
on the first and last stage's ranks, predicted 35,328 and 38,916. --pp 2 under gpipe (every forward
before any backward: all m = 4 micro-batches alive at once): 4,213,760 B on the first stage
and 4,507,664 on the last, predicted 4,212,992 and 4,507,652 (lab/layouts.stage_activations:
the one-process count taken stage by stage, × m / m); the test allows 0.1%. Under 1f1b a
storage freed by one micro-batch's backward can come back at the same address for the next,
which a count by address merges: no check there.
"""

from __future__ import annotations

import json

import pytest

from fasttrain.engine.config import TrainConfig
from fasttrain.lab.layouts import layout
from fasttrain.lab.memory import predict_layout
from tests.engine.launch import Part
from tests.lab.layout_driver import CONFIG, USER  # the same runs, predicted and measured

CASES = {  # name: (processes, driver flags, layout keywords)
    "tp2": (2, ["--tp", "2"], dict(tp=2)),
    "pp2": (2, ["--pp", "2"], dict(pp=2)),
    "pp2-gpipe": (2, ["--pp", "2", "--pp-schedule", "gpipe"], dict(pp=2, schedule="gpipe")),
    "fsdp2-tp2": (4, ["--tp", "2", "--parallel", "fsdp"], dict(tp=2, parallel="fsdp")),
    "fsdp2": (2, ["--parallel", "fsdp"], dict(parallel="fsdp")),
    "zero1-2": (2, ["--parallel", "zero1"], dict(parallel="zero1")),
    "user-tp2": (2, ["--tp", "2", "--user"], dict(tp=2)),  # no sequence parallelism
    "user-pp2-tp2-gpipe": (4, ["--pp", "2", "--tp", "2", "--pp-schedule", "gpipe", "--user"],
                           dict(pp=2, tp=2, schedule="gpipe")),
}


# Every case in the session's shared launch of its process count (tests/engine/launch.py), as a
# call of the driver (layout_driver.case: built, one step, measured), not as launches of their
# own (2 launches: 38.8 s of the slow suite, 2026-11-27).
PARTS = {procs: Part(__name__, procs, []) for procs in sorted({n for n, _, _ in CASES.values()})}
for _name, (_procs, _flags, _) in CASES.items():
    PARTS[_procs].add(_name, *_flags, call="tests.lab.layout_driver:case")


@pytest.fixture(scope="module")
def measured(shared):
    """case → what each of its ranks holds (layout_driver's rank<r>.json)."""
    parts = {procs: part.bound(shared) for procs, part in PARTS.items()}

    def ranks(case: str) -> list[dict]:
        part = parts[CASES[case][0]]
        part(case).ok()
        return [json.loads((part.root / case / f"rank{r}.json").read_text())
                for r in range(part.procs)]

    return ranks


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_prediction_equals_the_bytes_each_rank_holds(measured, case):
    procs, flags, kw = CASES[case]
    tp, pp = kw.get("tp", 1), kw.get("pp", 1)
    dp = procs // (tp * pp)
    base = USER if "--user" in flags else CONFIG
    ranks = measured(case)
    for r in ranks:  # a DTensor shard's storage is its own, not its whole tensor's (FSDP pads
        # an uneven dim-0 shard, e.g. the tied embedding's 15 vocabulary rows of a tp rank)
        assert all(r[k]["numel"] <= r[k]["storage"] < 1.01 * r[k]["numel"]
                   for k in ("params", "grads", "optimizer"))
    # One process at one data-parallel rank's batch, divided as the layout divides it.
    cfg = TrainConfig(**{**base, "batch_size": base["batch_size"] // dp})
    lay = layout(procs, rank_batch=cfg.batch_size, **kw)
    b, rows, _ = predict_layout(cfg, lay)
    assert len(rows) == pp
    # Activations: the saved-tensor count of each rank, against the prediction (lab/tp_saved:
    # counted on the model split over a fake group). Not under FSDP, whose forward saves the
    # all-gathered weights (freed after it, but counted when saved).
    if pp == 1 and kw.get("parallel") != "fsdp":
        one = b.activations + b.weight_copies  # one process, this micro-batch
        for r in ranks:
            assert rows[0].activations == pytest.approx(r["saved"], rel=0.01)
            assert (r["saved"] < one) == (tp > 1)  # tensor parallelism splits some of them
    for stage, row in enumerate(rows):
        # Global ranks of this pipeline stage (mesh: pp outermost), the heaviest one predicted.
        held = ranks[stage * tp * dp:(stage + 1) * tp * dp]
        if kw.get("schedule") == "gpipe":  # every micro-batch's activations alive at once
            for r in held:
                assert row.activations == pytest.approx(r["saved"], rel=1e-3)
        for part in ("params", "grads", "optimizer"):
            assert getattr(row, part) == max(r[part]["storage"] for r in held), (stage, part)

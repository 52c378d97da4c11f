"""lab/layout_choice.py: which layout for a model on N GPUs — memory per GPU and step time of
each candidate against hand arithmetic, the rule's order (data → FSDP → TP inside a node →
PP across nodes), and `experiment scaling`'s layout table."""

from __future__ import annotations

import dataclasses
import json

import pytest

from fasttrain.cli import main
from fasttrain.lab import layout_choice as lc
from fasttrain.lab import layouts
from fasttrain.lab.scaling import Link, Spec, allreduce_s, step_time

GIB = 2**30
NVLINK, IB = Link("nv", 450e9, 5e-6), Link("ib", 50e9, 5e-6)
SLOW = Link("slow", 6.25e9, 5e-6)  # one NIC per node of 8 GPUs
# A 1.3 B-parameter transformer-like model, 2 GiB saved for backward per sample.
BIG = lc.Model(params=1_300_000_000, flops_per_sample=2e13, saved_per_sample=2 * GIB,
               n_layer=24, n_head=16, n_embd=2048, seq=2048)


def rows(m: lc.Model, nodes: int = 1, batch: int = 4, gpu: int = 80 * GIB, inter=IB):
    return {r.layout: r for r in lc.candidates(m, 8, nodes, batch, NVLINK, inter, 0.4, 989e12,
                                               3e-4, gpu)}


def test_saved_bytes_by_hand_for_logreg():
    # Linear saves its input, log_softmax its output, nll_loss the int64 targets and a 4-byte
    # total weight: per sample 784·4 + 10·4 + 8 bytes, plus 4.
    for batch in (1, 8):
        spec = Spec("logreg", "logreg", (1, 28, 28), 10, batch)
        assert lc.saved_bytes(spec) == batch * (784 * 4 + 10 * 4 + 8) + 4


def test_memory_divides_as_each_layout_divides():
    r = rows(BIG)
    assert r["ddp"].state == 16 * BIG.params
    assert r["fsdp"].state == r["fsdp × tp 2"].state == 16 * BIG.params // 8
    # micro-batch: the largest power of 2 that fits 90% of 80 GiB: 20.8 GB + 2 GiB·μ → 16 > 4
    assert r["ddp"].micro_batch == 4  # capped by the 4 samples per GPU
    assert r["ddp"].memory == 16 * BIG.params + 4 * 2 * GIB
    assert r["fsdp × tp 2"].micro_batch == 8 and r["fsdp × tp 2"].memory == pytest.approx(
        16 * BIG.params // 8 + 8 * 2 * GIB / 2, abs=1)


def test_step_time_by_hand():
    r = rows(BIG)["fsdp × tp 2"]
    compute = 2e13 * 4 / (0.4 * 989e12)
    assert r.compute_s == pytest.approx(compute)
    # tp 2: 96 all-reduces of the 8-sample [8·2048, 2048] bf16 activation, ring over NVLink
    volume = layouts.tp_volume(2, 24, 8 * 2048, 2048, 2)
    assert r.tp_bytes == volume == 4 * 24 * 8 * 2048 * 2048 * 2
    assert r.tp_s == pytest.approx(96 * allreduce_s(volume / 96, 2, NVLINK))
    fsdp_exposed = 1.5 * step_time(compute, 4 * BIG.params // 2, 4, NVLINK)["exposed_s"]
    assert r.dp_exposed_s == pytest.approx(fsdp_exposed)
    assert r.step_s == pytest.approx(compute + fsdp_exposed + r.tp_s)
    p = rows(BIG, nodes=2)["pp 2 × fsdp"]  # 8 samples per dp rank, micro-batches of 2: m = 4
    assert p.micro_batch == 2 and p.bubble == pytest.approx(1 / 5)


def test_the_rule_data_then_fsdp_then_tp_then_pp():
    best, why = lc.pick(list(rows(BIG).values()), 80 * GIB, IB)
    assert best.layout == "ddp" and "fit one GPU" in why
    best, why = lc.pick(list(rows(BIG, gpu=22 * GIB).values()), 22 * GIB, IB)
    assert best.layout == "fsdp" and "FSDP shards" in why
    huge = lc.Model(**{**BIG.__dict__, "saved_per_sample": 75 * GIB})
    best, why = lc.pick(list(rows(huge).values()), 80 * GIB, IB)
    assert best.layout == "fsdp × tp 2" and "splits the activations" in why
    best, why = lc.pick(list(rows(BIG, nodes=2, inter=SLOW).values()), 80 * GIB, SLOW)
    assert best.pp == 2 and "bubble" in why and "slow" in why
    best, why = lc.pick(list(rows(BIG, gpu=GIB).values()), GIB, IB)
    assert best is None and "nothing fits" in why
    # Where a pipeline is the first that fits, the reason names its stages, not tp.
    only_pp = [dataclasses.replace(r, fits=r.pp > 1) for r in rows(BIG, nodes=2).values()]
    best, why = lc.pick(only_pp, 80 * GIB, IB)
    assert best.pp == 2 and "stages across nodes" in why and "splits the activations" not in why


def test_experiment_scaling_prints_and_writes_the_pick(tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["experiment", "scaling", "--predict-only", "--predict-models", "gpt-13b",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    one, two = result["layouts"]
    assert (one["gpus"], two["gpus"]) == (8, 16)
    assert one["pick"]["layout"] == "fsdp × tp 2"  # 12.9 B parameters: FSDP alone does not fit
    assert one["pick"]["tp_bytes"] == 4 * 40 * 2 * 2048 * 5120 * 2
    assert "which layout" in capsys.readouterr().out

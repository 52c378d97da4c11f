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


def test_a_gpt_counted_on_the_meta_device_saves_what_a_built_one_does_split_or_not():
    # tests/lab/layout_driver.py measured these on gloo ranks and lab/tp_saved counts them on a
    # built Run (gpt, block 32, batch 8, vocabulary 30): the meta count, which sizes no CPU can
    # build also take, must agree to the byte — split by gpt's plan at tp 2, and with attention
    # saved as its fused kernel saves it (the meta device's math path keeps [B, h, T, T]).
    spec = Spec("gpt", "gpt", (32,), 30, 8)
    assert lc.saved_bytes(spec) == 8_720_644
    assert lc.saved_bytes(spec, tp=2) == 4_952_324


def test_the_reference_gpt_rows_keep_what_a_tp_rank_saves_not_a_tp_th():
    spec = Spec("gpt-124m", "gpt", (1024,), 50257, 8,
                {"n_layer": 12, "n_head": 12, "n_embd": 768})
    m = lc.model_of(spec)
    counted = dict(m.saved_tp)
    assert set(counted) == {2, 4}  # the degrees dividing its 12 heads (candidates: ≤ 8 a node)
    for tp, saved in counted.items():
        assert saved == lc.saved_bytes(spec, tp) // spec.batch
        assert saved > 1.05 * m.saved_per_sample / tp  # no plan reaches 1/tp
    r = rows(m, batch=8, gpu=16 * GIB)
    tp2 = r["fsdp × tp 2"]
    assert tp2.memory == int(tp2.state + counted[2] * tp2.micro_batch)
    # a model without a count (a user's: no tp candidates) keeps 1/tp as its floor
    assert BIG.saved_on_rank(4) == BIG.saved_per_sample / 4

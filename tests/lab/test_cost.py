"""The catalogue and the arithmetic of cost, against hand-computed cases."""

import math

import pytest

from fasttrain.errors import UserError
from fasttrain.lab import cost

NAMED = ("T4", "L4", "A10G", "RTX 3090", "RTX 4090", "A6000", "V100", "A100 40GB", "A100 80GB",
         "H100 SXM", "H200")


def test_the_shipped_catalogue_has_every_gpu_the_guides_name_with_every_field():
    gpus = cost.load()
    assert set(NAMED) <= set(gpus)
    for g in gpus.values():
        assert g.memory_gb > 0 and g.bandwidth > 0 and g.link_bandwidth > 0 and g.interconnect
        assert g.peaks["fp32"] > 0
        assert "on_demand" in g.prices
        for p in g.prices.values():
            assert p.usd_per_hour > 0 and p.read and p.source
    assert "bf16" not in gpus["V100"].peaks and "fp8" not in gpus["A100 80GB"].peaks
    assert gpus["H100 SXM"].peaks["bf16"] == 989e12 and gpus["H200"].bandwidth == 4.8e12


def test_env_peaks_are_the_catalogues():
    from fasttrain.env import GPU_PEAKS

    gpus = cost.load()
    assert GPU_PEAKS["A100 80GB"]["bf16"] == gpus["A100 80GB"].peaks["bf16"]
    assert GPU_PEAKS["A100 80GB"]["bw"] == gpus["A100 80GB"].bandwidth


def _write(tmp_path, body: str):
    p = tmp_path / "mine.toml"
    p.write_text(body)
    return p


def test_a_user_catalogue_missing_a_field_names_the_gpu_and_the_field(tmp_path):
    p = _write(tmp_path, '[gpus."Mine"]\nmemory_gb = 24\nfp32 = 30\ninterconnect = "PCIe"\n'
               'link_gbs = 25\n')
    with pytest.raises(UserError, match=r"GPU 'Mine' lacks the field 'bandwidth_gbs'"):
        cost.load(p)
    p = _write(tmp_path, '[gpus."Mine"]\nmemory_gb = 24\nfp32 = 30\nbandwidth_gbs = 900\n'
               'interconnect = "PCIe"\nlink_gbs = 25\n'
               'prices.spot = { usd_per_hour = 0.5, read = "2026-11-25" }\n')
    with pytest.raises(UserError, match=r"'Mine' lacks the field 'prices.spot.source'"):
        cost.load(p)
    p = _write(tmp_path, '[gpus."Mine"]\nmemory_gb = -1\nfp32 = 30\nbandwidth_gbs = 900\n'
               'interconnect = "PCIe"\nlink_gbs = 25\n')
    with pytest.raises(UserError, match=r"'Mine': field 'memory_gb' must be a positive"):
        cost.load(p)


def test_spot_hours_by_hand():
    # 10 h of work, 0.1 preemptions/h, each losing 1 h / 2 + 0.5 h: loss 0.1 → 10 / 0.9
    assert cost.spot_hours(10, 0.1, 1.0, 0.5) == pytest.approx(100 / 9)
    assert cost.spot_hours(10, 0.0, 1.0, 0.5) == 10
    assert cost.spot_hours(10, 1.0, 1.0, 0.5) == math.inf  # loses as much as it works


def test_options_price_both_tiers_for_n_gpus():
    g = cost.GPU("X", 24, {"fp32": 1e12}, 1e11, "PCIe", 25e9,
                 {"on_demand": cost.Price(2.0, "d", "s"), "spot": cost.Price(0.6, "d", "s")})
    od, spot = cost.options(g, 2, 10.0, 0.1, 1.0, 0.5)
    assert (od.tier, od.hours, od.usd, od.preemptions) == ("on_demand", 10.0, 40.0, 0.0)
    assert spot.hours == pytest.approx(100 / 9)
    assert spot.usd == pytest.approx(100 / 9 * 2 * 0.6)  # 13.33 $
    assert spot.preemptions == pytest.approx(0.1 * 100 / 9)


def test_marks_and_pareto_front():
    a = cost.Option("A", "on_demand", 1, hours=10, usd=5)
    b = cost.Option("B", "on_demand", 1, hours=2, usd=20)
    c = cost.Option("C", "spot", 1, hours=4, usd=8)
    d = cost.Option("D", "on_demand", 1, hours=5, usd=30)  # beaten by C on both
    e = cost.Option("E", "spot", 1, hours=math.inf, usd=math.inf)
    opts = [a, b, c, d, e]
    cost.mark(opts, deadline_h=6)
    assert a.marks == ["cheapest"] and b.marks == ["fastest"]
    assert c.marks == ["cheapest by deadline"] and d.marks == [] and e.marks == []
    assert [o.gpu for o in cost.pareto(opts)] == ["B", "C", "A"]
    cost.mark([f := cost.Option("F", "spot", 1, hours=9, usd=1)], deadline_h=1)
    assert f.marks == ["cheapest", "fastest"]  # none meets the deadline: no such mark


def test_a_catalogue_launch_cost_needs_its_source(tmp_path):
    base = ('[gpus."Mine"]\nmemory_gb = 24\nfp32 = 30\nbandwidth_gbs = 900\n'
            'interconnect = "PCIe"\nlink_gbs = 25\n')
    gpu = cost.load(_write(tmp_path, base + 'launch_us = 4.5\nlaunch_source = "measured"\n'))
    assert gpu["Mine"].launch_s == pytest.approx(4.5e-6)
    assert gpu["Mine"].launch_source == "measured"
    assert cost.load(_write(tmp_path, base))["Mine"].launch_s is None
    with pytest.raises(UserError, match=r"'Mine' has 'launch_us' but lacks the field "
                       r"'launch_source'"):
        cost.load(_write(tmp_path, base + "launch_us = 4.5\n"))

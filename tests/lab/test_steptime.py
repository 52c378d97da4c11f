"""The roofline step time's arithmetic, against hand-computed FLOPs, bytes and scaling."""

import pytest
import torch

from fasttrain.engine.config import TrainConfig
from fasttrain.lab import scaling, steptime


def test_a_matmul_counted_by_hand():
    a, b = torch.randn(16, 64), torch.randn(64, 32)
    flops, nbytes = steptime.count_call(lambda: torch.mm(a, b))
    assert flops == 2 * 16 * 64 * 32  # one multiply-add per (i, k, j)
    assert nbytes == 4 * (16 * 64 + 64 * 32 + 16 * 32)  # both inputs read, the output written


def test_a_logreg_step_counts_forward_and_weight_gradient_flops():
    # logreg is one Linear(784 → 10); its input needs no gradient, so backward computes only the
    # weight's: 2 · B · 784 · 10 FLOPs forward, as many backward (bias and loss: no matmul FLOPs)
    batch = 32
    cfg = TrainConfig(model="logreg", data="synthetic", batch_size=batch, device="cpu")
    work = steptime.count(cfg)
    assert work.flops == 2 * (2 * batch * 784 * 10)
    assert work.grad_bytes == 4 * (784 * 10 + 10)
    assert work.ops > 6  # at least addmm, its weight's mm, the loss, the optimizer's ops
    # an upper bound it must exceed: the weights read twice and the input batch read once
    assert work.bytes > 4 * (2 * 7850 + batch * 784)


def test_roofline_and_efficiency_carried_over():
    work = steptime.StepWork(flops=2e12, bytes=1e10, grad_bytes=0)
    # compute: 2e12 / 1e14 = 20 ms; memory: 1e10 / 1e12 = 10 ms → compute-bound, 20 ms
    assert steptime.roofline_s(work, 1e14, 1e12) == pytest.approx(0.02)
    # memory-bound device: 1e10 / 1e11 = 100 ms beats 2e12 / 1e14
    assert steptime.roofline_s(work, 1e14, 1e11) == pytest.approx(0.1)
    # calibrated here: a 5 ms roof measured at 20 ms is 25% efficient; that fraction carries over
    eff = steptime.efficiency(measured_s=0.02, roof_s=0.005)
    assert eff == pytest.approx(0.25)
    assert steptime.predict_s(work, 1e14, 1e12, eff) == pytest.approx(0.08)
    # 100,000 ops at 1 µs each take 100 ms to issue: longer than the 80 ms of work
    many = steptime.StepWork(flops=2e12, bytes=1e10, grad_bytes=0, ops=100_000)
    assert steptime.predict_s(many, 1e14, 1e12, eff, issue_s=1e-6) == pytest.approx(0.1)


def test_data_parallel_step_by_hand():
    link = scaling.Link("test", bandwidth=1e9, latency=5e-6)
    one = steptime.on_gpus(1.0, 2**20, 1, link)
    assert one["step_s"] == 1.0 and one["allreduce_s"] == 0.0
    two = steptime.on_gpus(1.0, 2**20, 2, link)
    # half the samples each: 0.5 s; one 1 MiB bucket, ready as backward ends, is all exposed:
    # ring all-reduce 2 (N−1)/N · bytes / bw + 2 (N−1) · latency
    t = 2 * 1 / 2 * 2**20 / 1e9 + 2 * 1 * 5e-6
    assert two["compute_s"] == 0.5 and two["allreduce_s"] == pytest.approx(t)
    assert two["step_s"] == pytest.approx(0.5 + t)


def test_calibration_reports_its_basis():
    cfg = TrainConfig(model="logreg", data="synthetic", batch_size=64, device="cpu")
    eff, basis = steptime.calibrate(cfg, steps=2)
    assert 0 < eff.value == pytest.approx(basis["roofline_s"] / basis["measured_step_s"])
    assert "calibrated on cpu" in eff.source and basis["peaks"] == "measured"

"""The per-op roofline + launch step time: counts, arithmetic and the two-point fit, by hand."""

import dataclasses

import pytest
import torch

from fasttrain.engine.config import TrainConfig
from fasttrain.lab import scaling, steptime


def test_a_matmul_counted_by_hand():
    a, b = torch.randn(16, 64), torch.randn(64, 32)
    work = steptime.count_call(lambda: torch.mm(a, b))
    flops = 2 * 16 * 64 * 32  # one multiply-add per (i, k, j)
    nbytes = 4 * (16 * 64 + 64 * 32 + 16 * 32)  # both inputs read, the output written
    assert work.calls == {(flops, nbytes): 1} and work.ops == 1


def test_a_linear_layer_is_one_call_of_known_flops_and_bytes():
    batch, d_in, d_out = 16, 64, 32
    layer, x = torch.nn.Linear(d_in, d_out), torch.randn(batch, d_in)
    work = steptime.count_call(lambda: layer(x))
    # aten::t of the weight is a view (no call); aten::addmm reads bias, input and weight once
    # and writes the output
    flops = 2 * batch * d_in * d_out
    nbytes = 4 * (d_out + batch * d_in + d_in * d_out + batch * d_out)
    assert work.calls == {(flops, nbytes): 1}


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
    # the batch is not in the op count: the same calls at twice the batch
    twice = steptime.count(dataclasses.replace(cfg, batch_size=2 * batch))
    assert twice.ops == work.ops and twice.flops == 2 * work.flops


def test_the_roofline_is_summed_per_call():
    # one compute-bound call (20 ms of FLOPs, 1 ms of bytes) and one memory-bound (10 ms of
    # bytes) at 1e14 FLOP/s and 1e12 B/s: 20 + 10 ms, where the step's totals would say
    # max(20, 11) ms
    work = steptime.StepWork({(2e12, 1e9): 1, (0.0, 1e10): 1}, grad_bytes=0)
    assert steptime.roofline_s(work, 1e14, 1e12) == pytest.approx(0.03)
    assert work.flops == 2e12 and work.bytes == 1.1e10 and work.ops == 2


def test_prediction_adds_the_calls_issued():
    work = steptime.StepWork({(2e9, 1e6): 1000}, grad_bytes=0)  # each call 20 µs of compute
    # 20 ms of roofline at efficiency 0.5 is 40 ms, and 1000 calls at 10 µs are 10 ms
    assert steptime.predict_s(work, 1e14, 1e12, 0.5, 1e-5) == pytest.approx(0.05)
    # half the samples on this GPU: half the roofline, every call still issued
    assert steptime.predict_s(work, 1e14, 1e12, 0.5, 1e-5, share=0.5) == pytest.approx(0.03)


def test_efficiency_carries_to_another_gpu_launch_does_not():
    work = steptime.StepWork({(1e12, 1e8): 10, (0.0, 1e9): 100}, grad_bytes=0)
    # GPU A, 1e14 FLOP/s and 1e12 B/s: 10 × 10 ms + 100 × 1 ms = 200 ms of roofline;
    # GPU B, 4e14 and 2e12: 10 × 2.5 ms + 100 × 0.5 ms = 75 ms
    assert steptime.roofline_s(work, 1e14, 1e12) == pytest.approx(0.2)
    assert steptime.roofline_s(work, 4e14, 2e12) == pytest.approx(0.075)
    eff = 0.25  # fitted on A, carried to B; each GPU issues the 110 calls at its own cost
    assert steptime.predict_s(work, 1e14, 1e12, eff, 4e-6) == pytest.approx(0.8 + 110 * 4e-6)
    assert steptime.predict_s(work, 4e14, 2e12, eff, 2e-6) == pytest.approx(0.3 + 110 * 2e-6)


def _planted(eff: float, launch: float, works: dict[int, steptime.StepWork], peaks=(1e11, 4e10)):
    return [steptime.Point(b, steptime.roofline_s(w, *peaks), w.ops,
                           steptime.predict_s(w, *peaks, eff, launch)) for b, w in works.items()]


def test_the_two_point_fit_recovers_planted_constants():
    works = {b: steptime.StepWork({(2e6 * b, 4e4 * b): 20, (0.0, 1e3): 200}, 0)
             for b in (32, 128)}
    eff, launch = steptime.fit(_planted(0.37, 6e-6, works))
    assert eff == pytest.approx(0.37, rel=1e-9) and launch == pytest.approx(6e-6, rel=1e-9)


def test_the_fit_recovers_constants_planted_on_real_counted_steps():
    cfg = TrainConfig(model="logreg", data="synthetic", device="cpu")
    works = {b: steptime.count(dataclasses.replace(cfg, batch_size=b)) for b in (64, 512)}
    eff, launch = steptime.fit(_planted(0.2, 3e-6, works))
    assert eff == pytest.approx(0.2, rel=1e-9) and launch == pytest.approx(3e-6, rel=1e-9)


def test_the_fit_keeps_its_bounds():
    works = {b: steptime.StepWork({(2e6 * b, 4e4 * b): 20, (0.0, 1e3): 200}, 0)
             for b in (32, 128)}
    # a step faster than its roofline: efficiency stops at 1, the calls take what is left
    eff, launch = steptime.fit(_planted(1.1, 1e-4, works))
    assert eff == 1.0 and launch > 0
    # times that fall faster than the roofline as the batch shrinks would need a negative cost
    # per call: it stays 0, and the efficiency is the one-constant least squares
    points = [dataclasses.replace(p, measured_s=p.roofline_s / 0.5 - p.ops * 1e-6)
              for p in _planted(0.5, 0.0, works)]
    eff, launch = steptime.fit(points)
    assert launch == 0.0 and 0.5 < eff <= 1.0
    with pytest.raises(ValueError):
        steptime.fit(points[:1])


def test_the_fit_says_which_bound_held_and_what_the_unbounded_fit_was():
    works = {b: steptime.StepWork({(2e6 * b, 4e4 * b): 20, (0.0, 1e3): 200}, 0)
             for b in (32, 128)}
    inside = _planted(0.37, 6e-6, works)
    assert steptime.bounds_held(inside) == ((), None)
    faster = _planted(1.1, 1e-4, works)  # faster than the roofline: efficiency stops at 1
    held, free = steptime.bounds_held(faster)
    assert held == ("efficiency",) and free == pytest.approx((1.1, 1e-4), rel=1e-9)
    assert steptime.unbounded(faster) == free
    shrinking = [dataclasses.replace(p, measured_s=p.roofline_s / 0.5 - p.ops * 1e-6)
                 for p in _planted(0.5, 0.0, works)]  # would need a negative cost per call
    held, free = steptime.bounds_held(shrinking)
    assert held == ("launch_s",) and free == pytest.approx((0.5, -1e-6), rel=1e-9)
    note = steptime.held_note(steptime.Fit(*steptime.fit(shrinking), "cpu", "", held, free))
    assert "cost per call held at its bound 0" in note and "-1 µs per call" in note
    assert steptime.held_note(steptime.Fit(0.37, 6e-6, "cpu", "")) == ""


def test_data_parallel_step_by_hand():
    link = scaling.Link("test", bandwidth=1e9, latency=5e-6)
    work = steptime.StepWork({(1e12, 0.0): 1}, grad_bytes=2**20)  # 1 s at 1e12 FLOP/s
    one = scaling.step_time(steptime.predict_s(work, 1e12, 1e12, 1.0, 0.0), 2**20, 1, link)
    assert one["step_s"] == 1.0 and one["allreduce_s"] == 0.0
    per_gpu = steptime.predict_s(work, 1e12, 1e12, 1.0, 0.0, share=1 / 2)
    two = scaling.step_time(per_gpu, 2**20, 2, link)
    # half the samples each: 0.5 s; one 1 MiB bucket, ready as backward ends, is all exposed:
    # ring all-reduce 2 (N−1)/N · bytes / bw + 2 (N−1) · latency
    t = 2 * 1 / 2 * 2**20 / 1e9 + 2 * 1 * 5e-6
    assert two["compute_s"] == 0.5 and two["allreduce_s"] == pytest.approx(t)
    assert two["step_s"] == pytest.approx(0.5 + t)


def test_a_count_for_a_gpu_takes_the_optimizers_foreach_path():
    cfg = TrainConfig(model="mlp", data="synthetic", batch_size=32, device="cpu")
    from fasttrain.engine.run import build

    run = build(cfg, verbose=False)
    looped, foreach = steptime.count_run(run), steptime.count_run(run, foreach=True)
    params = sum(len(g["params"]) for g in run.opt.param_groups)
    # AdamW on a CPU: several calls per parameter tensor (6 here); foreach: one per op for all
    assert params >= 4 and looped.ops - foreach.ops >= 4 * (params - 1)
    assert foreach.flops == looped.flops
    assert all(g["foreach"] is None for g in run.opt.param_groups)  # left as it was


def test_attention_on_the_cpu_counts_as_the_fused_kernels_on_cuda_do():
    """torch has FLOP formulas for the CUDA attention kernels but not for the CPU's fused one:
    the plan and the profile count the CPU's with the same formulas (forward 4·B·H·S²·D,
    backward 2.5× that, recomputing the scores), so a transformer's FLOPs do not drop by its
    attention where it is counted on a CPU."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from fasttrain.lab.classify import flop_formulas

    class Count(TorchDispatchMode):
        flops, ops = 0.0, []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            formula = flop_formulas().get(func._overloadpacket)
            if formula and "attention" in str(func):
                self.flops += formula(*args, **(kwargs or {}), out_val=out)
                self.ops.append(func._overloadpacket.__name__)
            return out

    q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))
    with Count() as cpu:
        torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert cpu.ops == ["_scaled_dot_product_flash_attention_for_cpu",
                       "_scaled_dot_product_flash_attention_for_cpu_backward"]
    assert cpu.flops == 3.5 * 4 * 2 * 4 * 64 * 64 * 16

"""`fasttrain profile` and `fasttrain doctor` on a GPU: kernel busy/idle from the trace, a
planted sync found at its line, the overhead- and compute-bound cases named as such, NVML samples
during a run, and doctor's placement and mismatch checks."""

from __future__ import annotations

import inspect
import json

import pytest
import torch

from tests.gpu.common import GPU, cli, read_json

pytestmark = GPU


@pytest.fixture(scope="module")
def logreg_profile(tmp_path_factory):
    """The report's case: logistic regression at batch 128 — a few tiny kernels per step."""
    out = tmp_path_factory.mktemp("profile")
    assert cli("profile", "--model", "logreg", "--data", "synthetic", "--batch-size", 128,
               "--device", "cuda", "--steps", 20, "--profile-warmup", 5, "--trace",
               out / "trace.json", "--json", out / "r.json", "--plot", out / "util.png") == 0
    return read_json(out / "r.json"), out


def test_logreg_batch_128_is_overhead_bound_on_cuda(logreg_profile):
    result, _ = logreg_profile
    v = result["classification"]
    assert result["config"]["resolved_device"].startswith("cuda")
    assert v["class"] == "overhead", f"{v['class']}: {v['shares']}, {v['step_ms']:.3g} ms"
    assert result["syncs_are_real"] is True


def test_busy_and_idle_come_from_the_kernels_of_the_trace(logreg_profile):
    result, out = logreg_profile
    assert len(result["rows"]) == 20
    for row in result["rows"]:
        assert row["ops"] > 0, row  # kernels, memcpy or memset inside every step's window
        assert 0 < row["busy_ms"] < row["wall_ms"], row
        assert row["idle_ms"] >= -1e-6 and row["input_ms"] >= -1e-6
        assert row["busy_ms"] + row["idle_ms"] + row["input_ms"] == pytest.approx(row["wall_ms"])
    # Overhead-bound: the GPU waits for the host most of the step.
    steady = result["classification"]["steps_classified"]
    assert sum(result["rows"][i]["idle_ms"] for i in steady) > \
        sum(result["rows"][i]["busy_ms"] for i in steady)
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    assert kernels, "the trace holds no CUDA kernel"
    assert any(e.get("name") == "fasttrain.step" for e in events)


def test_nvml_sampler_returns_samples_during_a_run(logreg_profile):
    result, out = logreg_profile
    sampler = result["device_sampler"]
    if not sampler["available"] and "not installed" in (sampler["reason"] or ""):
        pytest.skip(f"NVML sampler: {sampler['reason']}")
    assert sampler["available"], sampler["reason"]
    assert sampler["count"] >= 1 and len(sampler["samples"]) == sampler["count"]
    assert 0 < sampler["mem_used_max_gb"] <= sampler["mem_total_gb"]
    assert all(0 <= s["gpu_util_pct"] <= 100 for s in sampler["samples"])
    assert (out / "util.png").stat().st_size > 0


def _profile(module=None, tweak=None, steps=5, warmup=3, n_train=1024, **cfg):
    """Profile the engine's Run on CUDA, training `module` instead of the configured model
    when given; `tweak(run)` plants something first (the lab's Python API, as the CPU tests
    of tests/lab/test_profile.py use it)."""
    from fasttrain.engine import TrainConfig, build
    from fasttrain.lab import profile as prof
    from tests.engine.conftest import image_task

    cfg = TrainConfig(**{"device": "cuda", "progress": False, "model": "mlp", **cfg})
    run = build(cfg, model=module, data=image_task(n_train=n_train), verbose=False)
    if tweak:
        tweak(run)
    return prof.profile_run(run, steps=steps, warmup=warmup)


def test_a_large_matmul_is_compute_bound():
    from fasttrain.models import build_model

    # batch 4096 × (784 → 4096 → 4096 → 4096 → 10): ~0.9 TFLOP per step, ~14 ms of fp32 GEMMs
    # at an H100's 67 TFLOP/s, against tens of µs of launches.
    model = build_model("mlp", in_shape=(1, 28, 28), num_classes=10, hidden=4096, depth=3)
    result = _profile(model, batch_size=4096, optimizer="sgd", lr=0.01, n_train=8192)
    v = result["classification"]
    assert v["class"] == "compute", f"{v['class']}: {v['shares']}, {v['step_ms']:.3g} ms"
    assert v["intensity_flop_per_byte"] > v["ridge_flop_per_byte"]


def test_a_planted_sync_is_found_at_its_line():
    planted = {}

    def plant(run):
        loss_fn = run.loss_fn

        def loss(output, target):
            planted["line"] = inspect.currentframe().f_lineno + 1
            run.loss_sum.item()  # the planted sync
            return loss_fn(output, target)

        run.loss_fn = loss

    result = _profile(tweak=plant, model="logreg", batch_size=128, steps=4)
    sites = [s for s in result["syncs"] if s["file"] == __file__]
    assert [(s["call"], s["line"], s["per_step"]) for s in sites] == \
        [(".item()", planted["line"], 1.0)], result["syncs"]
    assert result["syncs_are_real"] is True


def test_doctor_finds_the_gpu_and_catches_the_provoked_mismatch(capsys):
    assert cli("doctor", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpu_found"] and report["exit_status"] == 0
    cuda = [d for d in report["devices"] if d["kind"] == "cuda"]
    assert len(cuda) == torch.cuda.device_count()
    assert "bf16" in cuda[0]["fast_dtypes"] or torch.cuda.get_device_capability() < (8, 0)
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["placement"]["status"] == "ok" and "cuda" in checks["placement"]["device"]
    mismatch = checks["mismatch"]
    assert mismatch["status"] == "ok", mismatch
    assert "cuda" in mismatch["error"].lower(), mismatch["error"]  # names the two devices

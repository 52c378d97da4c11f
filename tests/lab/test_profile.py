"""`fasttrain profile` on planted cases: each kind of bound step must be named as such, and a
planted `.item()` must be found at its file:line.

The checks are on classes, never on times: this machine is a shared 2-core VM. The module runs
torch on one thread, because with two OpenMP threads every parallel op waits a whole scheduler
slice whenever a neighbour's process holds one of the cores (measured here: a 1.6M-element GELU
goes from 1 ms to 8 ms), which would turn every case into "overhead". The classifier itself does
not depend on the thread count: peaks are measured at the same count as the step.
"""

import inspect
import json
import math
import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fasttrain.cli import main
from fasttrain.engine import TrainConfig, build
from fasttrain.lab import profile as prof
from fasttrain.lab import trace
from fasttrain.lab.classify import OpWork, Peaks, Work, classify
from tests.engine.conftest import image_task


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_profile(task=None, module=None, tweak=None, steps=5, warmup=2, **cfg):
    """Profile a Run built from `cfg` (on `task`), training `module` instead of the model
    the config names when one is given; `tweak(run)` plants something first."""
    cfg = TrainConfig(**{"device": "cpu", "progress": False, "model": "mlp", **cfg})
    run = build(cfg, model=module, data=task, verbose=False)
    if tweak:
        tweak(run)
    result = prof.profile_run(run, steps=steps, warmup=warmup)
    assert torch.get_num_threads() == 1  # nothing it ran (numba's pool start) reset the count
    return result


def describe(result):
    v = result["classification"]
    return f"{v['class']}: {v['shares']}, step {v['step_ms']:.3g} ms"


# -- planted cases -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def logreg_cli(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    argv = ["profile", "--model", "logreg", "--data", "synthetic", "--batch-size", "128",
            "--device", "cpu", "--steps", "20", "--profile-warmup", "3",
            "--trace", str(out / "trace.json"), "--json", str(out / "r.json"),
            "--plot", str(out / "util.png")]
    assert main(argv) == 0
    return json.loads((out / "r.json").read_text()), out


def test_tiny_calls_are_overhead_bound():
    """logreg at batch 8: every call a few thousand FLOPs, far below what one costs to issue.
    (At batch 128 on this CPU the step sits on the line between overhead and memory, 0.47
    each: a fair answer, but not one a test can pin.)"""
    result = run_profile(image_task(), model="logreg", batch_size=8, steps=10, warmup=3)
    v = result["classification"]
    assert v["class"] == "overhead" and v["shares"]["overhead"] >= 0.5, describe(result)
    assert any("--compile" in tip for tip in v["next"])


def test_profile_json_is_self_describing(logreg_cli):
    result, _ = logreg_cli
    assert result["schema"] == "fasttrain.profile/1"
    assert {"cpu", "cores", "torch", "git_commit"} <= result["env"].keys()
    assert result["config"]["model"] == "logreg" and result["config"]["batch_size"] == 128
    assert len(result["rows"]) == 20
    assert len(result["classification"]["steps_classified"]) == 10
    # the untraced figure beside the traced one: several steps' faster half, not one sample
    assert result["untraced_steps"] == 5 and result["untraced_step_ms"] > 0
    for row in result["rows"]:
        assert row["wall_ms"] > 0 and row["busy_ms"] >= 0 and row["input_ms"] >= 0
        assert row["busy_ms"] + row["input_ms"] <= row["wall_ms"] + 1e-6
    shares = result["classification"]["shares"]
    assert set(shares) == {"compute", "memory", "overhead", "input"}
    assert math.isclose(sum(shares.values()), 1.0, rel_tol=1e-6)
    assert any(op["op"] == "aten::addmm" for op in result["ops"])
    assert result["classification"]["flops_per_step"] > 0
    assert result["device_sampler"]["available"] is False


def test_trace_is_written_and_plot_is_not_on_cpu(logreg_cli, capsys):
    _, out = logreg_cli
    chrome = json.loads((out / "trace.json").read_text())
    names = {e.get("name") for e in chrome["traceEvents"]}
    assert trace.STEP in names and "aten::addmm" in names
    assert not (out / "util.png").exists()  # no GPU: the plot says so and writes nothing


def test_wide_mlp_is_compute_bound():
    from fasttrain.models import build_model

    task = image_task(n_train=1024)
    model = build_model("mlp", in_shape=(1, 28, 28), num_classes=10, hidden=2048)
    result = run_profile(task, module=model, batch_size=512, optimizer="sgd", lr=0.01,
                         steps=3, warmup=1)
    assert result["classification"]["class"] == "compute", describe(result)
    assert result["classification"]["intensity_flop_per_byte"] > \
        result["classification"]["ridge_flop_per_byte"]


class Elementwise(nn.Module):
    """Test-only: wide activations through LayerNorm, GELU and residual adds, one tiny matmul.
    [B, 1, 28, 28] → [B, 784] → repeated to [B, width] → blocks × (h + gelu(norm(h))) → [B, 10]."""

    def __init__(self, width: int = 4096, depth: int = 4):
        super().__init__()
        self.width = width
        self.blocks = nn.ModuleList(nn.LayerNorm(width) for _ in range(depth))
        self.head = nn.Linear(width, 10)

    def forward(self, x):
        h = x.flatten(1).repeat(1, math.ceil(self.width / x[0].numel()))[:, :self.width]
        for norm in self.blocks:
            h = h + F.gelu(norm(h))
        return self.head(h)


def test_normalization_heavy_model_is_memory_bound():
    result = run_profile(image_task(n_train=1024), module=Elementwise(), batch_size=512,
                         optimizer="sgd", lr=0.01, steps=3, warmup=1)
    v = result["classification"]
    assert v["class"] == "memory", describe(result)
    assert v["intensity_flop_per_byte"] < v["ridge_flop_per_byte"]


def test_slow_loader_is_input_bound():
    def slow_loader(run):
        fast = run.batches.micro_batches

        def micro_batches(epoch, start_step=0):
            step = 0.0  # s: how long the last step held its batch
            for batch in fast(epoch, start_step):
                # A loader that cannot keep up: 20 ms a batch, or 10× the step it feeds where
                # the step is slower (a loaded or slow machine), so that waiting for input
                # outweighs everything else at any speed.
                time.sleep(max(0.02, 10 * step))
                fed = time.perf_counter()
                yield batch
                step = time.perf_counter() - fed

        run.batches.micro_batches = micro_batches

    result = run_profile(image_task(), tweak=slow_loader, model="logreg", data_on_device="off",
                         batch_size=32)
    v = result["classification"]
    assert v["class"] == "input", describe(result)
    assert any("--data-on-device on" in tip for tip in v["next"])


class _SlowSamples(torch.utils.data.Dataset):
    """A user's Dataset whose __getitem__ cannot keep up (decoding, a network read)."""

    classes = list(range(10))

    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.005)  # 20 ms a batch of 4: far longer than a logreg step
        return torch.rand(1, 28, 28), i % 10


def test_slow_user_dataset_is_input_bound_and_the_advice_is_accepted():
    # A streamed Dataset: --data-on-device on alone is refused for it (train says: add
    # --data-in-memory), so that is what profile must name, not --data-on-device.
    result = run_profile({"train": _SlowSamples(), "test": _SlowSamples()}, model="logreg",
                         batch_size=4, steps=4, warmup=1)
    v = result["classification"]
    assert v["class"] == "input", describe(result)
    assert any(t.startswith("--data-in-memory") for t in v["next"]), v["next"]
    assert not any("--data-on-device" in t for t in v["next"]), v["next"]
    build(TrainConfig(device="cpu", progress=False, model="logreg", batch_size=4,
                      data_in_memory=True), data={"train": _SlowSamples()}, verbose=False)


@pytest.mark.parametrize("source, named, refused", [
    ("host", "--data-on-device on", "--data-in-memory"),
    ("dataset", "--data-in-memory", "--data-on-device"),
    ("stream", "--workers", "--data-"),
    ("loader", "num_workers=N in your DataLoader", "--"),
    ("device", "no switch left", "--"),
])
def test_input_advice_names_only_switches_train_takes_for_that_data(source, named, refused):
    from fasttrain.lab.classify import next_switches

    tips = next_switches("input", TrainConfig(device="cpu"), "cpu", [], source)
    assert any(t.startswith(named) for t in tips), tips
    assert not any(t.startswith(refused) for t in tips), tips


# -- the sync audit ------------------------------------------------------------------------------


def test_sync_audit_finds_a_planted_item():
    planted = {}

    def plant(run):
        loss_fn = run.loss_fn

        def loss(output, target):
            planted["line"] = inspect.currentframe().f_lineno + 1
            run.loss_sum.item()  # the planted sync
            return loss_fn(output, target)

        run.loss_fn = loss

    result = run_profile(image_task(), tweak=plant, model="logreg", batch_size=32, steps=4)
    sites = [s for s in result["syncs"] if s["file"] == __file__]
    assert [(s["call"], s["line"], s["per_step"]) for s in sites] == \
        [(".item()", planted["line"], 1.0)], result["syncs"]
    assert "run.loss_sum.item()" in sites[0]["code"]
    assert result["syncs_are_real"] is False  # on the CPU they are would-be syncs


def test_sync_audit_counts_user_calls_only_and_restores_tensor():
    original = torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.to
    x = torch.ones(3)
    with prof.SyncAudit(torch.device("cpu")) as audit:
        x.sum().item()
        bool(x[0])
        float(x[1])
        x.to(torch.float64)  # not a device-to-host copy
        torch.nn.utils.clip_grad_norm_([nn.Parameter(x.clone())], 1.0)  # torch-internal calls
        with audit.paused():
            x.sum().item()
    calls = sorted(s["call"] for s in audit.per_step(1))
    assert calls == [".bool()", ".float()", ".item()"]
    assert (torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.to) == original


# -- pieces --------------------------------------------------------------------------------------


def test_union_and_coverage():
    merged = trace._union([(5, 7), (0, 2), (1, 3), (6, 9)])
    assert merged == [(0, 3), (5, 9)]
    starts = [s for s, _ in merged]
    assert trace._covered(merged, starts, 2, 6) == 2.0  # [2, 3] and [5, 6]
    assert trace._covered(merged, starts, 3, 5) == 0.0
    assert trace._covered(merged, starts, -1, 10) == 7.0


def _gpu_event(name: str, stream: int, start: float, end: float):
    from types import SimpleNamespace

    from torch.autograd import DeviceType

    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_resource_id=stream,
                           time_range=SimpleNamespace(start=start, end=end))


def test_copy_overlap_counts_only_other_streams_kernels():
    copy = "Memcpy HtoD (Pinned -> Device)"
    events = [_gpu_event("conv_kernel", 7, 0, 10), _gpu_event("gemm", 7, 20, 30),
              _gpu_event(copy, 13, 5, 15),      # half inside conv_kernel
              _gpu_event(copy, 13, 12, 18),     # between kernels: no overlap
              _gpu_event(copy, 7, 1, 3),        # inside conv_kernel, but on its stream
              _gpu_event(copy, 13, 25, 25),     # a point inside gemm
              _gpu_event("Memset (Device)", 13, 16, 17),  # neither copy nor compute
              _gpu_event("Memcpy DtoH (Device -> Pinned)", 13, 0, 10)]
    found = trace.copy_overlap(events)
    assert found["kernel_streams"] == {7: 2}
    assert found["kernel_busy"] == pytest.approx(20 / 30)  # kernels 0–10 and 20–30
    assert [(c["stream"], c["overlap"]) for c in found["copies"]] == [
        (7, 0.0), (13, 0.5), (13, 0.0), (13, 1.0)]
    assert [c["us"] for c in found["copies"]] == [2, 10, 6, 0]


def test_classify_by_hand():
    peaks = Peaks(flops=100e9, bandwidth=10e9, source="test")
    work = Work(by_op={
        "aten::mm": OpWork(flops=1e9, bytes=1e6, roofline=[(0.01, 0.0)]),  # 10 ms at its roof
        # one 2 ms elementwise call and ten that are smaller than issuing an op (10 µs)
        "aten::add": OpWork(bytes=2e7, roofline=[(0.0, 2e-3)] + [(0.0, 1e-6)] * 10),
        "aten::sum": OpWork(bytes=1e3, roofline=[(0.0, 1e-7)]),  # compiled away: unseen
    })
    v = classify(wall=0.030, input_s=0.002, busy=0.025,
                 measured={"aten::mm": 0.012, "aten::add": 0.010, "aten::linear": 0.001},
                 issue_s=10e-6, work=work, peaks=peaks)
    shares = {k: round(x * 30, 6) for k, x in v["shares"].items()}  # in ms of the 30 ms step
    # idle 3 ms + the small adds (10 × 10 µs) + rest (3 ms, only a tiny unseen call) → overhead
    assert shares == {"compute": 12.0, "memory": 9.9, "overhead": 6.1, "input": 2.0}
    assert v["class"] == "compute" and v["runner_up"] == "memory"
    assert v["groups"]["aten::add"]["limited_by"] == "memory"
    assert v["groups"]["rest"]["limited_by"] == "overhead"


@pytest.mark.parametrize("argv, words", [
    (["--steps", "0"], ["--steps"]),
    (["--profile-warmup", "-1"], ["--profile-warmup"]),
    (["--json", "/nonexistent-dir/r.json"], ["--json", "does not exist"]),
    (["--precision", "tf32"], ["tf32"]),
])
def test_bad_flags_are_one_line_errors(capsys, argv, words):
    code = main(["profile", "--model", "logreg", "--data", "synthetic", "--device", "cpu", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: ")
    assert all(w in err[0] for w in words), err


def test_a_run_directory_is_refused_and_left_as_it_was(capsys, tmp_path):
    # profile --out RUN --resume auto rewrote the run's config.toml with its own switches (a
    # later `train --resume auto` takes them from there) and left a lock in it.
    flags = ["--model", "logreg", "--data", "synthetic", "--device", "cpu", "--batch-size", "64"]
    run = tmp_path / "run"
    assert main(["train", *flags, "--max-steps", "2", "--out", str(run), "--no-progress"]) == 0
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()
    for extra in (["--out", str(run), "--resume", "auto"], ["--out", str(tmp_path / "new")]):
        code = main(["profile", *flags, "--lr", "0.5", "--steps", "1", *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and "--out" in err[0], err
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == before
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("flags", [("--parallel", "ddp"), ("--parallel", "dp"), ("--tp", "2")])
def test_a_layout_is_refused_as_the_other_lab_commands_refuse_it(capsys, flags):
    # profile measures one process; `--parallel ddp` asked for torchrun and `-m fasttrain train`
    # instead, and under torchrun every rank printed its own report.
    from tests.conftest import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "profile", "--model", "logreg", "--data", "synthetic", *flags)
    assert_one_line_error(code, err, "fasttrain profile")

"""`fasttrain memory`: exact parts, saved tensors counted by hand, the batch-size search, bad input.

CPU only and small: the CUDA measurement (max_memory_allocated, workspaces, rounding) is left to
GPU machines; here the "measured" peak is the hook-based count.
"""

import dataclasses
import json

import pytest
import torch

from fasttrain.engine import TrainConfig, build
from fasttrain.engine.loop import endless_batches
from fasttrain.engine.loop import step as engine_step
from fasttrain.lab import batch_size as bs
from fasttrain.lab import bytecount
from fasttrain.lab import memory as mem
from tests.conftest import assert_one_line_error, run_cli
from tests.engine.conftest import image_task, text_task


def config(**kw) -> TrainConfig:
    kw.setdefault("device", "cpu")
    kw.setdefault("data", "synthetic")
    kw.setdefault("batch_size", 16)
    return TrainConfig(progress=False, **kw)


def measure(task=None, **kw) -> mem.Breakdown:
    return mem.measure(build(config(**kw), data=task or image_task(), verbose=False))


def n_params(model: str) -> int:
    return sum(p.numel() for p in build(config(model=model), data=image_task(), verbose=False).model
               .parameters())


@pytest.mark.parametrize("model", ["logreg", "mlp"])
@pytest.mark.parametrize("optimizer, momentum, state_per_param", [
    ("adamw", 0.9, 2), ("sgd", 0.9, 1), ("sgd", 0.0, 0),
])
def test_parts_equal_hand_computed_bytes(model, optimizer, momentum, state_per_param):
    P = n_params(model)
    b = measure(model=model, optimizer=optimizer, momentum=momentum)
    assert b.params == P
    assert b.weights == 4 * P  # fp32, no buffers in these models
    assert b.gradients == 4 * P
    assert b.optimizer == 4 * P * state_per_param  # AdamW: exp_avg + exp_avg_sq
    assert b.data == b.workspace == 0  # the CPU: host memory, no allocator workspaces
    assert b.measured_peak == (b.weights + b.gradients + b.optimizer + b.activations
                               + b.weight_copies + b.inputs)


def test_saved_tensors_of_a_tiny_mlp_by_hand():
    # mlp 784→256→256→10. Saved for backward, parameters aside: the flattened input (addmm's
    # mat1), each ReLU's output (also the next Linear's input: one storage), log_softmax's output,
    # the int64 targets and nll_loss's 0-dim total weight.
    B = 16
    b = measure(model="mlp", batch_size=B)
    assert b.activations == B * (784 + 256 + 256 + 10) * 4 + B * 8 + 4
    assert b.weight_copies == 0 and b.inputs == 0  # both inputs were saved, so counted once


def test_count_leaves_the_run_as_it_was():
    run = build(config(model="resnet"), data=image_task(), verbose=False)  # BatchNorm
    batches = endless_batches(run)
    engine_step(run, next(batches))
    before = {k: v.clone() for k, v in run.model.state_dict().items()}
    rng = torch.get_rng_state()
    bytecount.count_saved(run, next(batches)[0])
    assert all(torch.equal(before[k], v) for k, v in run.model.state_dict().items())
    assert all(p.grad is None for p in run.model.parameters())
    assert torch.equal(rng, torch.get_rng_state())


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: every storage's address is 0
def test_saved_bytes_counts_each_storage_once_per_part(device):
    w = torch.nn.Parameter(torch.ones(5, 3, device=device))
    x = torch.ones(4, 3, device=device, requires_grad=True)  # so that mm saves w.t() too

    def forward(stage):
        stage[0] = 0
        r = (x @ w.t()).relu()  # mm saves x (and w.t(), a view of w: owned); relu its output
        stage[0] = 1
        return (r * r).sum()  # mul saves r twice: one storage, counted again in part 1

    stage = [0]
    loss, saved = bytecount.saved_bytes(lambda: forward(stage), owned=[w], part=lambda t: stage[0])
    assert saved.parts == {0: 4 * 3 * 4 + 4 * 5 * 4, 1: 4 * 5 * 4}
    assert len(saved.storages) == 2 and loss.requires_grad
    _, whole = bytecount.saved_bytes(lambda: forward(stage), block=512)  # one part, w counted too
    assert whole.parts == {None: 3 * 512}


@pytest.mark.parametrize("model", ["cnn", "gpt"])
def test_activation_checkpointing_saves_fewer_activations(model):
    task = text_task() if model == "gpt" else image_task()
    kw = dict(model=model, block_size=16, data="synthetic-text") if model == "gpt" else {}
    plain = measure(task, **{"model": model, **kw})
    ckpt = measure(task, **{"model": model, **kw}, activation_checkpointing=True)
    assert ckpt.activations < 0.6 * plain.activations
    assert ckpt.gradients == plain.gradients and ckpt.weights == plain.weights


def test_bf16_saves_half_precision_activations():
    fp32 = measure(model="cnn", batch_size=32)
    bf16 = measure(model="cnn", batch_size=32, precision="bf16")
    assert bf16.activations < 0.7 * fp32.activations
    assert bf16.activations + bf16.weight_copies < fp32.activations
    assert bf16.weight_copies > 0  # autocast's bf16 copies of the weights, saved for backward
    assert bf16.gradients == fp32.gradients  # autocast keeps fp32 gradients
    assert bf16.activations_fp32 == fp32.activations  # the lab formula's input, same batch


def test_lab_formula_for_this_model():
    b = measure(model="mlp")
    P, A = b.params, b.activations_fp32
    lab = b.lab_formula()
    assert lab["fp32"]["total"] == 4 * P + 4 * P + 8 * P + A
    assert lab["mixed"]["total"] == 4 * P + 2 * P + 2 * P + 8 * P + A // 2


def test_predict_builds_the_run_and_agrees_with_measure():
    # The one prediction `memory` and `plan` share: same parts as measuring a Run built by hand.
    cfg = config(model="mlp", optimizer="adamw")
    by_hand = mem.measure(build(cfg, data=image_task(), verbose=False))
    predicted = mem.predict(cfg, data=image_task())
    assert predicted == by_hand


def test_counted_for_cuda_rounds_blocks_and_adds_foreach_temporaries():
    # logreg: weight 10×784 fp32 (31,360 B → 31,744 in 512-byte blocks), bias 40 B → 512.
    cfg = config(model="logreg", optimizer="adamw")
    cpu = mem.predict(cfg, data=image_task())
    gpu = mem.predict(cfg, data=image_task(), device_type="cuda")
    blocks = 31_744 + 512
    assert cpu.weights == 4 * 7850 and gpu.weights == blocks
    assert gpu.gradients == blocks and gpu.optimizer == 2 * blocks  # exp_avg, exp_avg_sq
    assert cpu.step_temp == 31_360 and gpu.step_temp == blocks  # per tensor vs foreach: all
    assert cpu.data == 0 and gpu.data > 0  # the dataset, resident on the device in memory
    assert gpu.device == "cuda (counted on cpu)"
    assert gpu.predicted_peak > cpu.predicted_peak


def test_counted_for_cuda_on_the_cpu_claims_no_measurement():
    # plan's JSON said "measured_peak" (the CPU's hook count, without the dataset a GPU holds)
    # and "error": +227% for the cnn: a measurement of nothing set against the CUDA count.
    gpu = mem.predict(config(model="logreg"), data=image_task(), device_type="cuda")
    assert gpu.measured_peak is None and gpu.error is None
    assert "not measured" in gpu.measured_by
    d = gpu.to_dict()
    assert d["measured_peak"] is None and d["error"] is None and d["predicted_peak"] > 0


@pytest.fixture
def fixed_step_time(monkeypatch):
    """Every timed step takes 1 ms, so samples/s grows with the batch: the search then stops
    only where memory does, whatever the load on this machine."""
    from fasttrain import timing

    monkeypatch.setattr(timing, "time_call", lambda fn, sync: (fn(), 1.0))


def predicted(cfg, task, batch: int) -> int:
    run = build(dataclasses.replace(cfg, batch_size=batch), data=task, verbose=False)
    return mem.measure(run).predicted_peak


def test_find_batch_size_fits_the_limit_and_the_next_does_not(fixed_step_time):
    cfg, task = config(model="logreg"), image_task()
    usable = (predicted(cfg, task, 40) + predicted(cfg, task, 48)) // 2
    best, tries = bs.search(lambda b: bs.try_batch(cfg, task, b, usable, steps=1),
                             floor=8, unit=8, cap=256)
    assert best.batch == 40 and best.fits
    assert predicted(cfg, task, best.batch) <= usable < predicted(cfg, task, best.batch + 8)
    assert [t.batch for t in tries] == [8, 16, 32, 64, 48, 40]
    assert not any(t.fits for t in tries if t.batch > 40)


def test_find_batch_size_never_raises_on_out_of_memory(fixed_step_time, monkeypatch):
    def oom_above_64(run, micro_batches):
        if micro_batches[0][0].shape[0] > 64:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return engine_step(run, micro_batches)

    from fasttrain.engine import run as run_module

    monkeypatch.setattr(run_module, "step", oom_above_64)  # each new run's train_step
    cfg, task = config(model="logreg"), image_task()
    best, tries = bs.search(lambda b: bs.try_batch(cfg, task, b, 2**40, steps=1),
                             floor=8, unit=8, cap=256)
    assert best.batch == 64
    assert {t.batch: t.reason for t in tries if not t.fits} == {
        128: "out of memory", 96: "out of memory", 80: "out of memory", 72: "out of memory"}


def test_search_prefers_throughput_over_size():
    # Fits everywhere, fastest at 32: the search must not return the largest batch.
    sps = {8: 100.0, 16: 180.0, 32: 250.0, 64: 200.0, 48: 240.0, 40: 245.0}
    best, tries = bs.search(lambda b: bs.Try(b, True, sps[b]), floor=8, unit=8, cap=1024)
    assert best.batch == 32
    assert [t.batch for t in tries] == [8, 16, 32, 64, 48, 40]


def test_search_when_the_floor_does_not_fit():
    best, tries = bs.search(lambda b: bs.Try(b, False, reason="x"), floor=8, unit=8, cap=64)
    assert best is None and [t.batch for t in tries] == [8]


# -- the command ---------------------------------------------------------------------------------


BASE = ("memory", "--model", "logreg", "--data", "synthetic", "--device", "cpu")


def test_memory_command_writes_the_breakdown(capsys, tmp_path):
    path = tmp_path / "m.json"
    code, out, err = run_cli(capsys, *BASE, "--batch-size", "32", "--json", str(path))
    assert code == 0, err
    assert "hook count" in out and "lab formula" in out and "SYNTHETIC" in out
    result = json.loads(path.read_text())
    assert result["schema"] == "fasttrain.memory/1" and result["env"]["torch"]
    assert result["config"]["model"] == "logreg" and result["config"]["synthetic"] is True
    (row,) = result["rows"]
    assert row["kind"] == "breakdown" and row["weights"] == 4 * 7850
    assert row["predicted_peak"] >= row["measured_peak"] > 0


def test_memory_command_finds_a_batch_size(capsys, tmp_path, fixed_step_time):
    path = tmp_path / "f.json"
    code, out, err = run_cli(capsys, *BASE, "--find-batch-size", "--memory-limit", "0.0005",
                         "--json", str(path))
    assert code == 0, err
    result = json.loads(path.read_text())
    best = result["best_batch_size"]
    usable = result["config"]["usable_bytes"]
    rows = {r["batch"]: r for r in result["rows"]}
    assert rows[best]["fits"] and rows[best]["peak"] <= usable
    assert not rows[best + 8]["fits"] and rows[best + 8]["predicted"] > usable
    assert f"best batch size: {best}" in out
    assert "batch" in err and "does not fit" in err  # every try, as it happens


@pytest.mark.parametrize("argv, words", [
    (["--find-batch-size"], ["--memory-limit"]),
    (["--find-batch-size", "--memory-limit", "-1"], ["--memory-limit"]),
    (["--margin", "1.5"], ["--margin"]),
    (["--find-batch-size", "--memory-limit", "1", "--floor", "0"], ["--floor"]),
    (["--json", "/nonexistent-dir/m.json"], ["--json", "does not exist"]),
    (["--out", "run"], ["--out"]),
    (["--precision", "tf32"], ["tf32"]),
])
def test_bad_input_is_a_one_line_error(capsys, argv, words):
    code, _, err = run_cli(capsys, *BASE, *argv)
    assert_one_line_error(code, err, *words)


# -- convolution workspaces, the warm-up's peak, what a try gives back ---------------------------


def test_conv_calls_are_recorded_without_changing_the_run():
    from fasttrain.lab import conv_workspace as cw

    run = build(config(model="resnet", batch_size=4), data=image_task(), verbose=False)
    micro = next(endless_batches(run))[0]
    buffers = [b.clone() for b in run.model.buffers()]
    rng = torch.get_rng_state()
    calls = cw.conv_calls(run, micro)
    convs = [m for m in run.model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert {id(c[0]) for c in calls} == {id(m) for m in convs}  # every convolution, once each
    first = next(c for c in calls if c[0] is convs[0])
    assert first[1] == tuple(micro[0].shape) and first[4] is False  # the images need no grad
    assert all(c[4] for c in calls if c[0] is not convs[0])
    assert all(p.grad is None for p in run.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(buffers, run.model.buffers(), strict=True))
    assert torch.equal(rng, torch.get_rng_state())


def test_no_conv_workspace_or_first_step_peak_on_the_cpu():
    b = measure(model="cnn")
    assert b.conv_workspace == 0 and b.first_step_peak is None
    assert b.to_dict()["conv_workspace"] == 0


def test_the_conv_workspace_is_added_where_activations_peak():
    b = measure(model="cnn")
    w = dataclasses.replace(b, conv_workspace=10**6)
    assert w.predicted_peak == b.predicted_peak + 10**6  # activations + copies > step temp here
    huge_temp = dataclasses.replace(b, step_temp=b.activations + b.weight_copies + 2 * 10**6)
    assert (dataclasses.replace(huge_temp, conv_workspace=10**6).predicted_peak
            == huge_temp.predicted_peak)  # it lives inside a call, not during the optimizer step


class _FakeAllocator:
    """torch.cuda's allocator statistics for CPU tensors: the probe's arithmetic, checked."""

    def __init__(self):
        self.allocated = self.peak = 0

    def bump(self, nbytes: int) -> None:  # a scratch buffer taken and given back
        self.peak = max(self.peak, self.allocated + nbytes)


@pytest.mark.parametrize("fwd, bwd", [(3_000_000, 1_000_000), (512, 7_000_000)])
def test_probe_takes_the_larger_transient_beyond_the_outputs(monkeypatch, fwd, bwd):
    from fasttrain.lab import conv_workspace as cw

    fake = _FakeAllocator()
    for name, fn in (("synchronize", lambda *_: None),
                     ("memory_allocated", lambda *_: fake.allocated),
                     ("max_memory_allocated", lambda *_: fake.peak),
                     ("reset_peak_memory_stats", lambda *_: setattr(fake, "peak", fake.allocated))):
        monkeypatch.setattr(torch.cuda, name, fn)

    class Scratch(torch.autograd.Function):
        @staticmethod
        def forward(ctx, y):
            fake.bump(cw._alloc(y) + fwd)  # output and workspace alive together
            return y.view_as(y)

        @staticmethod
        def backward(ctx, g):
            fake.bump(grads + bwd)  # the gradients being written, and the workspace
            return g

    class Conv(torch.nn.Conv2d):
        def _conv_forward(self, x, w, b):
            return Scratch.apply(super()._conv_forward(x, w, b))

    conv = Conv(3, 8, 3, padding=1)
    shape = (4, 3, 16, 16)
    grads = cw._alloc(torch.empty(shape)) + cw._alloc(conv.weight) + cw._alloc(conv.bias)
    x = torch.empty(shape)
    assert cw.probe(conv, shape, x.stride(), x.dtype, True) == max(fwd, bwd)


def test_a_counted_forward_that_no_backward_follows_is_freed():
    # tanh saves its output: kept with its grad_fn by the pack hook, that output would hold the
    # graph that saves it, a cycle no gc.collect() breaks.
    import gc
    import weakref

    w = torch.randn(64, 64, requires_grad=True)
    saved = []

    def part(t):
        saved.append(weakref.ref(t))
        return None

    loss, count = bytecount.saved_bytes(lambda: torch.tanh(torch.tanh(w @ w) @ w).sum(), [w],
                                        part=part)
    assert count.parts[None] > 0 and saved
    del loss  # no backward: an out-of-memory error, or a count of the forward alone
    gc.collect()
    assert all(r() is None for r in saved), "the counted graph outlived its loss"


def test_a_try_that_ran_out_while_counting_gives_its_memory_back(fixed_step_time, monkeypatch):
    # Out of memory in the counting forward (after the measured step fit): every tensor that
    # try allocated must go, the parameters (which the graph's AccumulateGrad nodes hold) too.
    import gc
    import weakref

    params = []
    real = bytecount.saved_bytes

    def oom_while_counting(run_forward, *args, **kwargs):
        def forward():
            run_forward()  # a graph half-built when the allocator gives up
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(forward, *args, **kwargs)

    def tracked(cfg, **kwargs):
        run = build(cfg, **kwargs)
        params.extend(weakref.ref(p) for p in run.model.parameters())
        return run

    from fasttrain.engine import run as engine_run

    monkeypatch.setattr(bytecount, "saved_bytes", oom_while_counting)
    monkeypatch.setattr(engine_run, "build", tracked)
    t = bs.try_batch(config(model="mlp"), image_task(), 16, 2**40, steps=1)
    assert not t.fits and t.reason == "out of memory" and t.held_after is None  # CPU
    gc.collect()
    assert params and all(r() is None for r in params), "the failed try's graph is still alive"


def test_memory_command_takes_a_streamed_dataset_and_a_step_of_yours(capsys):
    # A Dataset is streamed: the command loads it once, and the Run it measures must take that
    # loaded stream as it is (it was refused as "not StreamData").
    code, out, err = run_cli(capsys, "memory", "--model", "tests.engine.userstep:make_lm",
                             "--data", "tests.engine.test_dict_stream:DictTokens",
                             "--step", "tests.engine.test_dict_stream:hf_dict_step",
                             "--batch-size", "8", "--device", "cpu")
    assert code == 0, err
    assert "hook count" in out and "predicted peak" in out


def fixed_loader():
    """A user's DataLoader: its batch size is its own (imported by path below)."""
    x, y = torch.rand(64, 1, 28, 28), torch.arange(64) % 10
    data = torch.utils.data.TensorDataset(x, y)
    data.classes = list(range(10))  # what --model mlp is built for
    return torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)


def test_find_batch_size_refuses_a_dataloader_it_cannot_rebatch_up_front(capsys):
    # It tried batch 8, then stopped at 16 telling the user to change --batch-size.
    code, _, err = run_cli(capsys, "memory", "--model", "mlp", "--data",
                           "tests.lab.test_memory:fixed_loader", "--batch-size", "8",
                           "--device", "cpu", "--find-batch-size", "--memory-limit", "1")
    assert_one_line_error(code, err, "--find-batch-size", "batch_size=8", "dataset")
    assert "batch      8" not in err  # refused before any try

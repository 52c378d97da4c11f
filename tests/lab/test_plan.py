"""`fasttrain plan`: its memory column is the memory model's, a run end to end, catalogue errors."""

import dataclasses
import json

import pytest

from fasttrain.cli import main
from fasttrain.commands import plan as plan_cmd
from fasttrain.engine.config import TrainConfig
from fasttrain.errors import UserError
from fasttrain.lab import cost, fitting
from fasttrain.lab import memory as memory_model

FLAGS = ["--model", "logreg", "--data", "synthetic", "--batch-size", "64", "--device", "cpu"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    d = tmp_path_factory.mktemp("plan")
    assert main(["plan", *FLAGS, "--deadline", "1", "--json", str(d / "p.json"),
                 "--plot", str(d / "p.png")]) == 0
    return json.loads((d / "p.json").read_text()), d


def test_a_deadline_no_option_meets_is_said(capsys):
    # The table had no mark and the footer only "Deadline 1e-09 h.": silence read as a plan.
    from tests.conftest import run_cli

    code, out, err = run_cli(capsys, "plan", *FLAGS, "--deadline", "1e-9")
    assert code == 0, err
    text = " ".join(out.split())
    assert "Deadline 1e-09 h: NO option finishes within it; the fastest takes" in text, text
    assert "cheapest by deadline" not in text


def test_the_memory_column_is_the_memory_model(planned):
    from fasttrain.data.tasks import load_task

    result, _ = planned
    cfg = TrainConfig(model="logreg", data="synthetic", batch_size=64, device="cpu")
    task = load_task("synthetic", seed=cfg.seed, block_size=cfg.block_size)
    b = memory_model.predict(cfg, data=task, device_type="cuda")
    assert {r["memory_needed"] for r in result["rows"]} == {b.predicted_peak}
    assert result["memory"]["predicted_peak"] == b.predicted_peak


def test_the_memory_column_matches_fasttrain_memory(planned, tmp_path):
    result, _ = planned
    assert main(["memory", *FLAGS, "--json", str(tmp_path / "m.json")]) == 0
    mem = json.loads((tmp_path / "m.json").read_text())["rows"][0]
    # `memory` counts for this CPU, plan as CUDA holds tensors (512-byte blocks): same parts,
    # each within its rounding
    for part in ("weights", "gradients", "optimizer", "activations", "inputs"):
        assert 0 <= result["memory"][part] - mem[part] <= 512 * 4, part


def test_a_plan_end_to_end(planned):
    result, d = planned
    names = [r["gpu"] for r in result["rows"]]
    assert names == list(cost.load())
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    assert ok and all(r["fit"] == "fits" for r in ok)  # 64 samples of logreg fit anywhere
    marks = [m for r in ok for o in r["options"] for m in o["marks"]]
    assert sorted(marks) == ["cheapest", "cheapest by deadline", "fastest"]
    h = next(r for r in ok if r["gpu"] == "H100 SXM")
    steps = result["total_steps"]
    assert h["total_s"] == pytest.approx(steps * h["step_s"])
    od = next(o for o in h["options"] if o["tier"] == "on_demand")
    price = cost.load()["H100 SXM"].prices["on_demand"].usd_per_hour  # the catalogue's
    assert od["usd"] == pytest.approx(h["total_s"] / 3600 * price)
    assert result["efficiency"]["value"] == 0.3 and (d / "p.png").stat().st_size > 0


def _catalog(tmp_path, body, name):
    p = tmp_path / name
    p.write_text(body)
    return str(p)


def test_catalogue_errors_are_one_line_exit_2(tmp_path, capsys):
    bad = _catalog(tmp_path, '[gpus."Mine"]\nmemory_gb = 24\nfp32 = 30\ninterconnect = "x"\n'
                   'link_gbs = 25\n', "bad.toml")
    for path, want in ((bad, "GPU 'Mine' lacks the field 'bandwidth_gbs'"),
                       (str(tmp_path / "none.toml"), "no such file"),
                       (_catalog(tmp_path, "gpus = [", "broken.toml"), "not valid TOML")):
        assert main(["plan", *FLAGS, "--catalog", path]) == 2
        err = capsys.readouterr().err
        assert want in err and err.count("\n") == 1


def test_a_switch_is_chosen_only_when_predicting_with_it_fits():
    from fasttrain.data.tasks import load_task

    cfg = TrainConfig(model="mlp", data="synthetic", batch_size=512, device="cpu").validate()
    task = load_task("synthetic", seed=cfg.seed, block_size=cfg.block_size)
    models = fitting.Models(task)
    base = fitting.need(models.memory(cfg), 1)
    accum = fitting.need(models.memory(dataclasses.replace(cfg, accum_steps=2)), 1)
    assert accum < base  # half the micro-batch's activations

    def gpu(usable_bytes):
        gb = usable_bytes / (1 - fitting.MARGIN) / 2**30
        return cost.GPU("G", gb, {"fp32": 1e12, "bf16": 1e12}, 1e11, "PCIe", 25e9)

    got = fitting.fit(models, cfg, gpu(base + 4096), 1)
    assert (got.how, got.gpus, got.need) == ("fits", 1, base)
    # bf16 is tried first, but on this small model its saved weight casts outweigh the halved
    # activations: predicted, it does not fit, so accumulation is the named switch
    got = fitting.fit(models, cfg, gpu((base + accum) / 2), 1)
    assert got.how == "fits with accumulation ×2" and got.cfg.accum_steps == 2
    assert got.need == accum
    none = fitting.fit(models, cfg, gpu(1024), 1)
    assert none.how == "does not fit" and none.least.startswith("with ")
    assert none.need <= accum < base  # what the least needy attempt needs, not the given's


def test_fsdp_and_ddp_needs_by_hand():
    from types import SimpleNamespace

    b = SimpleNamespace(weights=400, gradients=400, optimizer=800, step_temp=400,
                        activations=1000, weight_copies=0, inputs=100, data=0, workspace=0,
                        conv_workspace=0,
                        predicted_peak=2900)
    # sharded 4 ways: (400 + 400 + 800 + 400) / 4 = 500, plus the unsharded 1100
    assert fitting.fsdp_need(b, 4) == 1600
    assert fitting.need(b, 1) == 2900
    assert fitting.need(b, 2) == 3300  # DDP's buckets: one more copy of the gradients
    gpu = cost.GPU("G", 1602 / (1 - fitting.MARGIN) / 2**30, {"fp32": 1e12}, 1e11, "x", 1e9)

    class Models:
        def memory(self, cfg):
            return b

    sharded = fitting.fit(Models(), None, gpu, 4, fsdp=True)
    assert (sharded.how, sharded.gpus) == ("fits (FSDP over 4 GPUs)", 4)


def test_the_cost_per_op_issued_comes_from_the_fit_only_on_the_gpu_it_was_fitted_on():
    from fasttrain.lab import steptime

    cfg = TrainConfig(model="logreg", data="synthetic", batch_size=64, device="cpu")
    h100 = cost.load()["H100 SXM"]
    mine = dataclasses.replace(h100, launch_s=3e-6, launch_source="measured on mine")
    on_cpu = steptime.Fit(0.3, 9e-6, "cpu", "fitted here")
    on_h100 = steptime.Fit(0.3, 7e-6, "NVIDIA H100 80GB HBM3", "fitted there")
    assert plan_cmd.launch(h100, cfg, on_cpu) == (steptime.DEFAULT_LAUNCH_S,
                                                  steptime.DEFAULT_LAUNCH_SOURCE)
    assert plan_cmd.launch(mine, cfg, on_cpu) == (3e-6, "measured on mine")
    assert plan_cmd.launch(mine, cfg, on_h100)[0] == 7e-6
    assert plan_cmd.launch(cost.load()["H100 PCIe"], cfg, on_h100)[0] == steptime.DEFAULT_LAUNCH_S
    graphs = dataclasses.replace(cfg, cuda_graphs=True)
    assert plan_cmd.launch(mine, graphs, on_h100)[0] == 0.0


def test_a_calibration_on_a_gpu_is_applied_on_it_as_the_max_it_was_read_by(tmp_path,
                                                                           monkeypatch):
    """A calibration planted as made on an H100 (its steps read by the max: lab/calibration):
    the H100 SXM row uses its cost per call, and its step is the slower of the two terms, not
    their sum (which the sum's constants were applied as before)."""
    from fasttrain.lab import calibration, classify, steptime

    peaks = classify.Peaks(1e11, 2e10, "planted")

    def planted_steps(run, steps, clock=None):
        work = steptime.count_run(run)
        return [max(steptime.roofline_s(work, peaks.flops, peaks.bandwidth) / 0.4,
                    work.ops * 2e-6)] * steps

    monkeypatch.setattr(calibration, "_measuring",
                        lambda device, precision: (peaks, None, "planted", True))
    monkeypatch.setattr(calibration, "_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(steptime, "time_steps", planted_steps)
    out = tmp_path / "gpu.json"
    assert main(["plan", *FLAGS, "--calibrate", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["efficiency"]["model"] == "max"
    h = next(r for r in result["rows"] if r["gpu"] == "H100 SXM")
    eff = result["efficiency"]["value"]
    assert h["launch_s"] == result["launch"]["fitted_s"]
    assert h["step_s"] == pytest.approx(max(h["roofline_s"] / eff, h["ops"] * h["launch_s"]))


def test_gpu_names_match_the_catalogue_as_torch_reports_them():
    assert plan_cmd.same_gpu("NVIDIA A100-SXM4-80GB", "A100 80GB")
    assert not plan_cmd.same_gpu("NVIDIA A100-SXM4-80GB", "A100 40GB")
    assert plan_cmd.same_gpu("NVIDIA H100 80GB HBM3", "H100 SXM")
    assert not plan_cmd.same_gpu("NVIDIA H100 PCIe", "H100 SXM")
    assert plan_cmd.same_gpu("NVIDIA GeForce RTX 5090", "RTX 5090")  # a user catalogue's GPU
    assert not plan_cmd.same_gpu("NVIDIA L40S", "L40")  # whole words: an L40 is not an L40S


def test_a_calibrated_plan_carries_the_efficiency_and_not_this_cpus_launch_cost(tmp_path):
    from fasttrain.lab import steptime

    out = tmp_path / "c.json"
    assert main(["plan", *FLAGS, "--calibrate", "--gpus", "2", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    eff = result["efficiency"]["value"]
    assert [p["batch_size"] for p in result["efficiency"]["basis"]["points"]] == [64, 32]
    assert result["launch"]["fitted_on"] == "cpu"
    h = next(r for r in result["rows"] if r["gpu"] == "H100 SXM")
    assert h["launch_s"] == steptime.DEFAULT_LAUNCH_S and h["gpus"] == 2
    # each of the two GPUs: half the roofline over the carried efficiency or every call issued,
    # the slower (the host issues while the device computes)
    compute = max(h["roofline_s"] / eff / 2, h["ops"] * h["launch_s"])
    assert h["step_s"] == pytest.approx(compute + h["exposed_s"])


def test_a_calibration_held_at_its_bound_says_so_with_the_unbounded_fit(tmp_path, capsys,
                                                                          monkeypatch):
    """Steps planted 1.25× faster than their per-op roofline: the fit holds the efficiency at 1,
    and the table's footer and the JSON say so, with the 1.25 the measurements gave."""
    from fasttrain.lab import calibration, classify, steptime

    peaks = classify.Peaks(1e11, 2e10, "planted")

    def planted_steps(run, steps, clock=None):
        work = steptime.count_run(run)
        return [steptime.roofline_s(work, peaks.flops, peaks.bandwidth) / 1.25
                + work.ops * 2e-6] * steps

    monkeypatch.setattr(calibration, "_measuring",
                        lambda device, precision: (peaks, None, "planted", False))
    monkeypatch.setattr(steptime, "time_steps", planted_steps)
    out = tmp_path / "held.json"
    assert main(["plan", *FLAGS, "--calibrate", "--json", str(out)]) == 0
    footer = " ".join(capsys.readouterr().out.split())
    assert "÷ efficiency 1 (HELD AT ITS BOUND: the unbounded fit was 1.25)" in footer, footer
    assert "BOUND HELD: efficiency held at its bound 1" in footer
    assert "the unbounded fit was efficiency 1.25, 2 µs per call" in footer
    eff = json.loads(out.read_text())["efficiency"]
    assert eff["value"] == 1.0 and eff["held"] == ["efficiency"]
    assert eff["unbounded"]["efficiency"] == pytest.approx(1.25)
    assert eff["unbounded"]["launch_s"] == pytest.approx(2e-6)
    assert "BOUND HELD" in eff["source"] and eff["basis"]["held"] == ["efficiency"]


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't allocate memory: you tried "
    "to allocate 1099511627776 bytes")])
def test_a_model_too_big_for_this_host_is_one_line(error):
    from types import SimpleNamespace

    def count():
        raise error

    with pytest.raises(UserError) as e:
        fitting.on_this_host(SimpleNamespace(batch_size=512), count)
    assert "a step of 512 samples does not fit in this machine's memory" in str(e.value)
    with pytest.raises(RuntimeError, match="another"):  # any other error is not ours to hide
        fitting.on_this_host(SimpleNamespace(batch_size=512),
                               lambda: (_ for _ in ()).throw(RuntimeError("another")))


@pytest.mark.parametrize("flags", [("--tp", "2"), ("--pp", "2")])
def test_a_tensor_or_pipeline_layout_points_to_memory_in_one_line(capsys, flags):
    from tests.conftest import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "plan", "--model", "logreg", "--data", "synthetic", *flags)
    assert_one_line_error(code, err, "fasttrain plan models one process a GPU",
                          "fasttrain memory --gpus W --tp N --pp M")


def test_switches_a_model_cannot_take_are_left_out_of_the_combination():
    """A model without blocks to checkpoint: bf16 and accumulation ×8 each fall short, together
    they fit; the refusal of one switch does not cost the combination of the others, and what
    was tried is said."""
    from types import SimpleNamespace

    class Models:
        def memory(self, cfg):
            if cfg.activation_checkpointing:
                raise UserError("no blocks to checkpoint")
            peak = 1000 - 100 * (cfg.precision == "bf16") - {1: 0, 2: 200, 4: 300, 8: 350}[
                cfg.accum_steps]
            return SimpleNamespace(predicted_peak=peak, activations=peak, gradients=0,
                                   weights=0, optimizer=0, step_temp=0, weight_copies=0,
                                   conv_workspace=0, inputs=0, data=0, workspace=0)

    cfg = TrainConfig(model="mlp", data="synthetic", batch_size=64)
    gpu = cost.GPU("G", 600 / (1 - fitting.MARGIN) / 2**30, {"fp32": 1e12, "bf16": 1e12}, 1e11,
                   "PCIe", 25e9)
    got = fitting.fit(Models(), cfg, gpu, 1)
    assert got.how == "fits with bf16 + accumulation ×8" and got.need == 550
    assert got.cfg.precision == "bf16" and got.cfg.accum_steps == 8
    assert got.tried == ("bf16", "accumulation ×2", "accumulation ×4", "accumulation ×8",
                         "bf16 + accumulation ×8")
    small = cost.GPU("S", 400 / (1 - fitting.MARGIN) / 2**30, {"fp32": 1e12}, 1e11, "PCIe", 25e9)
    none = fitting.fit(Models(), cfg, small, 1)  # no bf16 on this card: not claimed as tried
    assert none.how == "does not fit" and "bf16" not in " ".join(none.tried)
    assert none.least == "with accumulation ×8" and none.need == 650
    assert none.tried[-1] == "FSDP over 8 GPUs"


def test_the_largest_batch_grows_from_the_activations_not_the_peak():
    # A small batch of a model whose optimizer-step temporaries outweigh its activations: the
    # peak is the same at micro-batch m and 2m, yet each sample still costs its activations.
    from fasttrain.lab.memory import Breakdown

    def breakdown(batch):
        return Breakdown("cuda", "fp32", "adamw", 0.0, batch, batch, 1000, weights=4000,
                         gradients=4000, optimizer=8000, activations=100 * batch,
                         weight_copies=0, inputs=10 * batch, data=0, workspace=0,
                         step_temp=4000, activations_fp32=100 * batch, measured_peak=0,
                         measured_by="")

    class Models:
        def memory(self, cfg):
            return breakdown(cfg.batch_size)

    cfg = TrainConfig(batch_size=8)
    assert breakdown(8).predicted_peak - 80 == breakdown(16).predicted_peak - 160  # flat peak
    largest, at_m, per_sample = fitting.largest_micro(Models(), cfg, 116_000)
    assert (at_m, per_sample) == (breakdown(8).predicted_peak, 110)
    # 16000 fixed + 110 B per sample ≤ 116000 → 909 (then the activations outgrow the temps)
    assert largest == 909
    assert breakdown(909).predicted_peak <= 116_000 < breakdown(910).predicted_peak


def test_a_stream_without_length_is_planned_for_its_max_steps(tmp_path, capsys):
    import torch

    class Stream(torch.utils.data.IterableDataset):
        classes = list(range(10))

        def __iter__(self):
            for i in range(64):
                yield torch.rand(1, 28, 28), i % 10

    import sys
    import types

    mod = types.ModuleType("plan_stream_data")
    mod.load = Stream
    sys.modules["plan_stream_data"] = mod
    try:
        flags = ["plan", "--model", "logreg", "--data", "plan_stream_data:load",
                 "--batch-size", "16", "--device", "cpu"]
        assert main(flags) == 2
        assert "--max-steps" in capsys.readouterr().err
        assert main([*flags, "--max-steps", "40", "--json", str(tmp_path / "p.json")]) == 0
    finally:
        del sys.modules["plan_stream_data"]
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["total_steps"] == 40 and result["steps_per_epoch"] is None
    ok = [r for r in result["rows"] if r["status"] == "ok"]
    assert ok and all(r["epoch_s"] is None and r["total_s"] == pytest.approx(40 * r["step_s"])
                      for r in ok)
    assert all(r["largest_batch"] < 2**40 for r in ok)  # from the activations: no cap needed


def test_a_users_dataloader_is_planned_at_other_batches_too(tmp_path, capsys):
    # plan predicts the step at 2× the batch (the largest batch) and with accumulation: the
    # DataLoader's fixed batch_size stopped it, telling the user to change --batch-size.
    flags = ["plan", "--model", "mlp", "--data", "tests.lab.test_memory:fixed_loader",
             "--device", "cpu"]
    assert main([*flags, "--batch-size", "8", "--json", str(tmp_path / "p.json")]) == 0
    result = json.loads((tmp_path / "p.json").read_text())
    assert result["steps_per_epoch"] == 8  # 64 samples at the loader's 8
    assert {r["largest_batch"] for r in result["rows"] if r["status"] == "ok"} == {64}
    capsys.readouterr()
    assert main([*flags, "--batch-size", "16"]) == 2  # the given batch must match, as in train
    assert "batch_size=16" in capsys.readouterr().err


def test_tf32_and_cuda_graphs_are_planned_without_a_gpu_here(tmp_path):
    # The GPUs of the catalogue run them; this machine need not: plan refused both on a CPU
    # ("--precision tf32 is a mode of NVIDIA tensor cores"), before renting the GPU.
    flags = ["plan", "--model", "mlp", "--data", "synthetic", "--batch-size", "64"]
    rows = {}
    for name, extra in (("fp32", []), ("tf32", ["--precision", "tf32"]),
                        ("graphs", ["--cuda-graphs"])):
        assert main([*flags, *extra, "--json", str(tmp_path / f"{name}.json")]) == 0
        result = json.loads((tmp_path / f"{name}.json").read_text())
        rows[name] = {r["gpu"]: r for r in result["rows"]}
    a100 = {name: r["A100 80GB"] for name, r in rows.items()}
    assert a100["tf32"]["memory_needed"] == a100["fp32"]["memory_needed"]  # the same tensors
    assert a100["tf32"]["roofline_s"] < a100["fp32"]["roofline_s"]  # at the TF32 peak
    assert a100["graphs"]["launch_s"] == 0 < a100["fp32"]["launch_s"]
    assert rows["tf32"]["T4"]["status"] == "unsupported"  # no TF32 units


def test_an_efficiency_the_calibration_could_not_identify_is_marked_where_it_is_used():
    from fasttrain.lab import steptime

    flat = steptime.Fit(0.3, 3e-5, "NVIDIA H100 80GB HBM3", "fitted there",
                        unidentified=("efficiency",), model="max")
    assert "NOT IDENTIFIED" in plan_cmd._held(flat)
    assert plan_cmd._held(steptime.Fit(0.4, 3e-5, "NVIDIA H100 80GB HBM3", "fitted")) == ""

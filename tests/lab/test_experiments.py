"""`fasttrain experiment precision|memory|e2e` on the CPU: every experiment end to end with tiny
steps, the rows a CPU cannot run listed with their reason, JSON and PNG written, bad input."""

import json

import pytest
import torch

from fasttrain.commands.common import lab_config
from fasttrain.engine import TrainConfig
from fasttrain.errors import UserError
from fasttrain.lab import experiments as ex
from tests.conftest import requires_mnist, run_cli
from tests.engine.conftest import image_task

TINY = ex.Options(steps=2, warmup=1, batches=(16, 32, 512), accum=4)


def config(**kw) -> TrainConfig:
    kw.setdefault("device", "cpu")
    kw.setdefault("data", "synthetic")
    kw.setdefault("batch_size", 32)
    return TrainConfig(progress=False, **kw)


def test_precision_rows_on_the_cpu():
    rows = {r["precision"]: r for r in ex.run_experiment("precision", config(model="mlp"),
                                                         image_task(), TINY)}
    assert list(rows) == ["fp32", "tf32", "fp16", "bf16"]
    assert rows["tf32"]["status"] == "unavailable" and "TF32" in rows["tf32"]["reason"]
    for p in ("fp32", "fp16", "bf16"):
        r = rows[p]
        assert r["status"] == "ok", r
        assert r["ms_per_step"] > 0 and r["peak_bytes"] > 0 and r["peak_by"] == "hook count"
        assert 0 <= r["test_accuracy"] <= 1 and r["final_loss"] > 0
    assert rows["fp16"]["loss_scale"] > 0 and rows["fp16"]["skipped_steps"] >= 0
    assert "slow" in rows["fp16"]["note"]  # honest: fp16 on a CPU is emulated
    assert rows["fp32"]["loss_scale"] is None


def test_memory_experiment_sweep_accumulation_and_checkpointing():
    opts = ex.Options(steps=1, warmup=1, batches=(8, 16, 512), accum=4)
    rows = ex.run_experiment("memory", config(model="cnn", batch_size=16), image_task(), opts)
    sweep = [r for r in rows if r["part"] == "sweep"]
    assert [r["status"] for r in sweep] == ["ok", "ok", "skipped"]  # 512 > 256 samples
    assert sweep[1]["peak_bytes"] > sweep[0]["peak_bytes"]
    big, small = (r for r in rows if r["part"] == "accumulation")
    assert (big["label"], small["label"]) == ("16 × 1", "4 × 4")
    # Same update up to fp32 rounding (AdamW normalizes it: near-zero gradients amplify noise).
    assert big["max_abs_dweight"] == 0 and small["max_abs_dweight"] < 1e-4
    assert small["peak_bytes"] < big["peak_bytes"]  # a quarter of the activations
    off, on = (r for r in rows if r["part"] == "checkpointing")
    assert on["memory_saved"] > 0.2 and on["peak_bytes"] < off["peak_bytes"]
    assert "time_lost" in on
    # What checkpointing trades, counted apart from the peak: the bytes saved for backward.
    assert 0 < on["saved_bytes"] < off["saved_bytes"] and on["activations_saved"] > 0.3
    assert "note" not in on  # on the CPU the peak moves with them: nothing to explain


def _ckpt_row(peak, saved, **cuda):
    return {"ms_per_step": 2.0, "peak_bytes": peak, "saved_bytes": saved, **cuda}


def test_checkpointing_that_moves_no_peak_says_why():
    # The first H100 run: cnn, batch 64, fp32 — the same peak to the byte, off and on.
    off = _ckpt_row(193_114_112, 26_000_000, after_forward_bytes=27_000_000,
                    backward_peak_bytes=61_000_000)
    on = _ckpt_row(193_114_112, 4_000_000, after_forward_bytes=5_000_000,
                   backward_peak_bytes=61_000_000)
    on["ms_per_step"] = 3.0
    got = ex.checkpointing_summary(off, on)
    assert got["memory_saved"] == got["memory_saved_bytes"] == 0
    assert got["time_lost"] == pytest.approx(0.5)
    assert got["activations_saved"] == pytest.approx(1 - 4 / 26)
    assert "22,000,000" in got["note"] and "inside backward" in got["note"]
    assert "little or no peak memory" in got["note"]


def test_checkpointing_that_lowers_the_peak_needs_no_note():
    got = ex.checkpointing_summary(_ckpt_row(100_000_000, 30_000_000),
                                   _ckpt_row(75_000_000, 5_000_000))
    assert got["memory_saved_bytes"] == 25_000_000 and "note" not in got


def test_memory_sweep_stops_at_the_limit():
    opts = ex.Options(steps=1, warmup=1, batches=(16, 32, 64), accum=2, memory_limit=1)
    sweep = [r for r in ex.run_experiment("memory", config(model="logreg"), image_task(), opts)
             if r["part"] == "sweep"]
    assert [r["status"] for r in sweep] == ["over limit"]  # then stopped: larger fit even less


def test_e2e_runs_the_cpu_row_and_lists_gpu_rows():
    rows = {r["row"]: r for r in ex.run_experiment("e2e", config(model="cnn", batch_size=16),
                                                   image_task(), TINY)}
    assert list(rows) == ["cpu-fp32", "cuda-fp32", "cuda-fp16", "cuda-bf16"]
    cpu = rows["cpu-fp32"]
    assert cpu["status"] == "ok" and cpu["speedup_vs_cpu"] == 1.0
    assert cpu["s_per_epoch"] == pytest.approx(cpu["ms_per_step"] * 16 / 1e3)  # 256/16 steps
    assert cpu["lab_expected"] == {"s_per_epoch": 120.0}
    if not torch.cuda.is_available():
        for key in ("cuda-fp32", "cuda-fp16", "cuda-bf16"):
            assert rows[key]["status"] == "unavailable"
            assert "no CUDA GPU" in rows[key]["reason"]


def test_a_failing_row_does_not_stop_the_others(monkeypatch):
    real = ex.measure_run

    def flaky(cfg, *a, **kw):
        if cfg.precision == "bf16":
            raise torch.OutOfMemoryError("simulated")
        return real(cfg, *a, **kw)

    monkeypatch.setattr(ex, "measure_run", flaky)
    rows = {r["precision"]: r for r in ex.run_experiment("precision", config(model="logreg"),
                                                         image_task(), TINY)}
    assert rows["bf16"]["status"] == "failed" and rows["bf16"]["reason"] == "out of memory"
    assert rows["fp32"]["status"] == "ok"


def test_default_data_falls_back_to_the_labelled_stand_in(monkeypatch):
    from fasttrain.data import tasks
    from fasttrain.engine.configfile import add_arguments

    real = tasks.load_task

    def no_mnist(name, *a, download=True, **kw):
        if name == "mnist":
            assert download is False  # the lab never downloads behind the user's back
            raise UserError("mnist not found")
        return real(name, *a, download=download, **kw)

    monkeypatch.setattr(tasks, "load_task", no_mnist)
    import argparse

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg, task = lab_config(p.parse_args(["--model", "logreg"]), "experiment")
    assert cfg.data == "synthetic" and task.synthetic


@requires_mnist
def test_default_data_is_mnist_when_present():
    import argparse

    from fasttrain.engine.configfile import add_arguments

    p = argparse.ArgumentParser()
    add_arguments(p)
    cfg, task = lab_config(p.parse_args(["--model", "cnn"]), "experiment")
    assert cfg.data == "mnist" and not task.synthetic


# -- the command ---------------------------------------------------------------------------------




BASE = ("--model", "logreg", "--data", "synthetic", "--device", "cpu", "--steps", "2",
        "--timing-warmup", "1", "--batches", "16,32")


@pytest.mark.parametrize("name", ex.EXPERIMENTS)
def test_each_experiment_writes_json_and_png(capsys, tmp_path, name):
    js, png = tmp_path / f"{name}.json", tmp_path / f"{name}.png"
    code, out, err = run_cli(capsys, "experiment", name, *BASE, "--json", str(js),
                         "--plot", str(png))
    assert code == 0, err
    result = json.loads(js.read_text())
    assert result["schema"] == "fasttrain.experiment/1" and result["experiment"] == name
    assert {"cpu", "torch", "git_commit"} <= result["env"].keys()
    assert result["config"]["model"] == "logreg" and result["config"]["synthetic"] is True
    assert result["options"]["steps"] == 2
    assert any(r["status"] == "ok" for r in result["rows"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "SYNTHETIC" in out


@pytest.mark.parametrize("argv, words", [
    (["nonsense"], ["invalid choice", "nonsense"]),
    (["precision", "--steps", "0"], ["--steps"]),
    (["precision", "--json", "/nonexistent-dir/r.json"], ["--json", "does not exist"]),
    (["e2e", "--plot", "/nonexistent-dir/r.png"], ["--plot"]),
    (["memory", "--batches", "a,b"], ["--batches"]),
    (["memory", "--batch-size", "64", "--accum", "3"], ["--accum"]),
    (["precision", "--out", "somewhere"], ["--out"]),
])
def test_bad_input_is_a_one_line_error(capsys, argv, words):
    code, _, err = run_cli(capsys, "experiment", *argv[:1], "--model", "logreg", "--data",
                       "synthetic", "--device", "cpu", *argv[1:])
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for w in words:
        assert w in lines[0], (w, lines[0])


def test_each_row_says_it_starts():
    """Progress: one line as each row it measures starts (tf32 is refused before: a CPU has
    no TF32)."""
    said = []
    opts = ex.Options(steps=1, warmup=0, say=said.append)
    ex.run_experiment("precision", config(model="logreg"), image_task(), opts)
    assert [line.split(",")[0] for line in said] == [
        "measuring precision fp32", "measuring precision fp16", "measuring precision bf16"]


@pytest.mark.parametrize("argv, flag", [
    (["scaling", "--predict-only", "--plot", "s.png"], "--plot"),
    (["scaling", "--predict-only", "--batches", "16,32"], "--batches"),
    # given, whatever its value: "1,2" is the default on a CPU, "1" on one GPU
    (["precision", "--model", "logreg", "--data", "synthetic", "--procs", "1,2"], "--procs"),
    (["precision", "--model", "logreg", "--data", "synthetic", "--procs", "1"], "--procs"),
])
def test_a_flag_of_another_experiment_is_refused_not_ignored(capsys, tmp_path, monkeypatch,
                                                             argv, flag):
    from tests.conftest import assert_one_line_error

    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(capsys, "experiment", *argv)
    assert_one_line_error(code, err, f"{flag} does not apply to `fasttrain experiment {argv[0]}`")
    assert not (tmp_path / "s.png").exists()


@pytest.mark.parametrize("progress", ["flag", "config"])
def test_progress_off_by_flag_or_config_is_silent_and_no_function_lands_in_the_json(
        capsys, tmp_path, progress):
    out = tmp_path / "p.json"
    off = ["--no-progress"] if progress == "flag" else ["--config", str(tmp_path / "c.toml")]
    (tmp_path / "c.toml").write_text("progress = false\n")
    code, _, err = run_cli(capsys, "experiment", "precision", "--model", "logreg", "--data",
                           "synthetic", "--steps", "1", "--timing-warmup", "0", "--json",
                           str(out), *off)
    assert code == 0, err
    assert "measuring" not in err
    options = json.loads(out.read_text())["options"]
    assert "say" not in options and options["steps"] == 1


def test_scaling_refuses_a_run_directory_from_the_config_too(capsys, tmp_path):
    from tests.conftest import assert_one_line_error

    (tmp_path / "c.toml").write_text(f'out = "{tmp_path / "run"}"\n')
    code, _, err = run_cli(capsys, "experiment", "scaling", "--predict-only", "--config",
                           str(tmp_path / "c.toml"))
    assert_one_line_error(code, err, "writes no run directory")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["precision", "e2e"])  # memory's sweep has its own batches
def test_input_every_row_refuses_is_bad_input_not_a_table(capsys, tmp_path, name):
    # A batch larger than the data made every row 'unavailable' with the engine's one line,
    # and the command exited 0 with a table (and JSON) of nothing.
    js = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "experiment", name, "--model", "logreg", "--data",
                           "synthetic", "--device", "cpu", "--batch-size", "1000000",
                           "--steps", "1", "--json", str(js))
    assert code == 2, err
    assert err.strip().splitlines()[-1].startswith("error: --batch-size 1000000"), err
    assert "Traceback" not in err and not js.exists()


class _Stream(torch.utils.data.IterableDataset):
    classes = list(range(10))

    def __iter__(self):
        for i in range(64):
            yield torch.rand(1, 28, 28), i % 10


def test_a_stream_without_length_names_the_sweep_not_a_batch_size_search(capsys):
    code, _, err = run_cli(capsys, "experiment", "memory", "--model", "logreg", "--data",
                           "tests.lab.test_experiments:_Stream", "--device", "cpu",
                           "--batch-size", "16", "--max-steps", "4", "--steps", "1")
    assert code == 2 and "batch sweep" in err.strip().splitlines()[-1], err

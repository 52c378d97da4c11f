"""The bench as an instrument: check before time, interleaved repeats and their statistics, the
roofline's arithmetic and the peaks it divides by."""

from dataclasses import dataclass

import numpy as np
import pytest

from fasttrain import bench, ladder
from fasttrain.ladder.check import check_row, reference_step
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.numpy_cpu import NumpyCPU
from fasttrain.ladder.roofline import Roofline, epoch_work, roofline_ms
from fasttrain.timing import repeat_summary
from tests.conftest import tiny_images

CALLS: list[str] = []  # (row, method) in the order the bench made them


class LoggedNumpy(NumpyCPU):
    """A correct row that logs its setups and epochs."""

    name = "logged"

    def setup(self, data, cfg):
        CALLS.append(f"{self.name}:setup")
        super().setup(data, cfg)

    def train_epoch(self, epoch):
        CALLS.append(f"{self.name}:epoch")
        return super().train_epoch(epoch)


class OtherLogged(LoggedNumpy):
    name = "other"


class WrongSign(LoggedNumpy):
    """Deliberately broken: climbs the gradient instead of descending it."""

    name = "wrong-sign"

    def setup(self, data, cfg):
        super().setup(data, cfg)
        self.cfg = LadderConfig(epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr)
        self.lr_sign = -1.0

    def train_epoch(self, epoch):
        w0, b0 = (a.copy() for a in self.params())
        loss = super().train_epoch(epoch)
        w, b = self.params()
        w[...] = 2 * w0 - w  # undo the step and take it backwards
        b[...] = 2 * b0 - b
        return loss


class RaisesInSetup(LoggedNumpy):
    name = "raises"

    def setup(self, data, cfg):
        raise RuntimeError("kernel launch failed")


@dataclass(frozen=True)
class FakeEntry(ladder.Entry):
    cls: type = None

    def load(self):
        return self.cls


def entry_for(cls):
    return FakeEntry(cls.name, "unused:Unused", cls=cls)


@pytest.fixture
def tiny_data():
    cfg = LadderConfig(epochs=2, batch_size=32)
    return make_ladder_data(tiny_images(n_train=100), cfg), cfg


@pytest.mark.parametrize("broken, words", [(WrongSign, "differs from the float64 reference"),
                                           (RaisesInSetup, "kernel launch failed")])
def test_broken_row_is_reported_failed_and_never_timed(tiny_data, broken, words):
    data, cfg = tiny_data
    CALLS.clear()
    rows = bench.run_rows([entry_for(broken), entry_for(LoggedNumpy)], data, cfg, {}, repeats=2)
    bad, good = rows
    assert bad["status"] == "failed" and words in bad["reason"], bad["reason"]
    assert bad["reason"].startswith("check:") and bad["repeats"] == [] and "epoch_ms" not in bad
    # the check took one step (at most); no timed epoch ever ran
    assert CALLS.count(f"{broken.name}:epoch") <= 1
    assert CALLS.count(f"{broken.name}:setup") <= 1
    assert good["status"] == "ok" and len(good["repeats"]) == 2


def test_rows_are_checked_then_timed_in_interleaved_repeats(tiny_data):
    data, cfg = tiny_data
    CALLS.clear()
    rows = bench.run_rows([entry_for(LoggedNumpy), entry_for(OtherLogged)], data, cfg, {},
                          repeats=3)
    setups = [c.split(":")[0] for c in CALLS if c.endswith(":setup")]
    # two checks first, then three rounds of (logged, other)
    assert setups == ["logged", "other"] + ["logged", "other"] * 3
    for r in rows:
        assert r["check"]["ok"] and r["check"]["max_abs_err"] <= r["check"]["atol"]
        assert len(r["repeats"]) == 3
        assert all(len(rep["epoch_ms_all"]) == cfg.epochs for rep in r["repeats"])
        per_repeat = sorted(rep["epoch_ms"] for rep in r["repeats"])
        assert r["epoch_ms"] == per_repeat[1]  # the median of three
        assert (r["epoch_ms_repeat_min"], r["epoch_ms_repeat_max"]) == (per_repeat[0],
                                                                        per_repeat[2])
        every = [ms for rep in r["repeats"] for ms in rep["epoch_ms_all"]]
        assert r["epoch_ms_min"] == min(every) and r["epoch_ms_max"] == max(every)


def test_a_row_slower_than_the_repeat_limit_runs_once_and_says_so(tiny_data):
    """--repeat-limit: any run exceeds 1 ns and none 1e9 s, so the limits decide alone."""
    data, cfg = tiny_data
    CALLS.clear()
    rows = bench.run_rows([entry_for(LoggedNumpy), entry_for(OtherLogged)], data, cfg, {},
                          repeats=3, repeat_limit=1e-9)
    assert [len(r["repeats"]) for r in rows] == [1, 1]
    for r in rows:
        assert r["status"] == "ok" and r["repeat_limit_s"] == 1e-9
        assert r["epoch_ms"] == r["repeats"][0]["epoch_ms"]
    setups = [c.split(":")[0] for c in CALLS if c.endswith(":setup")]
    assert setups == ["logged", "other"] * 2  # the checks, then one run each
    rows = bench.run_rows([entry_for(LoggedNumpy)], data, cfg, {}, repeats=3, repeat_limit=1e9)
    assert len(rows[0]["repeats"]) == 3 and "repeat_limit_s" not in rows[0]


@pytest.mark.parametrize("limit", ["0", "-1", "nan", "inf"])
def test_a_repeat_limit_that_is_not_a_positive_time_is_one_line(limit, capsys):
    from fasttrain.cli import main

    assert main(["bench", "--impl", "numpy-cpu", "--data", "synthetic", "--repeat-limit",
                 limit]) == 2
    err = capsys.readouterr().err
    assert "--repeat-limit must be a number of seconds > 0" in err and "Traceback" not in err


POISONED = [False]  # the fake device's state: a sticky fault makes every later call fail


class Faults(LoggedNumpy):
    """Fails with a sticky device fault in the setup of its `at`-th instance (1: the check)."""

    name, at, made = "faults", 1, 0

    def setup(self, data, cfg):
        type(self).made += 1
        if type(self).made == self.at:
            POISONED[0] = True
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        super().setup(data, cfg)


class FaultsTimed(Faults):
    name, at = "faults-timed", 3  # the check, repeat 1, then repeat 2


def unless_poisoned(device: str) -> bool:
    return not POISONED[0]


def in_a_fresh_process(data, cfg, repeats: int, log: list):
    """What bench's rerun does, in this process: the rows again from the start, device reset."""
    def rerun(entries):
        log.append([e.name for e in entries])
        POISONED[0] = False
        return bench.run_rows(entries, data, cfg, {}, repeats)
    return rerun


@pytest.mark.parametrize("faulty", [Faults, FaultsTimed])
def test_a_sticky_device_fault_fails_its_row_and_reruns_the_others_fresh(tiny_data, faulty):
    """A row that leaves the device unusable (a sticky CUDA fault) fails alone: the rows not
    finished (checked but not timed, or not yet checked; not the ones already failed) are
    checked and timed again in a fresh process, which is marked in their rows."""
    data, cfg = tiny_data
    POISONED[0], faulty.made, log = False, 0, []
    entries = [entry_for(c) for c in (WrongSign, LoggedNumpy, faulty, OtherLogged)]
    rows = bench.run_rows(entries, data, cfg, {}, repeats=2, usable=unless_poisoned,
                          rerun=in_a_fresh_process(data, cfg, 2, log))
    by = {r["impl"]: r for r in rows}
    assert [r["impl"] for r in rows] == [e.name for e in entries]
    assert log == [["logged", "other"]]  # wrong-sign failed before: final, not rerun
    culprit = by[faulty.name]
    assert culprit["status"] == "failed" and "illegal memory access" in culprit["reason"]
    assert "left the device unusable" in culprit["reason"]
    assert by["wrong-sign"]["status"] == "failed" and "fresh_process_after" not in by["wrong-sign"]
    for name in ("logged", "other"):
        assert by[name]["status"] == "ok" and len(by[name]["repeats"]) == 2, by[name]
        assert by[name]["fresh_process_after"] == faulty.name


def test_without_a_fresh_process_the_rows_left_fail_with_the_reason(tiny_data):
    data, cfg = tiny_data
    POISONED[0], Faults.made = False, 0
    rows = bench.run_rows([entry_for(Faults), entry_for(LoggedNumpy)], data, cfg, {},
                          repeats=1, usable=unless_poisoned)
    assert rows[1]["status"] == "failed"
    assert rows[1]["reason"] == "not run: faults left the device unusable for its process " \
                                "(a sticky CUDA fault)"


def test_a_failure_that_leaves_the_device_usable_fails_its_row_only(tiny_data):
    data, cfg = tiny_data
    Faults.made = 0
    rows = bench.run_rows([entry_for(Faults), entry_for(LoggedNumpy)], data, cfg, {},
                          repeats=1, rerun=lambda todo: pytest.fail("nothing to rerun"))
    assert rows[0]["status"] == "failed" and "unusable" not in rows[0]["reason"]
    assert rows[1]["status"] == "ok" and "fresh_process_after" not in rows[1]
    assert bench.device_usable("cpu")


class Interrupts(LoggedNumpy):
    """Ctrl-C in the setup of its third instance: the check, repeat 1, then repeat 2."""

    name, made = "interrupts", 0

    def setup(self, data, cfg):
        type(self).made += 1
        if type(self).made == 3:
            raise KeyboardInterrupt
        super().setup(data, cfg)


def test_ctrl_c_keeps_the_repeats_finished(tiny_data):
    """Each row stands on the repeats it finished (the one in progress is dropped); a row that
    never got timed is "not run", not a row of zeros."""
    data, cfg = tiny_data
    Interrupts.made = 0
    with pytest.raises(bench.Interrupted) as cut:
        bench.run_rows([entry_for(c) for c in (LoggedNumpy, Interrupts, OtherLogged)], data,
                       cfg, {}, repeats=3)
    logged, interrupts, other = cut.value.rows
    assert len(logged["repeats"]) == 2 and logged["status"] == "ok"  # rounds 1 and 2
    assert len(interrupts["repeats"]) == 1 and interrupts["status"] == "ok"
    assert len(other["repeats"]) == 1 and other["epoch_ms"] == other["repeats"][0]["epoch_ms"]
    Interrupts.made = 1  # the check is now its second instance and repeat 1 its third
    with pytest.raises(bench.Interrupted) as cut:
        bench.run_rows([entry_for(Interrupts), entry_for(LoggedNumpy)], data, cfg, {},
                       repeats=1)
    assert [r["status"] for r in cut.value.rows] == ["not run", "not run"]
    assert cut.value.rows[1]["reason"] == "interrupted before it was timed"


def test_an_interrupted_bench_writes_what_it_has_and_exits_130(capsys, tmp_path, monkeypatch):
    from tests.conftest import run_cli

    def interrupted(entries, *args, **kwargs):
        raise bench.Interrupted([{**bench.base_row(e), "status": "not run",
                                  "reason": "interrupted before its check"} for e in entries])

    monkeypatch.setattr(bench, "run_rows", interrupted)
    out = tmp_path / "r.json"
    code, _, err = run_cli(capsys, "bench", "--data", "synthetic", "--impl", "numpy-cpu",
                           "--json", str(out))
    import json

    result = json.loads(out.read_text())
    assert code == 130 and "interrupted" in err
    assert result["config"]["interrupted"] is True
    assert result["rows"][0]["status"] == "not run"


def test_gpu_runs_take_the_hand_written_kernels_last():
    from tests.conftest import run_last

    ids = ["tests/ladder/test_cuda_epoch.py::test_a", "tests/gpu/test_train.py::test_b",
           "tests/ladder/test_cuda_rungs.py::test_c[x]", "tests/test_bench.py::test_d"]
    assert sorted(ids, key=run_last) == [ids[1], ids[3], ids[2], ids[0]]


def test_without_a_gpu_the_heaviest_modules_go_first():
    """CPU runs hand xdist's workers the slowest modules first (conftest's HEAVY); with a GPU the
    hand-written kernels still go last, the heavy order only among the others."""
    from pathlib import Path

    from tests.conftest import HEAVY, run_order

    root = Path(__file__).resolve().parents[1]
    assert [p for p in HEAVY if not (root / p).is_file()] == []  # a renamed module drops out
    ids = ["tests/data/test_idx.py::test_a", "tests/ladder/test_cuda_epoch.py::test_b",
           "tests/lab/test_scaling.py::test_c", "tests/engine/test_trainer.py::test_d[x]",
           "tests/ladder/test_cuda_rungs.py::test_e"]
    cpu = sorted(ids, key=lambda i: run_order(i, gpu=False))
    assert cpu == [ids[1], ids[2], ids[3], ids[0], ids[4]]
    gpu = sorted(ids, key=lambda i: run_order(i, gpu=True))
    assert gpu == [ids[2], ids[3], ids[0], ids[4], ids[1]]


def test_the_fresh_process_is_fasttrain_bench_with_these_settings(tmp_path):
    """bench's own rerun: a real `fasttrain bench` child for the rows given, same settings."""
    import argparse

    args = argparse.Namespace(data="synthetic", data_dir=None, repeat_limit=None)
    cfg = LadderConfig(epochs=1, batch_size=64, lr=0.05, seed=3)
    rows = bench.fresh_process([ladder.entry("numpy-cpu")], args, cfg, repeats=1)
    assert [r["impl"] for r in rows] == ["numpy-cpu"]
    assert rows[0]["status"] == "ok" and len(rows[0]["repeats"]) == 1
    assert len(rows[0]["repeats"][0]["epoch_ms_all"]) == 1


def test_repeat_summary_median_and_spread():
    s = repeat_summary([12.0, 10.0, 30.0, 11.0])
    assert s["epoch_ms"] == 11.5
    assert (s["epoch_ms_repeat_min"], s["epoch_ms_repeat_max"]) == (10.0, 30.0)
    assert s["spread"] == pytest.approx(20.0 / 11.5)
    assert repeat_summary([7.0])["spread"] == 0.0
    with pytest.raises(ValueError):
        repeat_summary([])


def test_reference_step_matches_float64_autograd(tiny_data):
    import torch

    from fasttrain.ladder.check import one_batch

    data, cfg = tiny_data
    small, _ = one_batch(data, cfg)
    w = torch.tensor(small.w0, dtype=torch.float64, requires_grad=True)
    b = torch.tensor(small.b0, dtype=torch.float64, requires_grad=True)
    x = torch.tensor(small.train_x, dtype=torch.float64) / 255
    loss = torch.nn.functional.cross_entropy(x @ w.T + b, torch.tensor(small.train_y))
    gw, gb = torch.autograd.grad(loss, (w, b))
    w_ref, b_ref = reference_step(small, cfg.lr)
    np.testing.assert_allclose(w_ref, (w - cfg.lr * gw).detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(b_ref, (b - cfg.lr * gb).detach().numpy(), atol=1e-12)
    assert small.n_train == cfg.batch_size and small.orders.shape == (1, cfg.batch_size)


@pytest.mark.parametrize("name", ["numpy-cpu", "numba-tiled"])
def test_correct_rows_pass_their_check(tiny_data, name):
    # (every row is checked by every bench run; the ladder's tests cover each row's step)
    data, cfg = tiny_data
    e = ladder.entry(name)
    if e.load().unavailable({}, cfg):
        pytest.skip(e.load().unavailable({}, cfg))
    result = check_row(e, data, cfg)
    assert result["ok"] and result["max_abs_err"] <= result["atol"], result


def test_roofline_arithmetic():
    work = epoch_work(60000)
    assert work["flops"] == 2 * 2 * 60000 * 784 * 10  # forward + weight gradient, FMA = 2 FLOPs
    assert work["bytes"] == 60000 * (784 + 8 + 8)
    r = roofline_ms(work["flops"], work["bytes"], peak_flops=196e9, bandwidth=20e9)
    assert r["compute_ms"] == pytest.approx(1e3 * 1.8816e9 / 196e9)  # ~9.6 ms
    assert r["memory_ms"] == pytest.approx(1e3 * 48e6 / 20e9)  # 2.4 ms
    assert r["epoch_ms"] == r["compute_ms"] and r["bound"] == "compute"
    slow_memory = roofline_ms(work["flops"], work["bytes"], peak_flops=196e9, bandwidth=1e9)
    assert slow_memory["bound"] == "memory" and slow_memory["epoch_ms"] == pytest.approx(48.0)


def test_roofline_row_on_a_gpu_uses_the_data_sheet(tiny_data):
    from fasttrain.env import GPU_PEAKS
    from fasttrain.peaks import machine_peaks

    data, cfg = tiny_data
    env = {"gpu": "NVIDIA H100 80GB HBM3"}
    peaks = machine_peaks(env, "cuda")
    assert peaks["fp32_flops"] == GPU_PEAKS["H100 SXM"]["fp32"]
    assert peaks["bandwidth"] == GPU_PEAKS["H100 SXM"]["bw"]
    est = Roofline("cuda").estimate(data, cfg, peaks)
    work = epoch_work(data.n_train)
    assert est["epoch_ms"] == pytest.approx(max(1e3 * work["flops"] / 67e12,
                                                1e3 * work["bytes"] / 3.35e12))
    from fasttrain import ladder
    from fasttrain.ladder.measure import base_row, computed_row

    entry = ladder.entry("roofline")  # the table says whose peaks: the GPU's, not "cpu"
    row = computed_row(entry, base_row(entry), data, LadderConfig(device="cuda"), peaks)
    assert row["device"] == "cuda" and row["epoch_ms"] == pytest.approx(est["epoch_ms"])
    assert machine_peaks({"gpu": "Some Unknown GPU"}, "cuda") is None
    assert Roofline.unavailable({"gpu": "Some Unknown GPU"},
                                LadderConfig(device="cuda")) is not None


def test_cpu_peaks_are_measured_with_every_trial_kept():
    pytest.importorskip("numba")
    from fasttrain.peaks import fma_flops, measure_cpu

    p = measure_cpu(n_threads=1, trials=2, reps=50)
    assert p["source"] == "measured" and p["threads"] == 1
    assert len(p["fp32_flops_trials"]) == len(p["bandwidth_trials"]) == 2
    assert p["fp32_flops"] == max(p["fp32_flops_trials"]) > 0
    assert p["bandwidth"] == max(p["bandwidth_trials"]) > 0
    assert fma_flops(50) == 2 * 16 * 8 * 256 * 50


def test_source_hash_covers_declared_sources():
    class WithSources(LoggedNumpy):
        sources = ("common.py",)

    plain, more = entry_for(LoggedNumpy).source_hash(), entry_for(WithSources).source_hash()
    assert more["files"][-1] == "common.py" and len(more["files"]) == len(plain["files"]) + 1
    assert plain["sha256"] != more["sha256"]
    assert ladder.entry("numba-tiled").source_hash()["files"] == ["numba_tiled.py"]
    # a CUDA source brings the headers it includes, transitively (the kernel a figure came from)
    files = ladder.entry("cuda-epoch").source_hash()["files"]
    assert files[:2] == ["cuda_epoch.py", "csrc/cuda_epoch.cu"] and len(files) == len(set(files))
    assert {"csrc/epoch_v7f.cuh", "csrc/v8_workers.cuh", "csrc/v8_mma.cuh"} <= set(files)


def test_a_fresh_process_cut_short_marks_its_rows_interrupted(monkeypatch):
    import argparse
    import json
    import subprocess

    class Child:  # the child bench as it ends on a SIGINT: its JSON written, exit 130
        def __init__(self, argv, **kwargs):
            path = argv[argv.index("--json") + 1]
            with open(path, "w") as f:
                json.dump({"config": {"interrupted": True},
                           "rows": [{"impl": "numpy-cpu", "status": "ok"}]}, f)

        def wait(self):
            return 130

    monkeypatch.setattr(subprocess, "Popen", Child)
    args = argparse.Namespace(data="synthetic", data_dir=None, repeat_limit=None)
    rows = bench.fresh_process([ladder.entry("numpy-cpu")], args, LadderConfig(), repeats=1)
    assert rows == [{"impl": "numpy-cpu", "status": "ok", "interrupted": True}]


def test_a_negative_seed_is_one_line(capsys):
    from fasttrain.cli import main

    assert main(["bench", "--impl", "roofline", "--data", "synthetic", "--seed", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--seed must be an integer >= 0" in err and "Traceback" not in err


def test_json_and_plot_on_one_path_is_one_line_and_keeps_the_file(capsys, tmp_path):
    from fasttrain.cli import main

    out = tmp_path / "r.json"
    out.write_text("{}")
    assert main(["bench", "--impl", "roofline", "--data", "synthetic", "--json", str(out),
                 "--plot", str(out)]) == 2
    assert "--json and --plot both name" in capsys.readouterr().err
    assert out.read_text() == "{}"


def test_a_diverged_row_still_gets_its_json(tmp_path):
    import json
    import math

    from fasttrain import report

    result = {"rows": [{"train_loss": math.inf, "test_loss": math.nan,
                        "repeats": [{"train_loss_per_epoch": [1.0, math.inf]}]}]}
    report.write_json(tmp_path / "r.json", result)
    row = json.loads((tmp_path / "r.json").read_text())["rows"][0]
    assert row["train_loss"] is None and row["test_loss"] is None
    assert row["repeats"][0]["train_loss_per_epoch"] == [1.0, None]


@pytest.mark.parametrize("quiet", [False, True])
def test_a_log_file_gets_progress_lines_without_a_bar(monkeypatch, quiet):
    """stderr redirected to a file: no live bar, a plain line per epoch at most every
    LOG_EVERY_S (0 here: every epoch but the last, which the repeat's own line reports)."""
    import io

    from rich.console import Console

    cfg = LadderConfig(epochs=3, batch_size=50)
    data = make_ladder_data(tiny_images(n_train=100), cfg)
    monkeypatch.setattr(bench, "LOG_EVERY_S", 0.0)
    log = io.StringIO()
    console = Console(file=log, force_terminal=False, width=200)
    row = bench._time_with_progress(ladder.entry("numpy-cpu"), data, cfg, console, quiet,
                                    "numpy-cpu")
    assert len(row["epoch_ms_all"]) == 3
    lines = log.getvalue().splitlines()
    if quiet:
        assert lines == []
    else:
        assert [line.split(",")[0].split()[-1] for line in lines] == ["1/3", "2/3"]
        assert all("ms/epoch" in line and "\x1b" not in line for line in lines)


class ThreadCounting(NumpyCPU):
    """Notes which threads run beside each timed epoch."""

    name = "thread-counting"
    seen: list[set[str]] = []

    def train_epoch(self, epoch):
        import threading

        ThreadCounting.seen.append({type(t).__name__ for t in threading.enumerate()})
        return super().train_epoch(epoch)


def test_a_terminals_progress_bar_runs_no_thread_beside_the_timed_epochs():
    """The bar advances after each epoch's clock has stopped; a refresh thread redrawing it
    (rich's default, 10 times a second) would share the cores with the row being timed."""
    import io

    from rich.console import Console

    cfg = LadderConfig(epochs=3, batch_size=50)
    data = make_ladder_data(tiny_images(n_train=100), cfg)
    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=120)
    ThreadCounting.seen.clear()
    row = bench._time_with_progress(entry_for(ThreadCounting), data, cfg, console, False,
                                    "thread-counting")
    assert len(row["epoch_ms_all"]) == 3 and len(ThreadCounting.seen) == 3
    assert all("_RefreshThread" not in names for names in ThreadCounting.seen)
    assert "3/3" in screen.getvalue()  # and the bar was drawn, to the last epoch


def test_impl_picks_rows_in_the_tables_order_once_each():
    picked = bench.select("roofline, cpp-tiled,numpy-cpu,roofline")
    assert [e.name for e in picked] == ["numpy-cpu", "cpp-tiled", "roofline"]
    assert bench.select("all") == list(ladder.REGISTRY)


@pytest.mark.parametrize("flag, ours", [("--json", '{\n  "schema": "fasttrain.bench/2"}'),
                                        ("--json", '{"schemaVersion": 1, "traceEvents": ['),
                                        ("--json", ""),
                                        ("--trace", "gzip"),
                                        ("--plot", b"\x89PNG\r\n\x1a\n....")])
def test_an_earlier_output_may_be_replaced(tmp_path, flag, ours):
    """Recognized by the head of the file (never parsed whole): a result, a trace (gzipped too,
    as torch writes a `.gz` trace), a PNG."""
    import gzip

    from fasttrain import report

    p = tmp_path / "out"
    if ours == "gzip":
        p.write_bytes(gzip.compress(b'{"schemaVersion": 1, "traceEvents": [' + b" " * 5_000_000))
    else:
        p.write_bytes(ours if isinstance(ours, bytes) else ours.encode())
    assert report.check_writable(p, flag) == p


@pytest.mark.parametrize("command", [
    ["plan", "--model", "logreg", "--data", "synthetic"],
    ["experiment", "precision", "--model", "logreg", "--data", "synthetic"],
    ["profile", "--model", "logreg", "--data", "synthetic", "--trace", "{p}"],
])
def test_two_outputs_on_one_path_are_one_line_in_every_command(tmp_path, capsys, command):
    from fasttrain.cli import main

    out = tmp_path / "same.out"
    argv = [a.replace("{p}", str(out)) for a in command] + ["--json", str(out), "--plot",
                                                            str(out)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "both name" in err and "Traceback" not in err and not out.exists()


@pytest.mark.parametrize("flag, content", [("--json", "# My notes\n"), ("--json", "[1, 2]"),
                                           ("--json", '{"schema": "theirs/1"}'),
                                           ("--plot", b"GIF89a...")])
def test_any_other_existing_file_is_refused_and_kept(tmp_path, capsys, flag, content):
    from fasttrain.cli import main

    p = tmp_path / "README.md"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    before = p.read_bytes()
    assert main(["bench", "--impl", "roofline", "--data", "synthetic", flag, str(p)]) == 2
    err = capsys.readouterr().err
    assert f"{flag} {p}: exists and is not a" in err and "Traceback" not in err
    assert p.read_bytes() == before


def test_a_refused_trace_is_named_a_trace(tmp_path):
    """--trace writes a Chrome trace: a file it will not replace is 'not a trace an earlier run
    wrote', not 'not a fasttrain JSON' (which the user never asked for)."""
    from fasttrain import report
    from fasttrain.errors import UserError

    p = tmp_path / "notes.json"
    p.write_text("# My notes\n")
    with pytest.raises(UserError, match=r"--trace .*: exists and is not a trace an earlier run"):
        report.check_outputs((p, "--trace"))
    assert p.read_text() == "# My notes\n"


def test_more_epochs_than_their_shuffle_orders_fit_is_one_line(capsys):
    from fasttrain.cli import main

    # synthetic MNIST: 60,000 samples, 480 KB of order an epoch; 2 GiB hold 4,473 epochs
    assert main(["bench", "--impl", "roofline", "--data", "synthetic", "--epochs", "5000"]) == 2
    err = capsys.readouterr().err
    assert "--epochs 5000" in err and "at most 4,473 epochs" in err and "Traceback" not in err


def test_a_batch_larger_than_the_training_set_is_one_line(capsys):
    """Not a row-by-row failure (numba-fused and floor-gemm allocating 112 GiB of scratch for
    --batch-size 3000000000, cpp-tiled's "bad arguments"): the bench names the largest batch."""
    from fasttrain.cli import main
    from tests.conftest import assert_one_line_error

    code = main(["bench", "--impl", "numpy-cpu", "--data", "synthetic", "--epochs", "1",
                 "--batch-size", "3000000000", "--no-progress"])
    assert_one_line_error(code, capsys.readouterr().err, "--batch-size 3000000000",
                          "60,000", "--batch-size 60000")


def test_ctrl_c_before_any_row_ran_says_nothing_was_written(tmp_path, capsys, monkeypatch):
    from fasttrain.cli import main

    def interrupted(*_, **__):
        raise KeyboardInterrupt

    monkeypatch.setattr("fasttrain.peaks.machine_peaks", interrupted)  # Ctrl-C while measuring
    out = tmp_path / "r.json"
    assert main(["bench", "--impl", "roofline", "--data", "synthetic", "--json", str(out)]) == 130
    assert "interrupted before any row ran: no table, nothing written" in capsys.readouterr().err
    assert not out.exists()


def test_a_busy_cpu_is_said_before_the_rows_run():
    # Audit: with a 1-minute load of 10 on 2 cores, numpy-cpu ran 14,550 ms/epoch (80 on a quiet
    # machine) and nothing said why; the JSON's env.load_1min was the only trace.
    said = bench.load_warning({"load_1min": 10.2, "cores": 2})
    assert "load average 10.2 on 2 cores" in said and "quiet machine" in said, said
    assert bench.load_warning({"load_1min": 0.8, "cores": 2}) is None
    assert bench.load_warning({"load_1min": None, "cores": 2}) is None

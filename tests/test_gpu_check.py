"""`scripts/gpu-check` without a GPU: it must refuse to pass (exit 1, the reason in its summary),
and with --allow-cpu run its CPU steps, skip the GPU ones with the reason, and still write the
summary and the tarball. On a machine with CUDA these skip: the script runs for real there."""

import importlib.machinery
import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from fasttrain.cli import build_parser
from tests.conftest import import_benchmark

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu-check"
no_gpu_here = pytest.mark.skipif(torch.cuda.is_available(),
                                 reason="a GPU is present: scripts/gpu-check runs for real here")


def load_script():
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_check", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses look their module up while it loads
    loader.exec_module(module)
    return module


def run(*argv, env=None):
    return subprocess.run([sys.executable, str(SCRIPT), *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_every_fasttrain_step_parses_and_every_script_exists(tmp_path):
    steps = load_script().plan(tmp_path, "2026-01-01-some-gpu")
    names = [s.name for s in steps if not s.opt_in]
    assert names[:6] == ["env", "doctor", "bench", "engine-speedup", "gpu-tests",
                         "memory-prediction"]
    assert names[6] == "plan-accuracy"
    for step in steps:
        if step.argv[1:3] == ["-m", "fasttrain"]:
            build_parser().parse_args(step.argv[3:])  # a UserError here: a flag that is gone
        elif step.argv[1].endswith(".py"):
            assert (ROOT / step.argv[1]).is_file(), step.argv
        for path in step.outputs:
            assert "/" not in path or path.startswith("results/2026-01-01-some-gpu"), path


def test_the_triton_sweep_sweeps_triton_fused_alone_its_new_variants_first(tmp_path):
    """The loan's short sweep (scripts/gpu-loan): triton-fused's variants, seconds each, its
    DEFAULT then the ones not yet run on a GPU (programmatic dependent launch) first."""
    from fasttrain.ladder import triton_fused as tf

    script = load_script()
    step = {s.name: s for s in script.plan(tmp_path, "2026-01-01-some-gpu")}["triton-sweep"]
    argv = step.argv
    assert argv[argv.index("--rows") + 1] == "triton-fused" and "--variant" not in argv
    sweep = import_benchmark("variant_sweep")
    order = [e.variant for e in sweep.entries(["triton-fused"])]
    assert order[0] == tf.DEFAULT and all(v.pdl for v in order[1:4])


def test_the_v7_steps_are_opt_in_and_name_the_rows_variant_and_real_candidates(tmp_path):
    """v7-tests and v7-candidates run only when --only names them; they measure the row's own
    variant against candidates that exist, sync_cost takes their --v7, and their -k selects the
    candidates' float64 and one-launch tests and every variant's phase test (collected here)."""
    from fasttrain.ladder import cuda_epoch

    script = load_script()
    steps = {s.name: s for s in script.plan(tmp_path, "2026-01-01-some-gpu")}
    assert {n for n, s in steps.items() if s.opt_in} == {"v7-tests", "v7-candidates",
                                                         "triton-sweep"}
    assert script.V7_ROW == cuda_epoch.V7_VARIANT
    assert set(script.V7_CANDIDATES) <= set(cuda_epoch.V7_VARIANTS) - {script.V7_ROW}
    sync_cost = import_benchmark("sync_cost")
    argv = steps["v7-candidates"].argv
    timed = sync_cost.parse_v7(argv[argv.index("--v7") + 1])
    assert sorted(timed) == sorted((v, "launch") for v in (script.V7_ROW, *script.V7_CANDIDATES))
    argv = steps["v7-tests"].argv
    collect = [a for a in argv[1:argv.index("--junitxml")] if a != "-v"]
    done = subprocess.run([sys.executable, *collect, "--collect-only", "-q"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    ids = [ln for ln in done.stdout.splitlines() if "::" in ln]
    for v in script.V7_CANDIDATES:
        assert any(f"v7{v}-one-launch" in i and "float64" in i for i in ids), (v, done.stdout)
        assert any("in_one_launch" in i and f"[v7{v}]" in i for i in ids), v
    for v in (script.V7_ROW, *script.V7_CANDIDATES):
        assert any("phases_are_positive" in i and f"[{v}-launch]" in i for i in ids), v
    assert not any(f"v7{script.V7_ROW}" in i for i in ids), "the row's own tests ran before"
    assert not any("two-launches" in i for i in ids), "the row runs one launch"


def test_the_plan_accuracy_step_measures_on_cuda_into_its_result_file(tmp_path):
    plan_accuracy = import_benchmark("plan_accuracy")
    step = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}[
        "plan-accuracy"]
    args = plan_accuracy.parse(step.argv[2:])  # a SystemExit here: a flag that is gone
    assert args.device == "cuda" and args.json == str(tmp_path / step.outputs[0])
    assert step.outputs == ["results/2026-01-01-some-gpu-plan-accuracy.json"]


@no_gpu_here
def test_without_a_gpu_it_fails_and_says_why(tmp_path):
    done = run(tmp_path / "out")
    assert done.returncode == 1
    assert "no CUDA GPU" in done.stderr and "nothing measured" in done.stderr
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "**FAILED**" in summary and "NO GPU: torch.cuda.is_available() is False" in summary
    assert not json.loads((tmp_path / "out" / "summary.json").read_text())["passed"]


@pytest.mark.slow
@no_gpu_here
def test_allow_cpu_runs_the_cpu_steps_and_skips_the_gpu_ones_with_the_reason(tmp_path):
    out = tmp_path / "out"
    # The gpu-tests step's command as a GPU machine runs it, its pytest given one more option
    # through PYTEST_ADDOPTS (which the step's environment passes on): tests/ collected but for
    # what tests/gpu holds, its 52 GPU tests, so that what is checked here (the step runs pytest
    # -m gpu, writes and summarizes the JUnit file, every test skipped saying why) costs 4 s of
    # CPU, not the 13-15 s of collecting all 1,410 tests (a busy 2-core EPYC, 2026-11-28; the
    # whole test took 21.4 s of CPU before, 13.4-15.2 after). The fast suite runs every GPU test
    # without a GPU, so sees each of them skip, and collects tests/ as this step does.
    only_gpu = {**os.environ, "PYTEST_ADDOPTS": "--ignore-glob=tests/[!g]*"}
    done = run(out, "--allow-cpu", "--only", "env,gpu-tests,bench", "--compact", env=only_gpu)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["results.tar.gz", "summary.json",
                                                     "summary.md"]
    summary = json.loads((out / "summary.json").read_text())
    status = {s["name"]: s for s in summary["steps"]}
    assert status["env"]["status"] == "ok" and status["gpu-tests"]["status"] == "ok"
    assert status["bench"]["status"] == "skipped"
    assert status["bench"]["reason"].startswith("needs a CUDA GPU: torch.cuda.is_available()")
    assert status["doctor"]["reason"] == "not in --only"
    assert status["v7-candidates"]["reason"] == "not in --only"
    # The GPU tests ran and every one skipped, saying why.
    tests = status["gpu-tests"]["figures"]
    ran = re.fullmatch(r"(\d+) tests: 0 passed, 0 failed, 0 errors, (\d+) skipped", tests[0])
    assert ran and int(ran[1]) == int(ran[2]) > 0, tests
    text = (out / "summary.md").read_text()
    assert "CPU smoke run" in text and "nothing below is a GPU result" in text
    with tarfile.open(out / "results.tar.gz") as tar:
        names = set(tar.getnames())
        junit = tar.extractfile("pytest-gpu.xml").read().decode()
        env = json.loads(tar.extractfile("env.json").read())
    assert {"summary.md", "env.json", "logs/env.log", "logs/gpu-tests.log"} <= names
    assert "CUDA not available" in junit
    assert env["gpu"] is None and env["torch"] == torch.__version__


def test_the_bench_figures_say_an_interrupted_run_and_each_rows_repeats(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"config": {"interrupted": True}, "rows": [
        {"impl": "numpy-cpu", "device": "cpu", "status": "ok", "epoch_ms": 78.4,
         "test_accuracy": 0.92, "repeats": [{}, {}]},
        {"impl": "roofline", "device": "cpu", "status": "ok", "epoch_ms": 8.1},
        {"impl": "cuda-epoch", "device": "cuda", "status": "not run",
         "reason": "interrupted before it was timed"}]}))
    lines = gpu_check_figures.FIGURES["bench"](path)
    assert lines[0].startswith("interrupted")
    assert "78.4 ms/epoch (2×)" in lines[1] and "(computed)" in lines[2]
    assert "not run: interrupted before it was timed" in lines[3]


def test_the_bench_step_fails_on_a_row_that_trains_differently_or_did_not_run(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    def problem(**rows):
        path = tmp_path / "bench.json"
        path.write_text(json.dumps({"config": {}, "rows": [
            {"impl": name, "status": status, "test_accuracy": acc}
            for name, (status, acc) in rows.items()]}))
        return gpu_check_figures.bench_accuracy_problem(path)

    real = ROOT / "benchmarks/results/2026-11-26-nvidia-h100-80gb-hbm3.json"
    assert gpu_check_figures.bench_accuracy_problem(real) is None
    assert problem(**{"numpy-cpu": ("ok", 0.9232), "cuda-epoch": ("ok", 0.9230),
                      "roofline": ("ok", None)}) is None
    assert "cuda-epoch 0.9150" in problem(**{"numpy-cpu": ("ok", 0.9232),
                                             "cuda-epoch": ("ok", 0.915)})
    assert "triton-fused (unavailable)" in problem(**{"numpy-cpu": ("ok", 0.9232),
                                                      "triton-fused": ("unavailable", None)})
    assert "no numpy-cpu" in problem(**{"cuda-epoch": ("ok", 0.9232)})
    step = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}["gpu-tests"]
    assert any("test_full_training_on_cuda" in a for a in step.argv)  # deselected: bench checks


def test_the_peers_step_runs_the_mlp_on_cuda_and_its_figures_read_a_real_result(tmp_path):
    peers = import_benchmark("peers_in_memory")
    step = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}[
        "peers-in-memory"]
    args = peers.parser().parse_args(step.argv[2:])  # a SystemExit here: a flag that is gone
    assert args.device == "cuda" and args.models == ["mlp"]
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    cpu_result = ROOT / "benchmarks/results/2026-11-26-cpu-amd-epyc-2core-peers-in-memory.json"
    lines = gpu_check_figures.FIGURES["peers-in-memory"](cpu_result)
    assert len(lines) == 10 and "mlp fasttrain" in lines[0] and "samples/s" in lines[0]


def test_the_peers_step_is_given_the_seconds_it_has_and_its_partial_result_reads(tmp_path):
    """peers-in-memory timed out on the H200 (126 s): it now gets --max-seconds, the seconds
    the step is given less a margin, and a result stopped early still gives figures."""
    script = load_script()
    peers = import_benchmark("peers_in_memory")
    step = {s.name: s for s in script.plan(tmp_path, "2026-01-01-some-gpu")}["peers-in-memory"]
    for limit in (step.limit_s, 126.0):  # its own limit; what a spent budget left on the H200
        args = peers.parser().parse_args(script.step_argv(step, limit)[2:])
        assert args.max_seconds == limit - script.FLAG_MARGIN_S
    other = {s.name: s for s in script.plan(tmp_path, "2026-01-01-some-gpu")}["bench"]
    assert script.step_argv(other, 100.0) == other.argv  # a step without the flag: as planned

    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    partial = tmp_path / "peers.json"
    partial.write_text(json.dumps({"stopped_early": "after 3 of 10 runs: ...", "rows": [
        {"model": "mlp", "contender": "fasttrain", "status": "ok", "samples_per_s_median": 5e4,
         "vs_reference": None, "vs_reference_paired": None},
        {"model": "mlp", "contender": "hand-indexed", "status": "not run", "reason": None}]}))
    lines = gpu_check_figures.FIGURES["peers-in-memory"](partial)
    assert lines == ["mlp fasttrain    50,000 samples/s, × hand-indexed - (paired -)",
                     "mlp hand-indexed not run: None", "stopped after 3 of 10 runs: ..."]


def test_the_sync_cost_figures_read_a_real_result_a_failed_variant_and_the_phases(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    from fasttrain.ladder.cuda_epoch import PHASES

    real = json.loads((ROOT / "benchmarks/results/"
                       "2026-11-26-nvidia-h100-80gb-hbm3-run2-sync-cost.json").read_text())
    read = gpu_check_figures.FIGURES["sync-cost"]
    path = tmp_path / "sync-cost.json"
    path.write_text(json.dumps(real))
    lines = read(path)
    assert "v4, cluster of 14 CTAs: 2.273 ms/epoch = 4.85 µs/step" in "\n".join(lines)
    real["cuda_epoch_ms"]["v4, cluster of 7 CTAs"] = "RuntimeError: CTA 3 waited too long"
    real["cuda_epoch_phases_us"] = {"v4, cluster of 14 CTAs": {
        "step_us": 4.9, "mean_us": dict.fromkeys(PHASES, 0.8),
        "max_us": dict.fromkeys(PHASES, 1.0)}, "v5, cluster of 14 CTAs": {
        "step_us": 2.1, "mean_us": dict.fromkeys(PHASES, 0.35),
        "max_us": dict.fromkeys(PHASES, 0.5)}}
    path.write_text(json.dumps(real))
    lines = "\n".join(read(path))
    assert "v4, cluster of 7 CTAs: RuntimeError: CTA 3 waited too long" in lines
    assert "v4, cluster of 14 CTAs phases, µs a step (mean over CTAs): partials 0.80" in lines
    assert "v5, cluster of 14 CTAs phases, µs a step (mean over CTAs): partials 0.35" in lines


def test_the_v7_candidates_figures_rank_the_one_launch_variants_from_a_real_result(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    real = json.loads((ROOT / "benchmarks/results/"
                       "2026-11-28-nvidia-h200-run8-sync-cost.json").read_text())
    real["cuda_epoch_ms"]["v7k in one launch, a chain cluster of 8 CTAs"] = "RuntimeError: boom"
    path = tmp_path / "v7-candidates.json"
    path.write_text(json.dumps(real))
    lines = gpu_check_figures.FIGURES["v7-candidates"](path)
    assert "cuda-epoch, v7k in one launch, a chain cluster of 8 CTAs: RuntimeError: boom" in lines
    assert lines[-1] == ("v7 in one launch, fastest first (ms/epoch): v7f 1.721, v7e 1.906, "
                         "v7c 1.953")


def test_the_sync_cost_figures_show_v7s_phases_per_role_and_a_profile_that_failed(tmp_path):
    """v7's profile is recorded a role a key (benchmarks/sync_cost.py's profile_phases), or as
    its error where the profiling build failed on the GPU."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    from fasttrain.ladder.cuda_epoch import V7_PHASES

    v7 = "v7, a chain cluster of 8 CTAs and 7 worker clusters (64 CTAs)"
    result = {"cuda_epoch_phases_us": {
        f"{v7}: {role}": {"step_us": 1.4, "mean_us": dict.fromkeys(names, 0.2),
                          "max_us": dict.fromkeys(names, 0.3)}
        for role, names in V7_PHASES.items()}}
    path = tmp_path / "sync-cost.json"
    path.write_text(json.dumps(result))
    lines = gpu_check_figures.FIGURES["sync-cost"](path)
    assert lines == [
        f"  {v7}: chain phases, µs a step (mean over CTAs): wait G 0.20, wait partials 0.20, "
        "Gram terms 0.20, logits 0.20, softmax 0.20, send G 0.20, publish 0.20, wait Γ 0.20",
        f"  {v7}: workers phases, µs a step (mean over CTAs): load x 0.20, wait G 0.20, update "
        "0.20, partials 0.20, cluster barrier 0.20, reduce 0.20, publish 0.20",
        f"  {v7}: helpers phases, µs a step (mean over CTAs): "
        + ", ".join(f"{name} 0.20" for name in V7_PHASES["helpers"])]
    path.write_text(json.dumps({"cuda_epoch_phases_us": {
        v7: "cuda_epoch_train (v7 ...): CTA 9 waited too long"}}))
    assert gpu_check_figures.FIGURES["sync-cost"](path) == [
        f"  {v7} phases: cuda_epoch_train (v7 ...): CTA 9 waited too long"]


def _probes(ns=(700.4, 810.0, 1190.6), counters=(20_002, 20_002), payload_errors=0):
    """A synthetic handoff_probes section, as ladder/sync_probes.measure records it."""
    def pingpong(size, median):
        return {"payload_bytes": size, "rounds": 10_000, "ns_per_handoff": median,
                "ns_per_handoff_min": median - 5, "ns_per_handoff_max": median + 5,
                "ns_per_launch": [median] * 2, "counters": list(counters),
                "expected_counter": 20_002, "payload_errors": payload_errors,
                "sms": [[0, 66]] * 2}
    sizes = {"chain": {"8": {"clusters": 16, "ctas": 128, "regs": 10},
                       "16": "cudaOccupancyMaxActiveClusters (cluster 16, 512 threads, 128000 B): "
                             "cudaErrorInvalidClusterSize: invalid cluster size"}}
    return {"config": {"rounds": 10_000},
            "pingpong": {str(b): pingpong(b, x) for b, x in zip((0, 1024, 5120), ns, strict=True)},
            "broadcast": {"consumers": 56, "rounds": 1000, "first_ns_median": 650.0,
                          "last_ns_median": 1400.0, "last_ns_mean": 1420.5, "last_ns_max": 3000,
                          "timer_tick_ns": 32},
            "max_active_clusters": sizes,
            "resident_launch": {
                "16 clusters of 8, cooperative": {
                    "ctas": 128, "status": "cudaErrorCooperativeLaunchTooLarge: too many blocks "
                                           "in cooperative launch"},
                "16 clusters of 8": {"ctas": 128, "status": "ok", "resident": 128,
                                     "cluster_size": 8}}}


def test_the_sync_cost_figures_read_the_handoff_probes(tmp_path):
    sys.path.insert(0, str(ROOT / "scripts"))
    import gpu_check_figures

    read = gpu_check_figures.FIGURES["sync-cost"]
    path = tmp_path / "sync-cost.json"
    path.write_text(json.dumps({"schema": "fasttrain.sync_cost/1", "config": {"probes_only": True},
                                "handoff_probes": _probes()}))
    lines = read(path)
    assert lines == [
        "hand-off through L2, one way (median of launches): flag 700 ns, 1 KiB 810 ns, "
        "5 KiB 1191 ns",
        "one flag to many CTAs: 56 CTAs, the first sees it after 650 ns, the last after 1400 ns "
        "(median; timer step 32 ns)",
        "max active clusters: chain of 8 16, of 16 cudaOccupancyMaxActiveClusters (cluster 16, "
        "512 threads, 128000 B): cudaErrorInvalidClusterSize: invalid cluster size",
        "16 clusters of 8, cooperative: cudaErrorCooperativeLaunchTooLarge: too many blocks in "
        "cooperative launch",
        "16 clusters of 8: 128 of 128 CTAs resident at once"], "a --probes-only run: no barrier"
    path.write_text(json.dumps({"handoff_probes": _probes(counters=(20_002, 20_000))}))
    assert "flag 700 ns (PROTOCOL FAILED: counters [20002, 20000] of 20002, 0 payload errors)" in (
        read(path)[0])
    path.write_text(json.dumps({"handoff_probes": _probes(payload_errors=3)}))
    assert "5 KiB 1191 ns (PROTOCOL FAILED: counters [20002, 20002] of 20002, 3 payload errors)" \
        in read(path)[0]
    path.write_text(json.dumps({"handoff_probes": {"error": "Unavailable: nvcc not found"}}))
    assert read(path) == ["hand-off probes: Unavailable: nvcc not found"]


def test_an_outdir_that_is_a_file_is_one_line(tmp_path):
    out = tmp_path / "results.txt"
    out.write_text("mine")
    done = run(out, "--allow-cpu")
    assert done.returncode == 2 and "is a file" in done.stderr and "Traceback" not in done.stderr
    assert out.read_text() == "mine"


def test_a_python_without_torch_is_named_not_taken_for_no_gpu(tmp_path, monkeypatch, capsys):
    """The steps' Python cannot import torch (this one without its site-packages): one line
    naming it, not a report of 'no GPU'."""
    import sys

    bare = tmp_path / "python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    script = load_script()
    monkeypatch.setattr(script, "PY", str(bare))
    with pytest.raises(SystemExit) as e:
        script.main([str(tmp_path / "out"), "--allow-cpu"])
    assert e.value.code == 2
    assert "cannot import torch" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()

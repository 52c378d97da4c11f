"""benchmarks/variant_sweep.py on the CPU: its rows are each swept row with each Variant of its
module's SWEEP (named by it, hashed by the row's own source, refused without a GPU as the row
is), the bench's harness checks them, and the script refuses to run without CUDA or with a row
it cannot sweep. The sweep itself runs on a GPU (scripts/gpu-check's variant-sweep step)."""

import pytest

from tests.conftest import import_benchmark, tiny_images
from tests.test_gpu_check import load_script

pytest.importorskip("triton", reason="triton is in the test extra: pip install -e .[test]")


@pytest.fixture(scope="module")
def sweep():
    return import_benchmark("variant_sweep")


@pytest.mark.parametrize("row", ["triton-fused", "torch-graphs", "torch-optimized"])
def test_each_entry_is_the_row_with_its_variant(sweep, row):
    from fasttrain import ladder

    module = sweep.module(row)
    entries = sweep.entries([row])
    assert [e.variant for e in entries] == [module.DEFAULT] + [
        v for v in module.SWEEP if v != module.DEFAULT]  # the baseline first
    assert module.DEFAULT in module.SWEEP
    assert len({e.name for e in entries}) == len(entries)
    base = ladder.entry(row)
    for e in entries:
        cls = e.load()
        assert issubclass(cls, base.load()) and cls.variant == e.variant
        assert cls.name == e.name == f"{row} [{e.variant.tag}]"
        assert cls().variant == e.variant
        assert e.source_hash() == base.source_hash()  # the same code as the row's
        assert e.picks_device == base.picks_device  # torch-optimized runs on the sweep's cuda
    assert base.load().variant == module.DEFAULT  # the row itself is untouched


def test_without_a_gpu_the_bench_reports_every_variant_unavailable(sweep):
    import torch

    from fasttrain import bench, ladder

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the variants run")
    cfg = ladder.LadderConfig(epochs=1, batch_size=16)
    data = ladder.make_ladder_data(tiny_images(n_train=32), cfg)
    picked = [sweep.entries(["triton-fused"])[0], sweep.entries(["torch-graphs"])[-1]]
    rows = bench.run_rows(picked, data, cfg, {}, repeats=1)
    assert [r["status"] for r in rows] == ["unavailable"] * 2
    assert all("CUDA" in r["reason"] for r in rows)
    assert sweep.main(["--data", "synthetic"]) == 2


def test_the_defaults_run_first_then_the_rows_take_turns(sweep):
    """A compiled sweep cut short by gpu-check's limit (minutes of compiling a variant) must
    keep every row's baseline and the head of every row's SWEEP, where the not-yet-measured
    variants stand, not one row's whole SWEEP and nothing of the next."""
    rows = ["torch-graphs", "torch-optimized"]
    names = [e.name.split(" [")[0] for e in sweep.entries(rows, steps="compiled")]
    graphs = [v for v in sweep.module("torch-graphs").SWEEP
              if sweep.picked("torch-graphs", v, "compiled")]
    optimized = [v for v in sweep.module("torch-optimized").SWEEP
                 if sweep.picked("torch-optimized", v, "compiled")]
    n = min(len(graphs), len(optimized)) - 1  # besides each default
    assert names[:2] == rows
    assert names[2:2 + 2 * n] == rows * n
    assert names[2 + 2 * n:] == ["torch-graphs"] * (len(graphs) - len(optimized))
    entries = sweep.entries(rows, steps="compiled")
    assert [e.variant for e in entries if e.name.startswith("torch-graphs")][1:] == [
        v for v in graphs if v != sweep.module("torch-graphs").DEFAULT]  # each in SWEEP order


@pytest.mark.parametrize("argv", [["--rows", "cuda-epoch"], ["--rows", ","],
                                  ["--epochs", "0"]])
def test_bad_arguments_exit_2_naming_them(sweep, argv, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_the_gpu_check_step_runs_the_sweep(tmp_path, sweep):
    steps = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}
    step = steps["variant-sweep"]
    assert step.argv[1] == "benchmarks/variant_sweep.py" and step.needs_gpu
    assert step.outputs == ["results/2026-01-01-some-gpu-variant-sweep.json"]
    assert step.argv[step.argv.index("--steps") + 1] == "eager"
    compiled = steps["compiled-sweep"]  # minutes of compiling: apart, and last
    assert list(steps)[-2:] == ["compiled-tests", "compiled-sweep"] and compiled.needs_gpu
    tests = steps["gpu-tests"].argv  # the compiled variants' GPU tests in their own step
    ignored = tests[tests.index("--ignore") + 1]
    assert ignored in steps["compiled-tests"].argv and steps["compiled-tests"].needs_gpu
    argv = compiled.argv
    assert argv[argv.index("--steps") + 1] == "compiled"
    assert argv[argv.index("--rows") + 1] == "torch-graphs,torch-optimized"


def test_steps_picks_the_compiled_variants_or_the_others(sweep):
    """--steps compiled: the torch.compile variants; --steps eager: every other; each with
    every row's default (its table's baseline); together, the whole SWEEP."""
    rows = ["triton-fused", "torch-graphs", "torch-optimized"]
    every = sweep.entries(rows)
    compiled = sweep.entries(rows, steps="compiled")
    eager = sweep.entries(rows, steps="eager")
    def is_compiled(e):
        return getattr(e.variant, "compiled", False)  # triton-fused's Variant has no such field

    def is_default(e):
        return e.variant == sweep.module(e.name.split(" [")[0]).DEFAULT

    assert all(is_compiled(e) or is_default(e) for e in compiled)
    assert all(not is_compiled(e) or is_default(e) for e in eager)
    assert {e.name for e in compiled} | {e.name for e in eager} == {e.name for e in every}
    assert sum(map(is_default, eager)) == sum(map(is_default, compiled)) == 3  # one a row
    # torch-graphs' (8, 2 with programmatic dependent launch, 3 lagged-fused), torch-optimized's
    assert sum(map(is_compiled, compiled)) == 8 + 2 + 3 + 5
    assert [e.name for e in compiled if e.name.startswith("triton-fused")] == [
        f"triton-fused [{sweep.module('triton-fused').DEFAULT.tag}]"]


def test_an_unwritable_json_is_refused_before_any_gpu_time(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(["--json", str(tmp_path / "no-such-folder" / "r.json")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err


def test_variant_picks_only_the_tags_given(sweep):
    tags = {"32, 8w, ieee", "cublas, Wᵀ storage"}
    entries = sweep.entries(["triton-fused", "torch-graphs"], tags)
    assert [e.name for e in entries] == ["triton-fused [32, 8w, ieee]",
                                         "torch-graphs [cublas, Wᵀ storage]"]


def test_an_unknown_variant_is_refused_naming_the_known_ones(sweep, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(["--rows", "torch-graphs", "--variant", "64, 8w, ieee"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--variant 64, 8w, ieee" in err and "cublas, W storage" in err


def test_after_a_device_fault_the_rest_run_in_a_fresh_process(sweep, monkeypatch):
    """The rows the faulted process could not run are swept again by a child given their tags
    (and this run's settings), read back from its JSON; a child that writes none fails them."""
    import argparse
    import json
    import subprocess

    todo = sweep.entries(["triton-fused"])[:2]
    args = argparse.Namespace(data="synthetic", epochs=3)
    seen = []

    class Child:  # subprocess.Popen: writes the rows its --json names
        def __init__(self, argv, **kw):
            seen.append(argv)
            self.returncode = 0
            out = argv[argv.index("--json") + 1]
            with open(out, "w") as f:
                json.dump({"rows": [{"impl": e.name, "status": "ok"} for e in todo]}, f)

        def wait(self):
            return self.returncode

    class Failing(Child):  # exits 1 and writes nothing
        def __init__(self, argv, **kw):
            self.returncode = 1

    monkeypatch.setattr(subprocess, "Popen", Child)
    rows = sweep.fresh_process(todo, ["triton-fused"], args)
    assert [r["impl"] for r in rows] == [e.name for e in todo]
    argv = seen[0]
    assert argv[1].endswith("variant_sweep.py")
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--variant"] == \
        [e.variant.tag for e in todo]
    assert argv[argv.index("--epochs") + 1] == "3" and argv[argv.index("--data") + 1] == "synthetic"

    monkeypatch.setattr(subprocess, "Popen", Failing)
    rows = sweep.fresh_process(todo, ["triton-fused"], args)
    assert [r["status"] for r in rows] == ["failed"] * 2
    assert all("exited with 1" in r["reason"] for r in rows)


def test_the_json_is_rewritten_after_each_variant_and_a_faulted_process_hands_on_the_rest(
        sweep, monkeypatch, tmp_path):
    """A sweep cut short by its caller's time limit keeps what it finished: the JSON holds every
    variant done so far after each one; once a variant leaves the device faulted, the rest run in
    one fresh process (here: faked, as are the GPU, the data and each variant's run)."""
    import json

    import torch

    from fasttrain import bench, data, ladder, report

    chosen = sweep.entries(["triton-fused"])[:4]
    names = [e.name for e in chosen]
    out = tmp_path / "sweep.json"
    seen, handed = [], []

    def run_rows(todo, *a, **kw):
        assert len(todo) == 1  # one variant a call
        seen.append(json.loads(out.read_text())["rows"] if out.exists() else [])
        return [{"impl": todo[0].name, "status": "ok", "epoch_ms": 1.0}]

    def fresh(todo, rows, args):
        handed.extend(e.name for e in todo)
        return [{"impl": e.name, "status": "ok", "epoch_ms": 2.0} for e in todo]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sweep, "env_block", lambda: {})
    monkeypatch.setattr(sweep, "hardware_line", lambda env: "a faked GPU")
    monkeypatch.setattr(report, "bench_table", lambda result, baseline: "")  # a faked env
    monkeypatch.setattr(data, "load_dataset", lambda *a, **kw: tiny_images(n_train=64))
    monkeypatch.setattr(ladder, "make_ladder_data", lambda ds, cfg: None)
    monkeypatch.setattr(sweep, "entries", lambda *a, **kw: chosen)
    monkeypatch.setattr(bench, "run_rows", run_rows)
    monkeypatch.setattr(bench, "device_usable", lambda device: len(seen) < 2)
    monkeypatch.setattr(sweep, "fresh_process", fresh)
    assert sweep.main(["--rows", "triton-fused", "--json", str(out)]) == 0
    assert [len(rows) for rows in seen] == [0, 1]  # the first variant on disk before the second
    assert handed == names[2:]
    assert [r["impl"] for r in json.loads(out.read_text())["rows"]] == names


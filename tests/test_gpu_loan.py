"""scripts/gpu-loan without a GPU: its rules on the real files of the H200's run 10 (the
candidates' JUnit XML and times, the compiled sweep's JSON) and on edits of them, its careful
source edit, its dry run's calls, and the whole loan over a copy of the tree with gpu-check
replaced by one that writes run 10's files."""

import copy
import importlib.machinery
import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import import_benchmark
from tests.test_gpu_check import load_script as load_gpu_check

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RUN10 = RESULTS / "gpu-calls-2026-11-28-h200-run10"
CANDIDATES = RESULTS / "2026-11-28-nvidia-h200-run10-v7-candidates.json"
SWEEP = RESULTS / "2026-11-28-nvidia-h200-run10-compiled-sweep.json"
BENCH = RESULTS / "2026-11-28-nvidia-h200-bench-v7k-one-launch"
RUN10_ROW, RUN10_CANDIDATES = "f", ("g", "h", "i", "j", "k", "m")  # then


def load_loan():
    loader = importlib.machinery.SourceFileLoader("gpu_loan", str(ROOT / "scripts" / "gpu-loan"))
    spec = importlib.util.spec_from_loader("gpu_loan", loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_loan"] = module  # dataclasses look their module up while it loads
    loader.exec_module(module)
    return module


loan = load_loan()
rules = loan.rules


def run10_sweep() -> dict:
    """Run 10's sweep JSON as variant_sweep.py writes it now: with config.variants, made by its
    own function from the entries of that sweep's labels."""
    sweep = import_benchmark("variant_sweep")
    doc = json.loads(SWEEP.read_text())
    labels = {r["impl"] for r in doc["rows"]}
    every = sweep.entries(["torch-graphs", "torch-optimized"])
    doc["config"]["variants"] = sweep.variant_args([e for e in every if e.name in labels])
    return doc


# -- v7 ------------------------------------------------------------------------------------------


def v7_run10(xml_text=None, times=None):
    verdicts = rules.v7_verdicts(xml_text or (RUN10 / "pytest-v7.xml").read_text())
    times = times or rules.v7_times(json.loads(CANDIDATES.read_text()))
    return rules.pick_v7(RUN10_ROW, RUN10_CANDIDATES, verdicts, times)


def test_run10s_v7_choice_is_k_since_j_failed_its_fault_test():
    """Run 10's own decision (pick.py's): j was fastest (1.655) but failed a test; k (1.679)
    beats f (1.742)."""
    verdicts = rules.v7_verdicts((RUN10 / "pytest-v7.xml").read_text())
    assert verdicts == {"g": "passed", "h": "passed", "i": "passed", "j": "failed",
                        "k": "passed", "m": "passed"}  # no "s" from test_v7s_phases_...
    choice = v7_run10()
    assert (choice.current, choice.chosen) == ("f", "k")
    assert "1.679" in choice.why and "1.742" in choice.why and "'j'" in choice.why
    assert choice.figures["row_ms"] == pytest.approx(1.74176, abs=1e-5)


def test_a_candidate_with_a_failed_or_errored_test_is_never_chosen():
    xml = (RUN10 / "pytest-v7.xml").read_text()
    # k's float64 test at 64 rows errors as well: then the fastest that passed is h (1.690)
    bad = xml.replace('name="test_v7_matches_float64_reference[64-v7k-one-launch]" time="0.007" />',
                      'name="test_v7_matches_float64_reference[64-v7k-one-launch]" time="0.007">'
                      '<error message="boom" /></testcase>')
    assert bad != xml
    assert v7_run10(bad).chosen == "h"


def test_a_candidate_slower_than_the_row_or_tied_with_it_is_not_chosen():
    times = rules.v7_times(json.loads(CANDIDATES.read_text()))
    assert rules.pick_v7("j", ("h", "k", "m"), {v: "passed" for v in "hkm"}, times).chosen is None
    tied = {**times, "f": times["k"]}
    choice = v7_run10(times=tied)
    assert choice.chosen is None and "does not beat" in choice.why


def test_tied_candidates_go_to_the_first_letter():
    times = {"f": 2.0, "h": 1.5, "m": 1.5, "k": 1.6}
    assert rules.pick_v7("f", ("m", "k", "h"), {v: "passed" for v in "hkm"}, times).chosen == "h"


def test_a_candidate_without_tests_or_time_is_not_chosen():
    times = {"f": 2.0, "h": 1.5, "k": "CUDA error: too many resources", "m": 1.9}
    choice = rules.pick_v7("f", ("h", "k", "m"), {"k": "passed", "m": "passed"}, times)
    assert choice.chosen == "m" and "no tests: ['h']" in choice.why


@pytest.mark.parametrize("verdicts, times, said", [
    ({"k": "passed"}, None, "no v7-candidates JSON"),
    (None, {"f": 2.0, "k": 1.0}, "did not run to its end"),
    ({"k": "passed"}, {"k": 1.0}, "the row's own time is missing"),
])
def test_without_data_v7_stays(verdicts, times, said):
    choice = rules.pick_v7("f", ("k",), verdicts, times)
    assert choice.chosen is None and said in choice.why and choice.why.startswith("v7: ")


@pytest.mark.parametrize("outcome, complete", [
    ({"status": "ok", "exit_code": 0}, True), ({"status": "failed", "exit_code": 1}, True),
    ({"status": "timed out", "exit_code": None}, False), ({"status": "failed", "exit_code": 2},
                                                          False), (None, False)])
def test_only_a_pytest_that_ran_to_its_end_gives_verdicts(outcome, complete):
    assert rules.tests_complete(outcome) is complete


def test_the_step_outcome_is_read_from_gpu_checks_summary(tmp_path):
    summary = tmp_path / "summary.json"
    assert rules.step_outcome(summary, "v7-tests") is None  # gpu-check was stopped
    summary.write_text(json.dumps({"schema": "fasttrain.gpu-check/1", "steps": [
        {"name": "v7-tests", "status": "failed", "seconds": 124.0, "exit_code": 1}]}))
    assert rules.step_outcome(summary, "v7-tests")["exit_code"] == 1


def test_v7_inputs_read_a_gpu_check_folder_and_refuse_a_cut_test_step(tmp_path):
    (tmp_path / "results").mkdir()
    shutil.copy(RUN10 / "pytest-v7.xml", tmp_path)
    shutil.copy(CANDIDATES, tmp_path / "results" / "2026-01-01-gpu-v7-candidates.json")
    step = {"name": "v7-tests", "status": "failed", "seconds": 124.0, "exit_code": 1}
    (tmp_path / "summary.json").write_text(json.dumps({"steps": [step]}))
    verdicts, times = loan.v7_inputs(tmp_path)
    assert verdicts["j"] == "failed" and times["k"] == pytest.approx(1.679, abs=1e-3)
    (tmp_path / "summary.json").write_text(json.dumps({"steps": [
        {**step, "status": "timed out", "exit_code": None}]}))
    assert loan.v7_inputs(tmp_path)[0] is None


# -- the compiled sweep --------------------------------------------------------------------------


def test_run10s_sweep_makes_each_rows_fastest_its_default_with_its_arguments():
    sweep = run10_sweep()
    graphs = rules.pick_default("torch-graphs", sweep)
    assert graphs.current == "torch-graphs [cublas, Wᵀ storage]"
    assert graphs.chosen == "torch-graphs [cublas, W storage, inductor bcast autotuned]"
    assert graphs.args == {"step": "bcast", "autotune": True}
    assert graphs.figures["gain"] == pytest.approx(1 - 4.92596 / 9.56370, abs=1e-4)
    optimized = rules.pick_default("torch-optimized", sweep)
    assert optimized.chosen == "torch-optimized [reduce-overhead, 7 steps a call]"
    assert rules.variant_expr(optimized.args) == "Variant(k=7)"


def test_a_variant_that_failed_its_check_or_its_run_is_not_chosen():
    sweep = run10_sweep()
    for r in sweep["rows"]:
        if r["impl"].endswith("inductor bcast autotuned]"):
            r["check"]["ok"] = False
        if r["impl"].endswith("[reduce-overhead, 7 steps a call]"):
            r["status"], r["epoch_ms"] = "failed", None
    assert rules.pick_default("torch-graphs", sweep).args == {"step": "bcast"}
    assert rules.pick_default("torch-optimized", sweep).args == {"k": 67}


def sweep_of(times: dict, default: str, row="torch-graphs") -> dict:
    doc = copy.deepcopy(run10_sweep())
    template = doc["rows"][0]
    doc["config"]["defaults"][row] = f"{row} [{default}]"
    doc["config"]["variants"] = {f"{row} [{t}]": {"row": row, "args": {"step": t}} for t in times}
    doc["rows"] = [{**template, "impl": f"{row} [{t}]", "epoch_ms": ms} for t, ms in times.items()]
    return doc


def triton_sweep() -> dict:
    """A triton-sweep JSON in variant_sweep.py's form: the DEFAULT and the 3 PDL variants, one
    of which beats it by 12 %, one failed its float64 check (faster still: never chosen)."""
    sweep = import_benchmark("variant_sweep")
    from fasttrain.ladder import triton_fused as tf

    entries = sweep.entries(["triton-fused"])[:4]
    times = dict(zip([e.name for e in entries], (3.77, 3.60, 3.31, 3.50), strict=True))
    bad = entries[1].name  # [32, 8w, ieee, pdl]: fastest, but wrong
    times[bad] = 2.0
    return {"schema": "fasttrain.bench/1",
            "config": {"defaults": {"triton-fused": f"triton-fused [{tf.DEFAULT.tag}]"},
                       "variants": sweep.variant_args(entries)},
            "rows": [{"impl": e.name, "status": "ok", "check": {"ok": e.name != bad},
                      "epoch_ms": times[e.name]} for e in entries]}


def test_the_triton_sweep_rule_picks_the_fastest_pdl_variant_that_passed():
    choice = rules.pick_default("triton-fused", triton_sweep())
    assert choice.chosen == "triton-fused [32, 4w, ieee, pdl]", choice.why
    assert rules.variant_expr(choice.args) == "Variant(block_k=32, num_warps=4, pdl=True)"
    assert "32, 8w, ieee, pdl" in choice.figures["not_ok"]


@pytest.mark.parametrize("best_ms, chosen", [(9.9, False), (9.81, False), (9.75, True)])
def test_the_sweeps_winner_must_beat_the_default_by_2_percent(best_ms, chosen):
    choice = rules.pick_default("torch-graphs", sweep_of({"mm": 10.0, "bcast": best_ms}, "mm"))
    assert (choice.chosen is not None) is chosen, choice.why
    assert ("within 2%" in choice.why) is not chosen


def test_a_tie_keeps_the_default():
    choice = rules.pick_default("torch-graphs", sweep_of({"mm": 10.0, "bcast": 10.0}, "mm"))
    assert choice.chosen is None and "it is the fastest" in choice.why


@pytest.mark.parametrize("cut, said", [
    (lambda d: d["rows"].clear(), "no variant of the row"),
    (lambda d: d["rows"].pop(0), "the DEFAULT has no time"),  # the default was first
    (lambda d: d["config"].pop("variants"), "lacks its Variant's arguments"),
    (lambda d: d.clear(), "no variant of the row")])
def test_without_data_the_default_stays(cut, said):
    doc = sweep_of({"mm": 10.0, "bcast": 5.0}, "mm")
    cut(doc)
    choice = rules.pick_default("torch-graphs", doc)
    assert choice.chosen is None and said in choice.why


def test_the_sweeps_json_carries_each_variants_arguments():
    """variant_sweep.py's config.variants rebuilds every swept Variant, and variant_expr
    writes it as source that makes the same Variant."""
    sweep = import_benchmark("variant_sweep")
    for row in ("torch-graphs", "torch-optimized", "triton-fused"):
        module = sweep.module(row)
        entries = sweep.entries([row])
        found = sweep.variant_args(entries)
        assert set(found) == {e.name for e in entries}
        for e in entries:
            args = found[e.name]["args"]
            assert found[e.name]["row"] == row and module.Variant(**args) == e.variant
            assert eval(rules.variant_expr(args), {"Variant": module.Variant}) == e.variant
    assert rules.variant_expr({"step": "bcast", "autotune": True}) == \
        'Variant(step="bcast", autotune=True)'


# -- the source edit ---------------------------------------------------------------------------


CUDA_EPOCH = (ROOT / "src/fasttrain/ladder/cuda_epoch.py").read_text()


def test_the_edit_changes_one_line_and_is_idempotent():
    new = rules.edit_assignment(CUDA_EPOCH, "V7_VARIANT", '"n"', comment="v7n: 1.6 ms")
    changed = [(a, b) for a, b in zip(CUDA_EPOCH.splitlines(), new.splitlines(), strict=True)
               if a != b]
    assert changed == [(changed[0][0], 'V7_VARIANT = "n"  # v7n: 1.6 ms')]
    assert changed[0][0].startswith('V7_VARIANT = "k"  # ')
    assert rules.edit_assignment(new, "V7_VARIANT", '"n"', comment="v7n: 1.6 ms") == new
    kept = rules.edit_assignment(CUDA_EPOCH, "V7_VARIANT", '"n"')  # its comment stays
    assert 'V7_VARIANT = "n"  # version 7\'s' in kept
    graphs = (ROOT / "src/fasttrain/ladder/torch_graphs.py").read_text()
    out = rules.edit_assignment(graphs, "DEFAULT", 'Variant(step="bcast", autotune=True)')
    assert 'DEFAULT = Variant(step="bcast", autotune=True)\n' in out
    assert len(out.splitlines()) == len(graphs.splitlines())


@pytest.mark.parametrize("text, said", [
    ('X = 1\nV7_VARIANT = "a"\nV7_VARIANT = "b"\n', "found 2"),
    ('X = 1\n', "found 0"),
    ('def f():\n    V7_VARIANT = "a"\n', "found 0"),  # only the module's own
    ('V7_VARIANT = (\n    "a")\n', "spans lines")])
def test_the_edit_refuses_unless_the_assignment_is_there_exactly_once(text, said):
    with pytest.raises(rules.EditError, match=said):
        rules.edit_assignment(text, "V7_VARIANT", '"n"', "x.py")


def test_the_edit_refuses_a_value_that_is_not_python():
    with pytest.raises(rules.EditError, match="not valid Python"):
        rules.edit_assignment('V7_VARIANT = "k"\n', "V7_VARIANT", '"n', "x.py")


def test_the_diff_applies_with_git_apply(tmp_path):
    path = "src/fasttrain/ladder/cuda_epoch.py"
    (tmp_path / path).parent.mkdir(parents=True)
    (tmp_path / path).write_text(CUDA_EPOCH)
    new = rules.edit_assignment(CUDA_EPOCH, "V7_VARIANT", '"n"', comment="v7n ...")
    diff = rules.unified_diff(CUDA_EPOCH, new, path)
    assert diff.startswith(f"--- a/{path}\n+++ b/{path}\n") and '+V7_VARIANT = "n"' in diff
    (tmp_path / "d.patch").write_text(diff)
    subprocess.run(["git", "apply", "d.patch"], cwd=tmp_path, check=True)
    assert (tmp_path / path).read_text() == new


# -- the dry run and the budget --------------------------------------------------------------


def test_the_dry_run_runs_gpu_check_with_real_steps_in_the_plans_order(tmp_path, capsys):
    assert loan.main([str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert not (tmp_path / "out").exists()  # nothing run, nothing written
    steps = {s.name for s in load_gpu_check().plan(tmp_path, "2026-01-01-gpu")}
    onlys = re.findall(r"scripts/gpu-check \S+ --only (\S+) --budget (\d+)", printed)
    assert [o for o, _ in onlys] == ["env,v7-tests,v7-candidates", "env,triton-sweep",
                                     "env,compiled-sweep", "env,bench"]  # compiled-tests: no
    # time left at worst
    assert all(set(o.split(",")) <= steps for o, _ in onlys)
    assert all(set(c.only.split(",")) <= steps for c in loan.calls(170, 240))
    budgets = [int(b) for _, b in onlys]
    assert sum(budgets) + len(budgets) * loan.OVERHEAD_S + loan.END_S <= loan.BUDGET_S
    assert budgets[3] + loan.OVERHEAD_S == loan.BENCH_S  # the bench keeps its share
    assert budgets[1] + loan.OVERHEAD_S == loan.TRITON_CAP_S


def test_each_share_leaves_the_later_calls_theirs():
    v7, triton, sweep, bench, tests = loan.calls(170, 240)
    assert loan.share(triton, 400) == loan.TRITON_CAP_S
    assert loan.share(v7, 570) == 240  # its cap
    assert loan.share(v7, 400) == 400 - 170 - loan.END_S
    assert loan.share(sweep, 420) == 420 - 170 - loan.END_S
    assert loan.share(sweep, 200) == 0  # under MIN_SHARE_S: the bench's time is kept
    assert loan.share(bench, 200) == 200 - loan.END_S
    assert loan.share(tests, 30) == 0


def test_bad_input_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FASTTRAIN_DATA", str(tmp_path))
    with pytest.raises(SystemExit) as e:
        loan.main([str(tmp_path / "out")])
    assert e.value.code == 2 and "holds no mnist/" in capsys.readouterr().err
    (tmp_path / "mnist").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "kept").write_text("x")
    with pytest.raises(SystemExit) as e:
        loan.main([str(tmp_path / "out")])
    assert e.value.code == 2 and "not an empty folder" in capsys.readouterr().err
    assert (tmp_path / "out" / "kept").read_text() == "x"


# -- the whole loan, gpu-check replaced by run 10's files ----------------------------------------


FAKE_MAIN = '''
def main(argv=None):
    """The test's gpu-check: writes run 10's files for the steps --only names (scenario in
    FAKE_SCENARIO), its summary.json as gpu-check would."""
    import shutil
    a = argparse.ArgumentParser()
    a.add_argument("outdir", type=Path)
    a.add_argument("--only")
    a.add_argument("--budget", type=float)
    args = a.parse_args(argv)
    src, scenario = Path(os.environ["FAKE_RUN10"]), os.environ["FAKE_SCENARIO"]
    (args.outdir / "results").mkdir(parents=True)
    tag, steps = "2026-01-01-nvidia-h200", []
    for name in args.only.split(","):
        exit_code = 0
        if name == "v7-tests":
            if scenario == "v7 cut":
                return 1  # stopped: no summary, no XML
            shutil.copy(src / "pytest-v7.xml", args.outdir)
            exit_code = 1
        elif name == "v7-candidates":
            shutil.copy(src / "v7.json", args.outdir / "results" / f"{tag}-v7-candidates.json")
        elif name == "triton-sweep":
            shutil.copy(src / "triton.json", args.outdir / "results" / f"{tag}-triton-sweep.json")
        elif name == "compiled-sweep":
            shutil.copy(src / "sweep.json", args.outdir / "results" / f"{tag}-compiled-sweep.json")
        elif name == "bench":
            # what the bench ran with: the edits must be in place before it
            from fasttrain.ladder import cuda_epoch, torch_graphs, triton_fused
            (args.outdir / "bench-saw.txt").write_text(
                f"{cuda_epoch.V7_VARIANT} {torch_graphs.DEFAULT} | {triton_fused.DEFAULT.tag}")
            shutil.copy(src / "bench.json", args.outdir / "results" / f"{tag}.json")
            shutil.copy(src / "bench.png", args.outdir / "results" / f"{tag}.png")
        steps.append({"name": name, "status": "ok" if exit_code == 0 else "failed",
                      "seconds": 1.0, "exit_code": exit_code, "reason": None})
    (args.outdir / "summary.json").write_text(json.dumps(
        {"schema": "fasttrain.gpu-check/1", "passed": False, "header": ["GPU: NVIDIA H200"],
         "steps": steps}))
    (args.outdir / "summary.md").write_text("# fake gpu-check\\n")
    return 0


'''


def make_tree(tmp_path: Path) -> Path:
    """A copy of src/, tests/ladder and scripts/ in run 10's state (row f, candidates g-m; the
    sweep's defaults then), gpu-check's main replaced by FAKE_MAIN."""
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "tests" / "ladder", root / "tests" / "ladder",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (root / "scripts").mkdir()
    for name in ("gpu-loan", "gpu_loan_rules.py", "gpu_check_figures.py"):
        shutil.copy(ROOT / "scripts" / name, root / "scripts")
    gc = (ROOT / "scripts" / "gpu-check").read_text()
    gc = rules.edit_assignment(gc, "V7_ROW", '"f"')
    gc = rules.edit_assignment(gc, "V7_CANDIDATES", repr(RUN10_CANDIDATES))
    gc = gc.replace('\nif __name__ == "__main__":', FAKE_MAIN + 'if __name__ == "__main__":')
    (root / "scripts" / "gpu-check").write_text(gc)
    ce = root / "src/fasttrain/ladder/cuda_epoch.py"
    test = root / "tests/ladder/test_cuda_epoch.py"
    assert test.read_text().count('ce.V7_VARIANT == "k"') == 1
    test.write_text(test.read_text().replace('ce.V7_VARIANT == "k"', 'ce.V7_VARIANT == "f"'))
    ce.write_text(rules.edit_assignment(ce.read_text(), "V7_VARIANT", '"f"'))
    tg = root / "src/fasttrain/ladder/torch_graphs.py"
    tg.write_text(rules.edit_assignment(tg.read_text(), "DEFAULT", 'Variant(transposed=True)'))
    data = tmp_path / "run10"
    data.mkdir()
    shutil.copy(RUN10 / "pytest-v7.xml", data)
    shutil.copy(CANDIDATES, data / "v7.json")
    (data / "sweep.json").write_text(json.dumps(run10_sweep()))
    (data / "triton.json").write_text(json.dumps(triton_sweep()))
    shutil.copy(BENCH.with_suffix(".json"), data / "bench.json")
    shutil.copy(BENCH.with_suffix(".png"), data / "bench.png")
    return root


def run_loan(tmp_path, root, scenario):
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    env = {"PATH": "/usr/bin:/bin", "FASTTRAIN_DATA": str(tmp_path / "data"),
           "FAKE_RUN10": str(tmp_path / "run10"), "FAKE_SCENARIO": scenario}
    argv = [sys.executable, str(root / "scripts" / "gpu-loan"), str(tmp_path / "out"),
            "--work", str(tmp_path / "work"), "--budget", "600"]
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads((tmp_path / "out" / "decisions.json").read_text())


@pytest.mark.slow
def test_the_whole_loan_edits_before_the_bench_and_writes_it_all_down(tmp_path):
    root = make_tree(tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)  # the index: the tree before
    doc = run_loan(tmp_path, root, "all")
    assert doc["schema"] == "fasttrain.gpu-loan/1" and doc["gpu"] == "NVIDIA H200"
    assert [c["name"] for c in doc["calls"]] == ["v7", "triton", "sweep", "bench",
                                                 "compiled-tests"]
    chosen = {d["rule"]: (d["chosen"], d["applied"]) for d in doc["decisions"]}
    assert chosen == {"v7": ("k", True),
                      "triton-fused": ("triton-fused [32, 4w, ieee, pdl]", True),
                      "torch-graphs": ("torch-graphs [cublas, W storage, inductor bcast "
                                       "autotuned]", True),
                      "torch-optimized": ("torch-optimized [reduce-overhead, 7 steps a call]",
                                          True)}
    saw = (tmp_path / "work" / "gc4-bench" / "bench-saw.txt").read_text()
    assert saw.startswith("k BLAS cublas, weight stored [10, 785], torch.compile bcast step, "
                          "mode max-autotune-no-cudagraphs")
    assert saw.endswith("| 32, 4w, ieee, pdl")
    diff = doc["diff"]
    assert '-V7_VARIANT = "f"' in diff and '+V7_VARIANT = "k"  # v7k in one launch' in diff
    assert '+V7_ROW = "k"' in diff and '+DEFAULT = Variant(step="bcast", autotune=True)' in diff
    assert '+DEFAULT = Variant(block_k=32, num_warps=4, pdl=True)' in diff
    assert "torch_optimized.py" not in diff  # k = 7 was its DEFAULT already: no change
    edited = {p: (root / p).read_text() for p in doc["base_sha256"]}
    subprocess.run(["git", "checkout", "--", "."], cwd=root, check=True)
    subprocess.run(["git", "apply", "-"], cwd=root, input=diff, text=True, check=True)
    assert {p: (root / p).read_text() for p in edited} == edited
    names = [f for f in doc["followups"] if f.startswith("tests/")]
    assert names and all(n.startswith(("tests/ladder/test_cuda_epoch.py:",
                                       "tests/ladder/test_triton_fused.py:")) for n in names)
    assert "V7_VARIANT" in names[0] and "V7_VARIANTS" not in names[0]
    out = sorted(p.name for p in (tmp_path / "out").iterdir())
    assert out == sorted(["loan.log", "decisions.json", "summary.md", "loan.tar.gz",
                          "2026-01-01-nvidia-h200-v7-candidates.json",
                          "2026-01-01-nvidia-h200-compiled-sweep.json",
                          "2026-01-01-nvidia-h200.json", "2026-01-01-nvidia-h200.png"])
    log = (tmp_path / "out" / "loan.log").read_text()
    assert "v7: V7_VARIANT 'f' -> 'k'" in log and "torch-optimized: DEFAULT [eager v4] ->" in log


@pytest.mark.slow
def test_a_cut_v7_call_changes_nothing_and_the_bench_still_runs(tmp_path):
    root = make_tree(tmp_path)
    doc = run_loan(tmp_path, root, "v7 cut")
    v7 = next(d for d in doc["decisions"] if d["rule"] == "v7")
    assert v7["chosen"] is None and "no v7-candidates JSON" in v7["why"]
    assert doc["calls"][0]["status"] == "failed" and doc["calls"][3]["status"] == "ok"
    assert (tmp_path / "work" / "gc4-bench" / "bench-saw.txt").read_text().startswith("f ")
    assert '"f"' in (root / "scripts" / "gpu-check").read_text().split("V7_ROW = ")[1][:4]


@pytest.mark.slow
def test_without_a_gpu_the_real_gpu_check_runs_five_times_and_nothing_changes(tmp_path):
    """--allow-cpu over a copy of the tree with the real gpu-check: its CLI takes each call,
    every GPU step is skipped, so each rule has no data, says so and edits nothing."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the loan would measure for real")
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "src", root / "src", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(ROOT / "scripts", root / "scripts",
                    ignore=shutil.ignore_patterns("__pycache__"))
    def sources():
        return {p: p.read_text() for p in [*root.rglob("*.py"), root / "scripts" / "gpu-check"]}

    before = sources()
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    done = subprocess.run([sys.executable, str(root / "scripts" / "gpu-loan"),
                           str(tmp_path / "out"), "--work", str(tmp_path / "work"),
                           "--allow-cpu"], cwd=root, capture_output=True, text=True, timeout=600,
                          env={"PATH": "/usr/bin:/bin", "FASTTRAIN_DATA": str(tmp_path / "data")})
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "out" / "decisions.json").read_text())
    assert [(c["name"], c["status"]) for c in doc["calls"]] == [
        ("v7", "ok"), ("triton", "ok"), ("sweep", "ok"), ("bench", "ok"),
        ("compiled-tests", "ok")]
    assert [d["chosen"] for d in doc["decisions"]] == [None] * 4 and doc["diff"] == ""
    assert all("skipped" in d["why"] for d in doc["decisions"])
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "decisions.json", "loan.log", "loan.tar.gz", "summary.md"]
    assert sources() == before

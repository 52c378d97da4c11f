"""A user's own model (tests/engine/userblocks.py, not gpt) under --tp and --pp, brought as
docs/distributed.md says: its parallelize(tp_mesh) and pipeline_split(n). Trained by 2 and 4
gloo processes as one process trains it (tolerances as test_tensor_parallel.py's), and a split
that renames the model's parameters refused in one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from fasttrain.engine import pipeline
from fasttrain.errors import UserError
from tests.engine import userblocks
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import assert_same_run, records, torchrun, train_here

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--model", "tests.engine.userblocks:make", "--data", "tests.engine.userblocks:data",
        "--batch-size", "32", "--optimizer", "sgd", "--lr", "0.1", "--momentum", "0.9",
        "--seed", "1", "--deterministic", "--device", "cpu", "--no-progress", "--log-every", "1"]


@pytest.fixture(scope="module")
def one(tmp_path_factory) -> Path:
    """One process's 6 steps, the reference of every layout here: trained once, in pytest's
    process (test_tensor_parallel.train_here)."""
    out = tmp_path_factory.mktemp("user-one")
    proc = train_here(out, "--max-steps", "6", args=ARGS)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def test_a_split_that_renames_the_models_parameters_is_one_line():
    """nn.Sequential slices name both stages' blocks "1.up.weight": tied by name, their
    gradients would be summed over the pipeline and their checkpoint shards overwrite each
    other. Refused before any collective."""
    with pytest.raises(UserError, match=r"stage 0 of SeqSplit.pipeline_split\(2\) holds the "
                                        r"model's 'inp.weight' as '0.weight'"):
        pipeline.split(userblocks.seq_split(), 0, 2)


def test_a_split_that_keeps_the_models_names_holds_them_once():
    model = userblocks.make()
    held = [set(pipeline.Held(pipeline.split(model, r, 2)).state_dict()) for r in (0, 1)]
    assert held[0] | held[1] == set(model.state_dict()) and not held[0] & held[1]


LAYOUTS = {"tp2": (2, ["--tp", "2"]), "pp2": (2, ["--pp", "2"]),  # name: (processes, flags)
           "pp2-tp2": (4, ["--pp", "2", "--tp", "2"])}
UNEVEN = ("error: --tp 2: blocks.0.up (nn.Linear, out_features 63) does not split evenly "
          "over 2 ranks")
DATA_1025 = ["--data", "tests.engine.userblocks:data_1025", "--max-steps", "2"]


# This module's runs under torchrun, in the session's shared launches (launch.Part), the
# refusal last.
PARTS = {2: Part(__name__, 2, ARGS), 4: Part(__name__, 4, ARGS)}
for _name, (_procs, _flags) in LAYOUTS.items():
    PARTS[_procs].add(_name, "--max-steps", "6", *_flags)
PARTS[2].add("pp2-first", "--max-steps", "3", "--checkpoint-every", "3", "--pp", "2", out="run")
PARTS[2].add("tp2-resumed", "--max-steps", "6", "--resume", "auto", "--tp", "2", out="run")
PARTS[2].add("uneven", "--max-steps", "1", "--tp", "2", "--model",
             "tests.engine.userblocks:uneven", refused=True)
PARTS[4].add("pp2-fsdp2-1025", *DATA_1025, "--pp", "2", "--parallel", "fsdp")


@pytest.fixture(scope="module")
def launches(shared) -> dict[int, Part]:
    """{processes: this module's part of the session's launch of that many}."""
    return {procs: part.bound(shared) for procs, part in PARTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", LAYOUTS)
def test_a_users_model_trains_under_tp_and_pp_as_one_process(launches, one, name):
    launch = launches[LAYOUTS[name][0]]
    launch(name).ok()
    assert_same_run(one, launch.root / name)


@pytest.mark.slow
def test_a_users_pp_checkpoint_resumes_under_tp(launches, one):
    """DCP reshards: the pipeline's stage shards, under the model's names, are read by a --tp 2
    layout that continues as the uninterrupted one-process run."""
    launches[2]("pp2-first").ok()
    second = launches[2]("tp2-resumed").ok()
    assert "step-00000003" in second.stdouts[0], second.log
    assert_same_run(one, launches[2].root / "run")


def test_a_tp_plan_key_that_names_no_module_is_one_line():
    """torch's parallelize_module only warns and skips such a key: the layer stayed whole on
    every rank and the run trained, not split as asked."""
    from fasttrain.engine.tensor_parallel import check_plan

    model = userblocks.make()
    check_plan(model, {"blocks.*.up": "col", "blocks.0.down": "row", "": "root"})
    with pytest.raises(UserError, match=r"tp_plan key 'blocks.0.upp' names no submodule of "
                                        r"ResMLP"):
        check_plan(model, {"blocks.*.up": "col", "blocks.0.upp": "col"})


PLAN_SCRIPT = """
import sys
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
import fasttrain
from tests.engine import userblocks

plan = {"blocks.*.up": ColwiseParallel(), "blocks.*.%s": RowwiseParallel()}
run = fasttrain.build(model=userblocks.make(), data=userblocks.data(), tp=2, tp_plan=plan,
                      batch_size=32, max_steps=2, device="cpu", progress=False)
fasttrain.fit(run)
if run.main:  # one line: two ranks' prints would interleave
    print("trained", type(run.model.blocks[0].down.weight).__name__, flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("down, says", [("down", "trained DTensor"),
                                        ("dwn", "tp_plan key 'blocks.*.dwn' names no")])
def test_build_tp_plan_splits_a_users_model_or_refuses_a_wrong_name(tmp_path, down, says):
    script = tmp_path / "plan.py"
    script.write_text(PLAN_SCRIPT % down)
    proc = subprocess.run([*torchrun(2), str(script)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(ROOT / "src"), str(ROOT)])})
    assert says in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (proc.returncode == 0) == (down == "down")


@pytest.mark.slow
def test_a_linear_that_does_not_split_evenly_is_one_line_on_every_rank(launches):
    """Not a failure inside DTensor's sharding propagation at the first forward."""
    stderr = "".join(launches[2]("uneven").stderrs)
    assert stderr.count(UNEVEN) == 2 and "Sharding propagation" not in stderr, stderr


def test_a_split_that_leaves_a_block_over_is_one_line():
    """4 blocks dealt 1 a stage over 3 stages: block 3 ran nowhere, trained nothing and was
    missing from the weights file, silently."""
    with pytest.raises(UserError, match=r"no stage of ResMLP.pipeline_split\(3\) holds "
                                        r"'blocks.3.norm.weight' \(and 5 more\)"):
        pipeline.split(userblocks.make(), 0, 3)


@pytest.mark.slow
def test_pipelines_over_fsdp_evaluate_shares_of_unequal_batch_shapes(tmp_path, launches):
    """A new batch shape makes a stage infer shapes with a forward, which FSDP all-gathers
    over dp: a rank that met one shape more than its peer hung in evaluation. Now the same
    evaluation as one process (in pytest's process: test_tensor_parallel.train_here)."""
    one = train_here(tmp_path / "one", *DATA_1025, args=ARGS)
    launches[4]("pp2-fsdp2-1025").ok()
    evals = [[r["test_loss"] for r in records(d) if r["kind"] == "eval"]
             for d in (tmp_path / "one", launches[4].root / "pp2-fsdp2-1025")]
    assert one.returncode == 0 and evals[1] == pytest.approx(evals[0], rel=1e-5)

"""Pipeline parallelism (engine/pipeline.py): gpt cut into stages, 2 processes under torchrun
(gloo, CPU) against one process training the whole model through loop.accumulate.

The processes run tests/engine/pipeline_driver.py, which builds the stages with the pipeline
module directly (no engine build, config or mesh). fp32, deterministic algorithms, SGD with
momentum: after one step the weights agree to ~1e-8 and after 20 to ~1e-7 (measured here,
torch 2.13); the tests allow 1e-5. Batch 16 per step (2 accumulation micro-batches of 8),
4 pipeline micro-batches of 4.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from fasttrain.engine import pipeline
from fasttrain.errors import UserError
from fasttrain.models.gpt import GPT
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import ARGS, train_here
from tests.engine.textdata import NO_EVAL

ROOT = Path(__file__).resolve().parents[2]
DRIVER = ROOT / "tests" / "engine" / "pipeline_driver.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2"]
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


class Runs:
    """Each (layout, steps) trained once per session, on demand; {rank: what it saved}. The
    three schedules of one step count train in one torchrun launch (the driver runs them one
    after the other, each from the seed): two launches fewer, in the fast suite and the slow."""

    def __init__(self, root: Path):
        self.root, self.done = root, {}

    def __call__(self, schedule: str | None, steps: int) -> list[dict]:
        key = (schedule, steps)
        if key not in self.done:
            out = self.root / f"{'pp' if schedule else 'single'}-{steps}"
            cmd = ([sys.executable, str(DRIVER)] if schedule is None
                   else [*TORCHRUN, str(DRIVER), "--pp", "2", "--schedule", ",".join(SCHEDULES)])
            cmd += ["--steps", str(steps), "--out", str(out)]
            env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"}
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            if schedule is None:
                self.done[key] = [torch.load(out / "rank0.pt")]
            for name in SCHEDULES if schedule else ():
                self.done[name, steps] = [torch.load(out / name / f"rank{r}.pt")
                                          for r in range(2)]
        return self.done[key]


@pytest.fixture
def runs(pipeline_runs) -> Runs:
    return pipeline_runs  # conftest: one per session (test_pipeline_layouts uses its runs too)


def assert_matches_one_process(ranks: list[dict], one: dict) -> None:
    held = set()
    for saved in ranks:
        # The loss as the logger reads it: the ranks' sums over the number of ranks.
        assert saved["losses"] == pytest.approx(one["losses"], rel=1e-5, abs=1e-5)
        assert saved["eval"] == pytest.approx(one["eval"], rel=1e-5, abs=1e-5)
        for k, v in saved["state"].items():  # each stage's weights under the model's names
            torch.testing.assert_close(v, one["state"][k], rtol=1e-5, atol=1e-5, msg=k)
        held |= saved["state"].keys()
    assert held == one["state"].keys()  # together the ranks hold the whole model


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_one_step_of_each_schedule_equals_one_process(runs, schedule):
    assert_matches_one_process(runs(schedule, 1), runs(None, 1)[0])


@pytest.mark.slow
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_twenty_steps_of_each_schedule_equal_one_process(runs, schedule):
    one = runs(None, 20)[0]
    assert one["losses"][-1] < one["losses"][0] - 1.0  # it learned: the comparison means much
    assert_matches_one_process(runs(schedule, 20), one)


def test_each_rank_holds_half_the_parameters_and_optimizer_state(runs):
    """Exact bytes (tiny gpt: 4 blocks of 32 wide, 65 tokens; SGD momentum = one buffer per
    parameter): one process 213,888 + 213,888; pp=2 rank 0 (embeddings, blocks 0-1) 112,000 +
    112,000, rank 1 (blocks 2-3, final norm, head) 110,208 + 110,208. Together they hold one
    model plus the head's copy of the tied embedding (65 × 32 fp32 = 8,320 bytes, twice)."""
    one = runs(None, 1)[0]
    ranks = runs("1f1b", 1)
    tied = 65 * 32 * 4
    for key in ("param_bytes", "optimizer_bytes"):
        assert sum(r[key] for r in ranks) == one[key] + tied
        for r in ranks:
            assert r[key] <= 0.53 * one[key]


# -- in process: split points and checks --------------------------------------------------------


def tiny_gpt(n_layer: int = 4) -> GPT:
    torch.manual_seed(0)
    return GPT((8,), 11, n_layer=n_layer, n_head=2, n_embd=16)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_gpt_stages_in_sequence_are_the_model(n):
    model = tiny_gpt()
    x = torch.randint(11, (3, 8))
    out = x
    for stage in model.pipeline_split(n):
        out = stage(out)
    torch.testing.assert_close(out, model(x), rtol=0, atol=0)


def test_split_deals_stages_round_robin_with_the_models_names():
    model = tiny_gpt()
    names = set(model.state_dict())
    rank0 = pipeline.Held(pipeline.split(model, 0, 2, virtual=2))  # stages 0 and 2
    rank1 = pipeline.Held(pipeline.split(model, 1, 2, virtual=2))  # stages 1 and 3
    assert sorted(rank0.blocks) == ["0", "2"] and sorted(rank1.blocks) == ["1", "3"]
    assert set(rank0.state_dict()) | set(rank1.state_dict()) == names
    assert set(rank0.state_dict()) & set(rank1.state_dict()) == {"wte.weight"}  # tied copies
    torch.testing.assert_close(rank1.wte.weight, model.wte.weight, rtol=0, atol=0)


def test_more_stages_than_blocks_is_one_line():
    with pytest.raises(UserError, match="4 blocks and cannot be cut into 6"):
        pipeline.split(tiny_gpt(), 0, 3, virtual=2)


def test_two_stages_of_one_rank_holding_one_name_is_one_line():
    """build() asks this of every rank's stages before any collective, so all ranks refuse."""
    a, b = nn.Module(), nn.Module()
    a.add_module("head", nn.Linear(2, 2))
    b.add_module("head", nn.Linear(2, 2))
    with pytest.raises(UserError, match="two stages on one rank both hold a 'head'"):
        pipeline.Held([a, b])


def test_a_model_without_split_points_is_one_line():
    with pytest.raises(UserError, match="names no split points.*pipeline_split"):
        pipeline.split(nn.Sequential(nn.Linear(2, 2)), 0, 2)


class _Cfg:
    def __init__(self, pp: int, schedule: str, m: int):
        self.pp, self.pp_schedule, self.pp_microbatches = pp, schedule, m


def test_microbatches_default_to_twice_the_stages_and_must_divide_the_batch():
    assert pipeline.microbatches(_Cfg(2, "1f1b", 0), 16) == 4
    assert pipeline.microbatches(_Cfg(2, "gpipe", 3), 12) == 3
    with pytest.raises(UserError, match="must divide each pipeline's batch of 10"):
        pipeline.microbatches(_Cfg(2, "1f1b", 0), 10)
    with pytest.raises(UserError, match="multiple of --pp 2, not 3"):
        pipeline.microbatches(_Cfg(2, "interleaved-1f1b", 3), 12)


# -- end to end: fasttrain train --pp 2 ---------------------------------------------------------

# test_tensor_parallel's gpt run, 3 steps: conftest.one(3) is this run in one process.
TRAIN = [*ARGS, "--max-steps", "3"]
FP16 = {"pp": ["--pp", "2"], "fsdp": ["--parallel", "fsdp"], "tp": ["--tp", "2"]}
# The fp16 runs' data (NO_EVAL): TRAIN's samples without the test split (tests/engine/textdata),
# so they end without an evaluation, which their test does not read; fp16 is emulated on the CPU,
# where the evaluation after 4 steps was most of a run: one process's run took 15.8 s of CPU
# with it, 9.9 s without (2-core EPYC, load ~5, 2026-11-28), its losses, scale and skipped
# steps the same.
EVERY = ["--pp", "2", "--checkpoint-every", "2"]  # the resumed run's
LONG = ["--pp", "2", "--max-steps", "30", "--checkpoint-every", "10", "--log-every", "5"]
AT = 15  # the preempted run's stop: after the checkpoint of step 10, at a log step


def train(out: Path, *extra: str, procs: int = 1) -> subprocess.CompletedProcess:
    launcher = [*TORCHRUN[:-1], str(procs)] if procs > 1 else [sys.executable]
    return subprocess.run([*launcher, "-m", "fasttrain", "train", *TRAIN, "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})


# This module's 2-process `fasttrain train` runs, in the session's shared 2-process launch
# (launch.Part), in this order: the pp run, the fp16 runs, the run resumed from its checkpoint
# (its first half, then the resume, in one directory) and the uninterrupted one it is compared
# with, and the preempted test's uninterrupted run. They were eight launches of their own (the
# preempted run's stop and resume still are: they need torchrun's signal forwarding and a
# process of their own).
TWO = Part(__name__, 2, TRAIN)
TWO.add("pp", "--pp", "2", "--pp-schedule", "interleaved-1f1b")
for _name, _flags in FP16.items():
    TWO.add(f"fp16-{_name}", "--precision", "fp16", "--max-steps", "4", *NO_EVAL, *_flags)
TWO.add("full", *EVERY, "--max-steps", "4")
TWO.add("half", *EVERY, "--max-steps", "2")
TWO.add("half-resumed", *EVERY, "--max-steps", "4", "--resume", "auto", out="half")
TWO.add("long", *LONG)


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


def records(out: Path) -> list[dict]:
    import json

    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_fasttrain_train_pp_2_logs_evaluates_and_saves_as_one_process(two, one):
    """The engine's wiring: losses (logged from the last stage), evaluation (forward-only
    through the stages), gradient clipping (the norm over both stages) and the final weights
    file (both stages' tensors, under the model's names) equal one process's (TRAIN's 3 steps:
    conftest.one's run, shared with the other modules)."""
    from safetensors.torch import load_file

    two("pp").ok()
    reference = one(3)
    one, pp = records(reference), records(two.root / "pp")
    assert [r["step"] for r in one] == [r["step"] for r in pp]
    for a, b in zip(one, pp, strict=True):
        for key in ("loss", "test_loss", "test_token_accuracy"):
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-5, abs=1e-6), key
    assert pp[0]["param_bytes"] < 0.51 * one[0]["param_bytes"]  # rank 0's half
    w1, wp = (load_file(d / "weights.safetensors") for d in (reference, two.root / "pp"))
    assert w1.keys() == wp.keys()
    for k in w1:
        torch.testing.assert_close(wp[k], w1[k], rtol=1e-5, atol=1e-5, msg=k)


@pytest.mark.slow
def test_fp16_under_a_pipeline_fsdp_and_tp_tracks_one_process(tmp_path, two):
    """fp16 where each rank holds part of the gradients (engine/scaler.py): the found-inf flag
    is all-reduced, so every rank keeps the same scale and skips the same steps (a first stage
    never sees the loss, yet its scale must exist and move with the last stage's; tp's plain
    and DTensor gradients are unscaled together). The
    losses track one process's fp16 run (micro-batching and sharding change the rounding).
    The 2-process runs are in the shared launch."""
    # TRAIN's run with these flags, in pytest's process (test_tensor_parallel.train_here)
    proc = train_here(tmp_path / "one", "--precision", "fp16", "--max-steps", "4", *NO_EVAL)
    assert proc.returncode == 0, "one" + proc.stdout + proc.stderr
    for name in FP16:
        two(f"fp16-{name}").ok()

    def trained(out: Path) -> list[dict]:
        return [r for r in records(out) if r["kind"] == "train"]

    one = trained(tmp_path / "one")
    for name in FP16:
        got = trained(two.root / f"fp16-{name}")
        assert [r["step"] for r in got] == [r["step"] for r in one]
        for a, b in zip(one, got, strict=True):
            assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), name
            assert (b["loss_scale"], b["skipped_steps"]) == (a["loss_scale"],
                                                             a["skipped_steps"]), name
    assert one[-1]["loss"] < one[0]["loss"]


def test_pp_refuses_compile_before_torchrun_starts_anything(capsys):
    """At validation, one line, exit 2: before the launch check, so even outside torchrun, and
    inside it before any rank builds its stage."""
    from tests.conftest import assert_one_line_error, run_cli

    code, _, err = run_cli(capsys, "train", *TRAIN, "--pp", "2", "--compile")
    assert_one_line_error(code, err, "--pp runs each stage eagerly", "drop --compile")


@pytest.mark.slow
def test_a_pp_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(two):
    """DCP checkpoint of the stages (each rank its own parameters and optimizer state, under
    the model's names), then resumed: bit for bit the run that was not stopped. The three runs
    are in the shared launch: "half" stops at its checkpoint (step 2), and "half-resumed"
    goes on from it, in the same processes (the checkpoint is all it reads)."""
    from safetensors.torch import load_file

    two("full").ok()
    two("half").ok()
    resumed = two("half-resumed").ok()
    assert "step-00000002" in resumed.stdouts[0], resumed.log
    full, resumed = (load_file(two.root / d / "weights.safetensors") for d in ("full", "half"))
    assert full.keys() == resumed.keys()
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


@pytest.mark.slow
def test_a_preempted_pipeline_stops_all_stages_at_one_step_and_resumes(tmp_path, two):
    """SIGTERM to torchrun mid-run: both stages (only the last holds the loss) agree on one log
    step, write one DCP checkpoint and exit 75; `--resume auto` then ends bit-identical to the
    run never stopped (in the shared launch). The signal comes from inside the run
    (tests/engine/interrupt.py): rank 0 sends it to torchrun at step AT (15 of 30) and the
    stages wait there until it reaches them, so they stop at 15 — a log step but no
    checkpoint's: the checkpoint resumed from is the stop's own. (120 steps, stopped at 60,
    proved the same for 4 times the steps: 14.0 s of the shared launch and 33.8 s here.)"""
    from safetensors.torch import load_file

    from fasttrain.engine.checkpoint import complete

    at = AT
    two("long").ok()
    out = tmp_path / "stopped"
    cmd = [*TORCHRUN[:-1], "2", "-m", "tests.engine.interrupt", "SIGTERM", str(at),
           "--launcher", "1", "--", *TRAIN, "--out", str(out), *LONG]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"})
    log = run.stdout + run.stderr
    assert run.returncode != 0 and log.count("stopped: signal") == 2, log  # both ranks: 75
    step = complete(out / "checkpoints")[-1][0]
    assert step == at, log
    proc = train(out, *LONG, "--resume", "auto", procs=2)
    assert proc.returncode == 0 and f"step {step})" in proc.stdout + proc.stderr, proc.stderr
    full, resumed = (load_file(d / "weights.safetensors") for d in (two.root / "long", out))
    assert full.keys() == resumed.keys()
    for k in full:
        assert torch.equal(full[k], resumed[k]), k

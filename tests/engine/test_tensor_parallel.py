"""Tensor parallelism on CPU processes (gloo): --tp 2, and --parallel fsdp --tp 2 on 4 processes,
train gpt (its plan: tensor, sequence and loss parallel) exactly as one process does; bad
layouts stop every rank with the same line.

Tolerance: a row-wise layer's all-reduce adds its two partial sums in another order than one
process's matmul, so the fp32 results differ in the last bits. SGD carries that through as is
(the tests allow 1e-5 absolute, on weights of magnitude ~0.1); AdamW's first steps divide by
|g|, which magnifies the rounding of gradients near zero (measured: 6.6e-5 after 3 steps), so
the weight comparisons use SGD with momentum, as test_distributed.py does.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasttrain.engine.mesh import Layout, layout
from fasttrain.errors import UserError
from tests.engine.launch import Part

ARGS = ["--model", "gpt", "--data", "synthetic-text", "--block-size", "32", "--batch-size", "8",
        "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--grad-clip", "1.0",
        "--seed", "1", "--deterministic", "--device", "cpu", "--no-progress", "--log-every", "1"]


def torchrun(n: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            str(n)]


def train(out: Path, *extra: str, procs: int = 1) -> subprocess.CompletedProcess:
    launcher = torchrun(procs) if procs > 1 else [sys.executable]
    return subprocess.run([*launcher, "-m", "fasttrain", "train", *ARGS, "--out", str(out),
                           *extra], capture_output=True, text=True, timeout=400)


def train_here(out: Path, *extra: str, args: list[str] = ARGS,
               env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """train(out, *extra) of one process (`args` first), run in this one, its output
    captured: the same run, its losses and weights equal to the bit (gpt, userblocks; checked
    2026-11-28), without a subprocess's start-up and imports. CPU on the loaded 2-core
    machine: a 6-step gpt run 9.3 s as a subprocess, 5.6 s in a fresh process (imports
    included), 1.9 s in one that had already run one; fp16, 4 steps: 17.2 and 8.4 s. The flags
    a run sets process-wide it puts back as it ends (engine/switches.process_flags); `env` is
    set while it runs, then put back."""
    from fasttrain.cli import main
    from tests.engine.runs_driver import environ

    argv = ["train", *args, "--out", str(out), *extra]
    stdout, stderr = io.StringIO(), io.StringIO()
    with (environ(env or {}), contextlib.redirect_stdout(stdout),
          contextlib.redirect_stderr(stderr)):
        code = main(argv)
    return subprocess.CompletedProcess(argv, code, stdout.getvalue(), stderr.getvalue())


def losses(out: Path) -> list[float]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "weights.safetensors")


def assert_same_run(one: Path, many: Path) -> None:
    a, b = losses(one), losses(many)
    assert len(a) == len(b) and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5, (a, b)
    wa, wb = weights(one), weights(many)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-5, msg=k)


def test_the_mesh_is_pp_dp_tp_with_tp_fastest():
    lay = layout(8, tp=2, pp=2)
    assert lay == Layout(pp=2, dp=2, tp=2) and lay.size == 8
    assert [lay.coordinates(r)["tp"] for r in range(4)] == [0, 1, 0, 1]
    assert [lay.coordinates(r)["dp"] for r in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert [lay.coordinates(r)["pp"] for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    with pytest.raises(UserError, match="does not divide the 6 processes"):
        layout(6, tp=4, pp=1)


def test_tp_needs_torchrun_and_refuses_zero1(monkeypatch):
    from fasttrain.engine import TrainConfig

    with pytest.raises(UserError, match="--tp 2 splits the model over processes that torchrun"):
        TrainConfig(model="gpt", data="synthetic-text", tp=2, device="cpu").validate()
    for k, v in {"WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UserError, match="--parallel zero1 with --tp 2: ZeroRedundancyOptimizer"):
        TrainConfig(model="gpt", data="synthetic-text", tp=2, parallel="zero1",
                    device="cpu").validate()
    with pytest.raises(UserError, match="--parallel ddp with --tp 2: DistributedDataParallel"):
        TrainConfig(model="gpt", data="synthetic-text", tp=2, parallel="ddp",
                    device="cpu").validate()
    with pytest.raises(UserError, match="which --parallel none would train as unrelated copies"):
        TrainConfig(model="gpt", data="synthetic-text", tp=2, device="cpu").validate()
    with pytest.raises(UserError, match="--batch-size 5 .* 2 data-parallel processes"):
        TrainConfig(model="gpt", data="synthetic-text", tp=2, parallel="fsdp", batch_size=5,
                    device="cpu").validate()


TP_STEPS = 6  # every logged loss and the final weights (a 1-step case, run apart before,
# added nothing that these do not check, for 12 s of CI's 20-minute budget). 6 steps, not 20:
# conftest.one(6) is the reference test_tensor_parallel's resumed run needs anyway, and the
# layouts' rounding is that of any step (see test_pipeline_layouts.py's docstring for the
# differences measured at 6 and 20 steps).

BAD = [  # (processes, flags, the line every rank prints)
    (2, ["--tp", "4"], "--tp 4 × --pp 1 = 4 does not divide the 2 processes"),
    (3, ["--tp", "3"], "gpt's 4 attention heads do not split over 3 ranks"),
    (2, ["--tp", "2", "--block-size", "31"],
     "sequence parallelism splits each sequence of 31 tokens over 2 ranks"),
    (2, ["--tp", "2", "--model", "tests.engine.usermodel:make", "--data",
         "tests.engine.usermodel:data", "--loss", "mse", "--optimizer", "adamw"],
     "Regressor has no tensor-parallel plan"),
]


# This module's 2-process commands, in the session's shared 2-process launch (launch.Part):
# the runs, then the refusals.
TWO = Part(__name__, 2, ARGS)
TWO.add("tp2", "--max-steps", str(TP_STEPS), "--tp", "2")
TWO.add("tp2-first", "--max-steps", "2", "--tp", "2", out="run")
TWO.add("fsdp2-second", "--max-steps", "4", "--parallel", "fsdp", "--resume", "auto", out="run")
for _procs, _extra, _says in BAD:
    if _procs == 2:
        TWO.add(_says, *_extra, "--max-steps", "1", refused=True)


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


# The 2 × 2 run, in the session's shared 4-process launch (launch.Part).
FOUR = Part(__name__, 4, ARGS)
FOUR.add("fsdp2xtp2", "--max-steps", str(TP_STEPS), "--tp", "2", "--parallel", "fsdp")


@pytest.fixture(scope="module")
def four(shared) -> Part:
    return FOUR.bound(shared)


def assert_refused_alike(errors: list[str], procs: int, says: str, log: str) -> None:
    """Every rank printed the one same `error: ` line, and it says `says`."""
    assert len(errors) == procs and len(set(errors)) == 1, log
    assert says in errors[0], log


@pytest.mark.slow
def test_tp2_trains_exactly_as_one_process(two, one):
    two("tp2").ok()
    assert_same_run(one(TP_STEPS), two.root / "tp2")
    # Each rank holds half of every split matrix; embeddings and LayerNorms stay whole.
    first = [r for r in records(two.root / "tp2") if r["kind"] == "train"][0]
    full = [r for r in records(one(TP_STEPS)) if r["kind"] == "train"][0]
    held = first["param_bytes"] + first["optimizer_bytes"]
    whole = full["param_bytes"] + full["optimizer_bytes"]
    assert 0.5 * whole < held < 0.55 * whole, (held, whole)


@pytest.mark.slow
def test_fsdp_times_tp_2x2_trains_exactly_as_one_process(four, one):
    four("fsdp2xtp2").ok()
    assert_same_run(one(TP_STEPS), four.root / "fsdp2xtp2")


@pytest.mark.slow
@pytest.mark.parametrize("says", [says for procs, _, says in BAD if procs == 2])
def test_a_bad_layout_is_the_same_line_on_every_rank(two, says):
    """In the shared 2-process launch: every rank's main() returned 2 (`python -m fasttrain`
    exits with it; the 3-process case below checks that through torchrun)."""
    refused = two(says)
    assert refused.codes == [2, 2], refused.log
    assert_refused_alike(refused.errors, 2, says, refused.log)


@pytest.mark.slow
def test_a_bad_layout_on_three_processes_exits_2_on_every_rank(tmp_path):
    ((procs, extra, says),) = [case for case in BAD if case[0] == 3]
    proc = train(tmp_path / "out", *extra, "--max-steps", "1", procs=procs)
    log = proc.stdout + proc.stderr
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0, log
    assert_refused_alike(errors, procs, says, log)
    assert "exitcode  : 2" in log or "exitcode: 2" in log, log


@pytest.mark.slow
def test_tp2_then_fsdp2_then_one_process_continue_as_an_uninterrupted_run(two, one):
    """DCP reshards on load: the tp=2 shards (rows of each split matrix) are read into FSDP's
    shards (dim-0 halves of every parameter), those into one process's whole tensors, and
    training continues as one process would. The first two runs are in the shared 2-process
    launch, one after the other."""
    two("tp2-first").ok()
    second = two("fsdp2-second").ok()
    assert "step-00000002" in second.stdouts[0], second.log
    third = train_here(two.root / "run", "--max-steps", "6", "--resume", "auto")
    assert third.returncode == 0 and "step-00000004" in third.stdout, third.stdout
    assert_same_run(one(6), two.root / "run")

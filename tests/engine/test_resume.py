"""A run interrupted after a known checkpoint — politely (SIGTERM, Ctrl-C) or not (SIGKILL in the
middle of the next checkpoint's write) — and resumed with `--resume auto` ends with weights
bit-identical to a run that was never interrupted. The interruptions come from inside the run at
a fixed step (tests/engine/interrupt.py): no sleeps, no races, nothing skipped."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasttrain.engine import EXIT_PREEMPTED
from fasttrain.engine.checkpoint import complete
from tests.engine.test_tensor_parallel import train_here

pytestmark = pytest.mark.slow  # subprocess runs, interrupted and resumed: ~40 s on 2 cores

# Small and short: what is tested is the stop/restore path, not the model (each interrupted run
# is a subprocess; the whole file must stay cheap: about 40 s on 2 cores).
STEPS = 12
AT = 6  # the checkpoint after which the run is interrupted
ARGS = ["--model", "mlp", "--data", "synthetic", "--batch-size", "32", "--max-steps", str(STEPS),
        "--checkpoint-every", "3", "--log-every", "6", "--lr", "1e-3", "--seed", "5",
        "--device", "cpu", "--no-progress"]


def run(out: Path, *extra: str, interrupt: str | None = None) -> tuple[int, str]:
    head = ([sys.executable, "-m", "tests.engine.interrupt", interrupt, str(AT), "--"]
            if interrupt else [sys.executable, "-m", "fasttrain", "train"])
    proc = subprocess.run([*head, *ARGS, "--out", str(out), *extra], capture_output=True,
                          text=True, timeout=600)
    return proc.returncode, proc.stdout + proc.stderr


def run_here(out: Path, *extra: str) -> tuple[int, str]:
    """run(out, *extra) without an interruption, in pytest's process
    (test_tensor_parallel.train_here): the uninterrupted run and the resumes, which need no
    signal from outside. The same run to the bit (a run resumed here from the checkpoint of an
    interrupted subprocess ends with the uninterrupted run's weights), without the start-up and
    imports of four subprocesses: this file took 69.6 s of CPU with them, 43.7 s without
    (2-core EPYC, load 3-5, 2026-11-28). A resume that drops the optimizer state still fails."""
    proc = train_here(out, *extra, args=ARGS)
    return proc.returncode, proc.stdout + proc.stderr


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "weights.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    code, log = run_here(out)
    assert code == 0, log
    return final_weights(out)


@pytest.mark.parametrize("how, code, step", [
    ("SIGTERM", EXIT_PREEMPTED, AT),
    ("SIGINT", 130, AT),
    ("SIGKILL", -signal.SIGKILL, AT),
])
def test_resume_after_interruption_is_bit_identical(tmp_path, uninterrupted, how, code, step):
    got, log = run(tmp_path, interrupt=how)
    assert got == code, log
    assert complete(tmp_path / "checkpoints")[-1][0] == step
    if how == "SIGKILL":  # the next checkpoint's write was cut short: its temp file is there
        assert list((tmp_path / "checkpoints").glob(f".step-{AT + 3:08d}.pt.*.tmp"))
    else:
        assert f"checkpoint saved at step {step}" in log and "--resume auto" in log, log
    got, log = run_here(tmp_path, "--resume", "auto")
    assert got == 0, log
    assert f"step {step})" in log, log
    assert not list((tmp_path / "checkpoints").glob(".*"))  # the stray temp file is gone
    resumed = final_weights(tmp_path)
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        assert torch.equal(resumed[k], uninterrupted[k]), k


def test_a_second_ctrl_c_aborts_at_once(tmp_path):
    got, log = run(tmp_path, interrupt="SIGINT2")
    assert got == 130 and "interrupted" in log and "Traceback" not in log, log
    assert complete(tmp_path / "checkpoints")[-1][0] == AT  # the complete checkpoint is kept

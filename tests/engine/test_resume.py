"""A run interrupted at a random step — politely (SIGTERM) or not (SIGKILL) — and resumed with
`--resume auto` ends with weights bit-identical to a run that was never interrupted. The signal
is sent by the process itself after the chosen step (tests/engine/interrupt.py): no sleeps, the
same on any machine."""

import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasttrain.engine import EXIT_PREEMPTED
from fasttrain.engine.checkpoint import complete

pytestmark = pytest.mark.slow  # subprocesses training hundreds of steps

STEPS = 240
ARGS = ["--model", "cnn", "--data", "synthetic", "--batch-size", "32", "--max-steps", str(STEPS),
        "--checkpoint-every", "20", "--log-every", "40", "--lr", "1e-3", "--seed", "5",
        "--device", "cpu", "--no-progress"]


def start(out: Path, *extra: str, interrupt: tuple[int, str] | None = None) -> subprocess.Popen:
    entry = ["tests.engine.interrupt", str(interrupt[0]), interrupt[1]] if interrupt else \
        ["fasttrain"]
    cmd = [sys.executable, "-m", *entry, "train", *ARGS, "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen) -> int:
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out + err


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "weights.safetensors")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("whole")
    code, log = finish(start(out))
    assert code == 0, log
    return final_weights(out)


def interrupt(out: Path, sig: int) -> int:
    """Run until a random step after the first checkpoint, then receive `sig` there."""
    at = random.randint(21, STEPS - 2)
    return finish(start(out, interrupt=(at, signal.Signals(sig).name)))


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_resume_after_interruption_is_bit_identical(tmp_path, uninterrupted, sig):
    code, log = interrupt(tmp_path, sig)
    expected = EXIT_PREEMPTED if sig == signal.SIGTERM else -signal.SIGKILL
    assert code == expected, log
    steps_done = complete(tmp_path / "checkpoints")[-1][0]
    assert 0 < steps_done < STEPS
    # A write killed halfway leaves a temp file; plant one that claims to be newer.
    (tmp_path / "checkpoints" / f".step-{STEPS - 1:08d}.pt.abc.tmp").write_bytes(b"PK\x03")
    code, log = finish(start(tmp_path, "--resume", "auto"))
    assert code == 0, log
    assert f"step {steps_done}" in log, log
    resumed = final_weights(tmp_path)
    assert resumed.keys() == uninterrupted.keys()
    for k in resumed:
        assert torch.equal(resumed[k], uninterrupted[k]), k


def test_sigterm_exit_code_and_message(tmp_path):
    code, log = interrupt(tmp_path, signal.SIGTERM)
    assert code == EXIT_PREEMPTED and "--resume auto" in log

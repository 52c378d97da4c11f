"""An error in the user's own model, met by a lab command's real step (memory, its batch-size
search, plan, its calibration, profile, experiment), is shown as `train` shows it: the user's
frames and one line naming their callable, exit status 1 — not fasttrain's and torch's traceback."""

import pytest
from torch import nn

from fasttrain.errors import UserCodeError
from tests.conftest import run_cli


class WrongWidth(nn.Module):
    """A model of the user's whose forward fails on MNIST-shaped input (784 features, not 3)."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x):
        return self.fc(x.flatten(1))


def wrong_width():
    return WrongWidth()


COMMON = ("--model", "tests.lab.test_user_code_errors:wrong_width", "--data", "synthetic",
          "--batch-size", "8", "--device", "cpu")


def assert_users_frames(err: str) -> None:
    lines = err.rstrip("\n").splitlines()
    assert "error in your model's forward (WrongWidth) on batch (float32[8, 1, 28, 28]" in err, err
    assert "RuntimeError: mat1 and mat2 shapes cannot be multiplied" in err, err
    frames = [line for line in lines if line.startswith('  File "')]
    assert frames and all("test_user_code_errors.py" in f for f in frames), err
    assert "/fasttrain/" not in err and "/torch/" not in err, err


@pytest.mark.parametrize("command", [
    ("memory",),
    ("memory", "--find-batch-size", "--memory-limit", "1"),
    ("plan",),
    ("plan", "--calibrate"),
    ("profile", "--steps", "1", "--profile-warmup", "1"),
], ids=lambda c: " ".join(c))
def test_a_lab_command_shows_an_error_in_your_model_as_yours(capsys, command):
    code, _, err = run_cli(capsys, *command, *COMMON)
    assert code == UserCodeError.exit_code, err
    assert_users_frames(err)
    assert err.rstrip("\n").splitlines()[-1].startswith("error in your model's forward"), err


def test_experiment_rows_show_an_error_in_your_model_as_yours(capsys):
    # Each row fails alone (the others still run); what it prints is the user's frames.
    code, out, err = run_cli(capsys, "experiment", "precision", "--steps", "1", *COMMON)
    assert_users_frames(err)
    assert "failed" in out and "error in your model's forward (WrongWidth)" in out, out

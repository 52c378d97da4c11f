"""Under torchrun, an error that only one rank can see is every rank's one line: rank 0 alone
claims the run directory, so an --out that is a file is found there — and the other rank must
print the same line and exit 2 rather than die in the next collective."""

import subprocess
import sys

import pytest

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2"]


@pytest.mark.slow
def test_an_error_on_rank_0_is_the_same_line_on_every_rank(tmp_path):
    out = tmp_path / "not-a-folder"
    out.write_text("x")
    proc = subprocess.run([*TORCHRUN, "-m", "fasttrain", "train", "--model", "logreg", "--data",
                           "synthetic", "--batch-size", "16", "--max-steps", "2", "--parallel",
                           "ddp", "--device", "cpu", "--no-progress", "--out", str(out)],
                          capture_output=True, text=True, timeout=300)
    log = proc.stdout + proc.stderr
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    assert proc.returncode != 0 and len(errors) == 2 and errors[0] == errors[1], log
    assert "is a file" in errors[0]
    # torchrun's own failure report has a traceback of the launcher; the workers must have none
    # (which would show frames in fasttrain's source) and exit 2.
    assert "fasttrain/engine/" not in log and "fasttrain/train.py" not in log, log
    assert "exitcode  : 2" in log or "exitcode: 2" in log, log

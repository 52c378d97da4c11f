"""Under torchrun, an error that only one rank can see is every rank's one line: rank 0 alone
claims the run directory, so an --out that is a file is found there — and the other rank must
print the same line and exit 2 rather than die in the next collective."""

import os
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



@pytest.mark.slow
@pytest.mark.parametrize(("layout", "fault"), [(("--parallel", "ddp"), "1"),
                                               (("--parallel", "fsdp"), "1"),
                                               (("--tp", "2"), "0")])
def test_an_error_in_user_code_on_one_rank_shows_its_frames_once_and_one_line_elsewhere(
        tmp_path, layout, fault):
    """One rank's model raises mid-run; the other, waiting for it in the step's all-reduce
    (under --tp, in the model's own forward), finds the connection closed. The user sees their
    frames once, from the rank that raised, and the other rank says in one line that another
    process failed first: neither a traceback of gloo's error through the engine, nor (--tp) a
    second report blaming the user's model for it."""
    proc = subprocess.run([*TORCHRUN, "-m", "fasttrain", "train", "--model",
                           "tests.engine.rankfault:make", "--data", "tests.engine.userblocks:data",
                           "--batch-size", "16", "--max-steps", "6", *layout, "--device", "cpu",
                           "--no-progress", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "FAULT_RANK": fault})
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0, log
    assert log.count("error in your model's forward") == 1, log
    assert log.count('rankfault.py", line') == 2 and "ValueError: the user's" in log, log
    errors = [line for line in log.splitlines() if line.startswith("error: ")]
    other = 1 - int(fault)
    assert len(errors) == 1 and errors[0].startswith(f"error: rank {other} stopped: another "
                                                     f"process of this run failed first"), log
    assert "Connection closed by peer" in errors[0], log
    assert "fasttrain/engine/" not in log and "fasttrain/train.py" not in log, log
    assert "exitcode  : 1" in log, log  # the rank that raised: torchrun's root cause


GLOO = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
        "[127.0.0.1]:14493. This is typically caused by a remote worker crashing. Check the logs "
        "of the remote worker before reporting an error.")


@pytest.mark.parametrize(("world", "error", "line"), [
    ("2", RuntimeError(GLOO), "here: Connection closed by peer [127.0.0.1]:14493"),
    ("2", RuntimeError("a bug of ours"), None),  # keeps its traceback: an internal error
    ("1", RuntimeError(GLOO), None),  # one process has no peer to lose
])
def test_only_a_collective_that_lost_its_peer_is_the_other_ranks_one_line(monkeypatch, world,
                                                                          error, line):
    from fasttrain.engine.distributed import peer_failure

    monkeypatch.setenv("WORLD_SIZE", world)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    try:  # gloo's error as the context of another, raised while unwinding
        try:
            raise error
        except RuntimeError:
            raise ValueError("raised in a finally") from None
    except ValueError as e:
        wrapped = e
    for e in (error, wrapped):
        got = peer_failure(e)
        assert (got is None) if line is None else got.endswith(line) and "rank 0" in got

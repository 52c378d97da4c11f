"""scripts/slurm/train.sbatch on one node without SLURM: `srun` and `scontrol` are stand-ins, the
rest is real (bash, the trap, torchrun with c10d rendezvous, 2 CPU workers). SIGUSR1 to the
script — what `--signal=B:USR1@120` sends — must end in a checkpoint and a requeue, and the
requeued job must resume from it and finish."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fasttrain.engine.checkpoint import complete

SCRIPT = Path(__file__).parents[2] / "scripts" / "slurm" / "train.sbatch"
ARGS = ["--model", "mlp", "--data", "synthetic", "--batch-size", "128", "--max-steps", "300",
        "--log-every", "10", "--checkpoint-every", "50", "--optimizer", "sgd", "--lr", "0.05",
        "--device", "cpu", "--no-progress", "--parallel", "ddp"]


def stand_ins(folder: Path) -> None:
    (folder / "srun").write_text('#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                 'exec "$@"\n')  # srun on one node: become the command
    (folder / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && echo localhost '
                                     '|| echo "scontrol $*"\n')
    for name in ("srun", "scontrol"):
        (folder / name).chmod(0o755)


def sbatch(tmp_path: Path) -> subprocess.Popen:
    bin_dir = Path(sys.executable).parent  # torchrun lives beside the interpreter
    env = dict(os.environ, PATH=f"{tmp_path}:{bin_dir}:{os.environ['PATH']}",
               SLURM_JOB_ID="4242", SLURM_JOB_NAME="test", SLURM_JOB_NODELIST="localhost",
               SLURM_JOB_NUM_NODES="1", SLURM_GPUS_ON_NODE="2", OUT=str(tmp_path / "run"))
    return subprocess.Popen(["bash", str(SCRIPT), *ARGS], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow  # torchrun, twice: ~16 s on 2 cores
def test_time_limit_warning_checkpoints_requeues_and_the_requeued_job_resumes(tmp_path):
    stand_ins(tmp_path)
    job = sbatch(tmp_path)
    deadline = time.monotonic() + 240
    while not complete(tmp_path / "run" / "checkpoints"):
        assert job.poll() is None, job.communicate()[0]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.02)
    job.send_signal(signal.SIGUSR1)
    log, _ = job.communicate(timeout=300)
    assert job.returncode == 0, log
    assert "scontrol requeue 4242" in log and log.count("stopped: signal") == 2, log
    step = complete(tmp_path / "run" / "checkpoints")[-1][0]
    assert 0 < step < 300

    requeued = sbatch(tmp_path)
    log, _ = requeued.communicate(timeout=300)
    assert requeued.returncode == 0 and f"step {step})" in log, log
    assert "requeue" not in log and (tmp_path / "run" / "weights.safetensors").exists()

"""scripts/slurm/train.sbatch on one node without SLURM: `srun` and `scontrol` are stand-ins, the
rest is real (bash, the trap, torchrun with c10d rendezvous, 2 CPU workers). SIGUSR1 to the
script — what `--signal=B:USR1@120` sends — must end in a checkpoint and a requeue, and the
requeued job must resume from it and finish. The signal comes from inside the run at a fixed
step (tests/engine/interrupt.py, which the srun stand-in puts in place of `fasttrain train`):
rank 0 sends it to the script, and every rank waits until the script's trap and torchrun have
forwarded it, so the run stops at that step: no sleeps, no races."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fasttrain.engine.checkpoint import complete

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "slurm" / "train.sbatch"
AT = 60  # the step at which SIGUSR1 reaches the script: a log step, not a checkpoint step
ARGS = ["--model", "mlp", "--data", "synthetic", "--batch-size", "128", "--max-steps", "100",
        "--log-every", "10", "--checkpoint-every", "50", "--optimizer", "sgd", "--lr", "0.05",
        "--device", "cpu", "--no-progress", "--parallel", "ddp"]


# srun on one node: become the command (srun's own options dropped), its `fasttrain train`
# replaced by the interrupt hook's when INTERRUPT is set (the worker's 2nd ancestor: the script).
SRUN = f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
while args[0].startswith("--"):
    args.pop(0)
if os.environ.get("INTERRUPT"):
    at = args.index("-m")
    if args[at + 1:at + 3] != ["fasttrain", "train"]:
        sys.exit(f"srun stand-in: no `-m fasttrain train` in {{args}}")
    args[at + 1:at + 3] = ["tests.engine.interrupt", *os.environ["INTERRUPT"].split(), "--"]
os.execvp(args[0], args)
"""


def stand_ins(folder: Path) -> None:
    (folder / "srun").write_text(SRUN)
    (folder / "scontrol").write_text('#!/bin/bash\n[ "$1" = show ] && echo localhost '
                                     '|| echo "scontrol $*"\n')
    for name in ("srun", "scontrol"):
        (folder / name).chmod(0o755)


def sbatch(tmp_path: Path, interrupt: str = "") -> subprocess.Popen:
    bin_dir = Path(sys.executable).parent  # torchrun lives beside the interpreter
    path = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]  # tests.engine.interrupt
    env = dict(os.environ, PATH=f"{tmp_path}:{bin_dir}:{os.environ['PATH']}",
               PYTHONPATH=os.pathsep.join(path), INTERRUPT=interrupt,
               SLURM_JOB_ID="4242", SLURM_JOB_NAME="test", SLURM_JOB_NODELIST="localhost",
               SLURM_JOB_NUM_NODES="1", SLURM_GPUS_ON_NODE="2", OUT=str(tmp_path / "run"))
    return subprocess.Popen(["bash", str(SCRIPT), *ARGS], env=env, cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


@pytest.mark.slow  # torchrun, twice: ~16 s on 2 cores
def test_time_limit_warning_checkpoints_requeues_and_the_requeued_job_resumes(tmp_path):
    stand_ins(tmp_path)
    job = sbatch(tmp_path, interrupt=f"SIGUSR1 {AT} --launcher 2")
    log, _ = job.communicate(timeout=300)
    assert job.returncode == 0, log
    assert "scontrol requeue 4242" in log and log.count("stopped: signal") == 2, log
    step = complete(tmp_path / "run" / "checkpoints")[-1][0]
    assert step == AT, log  # saved by the stop itself: the periodic ones are at 50, 100

    requeued = sbatch(tmp_path)
    log, _ = requeued.communicate(timeout=300)
    assert requeued.returncode == 0 and f"step {step})" in log, log
    assert "requeue" not in log and (tmp_path / "run" / "weights.safetensors").exists()

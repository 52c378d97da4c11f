"""Scale-out on the CPU: 2 processes under torchrun (gloo) train the same model as 1 process.

Tolerance: ranks average their gradients with an fp32 all-reduce, which adds the same numbers in
another order than one process's batch mean. Measured here (torch 2.13, 2-core EPYC) after 50
SGD steps (the loss 2.303 → 2.282) the weights differ from one process's by ≤ 3.7e-8 absolute,
4.2e-7 of their largest magnitude, 0.088 (fsdp and its accumulation; ddp and zero1 2.2e-8,
2.5e-7; ddp-accum2 2.6e-8, ddp-compile 2.4e-8); after 100 steps it was 1.2e-7 and 8.6e-7, after
200 3.4e-7 and 1.3e-6. The tests allow rtol 1e-5, atol 1e-6.
50 steps, not 100, for CI's time (every run here is STEPS long; the modes' 7 runs took 64.6 s
of a launch of their own at 100 steps, 38 s of the shared launch at 50); the faults at step 30
still come between checkpoints (25, 50). Runs of the same --parallel mode are compared bit for
bit (a restart or a preemption changes nothing).
The faults (a killed rank, a preemption) come from inside the run at a fixed step
(tests/engine/interrupt.py): no sleeps, no races.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fasttrain.engine.checkpoint import complete
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import train_here

pytestmark = pytest.mark.slow  # subprocesses training a hundred steps

STEPS = 50
ARGS = ["--model", "mlp", "--data", "synthetic", "--batch-size", "128", "--max-steps", str(STEPS),
        "--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9", "--grad-clip", "0.25",
        "--seed", "3", "--log-every", "10", "--checkpoint-every", "25", "--device", "cpu",
        "--no-progress"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
            "2"]
# torchrun forwards only SIGTERM, SIGINT, SIGHUP and SIGQUIT unless told (SLURM sends SIGUSR1).
SIGNALS = ["--signals-to-handle", "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"]
AT = 30  # the step at which a fault comes: after the checkpoint of step 25, at a log step


def start(out: Path, *extra: str, launcher: tuple[str, ...] = tuple(TORCHRUN),
          interrupt: tuple[str, ...] = ()) -> subprocess.Popen:
    """`launcher -m fasttrain train ...`; with `interrupt` (SIGNAL, STEP, options), the same
    run under tests/engine/interrupt.py."""
    train = ["tests.engine.interrupt", *interrupt, "--"] if interrupt else ["fasttrain", "train"]
    cmd = [*launcher, "-m", *train, *ARGS, "--out", str(out), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: int = 300) -> tuple[int, str]:
    log, _ = proc.communicate(timeout=timeout)
    return proc.returncode, log


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(out / "weights.safetensors")


class Runs:
    """Each configuration trained once per session, on demand: the --parallel modes of MODES
    in the session's shared 2-process launch (launch.Part, one after the other), the one
    process's run in pytest's process."""

    def __init__(self, root: Path, two: Part):
        self.root, self.two, self.done = root, two, {}

    def __call__(self, name: str, *extra: str) -> Path:
        if name in MODES:
            assert list(extra) == MODES[name], (name, extra)
            self.two(name).ok()
            return self.two.root / name
        if name not in self.done:
            out = self.root / name
            if name == "single":  # in pytest's process (test_tensor_parallel.train_here)
                proc = train_here(out, *extra, args=ARGS)
                code, log = proc.returncode, proc.stdout + proc.stderr
            else:
                code, log = finish(start(out, *extra))
            assert code == 0, log
            self.done[name] = out
        return self.done[name]


@pytest.fixture(scope="module")
def runs(shared, tmp_path_factory) -> Runs:
    return Runs(tmp_path_factory.mktemp("distributed"), TWO.bound(shared))


def assert_close(a: dict, b: dict, exact: bool = False) -> None:
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6, msg=k)


MODES = {
    "ddp": ["--parallel", "ddp"],
    "fsdp": ["--parallel", "fsdp"],
    "zero1": ["--parallel", "zero1"],
    "ddp-accum2": ["--parallel", "ddp", "--accum-steps", "2"],
    "fsdp-accum2": ["--parallel", "fsdp", "--accum-steps", "2"],
    "fsdp-accum2-step": ["--parallel", "fsdp", "--accum-steps", "2", "--step",
                         "tests.engine.userstep:xy_step"],  # a user's step gets every switch
    "ddp-compile": ["--parallel", "ddp", "--accum-steps", "2", "--compile"],
}
TWO = Part(__name__, 2, ARGS)  # the modes, in the session's shared 2-process launch
for _mode, _flags in MODES.items():
    TWO.add(_mode, *_flags)


def test_ddp_on_two_ranks_ends_with_the_weights_of_one_process(runs):
    from fasttrain.engine.run import seed_everything
    from fasttrain.models import build_model

    one = final_weights(runs("single"))
    assert_close(final_weights(runs("ddp", *MODES["ddp"])), one)
    seed_everything(3)  # the initial weights, as the trainer draws them: the runs moved far
    init = build_model("mlp", in_shape=(1, 28, 28), num_classes=10).state_dict()
    assert max((one[k] - init[k]).abs().max().item() for k in one) > 1e-3


@pytest.mark.parametrize("mode", ["fsdp", "zero1", "ddp-accum2", "fsdp-accum2",
                                  "fsdp-accum2-step"])
def test_fsdp_zero1_and_accumulation_match_ddp(runs, mode):
    ddp = final_weights(runs("ddp", *MODES["ddp"]))
    other = final_weights(runs(mode, *MODES[mode]))
    assert_close(other, ddp)
    assert_close(other, final_weights(runs("single")))


def test_compile_wraps_ddp_and_skips_syncs_when_accumulating(runs):
    compiled = final_weights(runs("ddp-compile", *MODES["ddp-compile"]))
    assert_close(compiled, final_weights(runs("single")))


def test_metrics_are_averaged_over_ranks_and_written_once(runs):
    import json

    def records(out: Path) -> list[dict]:
        return [json.loads(line) for line in (out / "metrics.jsonl").open()]

    one, two = records(runs("single")), records(runs("ddp", *MODES["ddp"]))
    assert [r["step"] for r in one] == [r["step"] for r in two]  # rank 0 alone wrote
    for a, b in zip(one, two, strict=True):
        key = "loss" if a["kind"] == "train" else "test_loss"
        assert b[key] == pytest.approx(a[key], rel=1e-5)
    assert two[-1]["test_accuracy"] == pytest.approx(one[-1]["test_accuracy"], abs=1e-4)


def test_per_rank_state_bytes_follow_the_mode(runs):
    """Rank 0's logged parameter/gradient/optimizer bytes against the prediction from the
    parameter count: DDP keeps everything, ZeRO-1 part of the optimizer state (whole
    parameters: the largest decides how even the split is), FSDP a half of everything."""
    import json

    from fasttrain.engine.memory import predicted_rank_memory

    def held(name: str) -> dict:
        out = runs(name, *MODES[name])
        return [json.loads(line) for line in (out / "metrics.jsonl").open()][0]

    n = 269_322  # mlp on 28×28×1, 10 classes
    ddp, zero1, fsdp = held("ddp"), held("zero1"), held("fsdp")
    want = predicted_rank_memory(n, "ddp", 2, "sgd", 0.9)
    assert (ddp["param_bytes"], ddp["grad_bytes"], ddp["optimizer_bytes"]) == \
        (want.params, want.grads, want.optimizer)
    half = predicted_rank_memory(n, "fsdp", 2, "sgd", 0.9)
    assert (fsdp["param_bytes"], fsdp["grad_bytes"], fsdp["optimizer_bytes"]) == \
        (half.params, half.grads, half.optimizer)
    z = predicted_rank_memory(n, "zero1", 2, "sgd", 0.9)
    assert zero1["param_bytes"] == z.params and zero1["grad_bytes"] == z.grads
    largest = 784 * 256 * 4  # the first layer's weight, in bytes of momentum
    assert abs(zero1["optimizer_bytes"] - z.optimizer) <= largest
    assert zero1["optimizer_bytes"] < ddp["optimizer_bytes"]


# -- faults: a killed rank under --max-restarts, a preempted run ------------------------------


def test_a_killed_rank_restarts_and_resumes_to_the_same_weights(runs, tmp_path):
    """Worker 1 SIGKILLs itself at step 30, after the first checkpoint (25): torchrun
    (--max-restarts 1) restarts the group, the workers see TORCHELASTIC_RESTART_COUNT=1 and
    resume from the last complete (sharded, DCP) checkpoint by themselves, redo steps 26-30, and
    the run ends bit-identical to one never hurt."""
    uninterrupted = final_weights(runs("fsdp", *MODES["fsdp"]))
    launcher = (*TORCHRUN, "--max-restarts", "1")
    proc = start(tmp_path, *MODES["fsdp"], launcher=launcher,
                 interrupt=("SIGKILL", str(AT), "--rank", "1"))
    code, log = finish(proc)
    assert code == 0, log
    assert "resumed from" in log and "exitcode: -9" in log, log
    step = int(log.split("resumed from")[1].split("step ")[1].split(")")[0])
    assert step == 25, log
    assert_close(final_weights(tmp_path), uninterrupted, exact=True)


def test_a_preempted_run_checkpoints_on_every_rank_and_resumes(runs, tmp_path):
    """SIGUSR1 (SLURM's warning) to torchrun, which forwards it: the ranks agree on a step,
    save one consolidated ZeRO-1 checkpoint and exit 75; `--resume auto` finishes the run. Rank
    0 sends the signal to torchrun at step 30 and the ranks wait for it there: they stop at 30,
    a log step but no checkpoint's, so the checkpoint resumed from is the stop's own."""
    uninterrupted = final_weights(runs("zero1", *MODES["zero1"]))
    proc = start(tmp_path, *MODES["zero1"], launcher=(*TORCHRUN, *SIGNALS),
                 interrupt=("SIGUSR1", str(AT), "--launcher", "1"))
    code, log = finish(proc)
    assert code != 0 and log.count("stopped: signal") == 2, log  # both ranks exited 75
    step = complete(tmp_path / "checkpoints")[-1][0]
    assert step == AT, log
    code, log = finish(start(tmp_path, *MODES["zero1"], "--resume", "auto"))
    assert code == 0 and f"step {step})" in log, log
    assert_close(final_weights(tmp_path), uninterrupted, exact=True)

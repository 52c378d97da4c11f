"""--compile under --tp (gloo, CPU): the compiled run tracks the eager one, and it did compile.

Under --tp the engine compiles each gpt block alone, before activation checkpointing and FSDP
wrap it (engine/tensor_parallel.compile_blocks): compiling the whole wrapped model fails
under FSDP × TP and under activation checkpointing (torch 2.13).

Tolerance: inductor fuses and reorders the fp32 arithmetic inside a block, so results differ
in the last bits. Measured over 4 SGD steps against eager --tp 2: losses equal to the bit (tp,
tp + checkpointing) or within 6.9e-8 relative (fsdp × tp: one float32 ulp of a loss of 3.4),
weights within 1.2e-7 absolute (magnitude ~0.1). The test allows 1e-6 relative on the
losses and 1e-6 absolute on the weights: ten times what rounding gives, far below what a
wrong gradient or a skipped collective would do (the losses move by ~1e-2 per step).

Runtime (2 busy CPU cores): about 15 s for the eager run, 25-30 s for each compiled 2-process
run, 50 s for the 4-process one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.engine.test_tensor_parallel import ARGS, losses, torchrun, weights

DRIVER = Path(__file__).with_name("compile_driver.py")
STEPS = ["--max-steps", "4"]


def train(out: Path, *extra: str, procs: int = 2, compiled: bool = False):
    launcher = [*torchrun(procs), str(DRIVER), str(out / "dynamo")] if compiled else \
        [*torchrun(procs), "-m", "fasttrain"]
    return subprocess.run([*launcher, "train", *ARGS, *STEPS, "--out", str(out), *extra,
                           *(["--compile"] if compiled else [])],
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def eager(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("eager")
    proc = train(out, "--tp", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.slow
@pytest.mark.parametrize("extra, procs", [
    (["--tp", "2"], 2),
    (["--tp", "2", "--activation-checkpointing"], 2),
    (["--tp", "2", "--parallel", "fsdp"], 4),
], ids=["tp2", "tp2-checkpointed", "fsdp2xtp2"])
def test_compiled_tp_tracks_eager_tp(tmp_path, eager, extra, procs):
    proc = train(tmp_path, *extra, procs=procs, compiled=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    a, b = losses(eager), losses(tmp_path)
    assert len(a) == len(b) == 4, (a, b)
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True)) < 1e-6, (a, b)
    wa, wb = weights(eager), weights(tmp_path)
    assert wa.keys() == wb.keys()  # compiling in place keeps the names
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-6, msg=k)
    # It compiled, on every rank: graphs for forward and backward, none broken.
    for rank in range(procs):
        seen = json.loads((tmp_path / "dynamo" / f"dynamo-rank{rank}.json").read_text())
        assert seen["stats"]["unique_graphs"] >= 1 and seen["aot_autograd"]["ok"] >= 1, seen
        assert not seen.get("graph_break"), seen["graph_break"]

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

The eager run and the compiled runs are in the session's shared launches (launch.Part), each
compiling afresh (runs_driver.py resets dynamo before every command). Each compiled run took
25-30 s on 2 busy CPU cores (the 4-process one 50 s) when each was a launch of its own.

They train on synthetic-text without its test split (tests/engine/textdata.py: the same
training samples, the same losses to the bit), so no run evaluates after its last step: that
evaluation compiled the block twice more (eval mode, then the last, smaller batch with dynamic
shapes), about half of what a run compiled. `torchrun --nproc-per-node 2 fasttrain train ...
--tp 2 --compile` took 41 and 45 s of CPU so, 63 s with the evaluation (2-core EPYC, load 2-3,
one launch each, 2026-11-28); on 4 processes with --parallel fsdp, 91 s against 136 (load 5-9).
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import ARGS, losses, weights
from tests.engine.textdata import NO_EVAL

STEPS = ["--max-steps", "4"]
TRAIN = [*ARGS, *STEPS, *NO_EVAL]  # no evaluation at the end (docstring)
COMPILED = {  # name: (processes, flags)
    "tp2": (2, ["--tp", "2"]),
    "tp2-checkpointed": (2, ["--tp", "2", "--activation-checkpointing"]),
    "fsdp2xtp2": (4, ["--tp", "2", "--parallel", "fsdp"]),
}


# Eager --tp 2 first, then each compiled run, in the session's shared launches (launch.Part).
PARTS = {2: Part(__name__, 2, TRAIN), 4: Part(__name__, 4, TRAIN)}
PARTS[2].add("eager", "--tp", "2")
for _name, (_procs, _flags) in COMPILED.items():
    PARTS[_procs].add(_name, *_flags, "--compile")


@pytest.fixture(scope="module")
def launches(shared) -> dict[int, Part]:
    """{processes: this module's part of the session's launch of that many}."""
    return {procs: part.bound(shared) for procs, part in PARTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", COMPILED)
def test_compiled_tp_tracks_eager_tp(launches, name):
    procs = COMPILED[name][0]
    compiled = launches[procs](name).ok()
    launches[2]("eager").ok()
    eager, out = launches[2].root / "eager", launches[procs].root / name
    a, b = losses(eager), losses(out)
    assert len(a) == len(b) == 4, (a, b)
    assert max(abs(x - y) / abs(x) for x, y in zip(a, b, strict=True)) < 1e-6, (a, b)
    wa, wb = weights(eager), weights(out)
    assert wa.keys() == wb.keys()  # compiling in place keeps the names
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-6, msg=k)
    # It compiled, on every rank: graphs for forward and backward, none broken.
    assert len(compiled.dynamo) == procs
    for seen in compiled.dynamo:
        assert seen["stats"]["unique_graphs"] >= 1 and seen["aot_autograd"]["ok"] >= 1, seen
        assert not seen.get("graph_break"), seen["graph_break"]

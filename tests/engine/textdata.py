"""Text data for `--data tests.engine.textdata:train_only`: the bundled synthetic-text task as
`--seed 1 --block-size 32` loads it (tests/engine/test_tensor_parallel.ARGS), its test split cut
to one token: no window of it to evaluate (engine/batches.py: a stream of T tokens holds
(T - 1) // block windows), so a run ends without the evaluation after its last step.

    NO_EVAL  # after ARGS (the last --data counts): the same training samples, no evaluation

For the runs whose tests read only their training losses, weights and counters, where the
evaluation after the last step was a large part of a short run: fp16 (emulated on the CPU) and
--compile (the block compiled again for evaluation); the figures are in the modules that use
it. Eager fp32 runs keep theirs: without it test_tensor_parallel's tp2 and fsdp2xtp2 took 13.1
and 19.8 s of a shared launch, 10.0 and 18.8 s with it in an earlier slow run (another load):
no saving showed (2026-11-28)."""

import dataclasses

from fasttrain.data.tasks import load_task

NO_EVAL = ["--data", "tests.engine.textdata:train_only"]


def train_only():
    task = load_task("synthetic-text", seed=1, block_size=32)
    return dataclasses.replace(task, test_x=task.test_x[:1])

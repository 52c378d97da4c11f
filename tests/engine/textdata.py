"""Text data for `--data tests.engine.textdata:train_only`: the bundled synthetic-text task as
`--seed 1 --block-size 32` loads it (tests/engine/test_tensor_parallel.ARGS), its test split cut
to one token: no window of it to evaluate (engine/batches.py: a stream of T tokens holds
(T - 1) // block windows), so a run ends without the evaluation after its last step."""

import dataclasses

from fasttrain.data.tasks import load_task


def train_only():
    task = load_task("synthetic-text", seed=1, block_size=32)
    return dataclasses.replace(task, test_x=task.test_x[:1])

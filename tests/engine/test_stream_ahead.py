"""The streamed path's order of work on CUDA, checked on the CPU: the copy of batch k+1 is queued
(host side) before batch k is handed to the step, and batch k is handed out only once the step's
stream has been told to wait for its copy. The copies themselves (side stream, event, overlap
with the step's kernels) are checked on a GPU: tests/gpu/test_stream.py."""

from __future__ import annotations

import torch
from torch.utils.data import TensorDataset

from fasttrain.engine import stream, streamdata
from fasttrain.engine.config import TrainConfig

CPU = torch.device("cpu")


class Recorded:
    """SideStreamCopies' interface, writing down what is asked of it, in order."""

    def __init__(self, log: list):
        self.log = log

    def issue(self, batch):
        self.log.append(("copy", int(batch[1][0])))
        return batch, "event"

    def ready(self, batch, event):
        assert event == "event"
        self.log.append(("wait", int(batch[1][0])))
        return batch


def test_the_next_batch_is_copied_before_the_current_one_is_handed_to_the_step():
    cfg = TrainConfig(batch_size=4, device="cpu", max_steps=1000)
    data = TensorDataset(torch.randn(16, 3), torch.arange(16))  # labels name the samples
    s = stream.Stream(streamdata.load({"train": data}, cfg, 1, "test", "why"), cfg, CPU)
    log: list = []
    s.copy_stream = "side stream"  # the CUDA branch, with its CUDA calls recorded instead
    s._copies = lambda: Recorded(log)
    for _, y in s.micro_batches(0):
        log.append(("step", int(y[0])))
    firsts = [b for what, b in log if what == "step"]
    assert len(firsts) == 4
    expected = [("copy", firsts[0])]
    for k, b in enumerate(firsts):
        if k + 1 < len(firsts):
            expected.append(("copy", firsts[k + 1]))  # k+1's copy queued before k's step
        expected += [("wait", b), ("step", b)]
    assert log == expected

"""Batches copied to a CUDA device on a side stream, ahead of the step that uses them
(stream.py's streamed path: `Stream._ahead` issues batch k+1 before handing out batch k)."""

from __future__ import annotations

import torch

from fasttrain.engine import tree


class SideStreamCopies:
    """Host→device copies of batches on `copy_stream`, waited for by the step's stream with an
    event: no host sync. Resolved once per pass (the streams, two events used in turn), since
    everything here runs on the step's thread once a batch: torch.cuda.stream(...) as a context,
    torch.cuda.current_stream() and a new Event per batch cost ~40 Python calls and an event's
    creation and destruction in the driver; a batch's tensors are found in the walk that moves
    them.

    Both streams are on the current device (the engine's: torchrun's LOCAL_RANK is made current
    in distributed.init), so that torch.cuda.set_stream switches no device.

    Two events suffice: batch k's is waited for (`ready`) before batch k+2's copy records it
    again, and a stream's wait_event waits for the record that preceded the wait."""

    def __init__(self, device: torch.device, copy_stream):
        self.device, self.copy = device, copy_stream
        self.step = torch.cuda.current_stream(device)  # the stream the step's kernels run on
        self.events = (torch.cuda.Event(), torch.cuda.Event())
        self.turn = 0

    def issue(self, batch):
        """Queue the copy of `batch` on the side stream; the host does not wait."""
        moved: list[torch.Tensor] = []
        device = self.device

        def move(t: torch.Tensor) -> torch.Tensor:
            t = t.to(device, non_blocking=True)
            moved.append(t)
            return t

        torch.cuda.set_stream(self.copy)
        try:
            batch = tree.map_tensors(batch, move)
        finally:
            torch.cuda.set_stream(self.step)
        done = self.events[self.turn]
        self.turn ^= 1
        done.record(self.copy)
        return batch, moved, done

    def ready(self, batch, moved: list[torch.Tensor], done):
        """`batch`, once the step's stream has been told to wait for its copy."""
        self.step.wait_event(done)  # a device-side wait: the host goes on
        for t in moved:
            t.record_stream(self.step)  # allocated on the copy stream, used on this one
        return batch

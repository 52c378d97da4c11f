"""The streamed path on CUDA: the bundled cnn trained through `fasttrain.build(model="cnn",
data=DataLoader(...))` — a TensorDataset of MNIST-shaped uint8 images and int64 labels, pinned
memory, 2 workers — copies each batch to the device on a CUDA side stream while the step's
kernels run (stream.py: the next batch's copy is issued before the current batch is handed out),
and adds no host sync between logs.

1. Under torch.profiler (CUDA activity), ACTIVE steps after a warm-up: every host→device copy
   ran on a stream where no compute kernel ran, was from pinned memory, and at least
   OVERLAPPING of them overlap in time a compute kernel on the step's stream
   (fasttrain.lab.trace.copy_overlap reads the trace).
2. Sync count (tests/gpu/common.counting_syncs, as in test_train.py): after a warm-up run, a run
   of 2·LOG steps logging once makes exactly as many syncs as a run of LOG steps logging once.

Neither assertion depends on speed; the data are random, so nothing is learnt.
"""

from __future__ import annotations

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

import fasttrain
from fasttrain.lab.trace import copy_overlap
from tests.gpu.common import GPU, counting_syncs

pytestmark = GPU

BATCH = 512
SAMPLES = 32 * BATCH  # 32 steps an epoch: no run below reaches an epoch's end
WAIT, WARMUP, ACTIVE = 2, 3, 20  # profiler schedule, in steps
LOG = 8
# At least 3/4 of the traced copies must overlap a compute kernel. The step is made the
# bottleneck: at batch 512 the fp32 cnn's kernels take a few ms (~110 MFLOP a sample, no TF32),
# longer than the host takes to launch them (~0.1k ops) and than 2 workers take to read a batch
# (512 samples of 784 bytes: ~1–2 ms each). So the host runs ahead and issues batch k+1's copy
# while the kernels of step k and earlier are still queued, and the copy runs beside them. The
# misses allowed: copies issued where the device had just run dry (at the trace's start, after a
# hiccup of the workers) and label copies (4 KiB, ~2 µs) that fall in a gap between two kernels.
# Without the side stream no copy could overlap at all (one stream runs its work in order), so
# 3/4 still tells a working prefetch from a broken one.
OVERLAPPING = 0.75


def streamed_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (SAMPLES, 1, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (SAMPLES,), generator=g)
    data = TensorDataset(x, y)
    data.classes = [str(c) for c in range(10)]  # what tells --model cnn its classes
    return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2, pin_memory=True,
                      persistent_workers=True)


def streamed_run(steps: int, log_every: int):
    run = fasttrain.build(model="cnn", data=streamed_loader(), device="cuda", batch_size=BATCH,
                          max_steps=steps, epochs=10**6, log_every=log_every, lr=1e-3, seed=0,
                          progress=False, verbose=False)
    assert run.batches.path == "streamed" and not run.batches.on_device
    return run


class ProfilerStep:
    """A fit callback: one profiler step per training step."""

    def __init__(self, prof):
        self.prof = prof

    def on_step(self, run) -> None:
        self.prof.step()


def test_batch_copies_run_on_a_side_stream_and_overlap_the_step():
    run = streamed_run(steps=WAIT + WARMUP + ACTIVE + 2, log_every=10**6)  # no log inside
    traced = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: traced.extend(p.events())) as prof:
        fasttrain.fit(run, callbacks=[ProfilerStep(prof)])
    assert traced, "the profiler handed over no trace"
    found = copy_overlap(traced)
    copies, kernel_streams = found["copies"], found["kernel_streams"]
    described = (f"{len(copies)} host→device copies on streams "
                 f"{sorted({c['stream'] for c in copies})}, compute kernels per stream "
                 f"{kernel_streams}")
    # Two tensors (images, labels) a batch, one batch a step: the batches' copies were traced.
    assert len(copies) >= 2 * (ACTIVE - 1), described
    assert not any("Pageable" in c["name"] for c in copies), \
        f"a batch was copied from pageable memory: {[c['name'] for c in copies]}"

    # (a) No copy ran on a stream that ran compute kernels: the copies are on the side stream.
    shared = {c["stream"] for c in copies} & set(kernel_streams)
    assert not shared, f"copies on the compute stream(s) {shared}: {described}"

    # (b) Most copies ran while a compute kernel ran on the step's stream.
    overlapped = [c for c in copies if c["overlap"] > 0]
    share = len(overlapped) / len(copies)
    assert share >= OVERLAPPING, (
        f"only {len(overlapped)} of {len(copies)} copies ({share:.0%}) overlap a compute "
        f"kernel (need {OVERLAPPING:.0%}): {described}; copies (µs, share overlapped): "
        f"{[(round(c['us'], 1), round(c['overlap'], 2)) for c in copies]}")


def test_streamed_path_adds_no_sync_between_logs():
    fasttrain.fit(streamed_run(LOG, LOG))  # warm-up: cuDNN's choice, allocator, workers
    with counting_syncs() as short:
        fasttrain.fit(streamed_run(LOG, LOG))
    with counting_syncs() as long:
        fasttrain.fit(streamed_run(2 * LOG, 2 * LOG))
    assert long.count == short.count, (
        f"{long.count - short.count} more syncs in {LOG} more streamed steps: the streamed "
        f"path syncs. {LOG} steps: {short}; {2 * LOG} steps: {long}")

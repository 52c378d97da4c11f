"""The streamed path on CUDA: the bundled cnn trained through `fasttrain.build(data=DataLoader(
...))` — a TensorDataset of MNIST-shaped uint8 images and int64 labels, pinned memory, 2 workers —
copies each batch to the device on a CUDA side stream ahead of the step (stream.py: batch k+1's
copy is queued before batch k is handed out; tests/engine/test_stream_ahead.py checks that order
on the CPU), the step's stream waiting for it with an event, and adds no host sync between logs.

1. Under torch.profiler (CUDA activity), ACTIVE steps after a warm-up: every host→device copy
   ran on a stream where no compute kernel ran, was from pinned memory, the step's stream was
   told to wait for the copies (cudaStreamWaitEvent), and in steady state (the copies' latter
   half) a compute kernel ran on another stream during 90% of the copying time at least
   (fasttrain.lab.trace.copy_overlap reads the trace, prefetch_faults judges it; both are tested
   on the CPU with synthetic traces in tests/lab/test_trace_prefetch.py).
2. Sync count (tests/gpu/common.counting_syncs, as in test_train.py): after a warm-up run, a run
   of 2·LOG steps logging once makes exactly as many syncs as a run of LOG steps logging once.

Why the step of test 1 is made GPU-bound. A copy runs as soon as it is queued (its stream holds
nothing else), so it overlaps compute only if the GPU is still running earlier steps' kernels when
the host queues it: only where the host runs ahead of the GPU. The first H100 run (2026-11-26)
used the plain fp32 cnn at batch 512, whose step is host-bound there (~3 ms of launches a step,
more under the profiler, for well under that of kernels): the GPU had drained before every copy
was queued, and 0 of 40 copies overlapped although all ran on the side stream — no pipeline, right
or wrong, could have made them overlap, so that test measured the host's speed, not the prefetch.
Here every forward starts with a kernel that keeps the GPU busy SPIN_MS (torch.cuda._sleep,
calibrated with CUDA events), several times the host's time per step, and the test first checks
that premise (compute kernels ran over ≥ 90% of the traced span). Then a working pipeline
overlaps every copy once it has filled, and each way of breaking it overlaps none: a host sync on
the batch path (or a blocking copy) drains the GPU before each copy is queued; copies on the
step's stream run between its kernels, never beside them.

Why the copies' latter half, by time overlapped. On the H200 (2026-11-27) the first 3 batches'
copies (6 of 40) overlapped nothing and all 34 after them did, on a stream without kernels: when
the profiler starts tracing, the host can fall behind the GPU for a few steps, and a copy queued
while the GPU waits for the host has nothing to overlap — so the first criterion (90% of all
copies) measured the host's speed again. The second (each copy in the latter half of the
kernels' span overlaps) found no copy there on the next H200 run: the host had queued all 20
steps within the GPU's first 10, so every copy ran early (a working pipeline, host far ahead),
and the last batch's 1.6 µs labels copy fell in the µs between two kernels. The steady state is
now the latter half of the copies in batch order, and a compute kernel must run during 90% of
their copying time (trace.prefetch_faults); a broken pipeline overlaps none of it.

Neither assertion depends on speed; the data are random, so nothing is learnt.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils.data import DataLoader, TensorDataset

import fasttrain
from fasttrain.lab.trace import copy_overlap, prefetch_faults
from fasttrain.models import build_model
from tests.gpu.common import GPU, counting_syncs

pytestmark = GPU

BATCH = 512
SAMPLES = 32 * BATCH  # 32 steps an epoch: no run below reaches an epoch's end
WAIT, WARMUP, ACTIVE = 2, 3, 20  # profiler schedule, in steps
LOG = 8
SPIN_MS = 20  # GPU time planted in each step: the host takes a few ms per step
BUSY = 0.9  # the premise: compute kernels ran over ≥ 90% of the traced span
STEADY = ACTIVE // 2  # the fewest copies in the latter half that make a verdict


def streamed_loader() -> DataLoader:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (SAMPLES, 1, 28, 28), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (SAMPLES,), generator=g)
    data = TensorDataset(x, y)
    data.classes = [str(c) for c in range(10)]  # what tells --model cnn its classes
    return DataLoader(data, batch_size=BATCH, shuffle=True, num_workers=2, pin_memory=True,
                      persistent_workers=True)


def spin_cycles(ms: float) -> int:
    """Clock cycles of torch.cuda._sleep that keep this GPU busy ~`ms` (timed by CUDA events)."""
    n = 10_000_000
    torch.cuda._sleep(n)  # warm-up: the kernel's first launch
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return max(1, int(n * ms / start.elapsed_time(end)))


class SpinThenCNN(nn.Module):
    """The bundled cnn, its forward preceded by a kernel spinning `cycles` on the GPU."""

    def __init__(self, cycles: int):
        super().__init__()
        self.cycles = cycles
        self.cnn = build_model("cnn", in_shape=(1, 28, 28), num_classes=10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.cuda._sleep(self.cycles)  # queued on the step's stream like any kernel
        return self.cnn(x)


def streamed_run(steps: int, log_every: int, model="cnn"):
    run = fasttrain.build(model=model, data=streamed_loader(), device="cuda", batch_size=BATCH,
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
    model = SpinThenCNN(spin_cycles(SPIN_MS))
    run = streamed_run(steps=WAIT + WARMUP + ACTIVE + 2, log_every=10**6,  # no log inside
                       model=model)
    traced = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 schedule=schedule(wait=WAIT, warmup=WARMUP, active=ACTIVE, repeat=1),
                 on_trace_ready=lambda p: traced.extend(p.events())) as prof:
        fasttrain.fit(run, callbacks=[ProfilerStep(prof)])
    assert traced, "the profiler handed over no trace"
    found = copy_overlap(traced)
    copies, kernel_streams = found["copies"], found["kernel_streams"]
    calls = [e.name for e in traced if e.name.startswith("cuda") and "Sync" in e.name]
    waits = sum(e.name == "cudaStreamWaitEvent" for e in traced)
    described = (f"{len(copies)} host→device copies on streams "
                 f"{sorted({c['stream'] for c in copies})}, compute kernels per stream "
                 f"{kernel_streams}, busy {found['kernel_busy']:.0%} of the span; "
                 f"{waits} cudaStreamWaitEvent, synchronizing calls {calls}")
    assert found["kernel_busy"] >= BUSY, (
        f"the premise failed: the GPU was not the bottleneck ({described}); raise SPIN_MS")
    # Two tensors (images, labels) a batch, one batch a step: the batches' copies were traced.
    assert len(copies) >= 2 * (ACTIVE - 1), described
    assert not any("Pageable" in c["name"] for c in copies), \
        f"a batch was copied from pageable memory: {[c['name'] for c in copies]}"

    # The step's stream waited for the copies on the device, one wait a batch at least.
    assert waits >= ACTIVE - 1, described

    # The copies ran on a stream without compute kernels, and in steady state each beside one.
    faults = prefetch_faults(found, STEADY)
    first = copies[0]["start"]
    timeline = [(round(c["start"] - first), round(c["us"], 1), round(c["overlap"], 2))
                for c in copies]
    assert not faults, (
        f"{'; '.join(faults)}: {described}; copies (start µs from the first's, µs, share "
        f"overlapped): {timeline}")


def test_streamed_path_adds_no_sync_between_logs():
    fasttrain.fit(streamed_run(LOG, LOG))  # warm-up: cuDNN's choice, allocator, workers
    with counting_syncs() as short:
        fasttrain.fit(streamed_run(LOG, LOG))
    with counting_syncs() as long:
        fasttrain.fit(streamed_run(2 * LOG, 2 * LOG))
    assert long.count == short.count, (
        f"{long.count - short.count} more syncs in {LOG} more streamed steps: the streamed "
        f"path syncs. {LOG} steps: {short}; {2 * LOG} steps: {long}")

"""trace.copy_overlap and trace.prefetch_faults, the verdict of tests/gpu/test_stream.py, on
synthetic CUDA traces shaped like that test's: each step a 20 ms spin kernel then the cnn's
kernels on the step's stream (7), each batch two host→device copies (images 10 µs, labels 2 µs)
on the loader's side stream (42). The GPU's own failure (H200, 2026-11-27) and the faults the
verdict must catch are built here, so each can be seen to pass or fail without a GPU."""

from types import SimpleNamespace

import pytest
from torch.autograd import DeviceType

from fasttrain.lab import trace

COPY = "Memcpy HtoD (Pinned -> Device)"
STEP, SIDE = 7, 42
SPIN, CNN = 20_000.0, 40  # µs of the spin kernel; the cnn's kernels, 10 µs each
STEPS = 20


def event(name, stream, start, end):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_resource_id=stream,
                           time_range=SimpleNamespace(start=start, end=end))


def pipeline(host_late=(), drained=(), copy_stream=SIDE):
    """STEPS steps. Batch k+1's copies run early in step k's spin (the host queued them while
    the GPU was busy), except where the host came late to step k (`host_late`) or drained the
    GPU before queuing them (`drained`): then the GPU idles 500 µs before step k+1, and the
    copies run in that gap. Copies on the step's stream run after its step's kernels."""
    events, t = [], 0.0
    for k in range(STEPS):
        gap = k in host_late or k in drained
        copies_at = t + (SPIN + CNN * 10 + 100 if gap or copy_stream == STEP else 1_000)
        events.append(event("sleep_kernel", STEP, t, t + SPIN))
        t += SPIN
        for i in range(CNN):
            events.append(event(f"cnn_kernel_{i}", STEP, t + 1, t + 10))
            t += 10
        events.append(event(COPY, copy_stream, copies_at, copies_at + 10))
        events.append(event(COPY, copy_stream, copies_at + 12, copies_at + 14))
        t += 500 if gap else 2
    return events


def old_share(found):  # the criterion before 2026-11-27: the share of all copies overlapped
    return sum(c["overlap"] > 0 for c in found["copies"]) / len(found["copies"])


def test_a_working_pipeline_overlaps_every_copy():
    found = trace.copy_overlap(pipeline())
    assert found["kernel_streams"] == {STEP: STEPS * (CNN + 1)}
    assert found["kernel_busy"] > 0.99
    assert all(c["overlap"] == 1.0 for c in found["copies"])
    assert trace.prefetch_faults(found, STEPS // 2) == []


def test_the_host_falling_behind_at_the_trace_start_is_not_a_fault():
    """The H200's trace: the first 3 batches' copies (6 of 40) overlapped nothing, the 34 after
    them did. The former criterion (90% of all copies) failed it; the steady state holds."""
    found = trace.copy_overlap(pipeline(host_late={0, 1, 2}))
    assert [c["overlap"] for c in found["copies"][:8]] == [0.0] * 6 + [1.0] * 2
    assert old_share(found) == 34 / 40 < 0.9
    assert found["kernel_busy"] > 0.9  # the GPU test's premise holds
    assert trace.prefetch_faults(found, STEPS // 2) == []


def test_copies_on_the_steps_stream_are_a_fault():
    found = trace.copy_overlap(pipeline(copy_stream=STEP))
    faults = trace.prefetch_faults(found, STEPS // 2)
    assert faults[0] == f"copies ran on stream(s) [{STEP}], which ran compute kernels too"
    assert "overlap no compute kernel" in faults[-1]


def test_copies_after_a_drain_are_a_fault_though_the_gpu_stays_busy():
    """A sync (or a blocking copy) on the batch path: each copy is queued once the GPU has
    drained, so none overlaps, while the spin keeps the GPU busy enough for the premise."""
    found = trace.copy_overlap(pipeline(drained=set(range(STEPS))))
    assert found["kernel_busy"] > 0.9
    steady = [c for c in found["copies"] if c["start"] >= found["steady_from"]]
    assert trace.prefetch_faults(found, STEPS // 2) == [
        f"{len(steady)} of the {len(steady)} copies in the trace's latter half overlap no "
        f"compute kernel"]


@pytest.mark.parametrize("late", [STEPS // 2 + 2, STEPS - 2])
def test_one_copy_missed_in_steady_state_is_a_fault(late):
    found = trace.copy_overlap(pipeline(host_late={late}))
    assert old_share(found) == 38 / 40 >= 0.9  # what the former criterion let through
    assert trace.prefetch_faults(found, STEPS // 2) == [
        "2 of the 20 copies in the trace's latter half overlap no compute kernel"]


def test_too_few_steady_copies_make_no_verdict():
    events = [e for e in pipeline() if e.name != COPY or e.time_range.start < 5 * SPIN]
    found = trace.copy_overlap(events)
    assert trace.prefetch_faults(found, STEPS // 2) == [
        f"0 copies in the trace's latter half, fewer than the {STEPS // 2} a verdict needs"]

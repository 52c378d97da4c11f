"""trace.copy_overlap and trace.prefetch_faults, the verdict of tests/gpu/test_stream.py, on
synthetic CUDA traces shaped like that test's: each step a 20 ms spin kernel then the cnn's
kernels on the step's stream (7), each batch two host→device copies (images 10 µs, labels 2 µs)
on the loader's side stream (42). The GPU's own failure (H200, 2026-11-27) and the faults the
verdict must catch are built here, so each can be seen to pass or fail without a GPU."""

from types import SimpleNamespace

from torch.autograd import DeviceType

from fasttrain.lab import trace

COPY = "Memcpy HtoD (Pinned -> Device)"
STEP, SIDE = 7, 42
SPIN, CNN = 20_000.0, 40  # µs of the spin kernel; the cnn's kernels, 10 µs each
STEPS = 20


def event(name, stream, start, end):
    return SimpleNamespace(name=name, device_type=DeviceType.CUDA, device_resource_id=stream,
                           time_range=SimpleNamespace(start=start, end=end))


def pipeline(host_late=(), drained=(), copy_stream=SIDE, ahead=None):
    """STEPS steps. Batch k+1's copies run early in step k's spin (the host queued them while
    the GPU was busy), except where the host came late to step k (`host_late`) or drained the
    GPU before queuing them (`drained`): then the GPU idles 500 µs before step k+1, and the
    copies run in that gap. Copies on the step's stream run after its step's kernels. `ahead`:
    the host runs far ahead, queuing a step every `ahead` µs, and batch k's copies run at once."""
    events, t = [], 0.0
    for k in range(STEPS):
        gap = k in host_late or k in drained
        copies_at = t + (SPIN + CNN * 10 + 100 if gap or copy_stream == STEP else 1_000)
        if ahead is not None:
            copies_at = k * ahead + 5
        events.append(event("sleep_kernel", STEP, t, t + SPIN))
        t += SPIN
        for i in range(CNN):
            events.append(event(f"cnn_kernel_{i}", STEP, t + 1, t + 10))
            t += 10
        events.append(event(COPY, copy_stream, copies_at, copies_at + 10))
        events.append(event(COPY, copy_stream, copies_at + 12, copies_at + 14))
        t += 500 if gap else 2
    return events


def between_two_kernels(events, copy):
    """`copy` moved into the 1 µs between two of a late step's cnn kernels."""
    kernel = next(e for e in events if e.name == "cnn_kernel_5" and e.time_range.start > 2e5)
    at = kernel.time_range.end + 0.2
    copy.time_range = SimpleNamespace(start=at, end=at + 0.6)


def old_share(found):  # the first criterion: the share of all copies overlapped
    return sum(c["overlap"] > 0 for c in found["copies"]) / len(found["copies"])


def old_latter_half(found):  # the second: the copies in the latter half of the kernels' span
    kernels = [e for e in found["events"] if e.name != COPY]
    lo, hi = min(e.time_range.start for e in kernels), max(e.time_range.end for e in kernels)
    return [c for c in found["copies"] if c["start"] >= (lo + hi) / 2]


def judged(events):
    found = trace.copy_overlap(events)
    found["events"] = events
    return found, trace.prefetch_faults(found, STEPS // 2)


def test_a_working_pipeline_overlaps_every_copy():
    found, faults = judged(pipeline())
    assert found["kernel_streams"] == {STEP: STEPS * (CNN + 1)}
    assert found["kernel_busy"] > 0.99
    assert all(c["overlap"] == 1.0 for c in found["copies"])
    assert faults == []


def test_the_host_falling_behind_at_the_trace_start_is_not_a_fault():
    """The H200's first trace (2026-11-27): the first 3 batches' copies (6 of 40) overlapped
    nothing, the 34 after them did. The first criterion (90% of all copies) failed it."""
    found, faults = judged(pipeline(host_late={0, 1, 2}))
    assert [c["overlap"] for c in found["copies"][:8]] == [0.0] * 6 + [1.0] * 2
    assert old_share(found) == 34 / 40 < 0.9
    assert found["kernel_busy"] > 0.9  # the GPU test's premise holds
    assert faults == []


def test_the_host_running_far_ahead_is_not_a_fault():
    """The H200's second trace: the host queued all 20 steps within the GPU's first 10, so
    every copy ran in the first half of the kernels' span, and the last batch's labels (1.6 µs)
    fell between two kernels. The second criterion (the copies in the latter half of the span,
    each overlapped) found no copy to judge; the copies' latter half, by time overlapped, holds."""
    events = pipeline(ahead=10_000)
    between_two_kernels(events, [e for e in events if e.name == COPY][-1])
    found, faults = judged(events)
    assert old_latter_half(found) == [] and found["copies"][-1]["overlap"] == 0.0
    assert sum(c["overlap"] > 0 for c in found["copies"]) == 39
    assert faults == []


def test_copies_on_the_steps_stream_are_a_fault():
    found, faults = judged(pipeline(copy_stream=STEP))
    assert faults == [
        f"copies ran on stream(s) [{STEP}], which ran compute kernels too",
        "a compute kernel ran during 0% of the copying time of the trace's latter half "
        "(need 90%); 20 of its 20 copies overlap none"]


def test_copies_after_a_drain_are_a_fault_though_the_gpu_stays_busy():
    """A sync (or a blocking copy) on the batch path: each copy is queued once the GPU has
    drained, so none overlaps, while the spin keeps the GPU busy enough for the premise."""
    found, faults = judged(pipeline(drained=set(range(STEPS))))
    assert found["kernel_busy"] > 0.9
    assert faults == ["a compute kernel ran during 0% of the copying time of the trace's "
                      "latter half (need 90%); 20 of its 20 copies overlap none"]


def test_a_drain_in_steady_state_is_a_fault_once_it_recurs():
    """One late step in steady state is the host's hiccup (the H200's traces had none); a
    sync every other step is a broken pipeline."""
    found, faults = judged(pipeline(host_late={STEPS - 2}))
    assert sum(c["overlap"] == 0 for c in found["copies"]) == 2 and faults == []
    found, faults = judged(pipeline(drained=set(range(0, STEPS, 2))))
    assert faults == ["a compute kernel ran during 50% of the copying time of the trace's "
                      "latter half (need 90%); 10 of its 20 copies overlap none"]


def test_too_few_copies_make_no_verdict():
    events = [e for e in pipeline() if e.name != COPY or e.time_range.start < 5 * SPIN]
    found, faults = judged(events)
    assert len(found["copies"]) == 10
    assert faults == [f"5 copies in the trace's latter half, fewer than the {STEPS // 2} a "
                      f"verdict needs"]

"""What a torch.profiler trace says about training steps: each step's time split into input
(waiting for the batch), busy (the device inside an op) and idle (neither); the operators that took
it; and the time of named ops inside chosen steps. `fasttrain.lab.profile` records the trace with
its ranges STEP and INPUT around each step and its fetch.

"The device" is the GPU when training on one: busy = the union of its kernel, memcpy and memset
intervals. On the CPU it is the CPU: busy = the union of the intervals of aten ops (and compiled
graphs), so that idle is the time outside any op — Python, autograd bookkeeping, the loop.
Times in the trace are µs. On a GPU, `copy_overlap` says whether the host→device copies of the
batches ran on their own stream while compute kernels ran (the streamed path's prefetch).
"""

from __future__ import annotations

import bisect
from collections import Counter

from torch.autograd import DeviceType

STEP, INPUT = "fasttrain.step", "fasttrain.input"  # our ranges in the trace
_CPU_OPS = ("aten::", "## Call CompiledFxGraph")  # CPU events that are the device's work


def _is_device_op(event, device_type: str) -> bool:
    if device_type == "cuda":
        # Kernels, memcpy, memset; not the GPU-timeline copies of our record_function ranges.
        return (event.device_type == DeviceType.CUDA
                and not getattr(event, "is_user_annotation", False)
                and "annotation" not in str(getattr(event, "activity_type", "")))
    return event.device_type == DeviceType.CPU and event.name.startswith(_CPU_OPS)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _covered(merged: list[tuple[float, float]], starts: list[float], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the sorted, disjoint intervals `merged`."""
    total, i = 0.0, max(bisect.bisect_right(starts, lo) - 1, 0)
    while i < len(merged) and merged[i][0] < hi:
        total += max(0.0, min(hi, merged[i][1]) - max(lo, merged[i][0]))
        i += 1
    return total


def windows(events, name: str) -> list[tuple[float, float]]:
    """The host's ranges named `name` (µs). On CUDA, Kineto also puts a copy of every
    record_function range on the GPU's timeline ("gpu_user_annotation", a DeviceType.CUDA event
    from the range's first to its last kernel): not a step, and counting it doubled the rows."""
    return sorted((e.time_range.start, e.time_range.end) for e in events
                  if e.name == name and e.device_type == DeviceType.CPU)


def step_rows(events, device_type: str) -> list[dict]:
    """Per traced step: wall, input (waiting), busy and idle (ms), and device ops (count)."""
    ops = [(e.time_range.start, e.time_range.end) for e in events
           if _is_device_op(e, device_type)]
    busy = _union(ops)
    starts = [s for s, _ in busy]
    op_starts = sorted(s for s, _ in ops)
    rows = []
    for i, ((lo, hi), (in_lo, in_hi)) in enumerate(zip(windows(events, STEP),
                                                       windows(events, INPUT), strict=True)):
        in_busy = _covered(busy, starts, in_lo, in_hi)
        wall, on = hi - lo, _covered(busy, starts, lo, hi)
        waiting = (in_hi - in_lo) - in_busy
        rows.append({"step": i, "wall_ms": wall / 1e3, "input_ms": waiting / 1e3,
                     "busy_ms": on / 1e3, "idle_ms": (wall - on - waiting) / 1e3,
                     "ops": bisect.bisect_left(op_starts, hi) - bisect.bisect_left(op_starts, lo)})
    return rows


def steady_steps(rows: list[dict]) -> list[int]:
    """The faster half of the traced steps (indices). A neighbour on the machine can only slow a
    step down, never speed it up, so the fastest steps are the least disturbed (timeit's reason
    for taking the minimum); the class is computed on them."""
    ranked = sorted(range(len(rows)), key=lambda i: rows[i]["wall_ms"])
    return sorted(ranked[:max(1, (len(rows) + 1) // 2)])


def _window(start: float, windows: list[tuple[float, float]], lows: list[float]) -> bool:
    """Whether a time (µs) falls in one of the sorted, disjoint `windows` (`lows`: their starts)."""
    i = bisect.bisect_right(lows, start) - 1
    return i >= 0 and start <= windows[i][1]


def op_times(events, device_type: str, names, windows: list[tuple[float, float]]
             ) -> dict[str, float]:
    """name → seconds per step inside the outermost events named in `names` (an event inside
    another counted op is part of that op's time) that start in one of the step `windows` (µs):
    wall time on the CPU, the time of the kernels they and their children launched on a GPU."""
    names, found = set(names), {}
    windows = sorted(windows)
    lows = [lo for lo, _ in windows]
    for e in events:
        if e.device_type != DeviceType.CPU or e.name not in names:
            continue
        if not _window(e.time_range.start, windows, lows):
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name not in names:
            parent = parent.cpu_parent
        if parent is None:
            us = e.device_time_total if device_type == "cuda" else e.time_range.elapsed_us()
            found[e.name] = found.get(e.name, 0.0) + us * 1e-6 / len(windows)
    return found


def top_ops(events, device_type: str, windows: list[tuple[float, float]], step_ms: float,
            k: int) -> list[dict]:
    """The `k` operators with the most self time a step (on a GPU: their kernels' time, on the
    CPU: their own CPU time), over the steps in `windows` (µs) only: the same steps whose mean
    wall time is `step_ms`, so that each op's share of the step is of the step shown beside it
    (an average over every traced step would mix in the slow first ones)."""
    attr = "self_device_time_total" if device_type == "cuda" else "self_cpu_time_total"
    windows = sorted(windows)
    lows = [lo for lo, _ in windows]
    took, calls = Counter(), Counter()
    for e in events:
        if (e.device_type != DeviceType.CPU or e.name.startswith("fasttrain.")
                or not _window(e.time_range.start, windows, lows)):
            continue
        calls[e.name] += 1
        took[e.name] += getattr(e, attr)
    n = len(windows)
    return [{"op": name, "calls_per_step": calls[name] / n, "self_ms_per_step": us / 1e3 / n,
             "share_of_step": us / 1e3 / n / step_ms if step_ms else None}
            for name, us in took.most_common() if us > 0][:k]


HTOD = "Memcpy HtoD"  # CUPTI's name of a host→device copy: "Memcpy HtoD (Pinned -> Device)"


def copy_overlap(events) -> dict:
    """The host→device copies of a CUDA trace (`prof.events()`) against its compute kernels (the
    kernels that are neither memcpy nor memset). An event's stream is its `device_resource_id`
    (Kineto's resource of a GPU activity is its CUDA stream).

    Returns {"copies": [{"name", "stream", "start", "us", "overlap"}], "kernel_streams": {stream:
    kernels}, "kernel_busy": share} where `copies` are in the order they ran, `overlap` is the
    share (0..1) of a copy's time during which a compute kernel ran on another stream (a stream
    runs its work in order, so only another stream's kernel can run during a copy), and
    `kernel_busy` the share of the time from the first compute kernel's start to the last one's
    end during which one ran: near 1 where the GPU, not the host, set the pace (0 without
    kernels)."""
    ops = [e for e in events if _is_device_op(e, "cuda")]
    kernels = [e for e in ops if not e.name.startswith(("Memcpy", "Memset"))]
    copies = sorted((e for e in ops if e.name.startswith(HTOD)), key=lambda e: e.time_range.start)
    others: dict[int, tuple[list, list]] = {}  # copy stream → the other streams' kernels, merged
    for s in {e.device_resource_id for e in copies}:
        merged = _union([(k.time_range.start, k.time_range.end) for k in kernels
                         if k.device_resource_id != s])
        others[s] = (merged, [lo for lo, _ in merged])
    rows = []
    for e in copies:
        lo, hi = e.time_range.start, e.time_range.end
        merged, starts = others[e.device_resource_id]
        if hi > lo:
            share = _covered(merged, starts, lo, hi) / (hi - lo)
        else:  # a copy shorter than the clock's tick: a point, inside a kernel or not
            share = float(any(a <= lo <= b for a, b in merged))
        rows.append({"name": e.name, "stream": e.device_resource_id, "start": lo, "us": hi - lo,
                     "overlap": share})
    busy = _union([(k.time_range.start, k.time_range.end) for k in kernels])
    span = busy[-1][1] - busy[0][0] if busy else 0.0
    return {"copies": rows, "kernel_streams": dict(Counter(k.device_resource_id for k in kernels)),
            "kernel_busy": sum(e - s for s, e in busy) / span if span > 0 else 0.0}


def prefetch_faults(found: dict, min_steady: int, overlapped: float = 0.9) -> list[str]:
    """What in `copy_overlap(events)` contradicts the streamed path's promise: the batches are
    copied on a stream that runs no compute kernel, and in steady state a compute kernel runs
    while they copy. The steady state is the latter half of the copies in the order they ran
    (batch order): the first half is the pipeline filling, for after the profiler starts tracing
    the host may fall behind the GPU for a few steps, and a copy queued while the GPU waits for
    the host overlaps nothing, however it is issued. It passes where a compute kernel ran during
    `overlapped` (90%) of the steady copies' time at least, not each copy: a copy of 2 µs can
    fall in the µs between two kernels of a GPU busy 99% of the time. A copy on the step's
    stream, or one issued after the host drained the GPU (a sync, a blocking copy), overlaps
    nothing, in either half. `min_steady`: the fewest steady copies that make a verdict. Empty
    where the promise held."""
    copies, kernel_streams = found["copies"], found["kernel_streams"]
    faults = []
    shared = sorted({c["stream"] for c in copies} & set(kernel_streams))
    if shared:
        faults.append(f"copies ran on stream(s) {shared}, which ran compute kernels too")
    steady = copies[len(copies) // 2:]
    if len(steady) < min_steady:
        faults.append(f"{len(steady)} copies in the trace's latter half, fewer than the "
                      f"{min_steady} a verdict needs")
        return faults
    total = sum(c["us"] for c in steady)
    share = sum(c["us"] * c["overlap"] for c in steady) / total if total > 0 else 0.0
    if share < overlapped:
        missed = sum(c["overlap"] == 0 for c in steady)
        faults.append(f"a compute kernel ran during {share:.0%} of the copying time of the "
                      f"trace's latter half (need {overlapped:.0%}); {missed} of its "
                      f"{len(steady)} copies overlap none")
    return faults

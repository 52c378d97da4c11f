"""trace.py on events shaped like a real CUDA trace: two steps of `fasttrain profile --model cnn
--device cuda` on an H100 (torch 2.11+cu130), taken from the gpu-check run of 2026-11-26
(benchmarks/results/gpu-check-2026-11-26-h100/profile-cnn-trace.json.gz): each step's and each
input's range as the CPU recorded it ("user_annotation") and as Kineto copies it onto the GPU's
timeline ("gpu_user_annotation", same External id), three kernels and a memset of each step with
their cudaLaunchKernel / cudaMemsetAsync calls and the "ac2g" flow events that link them.

The events are made into torch's own FunctionEvent the way torch.profiler does from Kineto's
activities (its `activity_type` is the Chrome trace's "cat"; GPU activities are DeviceType.CUDA
with their stream as `device_resource_id`; flow events are not events)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from fasttrain.lab import trace

EXCERPT = Path(__file__).parent / "data" / "h100-profile-steps.json"
_ON_GPU = {"kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"}


def function_events(path: Path = EXCERPT) -> list[FunctionEvent]:
    found = json.loads(path.read_text())["traceEvents"]
    t0 = min(e["ts"] for e in found)  # torch's times start at the trace's start
    events = []
    for i, e in enumerate(found):
        if e.get("ph") != "X":  # "ac2g" flows: links between a launch and its kernel
            continue
        gpu = e["cat"] in _ON_GPU
        events.append(FunctionEvent(
            id=i, name=e["name"], thread=e["tid"], start_us=e["ts"] - t0,
            end_us=e["ts"] - t0 + e["dur"],
            device_type=DeviceType.CUDA if gpu else DeviceType.CPU,
            device_resource_id=e["args"].get("stream", e["tid"]) if gpu else e["tid"],
            is_user_annotation=e["cat"] in ("user_annotation", "gpu_user_annotation"),
            activity_type=e["cat"]))
    return events


def test_a_cuda_trace_has_one_row_per_step_from_the_host_ranges():
    """Kineto puts a GPU-timeline copy of every record_function range into the trace: counting
    those as steps gave two rows per step (tests/gpu/test_lab.py: 40 rows for 20 steps)."""
    events = function_events()
    names = [(e.name, e.activity_type) for e in events if e.is_user_annotation]
    assert names.count((trace.STEP, "gpu_user_annotation")) == 2  # the shape of the real trace
    # the host's ranges (µs from the excerpt's first event), not the GPU's copies of them
    assert trace.windows(events, trace.STEP) == [pytest.approx((0, 7624.208), abs=1e-3),
                                                 pytest.approx((7639.539, 15922.159), abs=1e-3)]
    rows = trace.step_rows(events, "cuda")
    assert len(rows) == 2
    # busy: three kernels (inside the input range: the batch's gather) and a memset
    busy_us = [2.24 + 3.487 + 2.88 + 0.767, 2.304 + 3.488 + 2.912 + 0.768]
    in_input_us = [2.24 + 3.487 + 2.88, 2.304 + 3.488 + 2.912]
    for row, wall, inp, busy, inside in zip(rows, (7624.208, 8282.62), (287.125, 409.006),
                                            busy_us, in_input_us, strict=True):
        assert row["ops"] == 4
        assert row["wall_ms"] == pytest.approx(wall / 1e3)
        assert row["busy_ms"] == pytest.approx(busy / 1e3)
        assert row["input_ms"] == pytest.approx((inp - inside) / 1e3)
        assert row["busy_ms"] + row["idle_ms"] + row["input_ms"] == pytest.approx(row["wall_ms"])


def test_top_ops_count_only_the_steps_given():
    """The ops table is over the same steps as the step time beside it: a slow first step's ops
    (a compile, a cold cache) do not land in the steady steps' shares."""
    def op(i, name, start, us, device=DeviceType.CPU):
        return FunctionEvent(id=i, name=name, thread=0, start_us=start, end_us=start + us,
                             device_type=device)

    events = [op(0, trace.STEP, 0, 900), op(1, "aten::mm", 10, 800),  # a slow first step
              op(2, trace.STEP, 1000, 100), op(3, "aten::mm", 1010, 30),
              op(4, "aten::add", 1050, 20), op(5, trace.STEP, 1200, 100),
              op(6, "aten::mm", 1210, 50)]
    steady = [(1000, 1100), (1200, 1300)]
    ops = trace.top_ops(events, "cpu", steady, step_ms=0.1, k=5)
    assert [o["op"] for o in ops] == ["aten::mm", "aten::add"]
    mm, add = ops
    assert mm["calls_per_step"] == 1 and mm["self_ms_per_step"] == pytest.approx(0.04)
    assert mm["share_of_step"] == pytest.approx(0.4) and add["share_of_step"] == pytest.approx(0.1)
    assert trace.top_ops(events, "cpu", steady, step_ms=0.1, k=1) == [mm]

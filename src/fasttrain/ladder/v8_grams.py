"""cuda-epoch v8's lagged Grams made on the GPU (csrc/v8_grams.cuh, Gram v2's CTA in its V8
instantiation: L = 6 lags, the bias as a 785th pixel of 255) for the v8 probes (ladder/v8_chain.py:
`run`, `run_cluster` and `measure` with grams="gpu"), in chain_inputs' layouts: "grams"
[steps][128][128] (Γ̃_{t,1}) and "gramh" [5][steps][128][128] (Γ̃_{t,j}, j = 2 … 6), every entry
written (0 outside valid row pairs and for t < j), so they equal chain_inputs' NumPy arrays bit
for bit (tests/ladder/test_gram_v2.py runs the kernel's CTA code on the CPU against them).

`time_grams` gives the kernel's µs an epoch by CUDA events (a warm-up launch, then `repeats`
timed launches: median, min, max). Written 2026-11-28 (branch gram6); NOT YET RUN ON A GPU.
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np

ROWS, LAG = 128, 6


def _inputs(inp: dict):
    if "x_u8" not in inp or "order" not in inp:
        raise ValueError("inp must be a chain_inputs() dict holding x_u8 and order")
    return inp["x_u8"], inp["order"]


def _stream(stream, device):
    import torch

    if stream is None and str(device).startswith("cuda"):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    return stream


def gpu_grams(lib, inp: dict, *, device="cuda", stream=None, _dev=None, _out=None):
    """(grams, gramh) as torch tensors on `device`, made by one launch of csrc/v8_chain.cu's
    v8_grams_run from inp's pixels and order (`_dev`: those already on the device; `_out`: the
    two arrays to fill)."""
    import torch

    from fasttrain.ladder.v8_chain import ChainError

    x_u8, order = _inputs(inp)
    n = len(order)
    steps = -(-n // ROWS)
    x, o = _dev if _dev is not None else (
        torch.from_numpy(np.ascontiguousarray(x_u8, np.uint8)).to(device),
        torch.from_numpy(np.ascontiguousarray(order, np.int32)).to(device))
    grams, gramh = _out if _out is not None else (
        torch.empty((steps, ROWS, ROWS), dtype=torch.float32, device=device),
        torch.empty((LAG - 1, steps, ROWS, ROWS), dtype=torch.float32, device=device))
    code = lib.v8_grams_run(ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(o.data_ptr()), n,
                            ctypes.c_void_p(grams.data_ptr()), ctypes.c_void_p(gramh.data_ptr()),
                            _stream(stream, device))
    if code:
        raise ChainError(f"v8_grams_run: {lib.v8_chain_error_name(code).decode()}: "
                         f"{lib.v8_chain_error_string(code).decode()}")
    return grams, gramh


def time_grams(lib, inp: dict, repeats: int = 5, *, device="cuda", stream=None) -> dict:
    """The Gram kernel's µs an epoch (CUDA events around each launch; pixels and order uploaded
    once, outside the timing), and whether its arrays equal inp's NumPy "grams" (and "gramh",
    where inp holds it) bit for bit."""
    import torch

    x_u8, order = _inputs(inp)
    dev = (torch.from_numpy(np.ascontiguousarray(x_u8, np.uint8)).to(device),
           torch.from_numpy(np.ascontiguousarray(order, np.int32)).to(device))
    grams, gramh = gpu_grams(lib, inp, device=device, stream=stream, _dev=dev)  # warm-up
    s = torch.cuda.current_stream() if stream is None else torch.cuda.ExternalStream(stream.value)
    us = []
    for _ in range(repeats):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0.record(s)
        gpu_grams(lib, inp, device=device, stream=stream, _dev=dev, _out=(grams, gramh))
        t1.record(s)
        t1.synchronize()
        us.append(t0.elapsed_time(t1) * 1e3)
    equal = bool(np.array_equal(grams.cpu().numpy(), inp["grams"]))
    if "gramh" in inp:
        equal = equal and bool(np.array_equal(gramh.cpu().numpy(), inp["gramh"]))
    return {"steps": grams.shape[0], "repeats": repeats,
            "us_per_epoch": {"median": statistics.median(us), "min": min(us), "max": max(us),
                             "runs": us},
            "equal_numpy": equal}


def describe_grams(r: dict) -> str:
    u = r["us_per_epoch"]
    return (f"v8 Grams on the GPU (L = {LAG}, bias pixel; {r['steps']} steps): {u['median']:.1f} "
            f"µs an epoch (median of {r['repeats']}, {u['min']:.1f}-{u['max']:.1f}; CUDA events,"
            f" includes the launch); equal to NumPy's bit for bit: {r['equal_numpy']}")

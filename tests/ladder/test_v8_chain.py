"""cuda-epoch v8's chain alone (csrc/v8_chain.cuh's bodies, csrc/v8_chain.cu, ladder/v8_chain.py).

On the CPU the kernel's per-warp bodies run for all 16 warps through V8HostWarp
(tests/ladder/csrc/v8_chain_host.cu): every step's G_t is held to split_precision's fp32 chain
(3xFP16, the same accumulation model) fed the harness's own G_{t−1}, so each step's product is
checked on its own; the free-running logits and loss to float64 plain SGD. Four planted bugs
fail. The .cu compiles for sm_90a within the register cap. On a GPU (marked gpu) the probe's G_t
equal the host emulation's within the same tolerance and its µs a step is finite."""

import ctypes
import dataclasses

import numpy as np
import pytest

from fasttrain.ladder import v8_chain
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import real_data_dir
from tests.ladder import split_precision as sp
from tests.ladder.host_harness import compile_harness, ptr
from tests.ladder.lagged_reference import softmax_grad
from tests.ladder.test_lagged_gram import random_uint8

G_ATOL = 5e-9
"""max |G_t − G_t(split_precision's chain)| a step, fed the same G_{t−1}, for its 3xFP16 product
(same accumulation model) and its fp32 SIMT one: ~5 fp32 ulps of G's largest entries (1/88 <
2⁻⁶, an ulp 2⁻³⁰ = 9.3e-10). The kernel sums its two K halves by one fp32 add where the emulation
runs one chain, and its exp, division and sums are C's, not NumPy's. Measured here (2026-11-28):
1.2e-9 to 2.8e-9 on 600 random rows and the 31-step MNIST slice, acc rn and rz; the planted
bugs 6.1e-7 (lo dropped) to 2.9e-3. PRODUCT_ATOL (1e-7, on the weights) is the chain's budget
after the workers' updates; this is the step's own, before them."""
Z64_ATOL = 1e-4
"""max |Z_t − Z_t(float64 plain SGD)|, free running (errors do not compound: P_t + Q_t are
float64's)."""


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness("tests/ladder/csrc/v8_chain_host.cu", tmp_path_factory.mktemp("v8c"))
    lib.v8_chain_host.restype = ctypes.c_int
    lib.v8_chain_host.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int, ctypes.c_float] + \
        [ctypes.c_int] * 2 + [ctypes.c_void_p] * 3
    return lib


def inputs(data):
    return v8_chain.chain_inputs(data.train_x, data.train_y, data.orders[0], data.w0, data.b0,
                                 LadderConfig().lr)


@pytest.fixture(scope="module")
def small():
    """600 random uint8 rows: 5 steps, the last of 88 rows."""
    return inputs(make_ladder_data(random_uint8(600), LadderConfig(epochs=1)))


@pytest.fixture(scope="module")
def mnist():
    """The split-precision tests' slice: 30 × 128 + 96 real MNIST rows, 31 steps."""
    if real_data_dir() is None:
        pytest.skip("set FASTTRAIN_DATA to a folder holding mnist/ to run")
    from fasttrain.data import load_dataset

    d = load_dataset("mnist", real_data_dir())
    n = 30 * 128 + 96
    d = dataclasses.replace(d, train_x=d.train_x[:n], train_y=d.train_y[:n])
    return inputs(make_ladder_data(d, LadderConfig(epochs=1)))


def run_host(lib, inp, rz=False, bug=0):
    steps = inp["grams"].shape[0]
    g = np.full((steps, 128, 10), np.nan, np.float32)
    z = np.full_like(g, np.nan)
    stats = np.zeros(2, np.float32)
    assert lib.v8_chain_host(ptr(inp["grams"]), ptr(inp["pq"]), ptr(inp["labels"]), inp["n"],
                             float(inp["c"]), int(rz), bug, ptr(g), ptr(z), ptr(stats)) == 0
    return g, z, stats


def rows(inp, t):
    return min(128, inp["n"] - 128 * t)


def reference_g(inp, g_in, scheme, accumulate):
    """Step t's G by split_precision's product `scheme` (from zero) on P_t + Q_t and g_in's
    G_{t−1}, then its fp32 softmax: one step at a time, so a step's error stays its own."""
    prod = sp.product(scheme, accumulate=accumulate, from_zero=True)
    out = np.zeros_like(g_in)
    for t in range(inp["grams"].shape[0]):
        n = rows(inp, t)
        acc = inp["pq"][t, :n].copy()
        if t:
            m = rows(inp, t - 1)
            acc = prod(acc, inp["grams"][t, :n, :m], g_in[t - 1, :m], inp["c"])
        out[t, :n], _ = softmax_grad(acc, inp["labels"][t, :n])
    return out


def errors(inp, got, rz):
    g, z, stats = got
    steps = inp["grams"].shape[0]
    valid = np.arange(128)[None, :] < np.array([rows(inp, t) for t in range(steps)])[:, None]
    acc = "rz" if rz else "rn"
    return {
        "g_3xfp16": float(np.abs(g - reference_g(inp, g, "3xFP16", acc)).max()),
        "g_fp32": float(np.abs(g - reference_g(inp, g, "fp32", acc)).max()),
        "z64": float(np.abs(z[valid] - inp["z64"][valid]).max()),
        "g64": float(np.abs(g[valid] - inp["g64"][valid]).max()),
        "loss_rel": abs(float(stats[0]) - inp["loss64"]) / inp["loss64"],
        "padding_zero": bool((g[~valid] == 0).all()),
    }


@pytest.mark.parametrize("rz", [False, True], ids=["acc rn", "acc rz"])
@pytest.mark.parametrize("which", ["small", "mnist"])
def test_host_chain_matches_the_fp32_chain_and_float64(lib, request, which, rz):
    inp = request.getfixturevalue(which)
    e = errors(inp, run_host(lib, inp, rz), rz)
    print(which, rz, e)
    assert e["padding_zero"], e
    assert e["g_3xfp16"] <= G_ATOL and e["g_fp32"] <= G_ATOL, e
    assert e["z64"] <= Z64_ATOL and e["loss_rel"] <= 1e-5, e


@pytest.mark.parametrize("bug", [1, 2, 3, 4], ids=["scale", "n", "lo dropped", "quad width"])
def test_planted_bugs_fail(lib, small, bug):
    e = errors(small, run_host(lib, small, bug=bug), False)
    print(bug, e)
    assert e["g_3xfp16"] > G_ATOL, e

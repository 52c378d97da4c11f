"""cuda-epoch v8's workers alone (`csrc/v8_workers.cuh`, design step 3 of
docs/measurements/cuda-epoch-v8-design.md) on the CPU: the same per-thread and per-warp bodies the
kernel runs (`csrc/v8_workers.cu`), compiled by nvcc for the host (`tests/ladder/csrc/
v8_workers_host.cu`: every thread and warp of the 56 worker CTAs, the tensor-core product emulated
by V8HostWarp) for a whole epoch with G' given, against a float64 NumPy reference of the folded-bias
algebra: W̃ after the epoch and P_t of every step and cluster.

The tolerance, derived: every compared value is a sum the kernel evaluates in fp32 at most ~32
roundings deep (P_t: 14 products and the bias slot, 8 partials, one scale; an update: 64 rows a
thread or four m16n8k16 sums, one scale, one subtraction), and the hi/lo pieces hold 22 bits (2⁻²²
of each W̃ entry). So |error| ≤ RTOL · (the same sum of absolute values), RTOL = 32·2⁻²⁴ ≈ 1.9e-6:
for W̃, |W̃_0| + Σ_a (lr/255)·|X̃_a|ᵀ|G_a|; for P_t, |X̃_t|·that / 255. "fp32-level": ~1e-6 relative.
mma-scatter's ring (arms, credit waits, st.async's complete_tx, slot waits, credits) also runs
alone over emulated mbarriers under random schedules. The kernel itself (the hardware's side of
st.async, the mbarriers, the cluster barrier, DSMEM) is only checked by the GPU tests at the bottom
(marker `gpu`).

A whole MNIST epoch on the host is a command, not a test (57 s here for acc rn and rz, 2-core
EPYC shared with other engineers, load ~2):

    FASTTRAIN_DATA=/work/shared/data PYTHONPATH=src python -m tests.ladder.test_v8_workers

G' from float64 plain SGD on MNIST (epoch 0's order), max |W̃ − float64| after the epoch (max |W̃|
0.44): simt 4.1e-7; mma 4.4e-7 (acc rn), 4.1e-7 (acc rz). So the tensor-core workers are as
far from float64 as v7's fp32 SIMT bodies given the same G'."""

import ctypes

import numpy as np
import pytest

from fasttrain.ladder import v8_workers
from tests.ladder.host_harness import compile_harness, ptr

HARNESS = "tests/ladder/csrc/v8_workers_host.cu"
K, C, BMAX, LAG, CLUSTERS, FEATS = 784, 10, 128, 6, 7, 112
VARIANTS = {"simt": 0, "mma": 1, "mma-scatter": 2}
RTOL = v8_workers.RTOL
BUGS = {1: "the update's G' lo piece left out",
        2: "the partials' W̃ scale undone twice (× 2⁻¹⁶)",
        3: "the bias slot left out",
        4: "the scatter's inbox row off by one",
        5: "the scatter's deferred reduce reading the next step's slot"}
BUG_VARIANTS = {1: VARIANTS, 2: ["mma"], 3: VARIANTS, 4: ["mma-scatter"], 5: ["mma-scatter"]}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("v8w"))
    i32, p = ctypes.c_int, ctypes.c_void_p
    lib.v8w_host_epoch.argtypes = [i32] * 5 + [ctypes.c_float] + [p] * 7
    lib.v8w_host_epoch.restype = i32
    return lib


def make_epoch(n, bs=128, seed=0, lr=0.1):
    return v8_workers.epoch_inputs(n, bs, seed, lr)


def reference(ep):
    return v8_workers.reference(ep)


def run_host(lib, ep, variant, rz=False, bug=0):
    steps = -(-ep["n"] // ep["bs"])
    p = np.full((steps, CLUSTERS, BMAX, C), np.nan, np.float32)
    w = np.full((K + 1, C), np.nan, np.float32)
    rc = lib.v8w_host_epoch(VARIANTS[variant], int(rz), bug, ep["n"], ep["bs"], ep["lr"],
                            ptr(ep["x"]), ptr(ep["order"]), ptr(ep["gh"]), ptr(ep["gl"]),
                            ptr(ep["w0"]), ptr(p), ptr(w))
    assert rc == 0
    return p, w


def errors(ep, got, ref):
    """The worst error over the tolerance, for P and W̃ (≤ 1 passes)."""
    return v8_workers.check_errors(*got, ref)


@pytest.fixture(scope="module")
def small():
    ep = make_epoch(600)  # 5 steps: 4 of 128 and the last of 88
    return ep, reference(ep)


def test_layout_constants_match(lib):
    assert lib.v8w_host_lag() == LAG


@pytest.mark.parametrize("rz", [False, True], ids=["acc rn", "acc rz"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_host_epoch_equals_float64(lib, small, variant, rz):
    if rz and variant == "simt":
        pytest.skip("simt has no tensor-core accumulation to round")
    ep, ref = small
    err_p, err_w = errors(ep, run_host(lib, ep, variant, rz), ref)
    assert err_p <= 1 and err_w <= 1, (err_p, err_w)


def test_host_epoch_long_lag_window(lib):
    """20 steps (L = 6: updates applied before P_t from step 7 on, the x ring wrapping twice), the
    last batch 96 rows, as MNIST's."""
    ep = make_epoch(19 * 128 + 96, seed=1)
    ref = reference(ep)
    for variant in VARIANTS:
        err_p, err_w = errors(ep, run_host(lib, ep, variant), ref)
        assert err_p <= 1 and err_w <= 1, (variant, err_p, err_w)


@pytest.mark.parametrize("bug", list(BUGS), ids=list(BUGS.values()))
def test_planted_bugs_fail(lib, small, bug):
    ep, ref = small
    for variant in BUG_VARIANTS[bug]:
        err_p, err_w = errors(ep, run_host(lib, ep, variant, bug=bug), ref)
        assert max(err_p, err_w) > 1, (variant, err_p, err_w)


PROTOCOL_BUGS = {6: "the sender not waiting for its credits",
                 7: "the credit wait's parity one phase late",
                 8: "the owner's slot wait's parity one phase early"}
PROTOCOL_RESULTS = {0: "ok", -1: "deadlock", -2: "a send over an unread slot",
                    -3: "a read of another step's rows"}


@pytest.mark.parametrize("ns", [2, 3, 4])
def test_scatter_ring_protocol_under_random_schedules(lib, ns):
    """mma-scatter's arms, credit waits, sends, slot waits and credits (one cluster, emulated
    mbarriers with tx-counts and phase parities, 200 random interleavings of 23 steps: the ring
    wraps 5-11 times): never a deadlock, an overwrite or a stale read. The kernel's ring has 4
    slots; at 2 and 3 the credits are what keeps a sender off an unread slot (without them every
    schedule tried overwrote one; at 4 none did: a sender's step t waits for its peers' step t − 2,
    sent after they read step t − 4)."""
    got = {lib.v8w_host_scatter_protocol(ns, 23, seed, 0) for seed in range(200)}
    assert got == {0}, [PROTOCOL_RESULTS.get(g, g) for g in got]


@pytest.mark.parametrize("bug", list(PROTOCOL_BUGS), ids=list(PROTOCOL_BUGS.values()))
def test_scatter_ring_protocol_planted_bugs_fail(lib, bug):
    """Each planted bug shows in some schedule: with 2 and 3 slots (the credits binding), and the
    two parity bugs also with the kernel's 4 (7 as a deadlock, 8 as a stale read or deadlock)."""
    for ns in (2, 3) if bug == 6 else (2, 3, 4):
        got = {lib.v8w_host_scatter_protocol(ns, 23, seed, bug) for seed in range(200)}
        assert got - {0}, (ns, "no schedule caught it")


# ---- the kernel: one sm_90a compile for all three variants --------------------------------------
KERNEL = "v8_workers.cu"
# HMMA.16816.F32 a kernel's SASS (nvcc 13.0): the update's 4 (2 k-steps × hi, lo) appear twice (in
# the step loop and in the drain after it), the partials' 2 once; simt has none.
HMMA = {0: 0, 1: 10, 2: 10}


def test_kernel_compiles_without_spill_within_the_launch_bound(tmp_path):
    """nvcc -arch=sm_90a -Xptxas -v (~4 CPU-s): each variant's kernel 0 stack, 0 spill and at most
    128 registers (512 threads, __launch_bounds__(512, 1)); with Triton's cuobjdump, the SASS's
    HMMA counts above and st.async (STAS) only in mma-scatter."""
    import re

    from fasttrain.ladder import build
    from tests.ladder.host_harness import compile_sm90, registers, sass_functions

    report, cubin = compile_sm90(build.CSRC / KERNEL, tmp_path)
    for v in VARIANTS.values():
        assert max(registers(report, rf"v8_workers_kernelILi{v}E")) <= 128, v
    functions = sass_functions(cubin)
    for v, count in HMMA.items():
        body = next(b for name, b in functions.items()
                    if re.match(rf"\w*v8_workers_kernelILi{v}E", name))
        assert len(re.findall(r"\bHMMA\.16816\.F32\b", body)) == count, v
        assert (len(re.findall(r"\bSTAS\b", body)) > 0) == (v == VARIANTS["mma-scatter"]), v


# ---- ladder/v8_workers.py: arguments and reporting (CPU), the kernel itself (gpu) --------------
@pytest.mark.parametrize("kwargs", [{"variants": ("mma", "tf32")}, {"variants": ()},
                                    {"repeats": 0}, {"repeats": 1.5}])
def test_measure_rejects_bad_arguments_in_one_line(kwargs):
    with pytest.raises(ValueError) as e:
        v8_workers.measure(lib=object(), **kwargs)
    assert "\n" not in str(e.value)


def test_step_figures_and_describe():
    """A fabricated record: 56 CTAs, CTA i's span 2,000,000 + 1,000·i² ns over 469 steps, thread
    0's clocks split 1:2:3:4 → the median span (i = 27, 28: 2,756.5 µs, not the mean's 3,017.5)
    / 469 = 5.88 µs a step, the reduce 40 % of it."""
    steps = 469
    out = np.zeros((56, len(v8_workers.OUT)), np.int64)
    out[:, 0] = 10**9
    out[:, 1] = 10**9 + 2_000_000 + 1_000 * np.arange(56) ** 2
    out[:, 2:6] = [1000, 2000, 3000, 4000]
    out[:, 6] = np.arange(56) * 2
    fig = v8_workers.step_figures(out, steps)
    assert fig["us_per_step"] == pytest.approx(2_756.5 / steps)
    assert fig["phases_us"]["reduce"] == pytest.approx(0.4 * 2_756.5 / steps)
    assert fig["sms"] == 56
    result = {"config": {"steps": steps, "batch": 128, "lag": 6, "repeats": 3},
              "simt": {"us_per_step": {"median": 4.32, "min": 4.3, "max": 4.4}, "per_repeat": [],
                       "phases_us": fig["phases_us"], "sms": 56,
                       "check": {"p_err": 0.05, "w_err": 0.01, "ok": True}},
              "mma-scatter": "mma-scatter: a wait timed out (g_signal_error 0x1a)"}
    lines = v8_workers.describe(result)
    assert len(lines) == 3 and "4.32 µs a step" in lines[1] and "check ok" in lines[1]
    assert lines[2].endswith("timed out (g_signal_error 0x1a)")
    out[3, 1] = -1
    with pytest.raises(v8_workers.ProbeError):
        v8_workers.step_figures(out, steps)


def _gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return v8_workers.load_library()


@pytest.mark.gpu
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_kernel_equals_float64_on_the_gpu(variant, small):
    lib = _gpu()
    ep, ref = small
    p, w, out = v8_workers.run(lib, ep, variant)
    err_p, err_w = v8_workers.check_errors(p, w, ref)
    assert err_p <= 1 and err_w <= 1, (err_p, err_w)
    fig = v8_workers.step_figures(out, 5)
    assert np.isfinite(fig["us_per_step"]) and fig["us_per_step"] > 0


@pytest.mark.gpu
def test_measure_on_the_gpu_a_whole_epoch():
    lib = _gpu()
    r = v8_workers.measure(lib, repeats=2)
    for v in VARIANTS:
        assert isinstance(r[v], dict), r[v]
        assert r[v]["check"]["ok"], r[v]["check"]
        assert 0 < r[v]["us_per_step"]["median"] < 1e3
    print("\n".join(v8_workers.describe(r)))


# ---- a real MNIST epoch on the host: a command, not a test (~25-40 s of CPU here) --------------
def mnist_epoch_errors(lib, variants=("simt", "mma"), rz=False):
    """One MNIST epoch's rows in its first order, with G' from float64 plain SGD (p − onehot of
    the real model, ×2¹², split hi/lo): max |W̃ − float64| for each variant on the host."""
    from fasttrain.data.sources import load_dataset
    from fasttrain.ladder.common import LadderConfig, make_ladder_data
    from tests.conftest import real_data_dir

    d = real_data_dir()
    if d is None:
        raise SystemExit("set FASTTRAIN_DATA to a folder holding mnist/")
    data = make_ladder_data(load_dataset("mnist", d), LadderConfig(epochs=1))
    ep = v8_workers.epoch_inputs(x=data.train_x)
    ep["order"] = data.orders[0].astype(np.int32)
    ep["w0"] = np.ascontiguousarray(np.concatenate([data.w0.T, data.b0[None]], 0), np.float32)
    xs = data.train_x[ep["order"]].astype(np.float64)
    y = data.train_y[ep["order"]]
    w, b = data.w0.T.astype(np.float64), data.b0.astype(np.float64)
    bs, steps = ep["bs"], len(ep["gh"])
    g = np.zeros((steps, BMAX, 16), np.float32)
    for t in range(steps):  # plain SGD (the lagged chain's values, exactly: the folded bias)
        xb, yb = xs[t * bs:t * bs + bs] / 255, y[t * bs:t * bs + bs]
        z = xb @ w + b
        pr = np.exp(z - z.max(1, keepdims=True))
        pr /= pr.sum(1, keepdims=True)
        pr[np.arange(len(yb)), yb] -= 1
        g[t, :len(yb), :C] = pr * 4096
        w -= ep["lr"] * xb.T @ pr / len(yb)
        b -= ep["lr"] * pr.sum(0) / len(yb)
    ep["gh"] = g.astype(np.float16)
    ep["gl"] = (g - ep["gh"].astype(np.float32)).astype(np.float16)
    _, rw, _, _ = v8_workers.reference(ep)
    return {v: float(np.abs(run_host(lib, ep, v, rz)[1] - rw).max()) for v in variants} | {
        "max |W̃|": float(np.abs(rw).max()),
        "float64 plain SGD vs the reference": float(np.abs(
            np.concatenate([w, b[None]]) - rw).max())}


if __name__ == "__main__":
    import tempfile
    from pathlib import Path

    lib_ = compile_harness(HARNESS, Path(tempfile.mkdtemp()))
    lib_.v8w_host_epoch.argtypes = [ctypes.c_int] * 5 + [ctypes.c_float] + [ctypes.c_void_p] * 7
    for rz_ in (False, True):
        print("acc rz" if rz_ else "acc rn", mnist_epoch_errors(lib_, rz=rz_))

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
The kernel itself (st.async, the mbarriers' credits, the cluster barrier) is only checked by the
GPU tests at the bottom (marker `gpu`)."""

import ctypes

import numpy as np
import pytest

from tests.ladder.host_harness import compile_harness, ptr

HARNESS = "tests/ladder/csrc/v8_workers_host.cu"
K, C, BMAX, LAG, CLUSTERS, FEATS = 784, 10, 128, 6, 7, 112
VARIANTS = {"simt": 0, "mma": 1, "mma-scatter": 2}
RTOL = 32 * 2.0**-24
BUGS = {1: "the update's G' lo piece left out",
        2: "the partials' W̃ scale undone twice (× 2⁻¹⁶)",
        3: "the bias slot left out",
        4: "the scatter's inbox row off by one"}
BUG_VARIANTS = {1: VARIANTS, 2: ["mma"], 3: VARIANTS, 4: ["mma-scatter"]}


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("v8w"))
    i32, p = ctypes.c_int, ctypes.c_void_p
    lib.v8w_host_epoch.argtypes = [i32] * 5 + [ctypes.c_float] + [p] * 7
    lib.v8w_host_epoch.restype = i32
    return lib


def make_epoch(n, bs=128, seed=0, lr=0.1):
    """Random uint8 rows, an order, G' = (p − y)·2¹² with |p − y| ≤ 1 split into fp16 hi/lo
    ([steps][128][16], 0 past each batch and at classes ≥ 10), and a random W̃_0 ([785][10])."""
    rng = np.random.default_rng(seed)
    steps = -(-n // bs)
    x = rng.integers(0, 256, size=(n, K), dtype=np.uint8)
    order = rng.permutation(n).astype(np.int32)
    g = np.zeros((steps, BMAX, 16), np.float32)
    for t in range(steps):
        nt = min(bs, n - t * bs)
        g[t, :nt, :C] = rng.uniform(-1, 1, size=(nt, C)) * 4096
    hi = g.astype(np.float16)
    lo = (g - hi.astype(np.float32)).astype(np.float16)
    w0 = (rng.standard_normal((K + 1, C)) * 0.01).astype(np.float32)
    return dict(n=n, bs=bs, lr=lr, x=x, order=order, gh=hi, gl=lo, w0=w0)


def reference(ep):
    """float64: (P [steps][7][128][10] (NaN past each batch), W̃, and the magnitudes the
    tolerance is relative to)."""
    n, bs, lr = ep["n"], ep["bs"], ep["lr"]
    steps = -(-n // bs)
    xt = np.concatenate([ep["x"][ep["order"]].astype(np.float64), np.full((n, 1), 255.0)], 1)
    gp = ep["gh"].astype(np.float64) + ep["gl"].astype(np.float64)
    w = ep["w0"].astype(np.float64)
    wmag = np.abs(w)
    feats = [list(range(FEATS * k, FEATS * (k + 1))) + ([K] if k == CLUSTERS - 1 else [])
             for k in range(CLUSTERS)]
    p = np.full((steps, CLUSTERS, BMAX, C), np.nan)
    pmag = np.full_like(p, np.nan)
    applied = 0

    def update(a):
        nonlocal w, wmag
        rows = xt[a * bs:a * bs + bs]
        ga = gp[a, :len(rows), :C] * 2.0**-12 / len(rows)
        w = w - lr / 255 * rows.T @ ga
        wmag = wmag + lr / 255 * np.abs(rows).T @ np.abs(ga)

    for t in range(steps):
        for a in range(applied, max(t - LAG, 0)):
            update(a)
        applied = max(applied, t - LAG)
        rows = xt[t * bs:t * bs + bs]
        for k, f in enumerate(feats):
            p[t, k, :len(rows)] = rows[:, f] @ w[f] / 255
            pmag[t, k, :len(rows)] = rows[:, f] @ wmag[f] / 255
    for a in range(applied, steps):
        update(a)
    return p, w, pmag, wmag


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
    p, w = got
    rp, rw, pmag, wmag = ref
    valid = ~np.isnan(rp)
    ep_ = np.abs(p[valid] - rp[valid]) / (RTOL * pmag[valid] + 1e-30)
    ew = np.abs(w - rw) / (RTOL * wmag + 1e-30)
    return float(ep_.max()), float(ew.max())


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
    import subprocess
    from pathlib import Path

    from fasttrain.ladder import build

    nvcc = build.find_nvcc()
    if nvcc is None:
        pytest.skip("nvcc not found on PATH")
    cubin = tmp_path / "v8w.cubin"
    r = subprocess.run([nvcc, "-O3", "-std=c++17", "-arch=sm_90a", "-cubin", "-Xptxas", "-v",
                        f"-I{build.CSRC}", str(build.CSRC / KERNEL), "-o", str(cubin)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    for v in VARIANTS.values():
        props = re.search(rf"Function properties for \w*v8_workers_kernelILi{v}E\w*\n\s*"
                          rf"0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                          rf".*?Used (\d+) registers", r.stderr, re.S)
        assert props and int(props.group(1)) <= 128, (v, r.stderr[-3000:])
    try:
        import triton
    except ImportError:
        pytest.skip("no Triton, so no cuobjdump to read the SASS")
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not cuobjdump.exists():
        pytest.skip(f"this Triton has no {cuobjdump}")
    sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True,
                          text=True).stdout
    functions = re.split(r"\n\s*Function : ", sass)
    for v, count in HMMA.items():
        body = next(f for f in functions if re.match(rf"\w*v8_workers_kernelILi{v}E", f))
        assert len(re.findall(r"\bHMMA\.16816\.F32\b", body)) == count, v
        assert (len(re.findall(r"\bSTAS\b", body)) > 0) == (v == VARIANTS["mma-scatter"]), v

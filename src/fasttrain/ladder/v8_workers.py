"""cuda-epoch v8's workers alone, as a GPU probe (docs/measurements/cuda-epoch-v8-design.md,
"Build first" step 3): what a worker step costs when nothing waits for G.

`csrc/v8_workers.cu` runs the 56 worker CTAs (7 clusters of 8, one CTA an SM) for one epoch of
MNIST's shape (60,000 rows, batch 128: 469 steps, the last of 96) with every G'_a written before
the launch, in three variants: `simt` (v7's worker bodies, cluster barrier + DSMEM reduce: the
baseline, v7a measured ~3.1 µs a step without its G wait and publish on an H200), `mma` (update
and partials on the tensor cores, hi/lo fp16 pieces) and `mma-scatter` (as mma, the reduce a
reduce-scatter by st.async into mbarrier-tracked inbox slots, no cluster barrier). The figure is µs
a step: the median over the 56 CTAs of (end − start) / steps, globaltimer stamps; the phase split
is thread 0's clock64 sums scaled to that span. Every run's P_t and W̃ are held to the float64
reference within RTOL (the host test's derivation, tests/ladder/test_v8_workers.py).

Not yet run on a GPU: the kernel is compiled and its arithmetic runs on the CPU (the host harness).

    from fasttrain.ladder import v8_workers
    print("\\n".join(v8_workers.describe(v8_workers.measure())))
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np

SOURCE = "v8_workers.cu"
VARIANTS = {"simt": 0, "mma": 1, "mma-scatter": 2}
K, C, BMAX, LAG, CLUSTERS, FEATS, CTAS = 784, 10, 128, 6, 7, 112, 56
RTOL = 32 * 2.0**-24  # fp32 sums ≤ ~32 roundings deep, relative to the sum of |terms|
N_MNIST, BATCH, LR = 60_000, 128, 0.1
# The kernel's per-CTA int64 record (v8_workers.cu's V8Out; checked at load).
OUT = ("start_ns", "end_ns", "clk_load", "clk_update", "clk_partials", "clk_reduce", "smid")
PHASES = ("load", "update", "partials", "reduce")


class ProbeError(RuntimeError):
    """The probe could not run, or a wait in it timed out; str(e) is one line."""


def epoch_inputs(n=N_MNIST, bs=BATCH, seed=0, lr=LR, x=None) -> dict:
    """An epoch's inputs: uint8 rows `x` (random if None: the timing does not depend on the
    values), an order, G' = (p − y)·2¹² with |p − y| ≤ 1 split into fp16 hi/lo ([steps][128][16],
    0 past each batch and at classes ≥ 10), and a random W̃_0 ([785][10], row 784 the bias)."""
    rng = np.random.default_rng(seed)
    if x is None:
        x = rng.integers(0, 256, size=(n, K), dtype=np.uint8)
    x = np.ascontiguousarray(x, dtype=np.uint8)
    n = len(x)
    steps = -(-n // bs)
    order = rng.permutation(n).astype(np.int32)
    g = np.zeros((steps, BMAX, 16), np.float32)
    for t in range(steps):
        nt = min(bs, n - t * bs)
        g[t, :nt, :C] = rng.uniform(-1, 1, size=(nt, C)) * 4096
    hi = g.astype(np.float16)
    lo = (g - hi.astype(np.float32)).astype(np.float16)
    w0 = (rng.standard_normal((K + 1, C)) * 0.01).astype(np.float32)
    return dict(n=n, bs=bs, lr=lr, x=x, order=order, gh=hi, gl=lo, w0=w0)


def reference(ep: dict):
    """float64 of the folded-bias algebra: (P [steps][7][128][10] (NaN past each batch), W̃ after
    the epoch, and the sums of |terms| that RTOL is relative to, for P and for W̃)."""
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

    def update(a):
        nonlocal w, wmag
        rows = xt[a * bs:a * bs + bs]
        ga = gp[a, :len(rows), :C] * 2.0**-12 / len(rows)
        w = w - lr / 255 * rows.T @ ga
        wmag = wmag + lr / 255 * rows.T @ np.abs(ga)

    applied = 0
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


def check_errors(p, w, ref) -> tuple[float, float]:
    """The worst |error| / (RTOL · |terms|) of P and of W̃: ≤ 1 passes."""
    rp, rw, pmag, wmag = ref
    valid = ~np.isnan(rp)
    ep = np.abs(p[valid] - rp[valid]) / (RTOL * pmag[valid] + 1e-30)
    ew = np.abs(w - rw) / (RTOL * wmag + 1e-30)
    return float(np.nan_to_num(ep, nan=np.inf).max()), float(np.nan_to_num(ew, nan=np.inf).max())


def load_library() -> ctypes.CDLL:
    """Build (once, cached) and load the kernel, its entry points typed and its layout checked."""
    from fasttrain.ladder import build

    lib = build.load(SOURCE)
    i32, p = ctypes.c_int, ctypes.c_void_p
    lib.v8w_run.argtypes = [i32, i32, i32, ctypes.c_float] + [p] * 9 + [ctypes.POINTER(i32)]
    lib.v8w_run.restype = i32
    lib.v8w_error_name.argtypes = [i32]
    lib.v8w_error_name.restype = ctypes.c_char_p
    for name, want in (("v8w_out_len", len(OUT)), ("v8w_lag", LAG),
                       ("v8w_variants", len(VARIANTS))):
        getattr(lib, name).restype = i32
        if getattr(lib, name)() != want:
            raise ProbeError(f"{SOURCE}'s {name} is {getattr(lib, name)()}, this module reads "
                             f"{want}: update one to the other")
    return lib


def run(lib, ep: dict, variant: str, *, device="cuda", stream=None):
    """One launch: (P, W̃, the [56][len(OUT)] record) as NumPy arrays."""
    import torch

    if variant not in VARIANTS:
        raise ValueError(f"variant {variant!r}: one of {', '.join(VARIANTS)}")
    steps = -(-ep["n"] // ep["bs"])
    dev = {k: torch.from_numpy(np.ascontiguousarray(ep[k])).to(device)
           for k in ("x", "order", "gh", "gl", "w0")}
    p = torch.full((steps, CLUSTERS, BMAX, C), float("nan"), device=device)
    w = torch.full((K + 1, C), float("nan"), device=device)
    out = torch.zeros((CTAS, len(OUT)), dtype=torch.int64, device=device)
    stream = stream if stream is not None else torch.cuda.current_stream(device).cuda_stream
    signal = ctypes.c_int(0)
    ptr = [ctypes.c_void_p(t.data_ptr()) for t in (*dev.values(), p, w, out)]
    rc = lib.v8w_run(VARIANTS[variant], ep["n"], ep["bs"], ep["lr"], *ptr,
                     ctypes.c_void_p(stream), ctypes.byref(signal))
    if rc == -2:
        raise ProbeError(f"{variant}: a wait timed out (g_signal_error {signal.value:#x})")
    if rc:
        name = lib.v8w_error_name(rc).decode() if rc > 0 else "bad arguments"
        raise ProbeError(f"{variant}: {name} ({rc})")
    return p.cpu().numpy(), w.cpu().numpy(), out.cpu().numpy()


def step_figures(out: np.ndarray, steps: int) -> dict:
    """µs a step (median over CTAs of (end − start) / steps) and the phases' µs a step (each CTA's
    thread-0 clock shares of its span, medians over CTAs)."""
    rec = {name: out[:, i] for i, name in enumerate(OUT)}
    if (rec["end_ns"] < 0).any():
        raise ProbeError("a CTA's wait failed (its end stamp is -1)")
    span = (rec["end_ns"] - rec["start_ns"]).astype(np.float64)
    clks = np.stack([rec[f"clk_{p}"] for p in PHASES], 1).astype(np.float64)
    share = clks / np.maximum(clks.sum(1, keepdims=True), 1)
    return {"us_per_step": float(np.median(span)) / steps / 1e3,
            "phases_us": {p: float(np.median(share[:, i] * span)) / steps / 1e3
                          for i, p in enumerate(PHASES)},
            "sms": int(len(set(rec["smid"].tolist())))}


def measure(lib=None, variants=tuple(VARIANTS), repeats=3, *, device="cuda", stream=None,
            ep=None) -> dict:
    """Per variant: µs a step (median, min, max over `repeats` launches), the phase split of the
    median launch, and the check of the first launch's P_t and W̃ against float64 (errors as
    fractions of the tolerance); a variant that fails is its one-line reason."""
    if isinstance(variants, str):
        variants = (variants,)
    bad = [v for v in variants if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"variants {list(variants)!r}: name some of {', '.join(VARIANTS)}")
    if not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats={repeats!r}: a whole number, at least 1")
    lib = lib if lib is not None else load_library()
    ep = ep if ep is not None else epoch_inputs()
    ref = reference(ep)
    steps = -(-ep["n"] // ep["bs"])
    result = {"config": {"n": ep["n"], "batch": ep["bs"], "steps": steps, "lag": LAG,
                         "repeats": repeats, "rtol": RTOL}}
    for v in variants:
        try:
            runs = []
            for i in range(repeats):
                p, w, out = run(lib, ep, v, device=device, stream=stream)
                if i == 0:
                    err_p, err_w = check_errors(p, w, ref)
                runs.append(step_figures(out, steps))
            us = [r["us_per_step"] for r in runs]
            mid = sorted(runs, key=lambda r: r["us_per_step"])[len(runs) // 2]
            result[v] = {"us_per_step": {"median": statistics.median(us), "min": min(us),
                                         "max": max(us)},
                         "per_repeat": us, "phases_us": mid["phases_us"], "sms": mid["sms"],
                         "check": {"p_err": err_p, "w_err": err_w,
                                   "ok": err_p <= 1 and err_w <= 1}}
        except ProbeError as e:
            result[v] = str(e)
    return result


def describe(result: dict) -> list[str]:
    """A line a variant, as benchmarks/sync_cost.py would print them."""
    cfg = result["config"]
    lines = [f"v8 workers alone ({cfg['steps']} steps of {cfg['batch']}, L = {cfg['lag']}, "
             f"{cfg['repeats']} launches each; µs a step = median over the 56 CTAs)"]
    for v in VARIANTS:
        if v not in result:
            continue
        r = result[v]
        if isinstance(r, str):
            lines.append(f"  {v}: {r}")
            continue
        u, c = r["us_per_step"], r["check"]
        phases = ", ".join(f"{p} {x:.2f}" for p, x in r["phases_us"].items())
        lines.append(
            f"  {v}: {u['median']:.2f} µs a step ({u['min']:.2f}-{u['max']:.2f}); {phases}; "
            f"{r['sms']} SMs; check {'ok' if c['ok'] else 'FAILED'} (P {c['p_err']:.2g}, "
            f"W̃ {c['w_err']:.2g} of the tolerance)")
    return lines

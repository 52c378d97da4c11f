"""cuda-epoch v8's chain alone, as a GPU probe (docs/measurements/cuda-epoch-v8-design.md, "Build
first" step 2): one CTA of 512 threads on one SM runs the chain for a whole MNIST epoch (469 steps,
batch 128, the last 96) with real Grams and P_t + Q_t from precomputed arrays, so its logits are
the real ones and its µs a step is T_chain, the design's central claim, without the protocol.

Inputs (`chain_inputs`, ladder/v8_inputs.py; NumPy, float64 where it matters):
- Γ̃_{t,1} = X̃_t X̃_{t−1}ᵀ = Γ + 255² (the bias as a 785th pixel of 255), fp32 [steps][128][128],
  0 outside the batches' rows and columns; step 0's all 0 (no lagged term);
- P_t + Q_t = X̃_t W̃_{t−1} / 255 in float64 plain SGD, rounded to fp32 [steps][128][10]: in the
  algebra Z_t = X̃_t W̃_{t−1}/255 − c Γ̃_{t,1} G_{t−1} (c = lr/255²), so this is what the workers'
  partial P_t and the helpers' terms j ≥ 2 add up to, whatever the lag;
- the labels [steps][128] (−1 past the batch) and float64's Z_t, G_t and summed loss, the check.

The cluster variant (`run_cluster`, design "Build first" step 4 joined to step 2): one cluster of
8 CTAs, the chain on rank 0 with P_t alone precomputed (`chain_inputs(..., lag=CLUSTER_LAG)`:
P_t = X̃_t W̃_{max(t−6, 0)}/255 and Γ̃_{t,j} for j = 2 … 6) and Q_t computed by helper CTAs on
ranks 1 … 6 from the G' the chain sends them through DSMEM (csrc/v8_helpers.cuh, csrc/
v8_cluster.cuh). Its µs a step is the chain's step with the cluster's protocol; its phase build
says whether the helpers keep up (the chain's wait_q) and where each helper's step goes.

The kernel is csrc/v8_chain.cu (nvcc → cached .so → ctypes, as ladder/sync_probes.py). Written
2026-11-28; not yet run on a GPU (neither the chain alone nor the cluster).
"""

from __future__ import annotations

import ctypes
import statistics

import numpy as np

from fasttrain.ladder.v8_inputs import (  # noqa: F401 (the probe's inputs, re-exported)
    CLASSES,
    CLUSTER_LAG,
    PIXEL,
    ROWS,
    chain_inputs,
    mnist_epoch,
)

SOURCE = "v8_chain.cu"
TIMING = ("epoch_ns", "epoch_clocks", "inputs_mma", "k_halves", "softmax", "write_b", "next_a",
          "step_barrier", "wait_inputs", "wait_gram", "issue_gram")
"""csrc/v8_chain.cu's int64 timing words: the epoch by globaltimer and clock64 (thread 0), then
clock64 sums over the steps of warp 0 (a softmax warp, on the critical path) for each phase, and
of warp 8 for the Γ̃ ring's cp.async wait and issue (the phase build only). wait_inputs: after the
K halves' barrier, until the step's P+Q and labels (loaded before the product) are in registers;
"softmax" starts after it (the H200's first runs put 1.8 µs of a 2.7 µs step in the softmax; run
9's split read 0.03 µs, but its mark preceded no reader of the loads: fixed since, not yet run)."""


CLUSTER_NSG, CLUSTER_NQ = 4, 2
"""csrc/v8_helpers.cuh's rings' slots: G' in each helper, Q parts in the chain (its V8H_LAG is
v8_inputs.CLUSTER_LAG)."""


CHAIN_PHASES = ("send_g", "inputs_mma", "k_halves", "wait_q", "softmax", "write_b", "next_a",
                "step_barrier", "wait_gram", "issue_gram")
HELPER_PHASES = ("wait_g", "mma", "k_halves", "wait_credit", "send_q", "next_a", "step_barrier",
                 "wait_gram")
HELPERS = ("j2 rows 0-63", "j2 rows 64-127", "j3", "j4", "j5", "j6")
CLUSTER_TIMING = ("epoch_ns", "epoch_clocks") + CHAIN_PHASES + tuple(
    f"h{h}_{k}" for h in range(1, 7) for k in HELPER_PHASES)
"""csrc/v8_cluster.cuh's int64 timing words: the chain's epoch (globaltimer, clock64; −1 if a wait
timed out), its clock64 sums a phase over the steps (thread 0; the Γ̃ ring's by thread 256: send_g
is the G' credit wait and the six st.async, wait_q the wait for the Q parts and their adds), then
each helper's (ranks 1 … 6, its first active warp: wait G', product, K halves' barrier, wait for
the chain's Q credit, the part's st.async, next A, the step's barrier; the Γ̃ wait by warp + 8)."""


class ChainError(RuntimeError):
    """The kernel could not run; str(e) is one line."""


def load_library() -> ctypes.CDLL:
    """Build (once, cached) and load csrc/v8_chain.cu with its entry points typed."""
    from fasttrain.ladder import build

    lib = build.load(SOURCE)
    p = ctypes.c_void_p
    lib.v8_chain_run.argtypes = [p, p, p, ctypes.c_int, ctypes.c_float, p, p, p, p,
                                 ctypes.c_int, ctypes.c_int, p]
    lib.v8_chain_run.restype = ctypes.c_int
    for name in ("v8_chain_error_name", "v8_chain_error_string"):
        getattr(lib, name).argtypes = [ctypes.c_int]
        getattr(lib, name).restype = ctypes.c_char_p
    for name in ("v8_chain_timing_len", "v8_chain_threads"):
        getattr(lib, name).restype = ctypes.c_int
    lib.v8_cluster_run.argtypes = [p, p, p, p, ctypes.c_int, ctypes.c_float, p, p, p, p,
                                   ctypes.c_int, p, ctypes.POINTER(ctypes.c_int)]
    lib.v8_cluster_run.restype = ctypes.c_int
    lib.v8_cluster_timing_len.restype = ctypes.c_int
    lib.v8_grams_run.argtypes = [p, p, ctypes.c_int, p, p, p]
    lib.v8_grams_run.restype = ctypes.c_int
    if lib.v8_cluster_timing_len() != len(CLUSTER_TIMING):
        raise ChainError(f"{SOURCE} writes {lib.v8_cluster_timing_len()} cluster timing words, "
                         f"this module reads {len(CLUSTER_TIMING)}: update one to the other")
    if lib.v8_chain_timing_len() != len(TIMING):
        raise ChainError(f"{SOURCE} writes {lib.v8_chain_timing_len()} timing words, this module "
                         f"reads {len(TIMING)}: update one to the other")
    return lib


GRAMS = ("numpy", "gpu")
"""Where `run`, `run_cluster` and `measure` take the Γ̃ from: chain_inputs' NumPy arrays, or
csrc/v8_grams.cuh's kernel (ladder/v8_grams.py) from inp's pixels and order, each launch."""

VARIANTS = (1, 2, 3)
"""csrc/v8_chain.cu's: 1, warps 0 … 7 split their own next A after the softmax (on the path);
2, warps 8 … 15 split it for them into a shared-memory stage during the softmax; 3, v1 with the
Γ̃ ring filled by bulk copies (cp.async.bulk, 128 a step from warps 8 … 11, completing on a slot's
mbarrier) instead of 4,096 cp.async of 16 B from warps 8 … 15 (compiled, not yet run)."""
UNTRIED = (3,)
"""Variants no GPU has run yet: `measure` times them after everything else (the cluster and the
GPU Grams too), and a ChainError of theirs is their entry's "error", not the call's."""


def _check_grams(grams):
    if grams not in GRAMS:
        raise ValueError(f"grams must be one of {GRAMS}, got {grams!r}")


def _device_grams(lib, inp, grams, dev, device, stream, lags_2_on=True):
    """(Γ̃_{·,1}, Γ̃_{·,j≥2} or None) on the device: uploaded from inp (the second only if
    `lags_2_on`), or made there (`grams`)."""
    if grams == "gpu":
        from fasttrain.ladder.v8_grams import gpu_grams

        return gpu_grams(lib, inp, device=device, stream=stream)
    return dev(inp["grams"]), dev(inp["gramh"]) if lags_2_on else None


def run(lib, inp: dict, *, variant: int = 2, phases: bool = False, logits: bool = False,
        device="cuda", stream=None, grams: str = "numpy") -> dict:
    """One launch of the chain over `inp` (`chain_inputs`): its G [steps, 128, 10], Z (if
    `logits`), summed loss and hits, and timing words (TIMING). Γ̃ from `grams` (GRAMS)."""
    import torch

    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
    _check_grams(grams)

    steps = inp["grams"].shape[0]

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    if stream is None and str(device).startswith("cuda"):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gram = _device_grams(lib, inp, grams, dev, device, stream, lags_2_on=False)[0]
    pq, labels = dev(inp["pq"]), dev(inp["labels"])
    g = torch.zeros((steps, ROWS, CLASSES), dtype=torch.float32, device=device)
    z = torch.full_like(g, float("nan")) if logits else None
    stats = torch.zeros((lib.v8_chain_threads(), 2), dtype=torch.float32, device=device)
    timing = torch.zeros(len(TIMING), dtype=torch.int64, device=device)

    def p(t):
        return ctypes.c_void_p(t.data_ptr()) if t is not None else None

    code = lib.v8_chain_run(p(gram), p(pq), p(labels), int(inp["n"]), float(inp["c"]), p(g),
                            p(z), p(stats), p(timing), int(phases), variant, stream)
    if code:
        raise ChainError(f"v8_chain_run: {lib.v8_chain_error_name(code).decode()}: "
                         f"{lib.v8_chain_error_string(code).decode()}")
    s = stats.double().sum(0).tolist()  # waits for the kernel
    tm = dict(zip(TIMING, timing.tolist(), strict=True))
    if tm["epoch_ns"] == -1:
        raise ChainError(f"v8_chain_run: variant {variant}'s wait for its Γ̃ bulk copies timed out")
    return {"g": g.cpu().numpy(), "z": z.cpu().numpy() if logits else None, "loss": s[0],
            "hits": s[1], "timing": tm}


def run_cluster(lib, inp: dict, *, phases: bool = False, logits: bool = False, device="cuda",
                stream=None, grams: str = "numpy") -> dict:
    """One launch of the chain cluster over `inp` (`chain_inputs(..., lag=CLUSTER_LAG)`): P_t from
    inp["p"], the helpers' Γ̃ from inp["gramh"] (or, grams="gpu", both Γ̃ made on the device);
    its G, Z (if `logits`), loss, hits and CLUSTER_TIMING words."""
    import torch

    _check_grams(grams)
    if inp.get("lag") != CLUSTER_LAG:
        raise ValueError(f"inp must be chain_inputs(..., lag={CLUSTER_LAG}), got lag "
                         f"{inp.get('lag')!r}")
    steps = inp["grams"].shape[0]

    def dev(a):
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    if stream is None and str(device).startswith("cuda"):
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    gram, gramh = _device_grams(lib, inp, grams, dev, device, stream)
    p_, labels = dev(inp["p"]), dev(inp["labels"])
    g = torch.zeros((steps, ROWS, CLASSES), dtype=torch.float32, device=device)
    z = torch.full_like(g, float("nan")) if logits else None
    stats = torch.zeros((lib.v8_chain_threads(), 2), dtype=torch.float32, device=device)
    timing = torch.zeros(len(CLUSTER_TIMING), dtype=torch.int64, device=device)

    def ptr(t):
        return ctypes.c_void_p(t.data_ptr()) if t is not None else None

    signal = ctypes.c_int(0)
    code = lib.v8_cluster_run(ptr(gram), ptr(gramh), ptr(p_), ptr(labels), int(inp["n"]),
                              float(inp["c"]), ptr(g), ptr(z), ptr(stats), ptr(timing),
                              int(phases), stream, ctypes.byref(signal))
    if code == -2:
        raise ChainError(f"v8_cluster_run: a wait timed out (code {signal.value:#x}: kind "
                         f"{signal.value >> 4 & 15}, rank or lag {signal.value >> 8 & 255}, step "
                         f"{signal.value >> 16})")
    if code:
        raise ChainError(f"v8_cluster_run: {lib.v8_chain_error_name(code).decode()}: "
                         f"{lib.v8_chain_error_string(code).decode()}")
    s = stats.double().sum(0).tolist()
    return {"g": g.cpu().numpy(), "z": z.cpu().numpy() if logits else None, "loss": s[0],
            "hits": s[1], "timing": dict(zip(CLUSTER_TIMING, timing.tolist(), strict=True))}


def check(inp: dict, out: dict) -> dict:
    """A run's distance from float64 plain SGD: G and (if it wrote them) Z over the batches' rows,
    the summed loss relative."""
    valid = inp["labels"] >= 0
    err = {"g_max_abs_err": float(np.abs(out["g"][valid] - inp["g64"][valid]).max()),
           "loss_rel_err": abs(out["loss"] - inp["loss64"]) / inp["loss64"],
           "padding_zero": bool((out["g"][~valid] == 0).all())}
    if out["z"] is not None:
        err["z_max_abs_err"] = float(np.abs(out["z"][valid] - inp["z64"][valid]).max())
    return err


def measure(lib=None, repeats: int = 3, *, inp: dict | None = None, device="cuda",
            stream=None, grams: str = "numpy") -> dict:
    """µs a step of the chain over one epoch (`inp`, default: MNIST's first, 469 steps), for each
    variant: a warm-up launch, `repeats` timed launches (median, min, max of globaltimer over the
    epoch's steps), then one launch of the phase build (clock64 sums, converted at its own clocks
    per ns) that also writes Z for the check against float64. The top level holds the variant
    of the lowest median; "variants" holds each. With grams="gpu" the launches take their Γ̃ from
    the GPU kernel, and "grams_gpu" holds its µs an epoch (ladder/v8_grams.py's time_grams)."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats must be an integer >= 1, got {repeats!r}")
    if inp is not None and not {"grams", "pq", "labels", "n", "c"} <= set(inp):
        raise ValueError("inp must be a chain_inputs() dict (grams, pq, labels, n, c, ...)")
    _check_grams(grams)
    lib = lib if lib is not None else load_library()
    inp = inp if inp is not None else mnist_epoch()
    launch = {"device": device, "stream": stream, "grams": grams}
    variants = {f"v{v}": _measure_variant(lib, inp, v, repeats, launch)
                for v in VARIANTS if v not in UNTRIED}
    out = {}
    if "gramh" in inp:
        out["cluster"] = _measure_cluster(lib, inp, repeats, launch)
    if grams == "gpu":
        from fasttrain.ladder.v8_grams import time_grams

        out["grams_gpu"] = time_grams(lib, inp, max(repeats, 5), device=device, stream=stream)
    for v in UNTRIED:  # last: a fault of theirs costs no other figure
        try:
            variants[f"v{v}"] = _measure_variant(lib, inp, v, repeats, launch)
        except ChainError as e:
            variants[f"v{v}"] = {"variant": v, "error": str(e)}
    timed = [k for k in variants if "error" not in variants[k]]
    best = min(timed, key=lambda k: variants[k]["us_per_step"]["median"])
    return {**variants[best], "best": best, "variants": variants, **out}


def _measure_cluster(lib, inp, repeats, launch) -> dict:
    """The cluster variant as _measure_variant does a chain variant: its µs a step (globaltimer,
    the chain's epoch), then the phase build's clock64 sums in µs a step, the chain's and each
    helper's, all at the chain's clocks per ns (its helpers' SMs may run another clock: an H200 ran
    SMs busy on the tensor cores ~9 % slower than others, run 9, so theirs are approximate)."""
    steps = inp["grams"].shape[0]
    run_cluster(lib, inp, **launch)
    us = [run_cluster(lib, inp, **launch)["timing"]["epoch_ns"] / 1e3 / steps
          for _ in range(repeats)]
    ph = run_cluster(lib, inp, phases=True, logits=True, **launch)
    tm = ph["timing"]
    ghz = tm["epoch_clocks"] / tm["epoch_ns"] if tm["epoch_ns"] > 0 else float("nan")
    per = steps * ghz * 1e3
    return {"steps": steps, "n": int(inp["n"]), "repeats": repeats,
            "us_per_step": {"median": statistics.median(us), "min": min(us), "max": max(us),
                            "runs": us},
            "phase_build_us_per_step": tm["epoch_ns"] / 1e3 / steps, "clock_ghz": ghz,
            "chain_us_per_step": {k: tm[k] / per for k in CHAIN_PHASES},
            "helpers_us_per_step": {name: {k: tm[f"h{h}_{k}"] / per for k in HELPER_PHASES}
                                    for h, name in enumerate(HELPERS, 1)},
            "check": check(inp, ph), "hits": ph["hits"]}


def _measure_variant(lib, inp, variant, repeats, launch) -> dict:
    steps = inp["grams"].shape[0]
    launch = {"variant": variant, **launch}
    run(lib, inp, **launch)  # warm-up: the module load, the smem attribute, the caches
    us = [run(lib, inp, **launch)["timing"]["epoch_ns"] / 1e3 / steps for _ in range(repeats)]
    ph = run(lib, inp, phases=True, logits=True, **launch)
    tm = ph["timing"]
    ghz = tm["epoch_clocks"] / tm["epoch_ns"] if tm["epoch_ns"] > 0 else float("nan")
    phases = {k: tm[k] / steps / ghz / 1e3 for k in TIMING[2:]}
    return {"variant": variant, "steps": steps, "n": int(inp["n"]), "repeats": repeats,
            "us_per_step": {"median": statistics.median(us), "min": min(us), "max": max(us),
                            "runs": us},
            "phase_build_us_per_step": tm["epoch_ns"] / 1e3 / steps, "clock_ghz": ghz,
            "phase_us_per_step": phases, "check": check(inp, ph), "hits": ph["hits"]}


def describe(result: dict) -> list[str]:
    """The probe's figures, a few lines a variant."""
    if "error" in result:
        return [f"v8 chain alone: {result['error']}"]
    lines = []
    for name, r in result["variants"].items():
        if "error" in r:
            lines.append(f"v8 chain alone {name}: {r['error']}")
            continue
        u, c, ph = r["us_per_step"], r["check"], r["phase_us_per_step"]
        lines += [
            f"v8 chain alone {name}{' (best)' if name == result['best'] else ''} (1 CTA, 512 "
            f"threads, {r['steps']} steps of {r['n']} samples): {u['median']:.3f} µs a step "
            f"(median of {r['repeats']}, {u['min']:.3f}-{u['max']:.3f}); "
            f"{u['median'] * r['steps'] / 1e3:.3f} ms an epoch",
            f"  phase build {r['phase_build_us_per_step']:.3f} µs a step at "
            f"{r['clock_ghz']:.2f} GHz; warp 0: " +
            ", ".join(f"{k} {ph[k]:.3f}" for k in TIMING[2:9]) +
            f"; warp 8: wait Γ̃ {ph['wait_gram']:.3f}, issue Γ̃ {ph['issue_gram']:.3f} (µs a step)",
            f"  check vs float64 SGD: G {c['g_max_abs_err']:.2e}, Z "
            f"{c.get('z_max_abs_err', 0):.2e}, loss {c['loss_rel_err']:.1e} relative; "
            f"{r['hits']:.0f} hits; padding rows {'zero' if c['padding_zero'] else 'NOT zero'}",
        ]
    if "cluster" in result:
        lines += describe_cluster(result["cluster"])
    if "grams_gpu" in result:
        from fasttrain.ladder.v8_grams import describe_grams

        lines.append(describe_grams(result["grams_gpu"]))
    return lines


def describe_cluster(r: dict) -> list[str]:
    """The cluster variant's figures: its step, the chain's phases (wait_q: whether the helpers
    keep up), each helper's."""
    u, c, ch = r["us_per_step"], r["check"], r["chain_us_per_step"]
    lines = [
        f"v8 chain cluster (8 CTAs: chain, helpers j = 2 x2, 3, 4, 5, 6, idle; {r['steps']} steps "
        f"of {r['n']} samples): {u['median']:.3f} µs a step (median of {r['repeats']}, "
        f"{u['min']:.3f}-{u['max']:.3f}); {u['median'] * r['steps'] / 1e3:.3f} ms an epoch",
        f"  phase build {r['phase_build_us_per_step']:.3f} µs a step at {r['clock_ghz']:.2f} GHz; "
        f"chain warp 0: " + ", ".join(f"{k} {ch[k]:.3f}" for k in CHAIN_PHASES[:8]) +
        f"; warp 8: wait Γ̃ {ch['wait_gram']:.3f}, issue Γ̃ {ch['issue_gram']:.3f} (µs a step)",
    ]
    for name, h in r["helpers_us_per_step"].items():
        lines.append(f"  helper {name}: " + ", ".join(f"{k} {h[k]:.3f}" for k in HELPER_PHASES))
    lines.append(f"  check vs float64 SGD: G {c['g_max_abs_err']:.2e}, Z "
                 f"{c.get('z_max_abs_err', 0):.2e}, loss {c['loss_rel_err']:.1e} relative; "
                 f"{r['hits']:.0f} hits; padding rows "
                 f"{'zero' if c['padding_zero'] else 'NOT zero'}")
    return lines

"""The probes that set cuda-epoch v7's lag (docs/measurements/cuda-epoch-v7-design.md, step 1):
what one global-memory hand-off between SMs costs, and whether v7's clusters can all be resident.

- ping-pong: two CTAs on two SMs bounce one counter through L2 (`st.release.gpu` /
  `ld.acquire.gpu`): ns per one-way hand-off (the round trip / 2, median over launches), bare and
  with a payload written before the release and checked after the acquire (1 KB and 5 KB: a chain
  CTA's 16 rows of G, all 128 rows);
- broadcast: one flag released to 56 polling CTAs (v7's chain → workers): ns until the first and
  the last of them sees it (global-timer stamps, median over rounds);
- co-residency: `cudaOccupancyMaxActiveClusters` for clusters of 8 and 16 of each v7 role's
  threads and shared memory, and launches of v7's 128 CTAs in clusters, with and without
  `cudaLaunchAttributeCooperative`, that count the CTAs which saw the whole grid arrive.

The kernels are `csrc/sync_probes.cu` (built like the ladder's: nvcc → cached .so → ctypes).

    PYTHONPATH=src python benchmarks/sync_cost.py --probes-only [--json PATH]
"""

from __future__ import annotations

import ctypes
import statistics

import torch

SOURCE = "sync_probes.cu"
ROUNDS = 10_000  # round trips a launch: ~20 ms at the design's 1 µs a hand-off (an estimate)
LAUNCHES = 5
PAYLOADS = (0, 1024, 5 * 1024)  # bytes each way: bare, a chain CTA's 16 rows of G, all 128 rows
CONSUMERS = 56  # v7's worker CTAs
BROADCAST_ROUNDS = 1_000
FLAG_STRIDE = 1024  # int32 words between launches' flags: each launch polls another 4 KiB line
KIB = 1024
ROLES = {  # v7's budget table (threads, dynamic shared memory): its roles' CTAs
    "chain": (512, 125 * KIB),
    "workers": (256, 45 * KIB),
    "producers": (256, 60 * KIB),
    # One launch gives every CTA the same threads and shared memory: the largest role's.
    "one launch": (512, 125 * KIB),
}
CLUSTER_SIZES = (8, 16)
V7_CTAS = 128  # 16 clusters of 8
# The layout of the kernels' int64 outputs (sync_probes.cu's enums; checked at load).
PINGPONG_OUT = ("ns", "counter", "payload_errors", "sm_0", "sm_1", "stuck_at")
BROADCAST_HEADER = ("stuck_at", "timer_tick_ns")
RESIDENT_OUT = ("all_seen", "cluster_size")


class ProbeError(RuntimeError):
    """A probe that could not run or whose protocol failed; str(e) is one line."""


def load_library() -> ctypes.CDLL:
    """Build (once, cached) and load the probes with their entry points typed."""
    from fasttrain.ladder import build

    lib = build.load(SOURCE)
    p, i32 = ctypes.c_void_p, ctypes.c_int
    for name, args in (("sync_probe_pingpong", [i32, i32, p, p, p, p]),
                       ("sync_probe_broadcast", [i32, i32, p, p, p, p, p]),
                       ("sync_probe_max_active_clusters",
                        [i32, i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]),
                       ("sync_probe_resident_launch", [i32, i32, i32, i32, i32, p, p, p])):
        getattr(lib, name).argtypes = args
        getattr(lib, name).restype = i32
    for name in ("sync_probe_error_name", "sync_probe_error_string"):
        getattr(lib, name).argtypes = [i32]
        getattr(lib, name).restype = ctypes.c_char_p
    for name, layout in (("sync_probe_pingpong_out_len", PINGPONG_OUT),
                         ("sync_probe_broadcast_header_len", BROADCAST_HEADER),
                         ("sync_probe_resident_out_len", RESIDENT_OUT)):
        getattr(lib, name).restype = i32
        if getattr(lib, name)() != len(layout):
            raise ProbeError(f"{SOURCE}'s {name} is {getattr(lib, name)()}, this module reads "
                             f"{len(layout)} fields: update one to the other")
    return lib


def error_text(lib, code: int) -> str:
    """cudaGetErrorName: cudaGetErrorString of a status an entry point returned."""
    name, text = lib.sync_probe_error_name(code), lib.sync_probe_error_string(code)
    return f"{name.decode()}: {text.decode()}"


def _check(lib, code: int, what: str) -> None:
    if code:
        raise ProbeError(f"{what}: {error_text(lib, code)}")


def _ptr(t: torch.Tensor, offset: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() + offset * t.element_size())


def _stream() -> ctypes.c_void_p:
    return ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)


def pingpong(lib, payload_bytes: int = 0, rounds: int = ROUNDS, launches: int = LAUNCHES, *,
             device="cuda", stream=None) -> dict:
    """ns per one-way hand-off between two SMs, `payload_bytes` travelling with each."""
    if payload_bytes < 0 or payload_bytes % 4:
        raise ValueError(f"payload_bytes={payload_bytes}: give a whole number of 32-bit words")
    if rounds < 1 or launches < 1:
        raise ValueError(f"rounds={rounds}, launches={launches}: both must be at least 1")
    words = payload_bytes // 4
    flags = torch.zeros(launches * FLAG_STRIDE, dtype=torch.int32, device=device)
    payload = torch.zeros(max(2 * words, 1), dtype=torch.int32, device=device)
    out = torch.zeros(len(PINGPONG_OUT), dtype=torch.int64, device=device)
    runs = []
    for i in range(launches):
        _check(lib, lib.sync_probe_pingpong(rounds, words, _ptr(flags, i * FLAG_STRIDE),
                                            _ptr(payload), _ptr(out), stream), "ping-pong")
        runs.append(dict(zip(PINGPONG_OUT, out.tolist(), strict=True)))  # waits for the kernel
        if runs[-1]["stuck_at"]:
            raise ProbeError(f"ping-pong: a CTA waited over 1 s for hand-off "
                             f"{runs[-1]['stuck_at']} (its peer was not resident?)")
    # The clock covers `rounds` round trips, 2 × rounds hand-offs (a warm-up round trip before).
    ns = [r["ns"] / (2 * rounds) for r in runs]
    return {"payload_bytes": payload_bytes, "rounds": rounds,
            "ns_per_handoff": statistics.median(ns),
            "ns_per_handoff_min": min(ns), "ns_per_handoff_max": max(ns), "ns_per_launch": ns,
            "counters": [r["counter"] for r in runs], "expected_counter": 2 * (rounds + 1),
            "payload_errors": sum(r["payload_errors"] for r in runs),
            "sms": [[r["sm_0"], r["sm_1"]] for r in runs]}


def broadcast(lib, consumers: int = CONSUMERS, rounds: int = BROADCAST_ROUNDS, *, device="cuda",
              stream=None) -> dict:
    """ns from one CTA's release of a flag until the first and the last of `consumers` CTAs
    polling it see it (median over rounds); the global timer's step is their grain."""
    if consumers < 1 or rounds < 1:
        raise ValueError(f"consumers={consumers}, rounds={rounds}: both must be at least 1")
    # The flag and the arrivals counter a line apart: the acknowledgements' atomics must not
    # contend with the polls of the flag.
    counters = torch.zeros(2 * FLAG_STRIDE, dtype=torch.int32, device=device)
    stamps = torch.zeros(consumers, dtype=torch.int64, device=device)
    out = torch.zeros(len(BROADCAST_HEADER) + 2 * rounds, dtype=torch.int64, device=device)
    _check(lib, lib.sync_probe_broadcast(consumers, rounds, _ptr(counters),
                                         _ptr(counters, FLAG_STRIDE), _ptr(stamps), _ptr(out),
                                         stream), "broadcast")
    values = out.tolist()
    header = dict(zip(BROADCAST_HEADER, values[:len(BROADCAST_HEADER)], strict=True))
    if header["stuck_at"]:
        raise ProbeError(f"broadcast: a wait of round {header['stuck_at']} took over 1 s")
    first, last = values[len(BROADCAST_HEADER)::2], values[len(BROADCAST_HEADER) + 1::2]
    return {"consumers": consumers, "rounds": rounds,
            "first_ns_median": statistics.median(first), "last_ns_median": statistics.median(last),
            "last_ns_mean": statistics.fmean(last), "last_ns_max": max(last),
            "timer_tick_ns": header["timer_tick_ns"]}


def max_active_clusters(lib, cluster: int, threads: int, smem: int) -> dict:
    """cudaOccupancyMaxActiveClusters for clusters of `cluster` CTAs of `threads` threads and
    `smem` bytes of dynamic shared memory (the probe kernel's registers, which a role's real
    kernel can only raise: the count is an upper bound)."""
    clusters, regs = ctypes.c_int(), ctypes.c_int()
    _check(lib, lib.sync_probe_max_active_clusters(cluster, threads, smem, ctypes.byref(clusters),
                                                   ctypes.byref(regs)),
           f"cudaOccupancyMaxActiveClusters (cluster {cluster}, {threads} threads, {smem} B)")
    return {"clusters": clusters.value, "ctas": clusters.value * cluster, "regs": regs.value}


def resident_launch(lib, clusters: int, cluster: int, threads: int, smem: int, cooperative: bool,
                    *, device="cuda", stream=None) -> dict:
    """Launch `clusters` clusters of `cluster` CTAs; how many CTAs saw the whole grid arrive
    (all of them: it was resident at once), or the launch's error."""
    arrivals = torch.zeros(1, dtype=torch.int32, device=device)
    out = torch.zeros(len(RESIDENT_OUT), dtype=torch.int64, device=device)
    code = lib.sync_probe_resident_launch(clusters, cluster, threads, smem, int(cooperative),
                                          _ptr(arrivals), _ptr(out), stream)
    ctas = clusters * cluster
    if code:
        return {"ctas": ctas, "status": error_text(lib, code)}
    got = dict(zip(RESIDENT_OUT, out.tolist(), strict=True))
    return {"ctas": ctas, "status": "ok", "resident": got["all_seen"],
            "cluster_size": got["cluster_size"]}


def _or_reason(probe, *args, **kwargs):
    """The probe's figures, or why it failed (one line): one failed probe leaves the others."""
    try:
        return probe(*args, **kwargs)
    except ProbeError as e:
        return str(e)


def measure(lib=None, *, device="cuda", stream=None) -> dict:
    """Every probe, as benchmarks/sync_cost.py records them."""
    lib = lib if lib is not None else load_library()
    stream = stream if stream is not None else _stream()
    launch = {"device": device, "stream": stream}
    return {
        "config": {"rounds": ROUNDS, "launches": LAUNCHES, "broadcast_rounds": BROADCAST_ROUNDS,
                   "roles": {k: {"threads": t, "smem": s} for k, (t, s) in ROLES.items()}},
        "pingpong": {str(b): _or_reason(pingpong, lib, b, **launch) for b in PAYLOADS},
        "broadcast": _or_reason(broadcast, lib, **launch),
        "max_active_clusters": {
            role: {str(c): _or_reason(max_active_clusters, lib, c, t, s) for c in CLUSTER_SIZES}
            for role, (t, s) in ROLES.items()},
        "resident_launch": {
            f"{V7_CTAS // c} clusters of {c}" + (", cooperative" if coop else ""):
                resident_launch(lib, V7_CTAS // c, c, *ROLES["one launch"], coop, **launch)
            for c in CLUSTER_SIZES for coop in (True, False)},
    }


def describe(result: dict) -> list[str]:
    """The probes' figures, a line each, as sync_cost prints them."""
    if "error" in result:
        return [f"hand-off probes: {result['error']}"]
    lines = []
    for size, r in result["pingpong"].items():
        label = f"hand-off through L2, {int(size) // KIB} KiB payload" if int(size) else \
            "hand-off through L2, one flag"
        lines.append(f"{label}: " + (r if isinstance(r, str) else (
            f"{r['ns_per_handoff']:.0f} ns (median of {len(r['ns_per_launch'])} launches, "
            f"{r['ns_per_handoff_min']:.0f}-{r['ns_per_handoff_max']:.0f}); counter "
            f"{r['counters'][-1]} of {r['expected_counter']}, payload errors "
            f"{r['payload_errors']}, SMs {r['sms'][0][0]} and {r['sms'][0][1]}")))
    b = result["broadcast"]
    lines.append("one flag to many CTAs: " + (b if isinstance(b, str) else (
        f"{b['consumers']} CTAs, the first sees it after {b['first_ns_median']:.0f} ns, the "
        f"last after {b['last_ns_median']:.0f} (medians of {b['rounds']} rounds; the last's mean "
        f"{b['last_ns_mean']:.0f}, max {b['last_ns_max']}; timer step {b['timer_tick_ns']} ns)")))
    for role, by_size in result["max_active_clusters"].items():
        threads, smem = ROLES[role]
        lines.append(f"max active clusters, {role} ({threads} threads, {smem // KIB} KiB): " +
                     ", ".join(f"of {c}: " + (v if isinstance(v, str) else str(v["clusters"]))
                               for c, v in by_size.items()))
    for name, r in result["resident_launch"].items():
        lines.append(f"{name} ({r['ctas']} CTAs of the one-launch config): " + (
            f"launched, {r['resident']} of {r['ctas']} CTAs saw the whole grid resident"
            if r["status"] == "ok" else r["status"]))
    return lines

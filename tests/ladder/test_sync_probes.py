"""cuda-epoch v7's hand-off and co-residency probes (ladder/sync_probes.py, csrc/sync_probes.cu).

On the CPU: the protocols themselves (csrc/sync_probes.cuh) run by threads, one a CTA
(tests/ladder/csrc/sync_probes_host.cu); and the Python side with the library replaced at the
ctypes boundary by `FakeProbes`, which writes what the kernels would into the buffers it is
handed (host memory here): its arguments, its arithmetic (ns per hand-off from a launch's clock,
medians), its errors and its JSON are checked against what the fake was told to report. On a GPU
the kernels themselves run (marked gpu)."""

import ctypes
import json
import math
import statistics

import numpy as np
import pytest
import torch

from fasttrain.ladder import sync_probes
from tests.conftest import import_benchmark
from tests.ladder.host_harness import compile_harness


def _int64s(ptr: ctypes.c_void_p, n: int):
    return (ctypes.c_int64 * n).from_address(ptr.value)


def _int32s(ptr: ctypes.c_void_p, n: int):
    return (ctypes.c_int32 * n).from_address(ptr.value)


class FakeProbes:
    """sync_probes.cu's entry points as seen through ctypes, over host buffers. A launch reports
    the clock it is given (`launch_ns`, one a launch) and the counter and SMs a correct ping-pong
    leaves; `fail` maps an entry point to the status it returns."""

    def __init__(self, launch_ns=(), broadcast=(), sms_per_gpc=(16, 16, 18, 18, 16, 16, 16, 16),
                 stuck_at=0, fail=None):
        self.launch_ns = list(launch_ns)
        self.broadcast_rounds = list(broadcast)  # (first, last) ns of each timed round
        self.sms_per_gpc, self.stuck_at, self.fail = sms_per_gpc, stuck_at, fail or {}
        self.calls = []

    def sync_probe_pingpong(self, rounds, words, flag, payload, out, stream):
        self.calls.append(("pingpong", rounds, words, flag.value, payload.value, stream))
        if "pingpong" in self.fail:
            return self.fail["pingpong"]
        handoffs = 2 * (rounds + 1)
        _int32s(flag, 1)[0] = handoffs
        o = _int64s(out, len(sync_probes.PINGPONG_OUT))
        o[:] = [self.launch_ns.pop(0), handoffs, 0, 3, 70, self.stuck_at]
        return 0

    def sync_probe_broadcast(self, consumers, rounds, flag, arrivals, stamps, out, stream):
        self.calls.append(("broadcast", consumers, rounds, flag.value, arrivals.value, stream))
        header = len(sync_probes.BROADCAST_HEADER)
        o = _int64s(out, header + 2 * rounds)
        o[0], o[1] = self.stuck_at, 32
        for i, (first, last) in enumerate(self.broadcast_rounds[:rounds]):
            o[header + 2 * i], o[header + 2 * i + 1] = first, last
        return 0

    def sync_probe_max_active_clusters(self, cluster, threads, smem, clusters, regs):
        if "clusters" in self.fail:
            return self.fail["clusters"]
        # One CTA an SM above half an SM's 228 KiB, two below; clusters stay inside a GPC.
        per_sm = 1 if smem > 114 * 1024 else 2
        clusters._obj.value = sum(n * per_sm // cluster for n in self.sms_per_gpc)
        regs._obj.value = 10
        return 0

    def sync_probe_resident_launch(self, clusters, cluster, threads, smem, cooperative, arrivals,
                                   out, stream):
        if cooperative and "cooperative" in self.fail:
            return self.fail["cooperative"]
        o = _int64s(out, len(sync_probes.RESIDENT_OUT))
        o[:] = [clusters * cluster, cluster]
        return 0

    def sync_probe_error_name(self, code):
        return {720: b"cudaErrorCooperativeLaunchTooLarge"}.get(code, b"cudaErrorInvalidValue")

    def sync_probe_error_string(self, code):
        return b"too many blocks in cooperative launch" if code == 720 else b"invalid argument"


CPU = {"device": "cpu", "stream": ctypes.c_void_p(1234)}


def test_pingpong_is_the_median_launch_clock_over_twice_the_round_trips():
    ns = [41_000_000, 40_000_000, 50_000_000]
    lib = FakeProbes(launch_ns=ns)
    r = sync_probes.pingpong(lib, payload_bytes=1024, rounds=20_000, launches=3, **CPU)
    per = [x / 40_000 for x in ns]
    assert r["ns_per_handoff"] == statistics.median(per) == 1025.0
    assert (r["ns_per_handoff_min"], r["ns_per_handoff_max"]) == (min(per), max(per))
    assert r["counters"] == [40_002] * 3 and r["expected_counter"] == 40_002
    assert r["payload_errors"] == 0 and r["sms"] == [[3, 70]] * 3
    calls = [c for c in lib.calls if c[0] == "pingpong"]
    assert [c[1:3] for c in calls] == [(20_000, 256)] * 3, "rounds, and the payload in words"
    flags = [c[3] for c in calls]
    assert [b - a for a, b in zip(flags, flags[1:], strict=False)] == [
        4 * sync_probes.FLAG_STRIDE] * 2, "each launch polls its own line"
    assert len({c[4] for c in calls}) == 1 and all(c[5] is CPU["stream"] for c in calls)


def test_pingpong_refuses_a_payload_of_part_words_and_no_rounds():
    with pytest.raises(ValueError, match="32-bit words"):
        sync_probes.pingpong(FakeProbes(), payload_bytes=6, **CPU)
    with pytest.raises(ValueError, match="at least 1"):
        sync_probes.pingpong(FakeProbes(), rounds=0, **CPU)


def test_a_stuck_or_refused_pingpong_is_a_one_line_probe_error():
    with pytest.raises(sync_probes.ProbeError, match="hand-off 7"):
        sync_probes.pingpong(FakeProbes(launch_ns=[1], stuck_at=7), launches=1, **CPU)
    with pytest.raises(sync_probes.ProbeError,
                       match="ping-pong: cudaErrorCooperativeLaunchTooLarge: too many blocks"):
        sync_probes.pingpong(FakeProbes(fail={"pingpong": 720}), **CPU)


def test_broadcast_takes_the_median_round_and_keeps_its_flag_and_acks_apart():
    rounds = [(300 + 10 * i, 900 + 40 * (i % 5)) for i in range(11)]
    lib = FakeProbes(broadcast=rounds)
    r = sync_probes.broadcast(lib, consumers=56, rounds=11, **CPU)
    assert r["first_ns_median"] == statistics.median(f for f, _ in rounds)
    assert r["last_ns_median"] == statistics.median(last for _, last in rounds)
    assert r["last_ns_max"] == 1060 and r["timer_tick_ns"] == 32
    _, consumers, n, flag, arrivals, _ = lib.calls[0]
    assert (consumers, n) == (56, 11) and arrivals - flag == 4 * sync_probes.FLAG_STRIDE


def test_measure_records_every_probe_and_a_failure_as_its_reason():
    launches = sync_probes.LAUNCHES * len(sync_probes.PAYLOADS)
    lib = FakeProbes(launch_ns=[2 * sync_probes.ROUNDS * (700 + i) for i in range(launches)],
                     broadcast=[(400, 1200)] * sync_probes.BROADCAST_ROUNDS,
                     fail={"cooperative": 720})
    result = sync_probes.measure(lib, **CPU)
    json.dumps(result)  # the JSON sync_cost writes
    assert list(result["pingpong"]) == ["0", "1024", "5120"]
    assert result["pingpong"]["0"]["ns_per_handoff"] == 702
    assert result["broadcast"]["last_ns_median"] == 1200
    # 8 GPCs of 16-18 SMs, one 125 KiB CTA an SM: two clusters of 8 a GPC, one of 16.
    assert result["max_active_clusters"]["one launch"]["8"]["clusters"] == 16
    assert result["max_active_clusters"]["one launch"]["16"]["clusters"] == 8
    assert result["max_active_clusters"]["workers"]["8"] == {"clusters": 32, "ctas": 256,
                                                             "regs": 10}
    resident = result["resident_launch"]
    assert resident["16 clusters of 8"] == {"ctas": 128, "status": "ok", "resident": 128,
                                            "cluster_size": 8}
    assert resident["8 clusters of 16, cooperative"]["status"].startswith(
        "cudaErrorCooperativeLaunchTooLarge")
    lines = "\n".join(sync_probes.describe(result))
    assert "hand-off through L2, one flag: 702 ns (median of 5 launches, 700-704)" in lines
    assert "max active clusters, one launch (512 threads, 125 KiB): of 8: 16, of 16: 8" in lines
    assert ("16 clusters of 8, cooperative (128 CTAs of the one-launch config): "
            "cudaErrorCooperativeLaunchTooLarge") in lines

    refused = sync_probes.measure(FakeProbes(launch_ns=[1] * launches,
                                             broadcast=[(1, 2)] * sync_probes.BROADCAST_ROUNDS,
                                             fail={"clusters": 1}), **CPU)
    assert refused["max_active_clusters"]["chain"]["16"].startswith(
        "cudaOccupancyMaxActiveClusters (cluster 16, 512 threads, 128000 B): cudaErrorInvalidValue")


def test_sync_cost_probes_only_writes_the_probes_and_nothing_else(tmp_path, monkeypatch, capsys):
    sync_cost = import_benchmark("sync_cost")
    launches = sync_probes.LAUNCHES * len(sync_probes.PAYLOADS)
    lib = FakeProbes(launch_ns=[2 * sync_probes.ROUNDS * 900] * launches,
                     broadcast=[(500, 1500)] * sync_probes.BROADCAST_ROUNDS)
    real_measure = sync_probes.measure
    monkeypatch.setattr(sync_probes, "measure", lambda: real_measure(lib, **CPU))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(sync_cost, "env_block", lambda: {"gpu": "a faked GPU"})
    monkeypatch.setattr(sync_cost, "hardware_line", lambda env: env["gpu"])
    out = tmp_path / "sync-cost.json"
    assert sync_cost.main(["--probes-only", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result) == {"schema", "env", "config", "handoff_probes"}
    assert result["handoff_probes"]["pingpong"]["5120"]["ns_per_handoff"] == 900
    printed = capsys.readouterr().out
    assert "hand-off through L2, 5 KiB payload: 900 ns" in printed
    assert "cuda-epoch" not in printed, "--probes-only runs no epoch kernel"


def test_sync_cost_records_a_probe_library_that_cannot_build(monkeypatch, capsys):
    sync_cost = import_benchmark("sync_cost")
    from fasttrain.ladder import build

    def unavailable():
        raise build.Unavailable("nvcc not found on PATH")

    monkeypatch.setattr(sync_probes, "measure", unavailable)
    assert sync_cost.handoff_probes() == {"error": "Unavailable: nvcc not found on PATH"}
    assert "hand-off probes: Unavailable: nvcc not found" in capsys.readouterr().out


HARNESS = "tests/ladder/csrc/sync_probes_host.cu"


@pytest.fixture(scope="module")
def host(tmp_path_factory):
    lib = compile_harness(HARNESS, tmp_path_factory.mktemp("probes"))
    p, i32, i64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong
    lib.pingpong_host.argtypes = [i32, i32, i32, i64, p, p, p]
    lib.broadcast_host.argtypes = [i32, i32, i64, p, p, p, p]
    return lib


def _np_ptr(a: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(a.ctypes.data)


def host_pingpong(host, ctas, rounds, words, timeout_ns=10**10):
    flag = np.zeros(1, dtype=np.uint32)
    payload = np.zeros(max(2 * words, 1), dtype=np.uint32)
    out = np.zeros(len(sync_probes.PINGPONG_OUT), dtype=np.int64)
    host.pingpong_host(ctas, rounds, words, timeout_ns, _np_ptr(flag), _np_ptr(payload),
                       _np_ptr(out))
    return dict(zip(sync_probes.PINGPONG_OUT, out.tolist(), strict=True)), payload


@pytest.mark.parametrize("words", [0, 256, 1280])
def test_the_pingpong_protocol_on_the_cpu_makes_every_round_trip(host, words):
    r, payload = host_pingpong(host, ctas=2, rounds=300, words=words)
    assert r["counter"] == 2 * (300 + 1) and r["stuck_at"] == 0
    assert r["payload_errors"] == 0 and r["ns"] > 0
    assert (r["sm_0"], r["sm_1"]) == (0, 1)
    if words:  # the last hand-off (602, CTA 1 → 0) and the one before (601, CTA 0 → 1)
        h = np.arange(words, dtype=np.uint64)
        assert (payload[words:] == (602 * 0x9E3779B1 + h) % 2**32).all()
        assert (payload[:words] == (601 * 0x9E3779B1 + h) % 2**32).all()


def test_a_pingpong_without_its_peer_times_out_at_the_first_hand_off_back(host):
    r, _ = host_pingpong(host, ctas=1, rounds=10, words=4, timeout_ns=20_000_000)
    assert r["stuck_at"] == 2 and r["counter"] == 1, "CTA 0 sent hand-off 1 and waited for 2"


def test_the_broadcast_protocol_on_the_cpu_times_every_round(host):
    consumers, rounds = 3, 40
    counters = np.zeros(2, dtype=np.uint32)
    stamps = np.zeros(consumers, dtype=np.int64)
    out = np.zeros(len(sync_probes.BROADCAST_HEADER) + 2 * rounds, dtype=np.int64)
    ptrs = [ctypes.c_void_p(counters.ctypes.data + 4 * i) for i in range(2)]
    host.broadcast_host(consumers, rounds, 10**10, *ptrs, _np_ptr(stamps), _np_ptr(out))
    stuck, tick = out[:2]
    first, last = out[2::2], out[3::2]
    assert stuck == 0 and tick > 0
    assert counters.tolist() == [rounds + 1, consumers * (rounds + 1)], "flag, acknowledgements"
    assert (first >= 0).all() and (first <= last).all(), "every timed round was written"


def _gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return sync_probes.load_library()


@pytest.mark.gpu
@pytest.mark.parametrize("payload_bytes", [0, 5 * 1024])
def test_pingpong_on_the_gpu_makes_every_round_trip(payload_bytes):
    r = sync_probes.pingpong(_gpu(), payload_bytes, rounds=2_000, launches=2)
    assert math.isfinite(r["ns_per_handoff"]) and r["ns_per_handoff"] > 0
    assert r["counters"] == [2 * (2_000 + 1)] * 2, "every round trip happened, none twice"
    assert r["payload_errors"] == 0, "a payload word read after the acquire was stale"
    assert all(a != b for a, b in r["sms"]), "the two CTAs shared an SM"


@pytest.mark.gpu
def test_broadcast_on_the_gpu_reaches_every_consumer():
    r = sync_probes.broadcast(_gpu(), consumers=56, rounds=100)
    assert 0 < r["first_ns_median"] <= r["last_ns_median"] < 1e6


@pytest.mark.gpu
def test_the_residency_probes_answer_and_leave_no_error_behind():
    lib = _gpu()
    threads, smem = sync_probes.ROLES["one launch"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("thread-block clusters need sm_90+")
    assert 0 < sync_probes.max_active_clusters(lib, 8, threads, smem)["ctas"] <= sms
    small = sync_probes.resident_launch(lib, 2, 8, 256, 0, cooperative=False)
    assert small == {"ctas": 16, "status": "ok", "resident": 16, "cluster_size": 8}
    both = sync_probes.resident_launch(lib, 16, 8, threads, smem, cooperative=True)
    assert both["status"] == "ok" or both["status"].startswith("cudaError"), both
    torch.cuda.synchronize()
    assert (torch.ones(4, device="cuda") + 1).sum().item() == 8, "a failed launch left its error"


def test_sync_cost_picks_versions_and_v7_pairs_or_refuses_with_one_line(capsys):
    sync_cost = import_benchmark("sync_cost")
    assert sync_cost.parse_versions(None) is None
    assert sync_cost.parse_versions("7,6") == {2, 6, 7}, "v2 is every variant's reference"
    assert sync_cost.parse_v7(None) == sync_cost.V7_TIMED
    assert sync_cost.parse_v7("e,c:launch") == (("c", "launch"), ("e", "launch"))
    assert sync_cost.parse_v7("c") == (("c", "kernel"), ("c", "launch"))
    # The next GPU loan's call: the row's v7f against g, h and i (timed in one launch only).
    assert sync_cost.parse_v7("h:launch,f:launch,g") == (("f", "launch"), ("g", "launch"),
                                                         ("h", "launch"))
    assert sync_cost.parse_v7("i,f:launch,h:launch") == (("f", "launch"), ("h", "launch"),
                                                         ("i", "launch"))
    assert sync_cost.parse_v7("j,i:launch,f:launch") == (("f", "launch"), ("i", "launch"),
                                                         ("j", "launch"))
    assert sync_cost.parse_v7("k,j:launch,f:launch") == (("f", "launch"), ("j", "launch"),
                                                         ("k", "launch"))
    assert sync_cost.parse_v7("m,k:launch,j:launch") == (("j", "launch"), ("k", "launch"),
                                                         ("m", "launch"))
    assert sync_cost.parse_v7("n,k:launch") == (("k", "launch"), ("n", "launch"))
    for argv in (["--versions", "8"], ["--versions", "six"], ["--v7", "c:graph"], ["--v7", "z"],
                 ["--v7", "h:kernel"], ["--v7", "i:kernel"], ["--v7", "j:kernel"],
                 ["--v7", "k:kernel"], ["--v7", "m:kernel"], ["--v7", "n:kernel"]):
        assert sync_cost.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("sync_cost: --"), err

"""The key figures scripts/gpu-check prints for each step, read from the files the step wrote
(its JUnit XML or JSON): a few lines each, for the summary."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path


def _junit_counts(path: Path) -> dict[str, int]:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "failures", "errors",
                                                            "skipped")}
    n["passed"] = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    return n


def passed_tests(path: Path) -> int:
    try:
        return _junit_counts(path)["passed"]
    except (OSError, ET.ParseError):
        return 0


def _pytest_figures(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    n = _junit_counts(path)
    lines = [f"{n['tests']} tests: {n['passed']} "
             f"passed, {n['failures']} failed, {n['errors']} errors, {n['skipped']} skipped"]
    for case in root.iter("testcase"):
        for kind in ("failure", "error", "skipped"):
            node = case.find(kind)
            if node is not None and (kind != "skipped" or n["skipped"] < 5):
                msg = (node.get("message") or "").splitlines()[0][:200] if node.get(
                    "message") else ""
                lines.append(f"{kind}: {case.get('name')}: {msg}")
    return lines[:40]


def _env_figures(path: Path) -> list[str]:
    env = json.loads(path.read_text())
    return [f"{env.get('gpu') or 'no GPU'} ({env.get('gpu_memory_gb')} GiB, driver "
            f"{env.get('driver')}, CUDA {env.get('cuda')}); torch {env.get('torch')}, Python "
            f"{env.get('python')}, triton {env.get('triton')}; commit {env.get('git_commit')}"]


def _doctor_figures(path: Path) -> list[str]:
    report = json.loads(path.read_text())
    return [f"{c['check']} on {c['device']}: {c['status']}" for c in report["checks"]]


def _speedup_figures(path: Path) -> list[str]:
    return [f"{r['model']:>4} {r['config']:<32} " + (
        f"{r['ms_per_step']:.3g} ms/step, {r.get('speedup', float('nan')):.2f}× faster, "
        f"peak {r.get('peak_memory_gb', float('nan')):.3f} GiB "
        f"({r.get('memory_ratio', float('nan')):.2f}× less)" if r["status"] == "ok"
        else f"{r['status']}: {r.get('reason')}") for r in json.loads(path.read_text())["rows"]]


def _memory_prediction_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    lines = [f"max |error| {result['max_abs_error']:.1%}" if result["max_abs_error"] is not None
             else "no case measured"]
    lines += [f"{r['model']:>6} batch {r['batch_size']:>3} {r['precision']}: " + (
        f"predicted {r['predicted_peak'] / 2**20:.1f} MiB, measured "
        f"{r['measured_peak'] / 2**20:.1f} MiB ({r['error']:+.1%})" if r["status"] == "ok"
        else r.get("reason", r["status"])) for r in result["rows"]]
    return lines


def _plan_accuracy_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    lines = [f"{scheme}: {w['all']}/{w['of']} points within ±{result['config']['target']:.0%} "
             f"({w['target_batches']}/{w['of_target']} at the target batch sizes), worst "
             f"{w['worst']:+.0%}" for scheme, w in result["within_target"].items()]
    lines.append(f"peaks {result['peaks']['source']}: {result['peaks']['flops'] / 1e12:.3g} "
                 f"TFLOP/s, {result['peaks']['bandwidth'] / 1e9:.0f} GB/s")
    lines += [f"{r['model']:>6} batch {r['batch_size']:>5}: measured {r['measured_s'] * 1e3:.3g} "
              f"ms, predicted {r['predictions']['other batch sizes']['predicted_s'] * 1e3:.3g} "
              f"ms ({r['predictions']['other batch sizes']['error']:+.0%}), {r['ops']} calls"
              for r in result["rows"]]
    return lines


def _bench_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    cut = ["interrupted: each row over the repeats it finished"] if result["config"].get(
        "interrupted") else []
    return cut + [f"{r['impl']:<20} {r.get('device') or '-':<5} " + (
        f"{r['epoch_ms']:.3g} ms/epoch ({len(r.get('repeats') or ()) or 'computed'}"
        f"{'×' if r.get('repeats') else ''}), test acc {r.get('test_accuracy')}"
        if r["status"] == "ok" else f"{r['status']}: {r.get('reason')}")
        for r in result["rows"]]


def bench_accuracy_problem(path: Path, tolerance: float = 0.005) -> str | None:
    """Why the ladder's rows do not all train alike, or None: every row that ran must end 20
    epochs within `tolerance` (half a point) of numpy-cpu's test accuracy, and on the GPU machine
    every row must run (an `unavailable` row there is a broken build). gpu-check takes this
    check from the bench run instead of training every CUDA row 20 epochs more in pytest."""
    rows = {r["impl"]: r for r in json.loads(path.read_text())["rows"]}
    reference = (rows.get("numpy-cpu") or {}).get("test_accuracy")
    if reference is None:
        return "no numpy-cpu test accuracy to compare the rows with"
    off = [f"{name} {r['test_accuracy']:.4f}" for name, r in rows.items()
           if r["status"] == "ok" and r.get("test_accuracy") is not None
           and abs(r["test_accuracy"] - reference) > tolerance]
    failed = [f"{name} ({r['status']})" for name, r in rows.items() if r["status"] != "ok"]
    problems = ([f"test accuracy more than {tolerance:.1%} from numpy-cpu's {reference:.4f}: "
                 + ", ".join(off)] if off else []) + (
        [f"rows not ok: {', '.join(failed)}"] if failed else [])
    return "; ".join(problems) or None


def experiment_figures(path: Path) -> list[str]:
    keys = ("row", "part", "label", "precision", "status", "ms_per_step", "peak_bytes",
            "speedup_vs_cpu", "memory_vs_gpu_fp32", "memory_saved", "reason")
    return ["; ".join(f"{k} {r[k]:.4g}" if isinstance(r[k], float) else f"{k} {r[k]}"
                      for k in keys if r.get(k) is not None)
            for r in json.loads(path.read_text())["rows"]]


def _profile_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    v = result["classification"]
    syncs = ", ".join(f"{s['call']} {Path(s['file']).name}:{s['line']} ×{s['per_step']:.2g}"
                      for s in result["syncs"]) or "none"
    shares = ", ".join(f"{k} {x:.0%}" for k, x in v["shares"].items())
    return [f"{v['class']}-bound, {v['step_ms']:.3g} ms/step traced; shares: {shares}",
            f"syncs per step: {syncs}",
            f"NVML samples: {result['device_sampler'].get('count', 0)}"]


def _stream_vs_memory_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    s, cfg = result["summary"], result["config"]
    lines = [f"streamed ÷ in memory {s['ratio']:.3f} (target ≥ {s['target']}: "
             f"{'met' if s['meets_target'] else 'NOT met'}); per round "
             + ", ".join(f"{x:.3f}" for x in s["paired_ratios"]),
             f"in memory {s['in_memory_samples_per_s']:,.0f} samples/s, streamed "
             f"{s['streamed_samples_per_s']:,.0f} (medians of {result['rounds_done']} rounds; "
             f"cnn, batch {cfg['batch_size']}, {cfg['precision']}, {cfg['workers']} workers)",
             f"DataLoader alone {s['loader_alone_samples_per_s']:,.0f} samples/s: "
             f"{s['loading_headroom']:.1f}× the in-memory speed; first losses differ by "
             f"{s['first_loss_max_rel_diff']:.1e} at most"]
    if result.get("stopped_early"):
        lines.append(f"stopped early: {result['stopped_early']}")
    return lines


def _peers_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())

    def ratio(x):  # None where hand-indexed has no run yet (a run stopped early)
        return "-" if x is None else f"{x:.3f}"

    lines = [f"{r['model']} {r['contender']:<12} " + (
        f"{r['samples_per_s_median']:,.0f} samples/s, × hand-indexed {ratio(r['vs_reference'])} "
        f"(paired {ratio(r['vs_reference_paired'])})" if r["status"] == "ok"
        else f"{r['status']}: {r.get('reason')}") for r in result["rows"]]
    if result.get("stopped_early"):
        lines.append(f"stopped {result['stopped_early']}")
    return lines


def _sync_cost_figures(path: Path) -> list[str]:
    result = json.loads(path.read_text())
    barriers = result.get("barrier_ns", {})  # none in a --probes-only run
    lines = [f"barrier: {', '.join(f'{k} {v:.0f} ns' for k, v in barriers.items())}"] * bool(
        barriers)
    if result.get("graph_node_us") is not None:
        lines.append(f"CUDA graph: {result['graph_node_us']:.2f} µs per dependent kernel")
    steps = result.get("config", {}).get("steps", 469)
    lines += [f"cuda-epoch, {k}: " + (f"{v:.3f} ms/epoch = {v * 1e3 / steps:.2f} µs/step"
                                       if isinstance(v, float) else str(v))
              for k, v in result.get("cuda_epoch_ms", {}).items()]
    phases = result.get("cuda_epoch_phases_us", result.get("cuda_epoch_v4_phases_us", {}))
    for k, profile in phases.items():  # the key before v5 was added: cuda_epoch_v4_phases_us
        lines.append(f"  {k} phases, µs a step (mean over CTAs): " + ", ".join(
            f"{name} {us:.2f}" for name, us in profile["mean_us"].items())
            if isinstance(profile, dict) else f"  {k} phases: {profile}")  # a profile that failed
    if result.get("handoff_probes"):
        lines += _handoff_probe_figures(result["handoff_probes"])
    return lines


def _v7_candidates_figures(path: Path) -> list[str]:
    """sync_cost's figures, then the v7 variants in one launch ranked, fastest first (the row's
    variant among them): the line the next choice of cuda_epoch.V7_VARIANT is read from."""
    result = json.loads(path.read_text())
    timed = sorted((ms, key.split(" ", 1)[0]) for key, ms in result.get("cuda_epoch_ms", {}).items()
                   if key.startswith("v7") and " in one launch" in key and isinstance(ms, float))
    ranked = ", ".join(f"{name} {ms:.3f}" for ms, name in timed) or "none timed"
    return [*_sync_cost_figures(path), f"v7 in one launch, fastest first (ms/epoch): {ranked}"]


def _handoff_probe_figures(probes: dict) -> list[str]:
    """cuda-epoch v7's step 1 (ladder/sync_probes.py): a failed probe is its reason; a hand-off
    that lost round trips or payload words is named, since v7's protocol would lose them too."""
    if "error" in probes:
        return [f"hand-off probes: {probes['error']}"]

    def handoff(size, r):
        label = f"{int(size) // 1024} KiB" if int(size) else "flag"
        if isinstance(r, str):
            return f"{label} {r}"
        wrong = (r["payload_errors"] or any(c != r["expected_counter"] for c in r["counters"]))
        return (f"{label} {r['ns_per_handoff']:.0f} ns" + (
            f" (PROTOCOL FAILED: counters {r['counters']} of {r['expected_counter']}, "
            f"{r['payload_errors']} payload errors)" if wrong else ""))

    lines = ["hand-off through L2, one way (median of launches): " + ", ".join(
        handoff(size, r) for size, r in probes["pingpong"].items())]
    b = probes["broadcast"]
    lines.append("one flag to many CTAs: " + (b if isinstance(b, str) else (
        f"{b['consumers']} CTAs, the first sees it after {b['first_ns_median']:.0f} ns, the last "
        f"after {b['last_ns_median']:.0f} ns (median; timer step {b['timer_tick_ns']} ns)")))
    lines.append("max active clusters: " + "; ".join(
        f"{role} " + ", ".join(f"of {c} {v if isinstance(v, str) else v['clusters']}"
                               for c, v in sizes.items())
        for role, sizes in probes["max_active_clusters"].items()))
    lines += [f"{name}: " + (f"{r['resident']} of {r['ctas']} CTAs resident at once"
                             if r["status"] == "ok" else r["status"])
              for name, r in probes["resident_launch"].items()]
    return lines


def _cuda_profile_figures(path: Path) -> list[str]:
    lines = []
    for r in json.loads(path.read_text())["rows"]:
        if r["status"] != "ok":
            lines.append(f"{r['impl']:<14} {r['status']}: {r.get('reason')}")
            continue
        top = sorted(r["top_kernels_us_per_step"].items(), key=lambda kv: -kv[1])[:3]
        lines.append(f"{r['impl']:<14} {r['span_us_per_step']:.1f} µs/step, busy "
                     f"{r['busy_fraction']:.0%}, {r['kernels_per_step']:.0f} kernels/step; top: "
                     + ", ".join(f"{name.split('(')[0]} {us:.1f} µs" for name, us in top))
    return lines


def _dispatch_cost_figures(path: Path) -> list[str]:
    """torch-optimized's step at the smallest shapes, µs: v3's ops and the product's, per device."""
    rows = {(r.get("device", "cpu"), r["variant"], r["mode"]): r["us_per_step_median"]
            for r in json.loads(path.read_text())["rows"] if r["shape"] == "smallest"}
    lines = [f"{dev}: v3's step {rows[(dev, 'out', 'grad')]:.2f} µs, train_steps "
             f"{rows[(dev, 'product', 'grad')]:.2f} µs, torch.jit.script "
             f"{rows[(dev, 'script', 'inference')]:.2f} µs (host path, smallest shapes)"
             for dev in ("cpu", "cuda") if (dev, "out", "grad") in rows]
    if ("cuda", "out", "grad") in rows:
        lines.append("the CUDA backend's host work: "
                     f"{rows[('cuda', 'out', 'grad')] - rows[('cpu', 'out', 'grad')]:.2f} µs "
                     "of v3's step")
    return lines


def _v8_probes_figures(path: Path) -> list[str]:
    """cuda-epoch v8's pieces alone (benchmarks/v8_probes.py), each probe's own lines."""
    from fasttrain.ladder import v8_chain, v8_grams, v8_workers

    result = json.loads(path.read_text())
    lines = []
    for name, describe in (("workers", v8_workers.describe), ("chain", v8_chain.describe),
                           ("grams", lambda r: [v8_grams.describe_grams(r)])):
        r = result.get(name, {"error": "not run"})
        lines += [f"v8 {name}: {r['error']}"] if "error" in r else describe(r)
    return lines


FIGURES = {"gpu-tests": _pytest_figures, "compiled-tests": _pytest_figures,
           "v7-tests": _pytest_figures, "v7-candidates": _v7_candidates_figures,
           "env": _env_figures, "doctor": _doctor_figures,
           "engine-speedup": _speedup_figures, "memory-prediction": _memory_prediction_figures,
           "plan-accuracy": _plan_accuracy_figures, "bench": _bench_figures,
           "profile": _profile_figures, "stream-vs-memory": _stream_vs_memory_figures,
           "peers-in-memory": _peers_figures, "sync-cost": _sync_cost_figures,
           "cuda-step-profile": _cuda_profile_figures, "dispatch-cost": _dispatch_cost_figures,
           "variant-sweep": _bench_figures,  # the bench's schema, one row a variant
           "compiled-sweep": _bench_figures,
           "v8-probes": _v8_probes_figures}

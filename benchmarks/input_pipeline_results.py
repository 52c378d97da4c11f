"""The statistics, targets, table and file name of benchmarks/input_pipeline.py's result."""

from __future__ import annotations

import datetime
import re
import statistics

PEERS = ("lightning", "accelerate")  # the frameworks; the hand-written loop is the reference


def summarize(runs: list, contenders, models: dict) -> list:
    """One row per (regime, contender): its rounds, their median, min, max and spread
    ((max - min) / median), the ratios of medians to the hand loop and the best peer, and the
    medians of the main process's and the workers' CPU ms per step."""
    rows = []
    for regime, model in models.items():
        med = {}
        for name in contenders:
            mine = [x for x in runs if x["regime"] == regime and x["contender"] == name]
            ok = [x["samples_per_s"] for x in mine if x["status"] == "ok"]
            row = {"regime": regime, "model": model, "contender": name,
                   "status": next((x["status"] for x in mine if x["status"] != "ok"), "ok"),
                   "reason": next((x["reason"] for x in mine if x["status"] != "ok"), None),
                   "samples_per_s_rounds": ok}
            if ok:
                med[name] = m = statistics.median(ok)
                row.update(samples_per_s_median=m, samples_per_s_min=min(ok),
                           samples_per_s_max=max(ok), spread=(max(ok) - min(ok)) / m)
            for who in ("main", "workers"):  # CPU ms per step, where it was read
                key = f"{who}_cpu_ms_per_step"
                cpu = [x[key] for x in mine if x["status"] == "ok" and x.get(key) is not None]
                row[f"{key}_median"] = statistics.median(cpu) if cpu else None
            if name == "fasttrain":
                row["data_path"] = next((x.get("path") for x in mine if x["status"] == "ok"),
                                        None)
            rows.append(row)
        best_peer = max((med[p] for p in PEERS if p in med), default=None)
        for row in rows[-len(contenders):]:
            m = med.get(row["contender"])
            row["vs_hand"] = m / med["hand-written"] if m and "hand-written" in med else None
            row["vs_hand_paired"] = paired(runs, regime, row["contender"], "hand-written")
            row["vs_best_peer"] = m / best_peer if m and best_peer else None
    return rows


def paired(runs: list, regime: str, name: str, ref: str) -> float | None:
    """The median over rounds of `name`'s samples/s over `ref`'s in the same round: slow drifts
    of the machine (other load, clock) cancel within a round, which the ratio of medians keeps."""
    by_round: dict[int, dict[str, float]] = {}
    for x in runs:
        if x["regime"] == regime and x["status"] == "ok" and x["contender"] in (name, ref):
            by_round.setdefault(x["round"], {})[x["contender"]] = x["samples_per_s"]
    ratios = [r[name] / r[ref] for r in by_round.values() if name in r and ref in r]
    return statistics.median(ratios) if ratios else None


def targets(rows: list) -> dict:
    """The issue's two targets, judged on the medians (only a streamed fasttrain counts)."""
    out = {}
    for regime, key, bound, rule in (("input-bound", "vs_best_peer", 1.0, "fasttrain >= best peer"),
                                     ("compute-bound", "vs_hand", 0.98,
                                      "fasttrain within 2% of the hand loop")):
        mine = {r["contender"]: r for r in rows if r["regime"] == regime}
        if "fasttrain" not in mine:
            continue
        ft, ratio = mine["fasttrain"], mine["fasttrain"].get(key)
        met = None if ratio is None or ft.get("data_path") != "streamed" else ratio >= bound
        # The rounds' spread next to the verdict: a ratio inside it is not a difference.
        spread = max((r.get("spread") or 0.0 for r in mine.values()), default=None)
        out[regime] = {"rule": rule, "ratio": ratio, "met": met, "largest_spread": spread}
    return out


def table(result: dict):
    from fasttrain.report import rows_table

    def num(key, fmt):
        return lambda r: "-" if r.get(key) is None else fmt.format(r[key])

    cfg, load = result["config"], result["load"]
    threads = cfg.get("threads") or "torch's default"
    caption = (f"{cfg['images']} PNG files, batch {cfg['batch_size']}, {cfg['workers']} workers, "
               f"main process intra-op threads: {threads}, "
               f"{cfg['device']}, {cfg['rounds']} interleaved rounds of {cfg['steps']} steps "
               f"after {cfg['warmup']}; load {load['before'][0]:.2f} → {load['after'][0]:.2f} "
               f"on {load['cpu_count']} CPUs")
    return rows_table("input pipeline: samples/s (median over rounds)", [
        ("regime", lambda r: f"{r['regime']} ({r['model']})"),
        ("contender", lambda r: r["contender"]),
        ("samples/s", num("samples_per_s_median", "{:,.0f}")),
        ("min", num("samples_per_s_min", "{:,.0f}")),
        ("max", num("samples_per_s_max", "{:,.0f}")),
        ("spread", num("spread", "{:.1%}")), ("× hand", num("vs_hand", "{:.3f}")),
        ("× hand, paired", num("vs_hand_paired", "{:.3f}")),
        ("× best peer", num("vs_best_peer", "{:.3f}")),
        ("main CPU ms/step", num("main_cpu_ms_per_step_median", "{:.2f}")),
        ("workers CPU ms/step", num("workers_cpu_ms_per_step_median", "{:.1f}")),
        ("data path", lambda r: "" if r["contender"] != "fasttrain"
         else r.get("data_path") or "not reported")], result["rows"], caption,
        label_columns=2)


def default_name(env: dict) -> str:
    """DATE-HARDWARE-input-pipeline.json, as the other results are named."""
    hw = env.get("gpu") or env["cpu"]
    slug = "-".join(re.findall(r"[a-z0-9]+", hw.lower().replace("(r)", "").replace("(tm)", "")))
    kind = "gpu" if env.get("gpu") else "cpu"
    return f"{datetime.date.today()}-{kind}-{slug}-{env['cores']}core-input-pipeline.json"

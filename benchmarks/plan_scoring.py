"""The scoring of benchmarks/plan_accuracy.py: every scheme's fit and prediction of each point
from points it did not see (that script's docstring names the schemes), the counts within the
target, and the re-fit of a committed result (`--from-json`: its measurements, nothing measured).
"""

from __future__ import annotations

import json

import numpy as np

from fasttrain.errors import UserError
from fasttrain.lab import calibration, overlap, steptime

TARGET = 0.3
SCHEMES = ("other batch sizes", "other models", "one efficiency", "overlapped, other points",
           "overlapped, other models", "calibrated, other batch sizes")


def one_efficiency(points: list[steptime.Point], totals: list[float]) -> float:
    """The previous model's constant: eff minimizing Σ ((R/eff)/T − 1)², R the roofline of the
    step's totals (max(FLOPs/peak, bytes/bandwidth) of the whole step)."""
    x = np.array([r / p.measured_s for p, r in zip(points, totals, strict=True)])
    return float(x @ x / x.sum())


def predict(rows: list[dict]) -> None:
    """Adds each scheme's fit, predicted step and error to every row."""
    pts = [r["point"] for r in rows]
    for i, r in enumerate(rows):
        same = [j for j, o in enumerate(rows) if o["model"] == r["model"] and j != i]
        other = [j for j, o in enumerate(rows) if o["model"] != r["model"]]
        r["predictions"] = {}
        for scheme, idx in (("other batch sizes", same), ("other models", other)):
            eff, launch = steptime.fit([pts[j] for j in idx])
            pred = r["roofline_s"] / eff + r["ops"] * launch
            r["predictions"][scheme] = {
                "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in idx],
                "efficiency": eff, "launch_s": launch, "predicted_s": pred,
                "error": pred / r["measured_s"] - 1}
        eff = one_efficiency([pts[j] for j in same], [rows[j]["totals_roofline_s"] for j in same])
        pred = r["totals_roofline_s"] / eff
        r["predictions"]["one efficiency"] = {
            "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in same],
            "efficiency": eff, "launch_s": 0.0, "predicted_s": pred,
            "error": pred / r["measured_s"] - 1}
        rest = [j for j in range(len(rows)) if j != i]
        for scheme, idx in (("overlapped, other points", rest),
                            ("overlapped, other models", other)):
            eff, issue = overlap.fit([pts[j] for j in idx])
            pred = overlap.step_s(r["roofline_s"], r["ops"], eff, issue)
            r["predictions"][scheme] = {
                "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in idx],
                "efficiency": eff, "launch_s": issue, "predicted_s": pred,
                "error": pred / r["measured_s"] - 1}
        # what `plan --calibrate` now does on a GPU: the same model's two other batch sizes,
        # each constant from the point on its side (lab/calibration.read_max; on a CPU it reads
        # the sum: "other batch sizes")
        eff, issue, _, _, unknown, _ = calibration.read_max([pts[j] for j in same])
        pred = overlap.step_s(r["roofline_s"], r["ops"], eff, issue)
        r["predictions"]["calibrated, other batch sizes"] = {
            "fitted_on": [f"{rows[j]['model']}@{rows[j]['batch_size']}" for j in same],
            "efficiency": eff, "launch_s": issue, "unidentified": list(unknown),
            "predicted_s": pred, "error": pred / r["measured_s"] - 1}


def within_target(rows: list[dict], points: dict) -> dict:
    """Per scheme: how many points are predicted within ±TARGET, all and at the target's two
    batch sizes (each model's ends), and the worst error."""
    within = {}
    for scheme in SCHEMES:
        errs = [r["predictions"][scheme]["error"] for r in rows]
        outer = [r["predictions"][scheme]["error"] for r in rows
                 if r["batch_size"] != points[r["model"]][1][1]]
        within[scheme] = {"all": sum(abs(e) <= TARGET for e in errs), "of": len(errs),
                          "target_batches": sum(abs(e) <= TARGET for e in outer),
                          "of_target": len(outer), "worst": max(errs, key=abs)}
    return within


def show(rows: list[dict], within: dict) -> None:
    """Every point's errors, then each scheme's count within the target and its worst error."""
    for r in rows:
        e = {s: r["predictions"][s]["error"] for s in SCHEMES}
        print(f"{r['model']:>6} batch {r['batch_size']:>5}: measured {r['measured_s'] * 1e3:8.3f}"
              f" ms, roofline {r['roofline_s'] * 1e3:8.3f} ms, {r['ops']:4d} calls; errors: "
              + ", ".join(f"{s} {v:+.0%}" for s, v in e.items()), flush=True)
    for scheme, w in within.items():
        print(f"{scheme:>24}: {w['all']}/{w['of']} within ±{TARGET:.0%} ({w['target_batches']}/"
              f"{w['of_target']} at the target batch sizes), worst {w['worst']:+.0%}")


def refit(path: str) -> dict:
    """A committed result's points re-fitted and re-scored by the present schemes, nothing
    measured: its rows with their predictions replaced, and the counts within the target."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError as e:
        raise UserError(f"--from-json {path}: cannot read it ({e.strerror}); give one of "
                        f"benchmarks/results/*plan-accuracy*.json") from None
    try:
        old = json.loads(text)
        rows, config = old["rows"], old["config"]
        points = {m: (c["data"], tuple(c["batch_sizes"])) for m, c in config["points"].items()}
        for r in rows:
            r["point"] = steptime.Point(r["batch_size"], r["roofline_s"], r["ops"],
                                        r["measured_s"], tuple(r.get("step_times_s", ())))
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"--from-json {path}: not a plan-accuracy result this script wrote "
                        f"({type(e).__name__}: {e}); give one of benchmarks/results/*plan-"
                        f"accuracy*.json") from None
    predict(rows)
    for r in rows:
        del r["point"]
    return {"schema": "fasttrain.plan-accuracy-refit/1", "refit_of": str(path),
            "note": "a re-fit of the measurements in refit_of (its counts and median steps), "
                    "not a new measurement", "env": old.get("env", {}), "config": config,
            "peaks": old.get("peaks"), "rows": rows, "within_target": within_target(rows, points)}

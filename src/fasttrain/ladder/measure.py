"""One row of the bench, measured: checked (one step against the float64 reference), timed
(a fresh instance per repeat, by the one timing harness) and summarized over its repeats; the
roofline row computed from the peaks. `fasttrain.bench` orders the rows and their repeats."""

from __future__ import annotations

import statistics

from fasttrain import ladder
from fasttrain.ladder.check import check_row
from fasttrain.timing import repeat_summary, synchronizer, time_call, time_epochs


def base_row(entry: ladder.Entry) -> dict:
    return {"impl": entry.name, "reproduces": None, "report_ms": None, "device": None,
            "precision": None, "status": "ok", "reason": None, "source": None, "check": None,
            "repeats": []}


def prepare_row(entry: ladder.Entry, data, cfg: ladder.LadderConfig, env: dict) -> dict:
    """Everything before timing: import, availability, source hash, and the check step. The
    returned row has status "ok" only when the row may be timed."""
    row = base_row(entry)
    try:
        cls = entry.load()
    except ImportError as e:
        return {**row, "status": "unavailable", "reason": f"cannot import: {e}"}
    row.update(reproduces=cls.reproduces, report_ms=cls.report_ms, device=cls.device,
               precision=cls.precision, source=entry.source_hash())
    reason = cls.unavailable(env, cfg)
    if reason:
        return {**row, "status": "unavailable", "reason": reason}
    if cls.trains and not cls.computed:
        row["check"] = check = check_row(entry, data, cfg)
        if not check["ok"]:
            return {**row, "status": "failed", "reason": f"check: {check['error']}"}
    return row


def time_row(entry: ladder.Entry, data, cfg: ladder.LadderConfig, on_epoch=None) -> dict:
    """One repeat: a fresh instance, set up, timed over every epoch and evaluated. Raises what the
    row raises (the caller marks the row failed)."""
    impl = entry.create(cfg.device)
    sync = synchronizer(impl.device)
    _, setup_ms = time_call(lambda: impl.setup(data, cfg), sync)
    times, losses = time_epochs(impl.train_epoch, cfg.epochs, sync, on_epoch)
    test_loss, test_acc = impl.evaluate()
    read = [x for x in losses if x is not None]
    return {
        "device": impl.device,
        "precision": impl.precision,
        "setup_ms": setup_ms,
        **times.summary(),
        "epoch_ms_all": list(times.ms),
        "train_loss": read[-1] if read else None,
        "train_loss_per_epoch": losses,
        "test_accuracy": test_acc,
        "test_loss": test_loss,
        "details": impl.details(),
    }


def summarize_row(row: dict) -> dict:
    """The row's figures from its repeats: median and spread of the per-repeat epoch times, the
    min / median / max over every timed epoch, the median setup; metrics of the first repeat
    (every repeat trains the same thing from the same start)."""
    reps = row["repeats"]
    if row["status"] != "ok" or not reps:
        return row
    every = [ms for r in reps for ms in r["epoch_ms_all"]]
    first = reps[0]
    return {
        **row,
        "device": first["device"],
        "precision": first["precision"],
        **repeat_summary([r["epoch_ms"] for r in reps]),
        "epoch_ms_min": min(every),
        "epoch_ms_median": statistics.median(every),
        "epoch_ms_max": max(every),
        "total_ms": statistics.median([r["total_ms"] for r in reps]),
        "setup_ms": statistics.median([r["setup_ms"] for r in reps]),
        **{k: first[k] for k in ("train_loss", "test_accuracy", "test_loss", "details")},
    }


def computed_row(entry: ladder.Entry, row: dict, data, cfg, peaks: dict | None) -> dict:
    """The roofline: its figure comes from the peaks, not from a clock."""
    if peaks is None:
        return {**row, "status": "unavailable", "reason": "no peak figures for this device"}
    est = entry.create(cfg.device).estimate(data, cfg, peaks)
    # Whose peaks: the GPU's data sheet when the bench runs on cuda, else this CPU's.
    device = "cuda" if cfg.device.startswith("cuda") else "cpu"
    return {**row, "device": device, "precision": "fp32", "roofline": est,
            "epoch_ms": est["epoch_ms"],
            "setup_ms": None, "test_accuracy": None, "test_loss": None}

"""Turning results into things people read: rich tables, self-describing JSON, PNG plots.

The report knows rows (dicts of the result schema), never the implementations behind them.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from rich.table import Table

from fasttrain.errors import UserError
from fasttrain.files import write_atomic


def check_writable(path: str | os.PathLike, flag: str) -> Path:
    """Fail before any work is done if `path` cannot be written (bad flag, not a late crash)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p}: is a directory; give a file name such as {p / 'out'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{flag} {p}: folder {parent} does not exist; create it or choose another")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"{flag} {p}: not writable; choose a path you can write to")
    return p


def write_json(path: str | os.PathLike, result: dict) -> None:
    write_atomic(path, (json.dumps(result, indent=2, allow_nan=False, default=str) + "\n").encode())


def _fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "-"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}" if ms >= 1 else f"{ms:.3f}"


def _baseline(rows: list[dict], name: str) -> dict | None:
    for r in rows:
        if r["impl"] == name and r["status"] == "ok":
            return r
    return None


def bench_table(result: dict, baseline: str = "numpy-cpu") -> Table:
    """The ladder as one table, in the report's order, with the report's figure beside ours."""
    rows, cfg = result["rows"], result["config"]
    base = _baseline(rows, baseline)
    data = cfg["data"] + (" (SYNTHETIC stand-in, not real data)" if cfg.get("synthetic") else "")
    table = Table(
        title=f"fasttrain bench — {data}, {cfg['epochs']} epochs, batch {cfg['batch_size']}, "
        f"lr {cfg['lr']}",
        caption="ms/epoch: mean of the latter half of epochs (min–max over all); setup apart. "
        + (f"Speed-up vs {baseline}." if base else ""),
    )
    for col, just in (
        ("implementation", "left"), ("device", "left"), ("precision", "left"),
        ("ms/epoch", "right"), ("min–max", "right"), ("total ms", "right"),
        ("setup ms", "right"), ("speed-up", "right"), ("test acc", "right"),
        ("test loss", "right"), ("report ms/epoch", "right"),
    ):
        table.add_column(col, justify=just)
    for r in rows:
        report = _fmt_ms(r.get("report_ms"))
        if r["status"] != "ok":
            table.add_row(r["impl"], r.get("device") or "-", "-",
                          f"[dim]{r['status']}[/dim]", f"[dim]{r['reason']}[/dim]",
                          *["" for _ in range(5)], report, style="dim")
            continue
        speedup = f"{base['epoch_ms'] / r['epoch_ms']:.1f}×" if base else "-"
        acc = r.get("test_accuracy")
        has_acc = acc is not None and math.isfinite(acc)
        table.add_row(
            r["impl"], r["device"], r["precision"], _fmt_ms(r["epoch_ms"]),
            f"{_fmt_ms(r['epoch_ms_min'])}–{_fmt_ms(r['epoch_ms_max'])}",
            _fmt_ms(r["total_ms"]), _fmt_ms(r["setup_ms"]), speedup,
            f"{100 * acc:.2f}%" if has_acc else "-",
            f"{r['test_loss']:.4f}" if has_acc else "-", report,
        )
    return table


def bench_markdown(result: dict, baseline: str = "numpy-cpu") -> str:
    """The same table as Markdown, for READMEs and closing notes."""
    rows = result["rows"]
    base = _baseline(rows, baseline)
    lines = [
        "| implementation | device | precision | ms/epoch | min–max | setup ms "
        f"| speed-up vs {baseline} | test acc | report ms/epoch |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        report = _fmt_ms(r.get("report_ms"))
        if r["status"] != "ok":
            cells = [r["impl"], r.get("device") or "-", "-", f"{r['status']}: {r['reason']}",
                     "", "", "", "", report]
        else:
            acc = r.get("test_accuracy")
            cells = [
                r["impl"], r["device"], r["precision"], _fmt_ms(r["epoch_ms"]),
                f"{_fmt_ms(r['epoch_ms_min'])}–{_fmt_ms(r['epoch_ms_max'])}",
                _fmt_ms(r["setup_ms"]),
                f"{base['epoch_ms'] / r['epoch_ms']:.1f}×" if base else "-",
                f"{100 * acc:.2f}%" if acc is not None and math.isfinite(acc) else "-",
                report,
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bench_plot(result: dict, path: str | os.PathLike) -> None:
    """Horizontal bars of ms/epoch on a log axis, beside the report's figure where it has one."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    rows = [r for r in result["rows"] if r["status"] == "ok"]
    names = [r["impl"] for r in rows][::-1]
    ours = [r["epoch_ms"] for r in rows][::-1]
    theirs = [r.get("report_ms") for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(rows) + 1.6))
    ys = range(len(rows))
    ax.barh([y + 0.2 for y in ys], ours, height=0.4, label="fasttrain (this run)", color="#1f77b4")
    ax.barh([y - 0.2 for y in ys], [t or 0 for t in theirs], height=0.4,
            label="published report (its own hardware)", color="#bbbbbb")
    for y, ms in zip(ys, ours, strict=True):
        ax.text(ms * 1.05, y + 0.2, _fmt_ms(ms), va="center", fontsize=8)
    floor = _baseline(rows, "floor-gemm")
    if floor:
        ax.axvline(floor["epoch_ms"], color="#d62728", linestyle="--", linewidth=1,
                   label="GEMM floor (bare matrix products)")
    ax.set_yticks(list(ys), names)
    ax.set_xscale("log")
    ax.set_xlabel("ms per epoch (log scale, lower is better)")
    env, cfg = result["env"], result["config"]
    hw = env.get("gpu") or env.get("cpu")
    data = cfg["data"] + (" (synthetic stand-in)" if cfg.get("synthetic") else "")
    ax.set_title(f"Logistic regression ladder — data: {data}, {cfg['epochs']} epochs — {hw}",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    from io import BytesIO

    buf = BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    write_atomic(path, buf.getvalue())

"""Turning results into things people read: rich tables, self-describing JSON, PNG plots.

The report knows rows (dicts of the result schema), never the implementations behind them.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

from rich.table import Table

from fasttrain.errors import UserError
from fasttrain.files import write_atomic, write_png


def check_outputs(*outputs: tuple[str | os.PathLike | None, str]) -> None:
    """Every (path, flag) of a command's outputs checked before any work is done: writable
    (`check_writable`), and no two flags naming one file (the later would replace the other)."""
    given = [(path, flag) for path, flag in outputs if path]
    seen: dict[str, str] = {}
    for path, flag in given:
        real = os.path.realpath(path)
        if real in seen:
            raise UserError(f"{seen[real]} and {flag} both name {path}: one would replace the "
                            f"other; give them different paths")
        seen[real] = flag
    for path, flag in given:
        check_writable(path, flag)


def check_writable(path: str | os.PathLike, flag: str) -> Path:
    """Fail before any work is done if `path` cannot be written (bad flag, not a late crash),
    or if it would replace a file that is not an earlier output of ours: a result or trace JSON
    (`--plot`: a PNG) is rewritten by a rerun; a README or a data file named by mistake is not."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{flag} {p}: is a directory; give a file name such as {p / 'out'}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{flag} {p}: folder {parent} does not exist; create it or choose another")
    if (not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK))
            or not _can_create_in(parent)):
        raise UserError(f"{flag} {p}: not writable; choose a path you can write to")
    if p.exists() and not _ours(p, png=flag == "--plot"):
        kind = {"--plot": "PNG", "--trace": "trace"}.get(flag, "fasttrain JSON")
        raise UserError(f"{flag} {p}: exists and is not a {kind} an earlier run wrote; choose "
                        f"another path, or move the file away yourself (it is kept)")
    return p


def _can_create_in(folder: Path) -> bool:
    """Whether a file can be made in `folder`, tried: os.access answers yes to root on any
    folder (/proc, a root-squashed share), and the result is written atomically through a new
    file beside its name. The probe is removed at once."""
    import tempfile

    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".fasttrain-probe-"):
            return True
    except OSError:
        return False


_SNIFF_BYTES = 1 << 20  # an output is recognized by its head: never parsed whole


def _ours(p: Path, png: bool) -> bool:
    """Whether the existing file `p` is an output fasttrain would write there: a PNG for a
    plot; for JSON (gzipped too: a `.gz` trace), a result (`"schema": "fasttrain.…`, its first
    key) or a profiler trace (`"traceEvents"`). An empty file counts as ours (a run cut short
    before it wrote, or `touch`)."""
    import gzip

    try:
        with p.open("rb") as f:
            head = f.read(_SNIFF_BYTES)
        if not head:
            return True
        if png:
            return head.startswith(b"\x89PNG\r\n\x1a\n")
        if head.startswith(b"\x1f\x8b"):  # gzip
            with gzip.open(p, "rb") as f:
                head = f.read(_SNIFF_BYTES)
    except (OSError, EOFError):
        return False
    text = head.decode("utf-8", "replace").lstrip()
    return text.startswith("{") and ('"traceEvents"' in text or re.match(
        r'\{\s*"schema"\s*:\s*"fasttrain\.', text) is not None)


def _finite(obj):
    """`obj` with every non-finite float (a diverged row's loss: inf, nan) as None: strict JSON
    has no inf or nan, and a diverged row must not cost the run its result file."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def write_json(path: str | os.PathLike, result: dict) -> None:
    write_atomic(path, (json.dumps(_finite(result), indent=2, allow_nan=False, default=str)
                        + "\n").encode())


def _fmt_ms(ms: float | None) -> str:
    if ms is None or not math.isfinite(ms):
        return "-"
    return f"{ms:,.0f}" if ms >= 100 else f"{ms:.3g}" if ms >= 1 else f"{ms:.3f}"


def _baseline(rows: list[dict], name: str) -> dict | None:
    for r in rows:
        if r["impl"] == name and r["status"] == "ok":
            return r
    return None


def _cells(r: dict, base: dict | None, floor: dict | None) -> list[str]:
    """ms/epoch, spread over repeats, × roofline, setup, speed-up, test acc, test loss."""
    if r.get("roofline"):
        rf = r["roofline"]
        return [_fmt_ms(r["epoch_ms"]), f"{rf['bound']}-bound", "1.0×", "-",
                f"{base['epoch_ms'] / r['epoch_ms']:.1f}×" if base else "-", "-", "-"]
    reps = len(r.get("repeats") or ())
    spread = (f"{_fmt_ms(r['epoch_ms_repeat_min'])}–{_fmt_ms(r['epoch_ms_repeat_max'])}"
              f" ({reps}×)" if reps > 1 else f"1 run: {_fmt_ms(r['epoch_ms_min'])}–"
              f"{_fmt_ms(r['epoch_ms_max'])}/epoch")
    acc = r.get("test_accuracy")
    has_acc = acc is not None and math.isfinite(acc)
    return [
        _fmt_ms(r["epoch_ms"]), spread,
        f"{r['epoch_ms'] / floor['epoch_ms']:.1f}×" if floor else "-",
        _fmt_ms(r["setup_ms"]),
        f"{base['epoch_ms'] / r['epoch_ms']:.1f}×" if base else "-",
        f"{100 * acc:.2f}%" if has_acc else "-",
        f"{r['test_loss']:.4f}" if has_acc else "-",
    ]


INTERRUPTED = " — INTERRUPTED: each row over the repeats it finished"  # title of table and plot
HEADERS = ("implementation", "device", "precision", "ms/epoch", "spread over repeats",
           "× roofline", "setup ms", "speed-up", "test acc", "test loss", "report ms/epoch")


def bench_table(result: dict, baseline: str = "numpy-cpu") -> Table:
    """The ladder as one table, in the report's order, with the report's figure beside ours."""
    rows, cfg = result["rows"], result["config"]
    base, floor = _baseline(rows, baseline), _baseline(rows, "roofline")
    data = cfg["data"] + (" (SYNTHETIC stand-in, not real data)" if cfg.get("synthetic") else "")
    # One epoch has no latter half: its figure carries the first call's costs (page faults,
    # thread start, caches), which the latter-half mean exists to leave out.
    figure = ("each repeat's one epoch, warm-up included (give --epochs 2 or more for a "
              "steady-state figure)" if cfg["epochs"] == 1 else
              "each repeat's latter-half epoch mean")
    cut = INTERRUPTED if cfg.get("interrupted") else ""
    table = Table(
        title=f"fasttrain bench — {data}, {cfg['epochs']} epochs, batch {cfg['batch_size']}, "
        f"lr {cfg['lr']}, {cfg.get('repeats', 1)} repeat(s){cut}",
        caption=f"ms/epoch: median over repeats of {figure}; spread: "
        "min–max over repeats; setup apart; roofline: computed from the measured peaks. "
        + (f"Speed-up vs {baseline}." if base else ""),
    )
    for i, col in enumerate(HEADERS):
        table.add_column(col, justify="left" if i < 3 else "right")
    # Reasons go under the table, numbered once each (the GPU rows on a CPU share one): inside
    # a numeric column they would wrap every row into several lines.
    notes: dict[str, int] = {}
    for r in rows:
        report = _fmt_ms(r.get("report_ms"))
        if r["status"] != "ok":
            note = notes.setdefault(f"{r['status']}: {r['reason']}", len(notes) + 1)
            table.add_row(r["impl"], r.get("device") or "-", "-", f"{r['status']} [{note}]",
                          *["" for _ in range(6)], report, style="dim")
            continue
        table.add_row(r["impl"], r["device"], r["precision"], *_cells(r, base, floor), report)
    table.caption = "\n".join([table.caption, *(f"[{n}] {t}" for t, n in notes.items())])
    table.caption_justify = "left"
    return table


def bench_markdown(result: dict, baseline: str = "numpy-cpu") -> str:
    """The same table as Markdown, for READMEs and closing notes."""
    rows = result["rows"]
    base, floor = _baseline(rows, baseline), _baseline(rows, "roofline")
    heads = [h if h != "speed-up" else f"speed-up vs {baseline}" for h in HEADERS]
    lines = ["| " + " | ".join(heads) + " |", "|---|---|---|" + "--:|" * (len(heads) - 3)]
    for r in rows:
        report = _fmt_ms(r.get("report_ms"))
        if r["status"] != "ok":
            cells = [r["impl"], r.get("device") or "-", "-", f"{r['status']}: {r['reason']}",
                     *[""] * 6, report]
        else:
            cells = [r["impl"], r["device"], r["precision"], *_cells(r, base, floor), report]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_bars(result: dict) -> list[dict]:
    """The plot's rows, in the table's order: every row that ran (ours: the median, with the
    min–max over repeats; none for the computed roofline), and every other row that has the
    report's figure, so that a GPU row unavailable on a CPU keeps the report's bar and says why
    ours is missing."""
    bars = []
    for r in result["rows"]:
        ok = r["status"] == "ok"
        if not ok and not r.get("report_ms"):
            continue
        ms = r["epoch_ms"] if ok else None
        bars.append({"impl": r["impl"], "ours": ms, "theirs": r.get("report_ms"),
                     "lo": ms - r.get("epoch_ms_repeat_min", ms) if ok else 0.0,
                     "hi": r.get("epoch_ms_repeat_max", ms) - ms if ok else 0.0,
                     "note": None if ok else f"{r['status']} here"})
    return bars


def bench_plot(result: dict, path: str | os.PathLike) -> None:
    """Horizontal bars of ms/epoch on a log axis, beside the report's figure where it has one."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    bars = plot_bars(result)[::-1]  # the first row at the top
    ours = [b["ours"] or 0 for b in bars]
    err = [[b["lo"] for b in bars], [b["hi"] for b in bars]]
    fig, ax = plt.subplots(figsize=(9, 0.55 * len(bars) + 1.6))
    ys = range(len(bars))
    ax.barh([y + 0.2 for y in ys], ours, height=0.4, xerr=err, capsize=2,
            label="fasttrain (this run: median, min–max over repeats)", color="#1f77b4")
    ax.barh([y - 0.2 for y in ys], [b["theirs"] or 0 for b in bars], height=0.4,
            label="published report (its own hardware)", color="#bbbbbb")
    lows = [v for b in bars for v in (b["ours"], b["theirs"]) if v]
    for y, b in zip(ys, bars, strict=True):  # the label right of the error bar
        if b["ours"] is not None:
            ax.text((b["ours"] + b["hi"]) * 1.05, y + 0.2, _fmt_ms(b["ours"]), va="center",
                    fontsize=8)
        else:  # at the axis' left end: no bar of ours to sit beside
            ax.text(min(lows) * 0.8, y + 0.2, b["note"], va="center", fontsize=8,
                    color="#555555", style="italic")
    floor = _baseline(result["rows"], "roofline")
    if floor:
        ax.axvline(floor["epoch_ms"], color="#d62728", linestyle="--", linewidth=1,
                   label="roofline (epoch's FLOPs and bytes at this machine's peaks)")
    ax.set_yticks(list(ys), [b["impl"] for b in bars])
    ax.set_xscale("log")
    ax.set_xlim(left=min(lows) * 0.6)
    ax.set_xlabel("ms per epoch (log scale, lower is better)")
    env, cfg = result["env"], result["config"]
    hw = env.get("gpu") or env.get("cpu")
    data = cfg["data"] + (" (synthetic stand-in)" if cfg.get("synthetic") else "")
    cut = INTERRUPTED if cfg.get("interrupted") else ""
    ax.set_title(f"Logistic regression ladder — data: {data}, {cfg['epochs']} epochs — {hw}{cut}",
                 fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    write_png(path, fig, dpi=120)


# -- shared by the lab's commands (memory, experiment) -------------------------------------------


def fmt_bytes(n: float | None) -> str:
    """Bytes in binary units, three significant digits: '512 B', '1.50 MiB', '7.81 GiB'."""
    if n is None or not math.isfinite(n):
        return "-"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            v = n / size
            return f"{v:.{2 if v < 10 else 1 if v < 100 else 0}f} {unit}"
    return f"{int(n)} B"


def wide_console():
    """A console for result tables: piped or redirected output keeps every column whole rather
    than wrapping at 80 characters. No emoji codes: a user's import path followed by a colon
    ("pkg.mod:factory: ...") would become a picture."""
    from rich.console import Console

    out = Console(emoji=False)
    return out if out.is_terminal else Console(width=160, emoji=False)


def rows_table(title: str, columns: list[tuple[str, object]], rows: list[dict],
               caption: str | None = None, label_columns: int = 1) -> Table:
    """A table of result rows. `columns` are (header, row → text); the first `label_columns` name
    the row. A row whose "status" is not "ok" shows its status with a numbered note, and the
    reasons follow under the table (long reasons would wrap inside a numeric column)."""
    table = Table(title=title)
    for i, (header, _) in enumerate(columns):
        table.add_column(header, justify="left" if i < label_columns else "right")
    notes: list[str] = []
    for r in rows:
        labels = [str(cell(r)) for _, cell in columns[:label_columns]]
        if r.get("status", "ok") != "ok":
            notes.append(f"[{len(notes) + 1}] {r['status']}: {r.get('reason') or 'no reason'}")
            rest = [f"{r['status']} [{len(notes)}]"] + [""] * (len(columns) - label_columns - 1)
            table.add_row(*labels, *rest, style="dim")
        else:
            table.add_row(*labels, *(str(cell(r)) for _, cell in columns[label_columns:]))
    table.caption = "\n".join(([caption] if caption else []) + notes) or None
    table.caption_justify = "left"
    return table


def panels_plot(path: str | os.PathLike, title: str, panels: list[dict]) -> None:
    """Side-by-side panels, one figure, written atomically as PNG. A panel is a dict: "title",
    "kind" ("bar": categories `x` with heights `y`; "line": numbers `x` against `y`, several
    series as `series` = {label: y}), "xlabel", "ylabel", optional "logx"/"logy"."""
    import matplotlib

    matplotlib.use("Agg")  # files only: never needs a display
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(4.6 * max(1, len(panels)), 3.8),
                             squeeze=False)
    for ax, panel in zip(axes[0], panels, strict=False):
        series = panel.get("series") or {"": panel.get("y", [])}
        if panel.get("kind", "bar") == "bar":
            xs = [str(x) for x in panel["x"]]
            width = 0.8 / len(series)
            for i, (label, ys) in enumerate(series.items()):
                pos = [j + (i - (len(series) - 1) / 2) * width for j in range(len(xs))]
                ax.bar(pos, [y or 0 for y in ys], width=width, label=label or None)
            ax.set_xticks(range(len(xs)), xs, rotation=20 if len(xs) > 3 else 0, fontsize=8)
        else:
            for label, ys in series.items():
                pts = [(x, y) for x, y in zip(panel["x"], ys, strict=True) if y is not None]
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label or None)
        if panel.get("logx"):  # batch sizes: powers of two, labelled as numbers
            ax.set_xscale("log", base=2)
            ax.set_xticks(list(panel["x"]), [str(x) for x in panel["x"]])
            ax.minorticks_off()
        if panel.get("logy"):
            ax.set_yscale("log")
        ax.set_title(panel.get("title", ""), fontsize=9)
        ax.set_xlabel(panel.get("xlabel", ""))
        ax.set_ylabel(panel.get("ylabel", ""))
        if len(series) > 1 or next(iter(series)):
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    write_png(path, fig)

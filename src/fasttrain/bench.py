"""`fasttrain bench`: the main job — every row of the ladder, timed the same way, one table.

    fasttrain bench                          # every row available here, MNIST, 20 epochs, 3 repeats
    fasttrain bench --quick                  # smoke run: 2 epochs, 1 repeat
    fasttrain bench --impl numpy-cpu,numba-fused --epochs 5 --repeats 5 --json out.json

Every training row is first checked (one step against a float64 reference: `ladder.check`); a
row that fails is reported failed and never timed. The rows that pass are timed `--repeats` times
in interleaved order; the table shows the median over repeats and the spread, the JSON keeps
every repeat. Repeats default to 3: the median of three survives one disturbed run, and three
passes of the slowest CPU row (torch-naive, ~15 s a pass) keep the default bench near two minutes
on the 2-core machine this was written on.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import traceback

from fasttrain import ladder
from fasttrain.errors import UserError
from fasttrain.ladder.measure import base_row, computed_row, prepare_row, summarize_row, time_row

SCHEMA = "fasttrain.bench/2"
DEFAULT_EPOCHS, DEFAULT_REPEATS = 20, 3
QUICK_EPOCHS, QUICK_REPEATS = 2, 1
LOG_EVERY_S = 10.0  # progress lines in a log file (stderr not a terminal): at most one this often


def bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="train MNIST logistic regression every way the ladder knows and time each",
        description="Run the optimization ladder: the same model, data, init and shuffle order "
        "implemented many ways, timed by one harness, printed as one table.",
    )
    p.add_argument("--impl", default="all", help="comma-separated rows to run (default: all). "
                   f"Known: {', '.join(ladder.NAMES)}")
    p.add_argument("--epochs", type=int, default=None,
                   help=f"passes over the training set (default {DEFAULT_EPOCHS}; "
                   f"{QUICK_EPOCHS} with --quick)")
    p.add_argument("--repeats", type=int, default=None,
                   help=f"timed runs of each row, interleaved (default {DEFAULT_REPEATS}; "
                   f"{QUICK_REPEATS} with --quick); the table shows their median and spread")
    p.add_argument("--repeat-limit", type=float, default=None, metavar="SECONDS",
                   help="time a row again only while one of its runs takes at most this long "
                   "(default: every row --repeats times); the spread column shows how many ran")
    p.add_argument("--quick", action="store_true",
                   help=f"smoke run: {QUICK_EPOCHS} epochs, {QUICK_REPEATS} repeat (unless "
                   "given)")
    p.add_argument("--batch-size", type=int, default=128,
                   help="samples per SGD step (default 128)")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate (default 0.1)")
    p.add_argument("--seed", type=int, default=0,
                   help="seeds the init and the shuffle orders (default 0)")
    p.add_argument("--data", default="mnist", choices=("mnist", "fashion-mnist", "synthetic"),
                   help="dataset (default mnist; 'synthetic': a deterministic stand-in, "
                   "labelled as such)")
    p.add_argument("--data-dir", default=None, help="folder holding <dataset>/ "
                   "(default: $FASTTRAIN_DATA, then ~/.cache/fasttrain)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="device of the rows that can run on either (default auto: CUDA when "
                   "there is one)")
    p.add_argument("--json", metavar="PATH", help="write the result JSON here")
    p.add_argument("--plot", metavar="PATH", help="write a PNG bar chart (log scale) here")
    p.add_argument("--no-progress", action="store_true", help="no live progress display")
    p.set_defaults(func=bench)


def select(spec: str) -> list[ladder.Entry]:
    if spec == "all":
        return list(ladder.REGISTRY)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    unknown = [n for n in names if n not in ladder.NAMES]
    if unknown or not names:
        raise UserError(f"--impl: unknown implementation {', '.join(unknown) or repr(spec)}; "
                        f"known: {', '.join(ladder.NAMES)}")
    return [e for e in ladder.REGISTRY if e.name in names]  # the table's order, not the flag's


def device_usable(device: str) -> bool:
    """Whether this process can still use `device`. A CUDA kernel fault (an illegal address, a
    trap) is sticky: every later call on the process's context fails with it, so each row after
    the culprit would fail with the culprit's error. A failure that is not sticky (a refused
    launch, a bad argument) leaves the context usable."""
    if not device.startswith("cuda"):
        return True
    import torch

    try:
        torch.ones(1, device=device).add_(1).cpu()
        torch.cuda.synchronize(device)
    except Exception:  # what a poisoned context raises varies (RuntimeError, AcceleratorError)
        return False
    return True


class Interrupted(Exception):
    """Ctrl-C (or a supervisor's SIGINT) during the bench: `rows` holds what was finished."""

    def __init__(self, rows: list[dict]):
        super().__init__(len(rows))
        self.rows = rows


class DeviceLost(Exception):
    """Row `culprit` failed and left the device unusable for this process."""

    def __init__(self, culprit: int):
        super().__init__(culprit)
        self.culprit = culprit


def _lost(row: dict, cfg, usable) -> bool:
    return row["status"] == "failed" and not usable(row.get("device") or cfg.device)


def run_rows(entries, data, cfg, env: dict, repeats: int, console=None, quiet=True,
             rerun=None, usable=device_usable, repeat_limit: float | None = None) -> list[dict]:
    """Check every row, then time the rows that passed `repeats` times in interleaved order
    (all rows once, then all rows again, ...), so slow drifts of the machine — another job
    starting, the clock throttling — spread over every row instead of landing on one. A row
    whose run (setup and epochs) took longer than `repeat_limit` seconds is not timed again:
    its row says so (`repeat_limit_s`), and its figure stands on the runs it has.

    A row that fails and leaves the device unusable (`usable`, a sticky CUDA fault) stays
    failed, and every row not yet finished is handed to `rerun(entries) -> rows`: the bench
    runs them again, checked and timed from the start, in a fresh process. Without `rerun`
    they fail with the reason.

    Ctrl-C raises Interrupted with the rows as far as they got: each timed row over the repeats
    it finished (the one in progress dropped), the others "not run"."""
    rows: list[dict] = []
    try:
        for e in entries:
            rows.append(prepare_row(e, data, cfg, env))
            _say(console, e.name, rows[-1], "check")
            if _lost(rows[-1], cfg, usable):
                raise DeviceLost(len(rows) - 1)
        _time_rows(entries, rows, data, cfg, env, repeats, console, quiet, usable, repeat_limit)
    except DeviceLost as lost:
        return _after_lost(entries, rows, lost.culprit, console, rerun)
    except KeyboardInterrupt:
        raise Interrupted(_cut_short(entries, rows)) from None
    return [summarize_row(r) for r in rows]


def _cut_short(entries, rows: list[dict]) -> list[dict]:
    out = []
    for i, e in enumerate(entries):
        row = rows[i] if i < len(rows) else {**base_row(e), "status": "not run",
                                               "reason": "interrupted before its check"}
        if row["status"] == "ok" and not row["repeats"] and "epoch_ms" not in row:
            row = {**row, "status": "not run", "reason": "interrupted before it was timed"}
        out.append(summarize_row(row))
    return out


def _after_lost(entries, rows: list[dict], culprit: int, console, rerun) -> list[dict]:
    """Rows as final as they stand (failed or unavailable before the loss, computed), the
    culprit failed, and every other row from `rerun`, or failed with the reason."""
    name = entries[culprit].name
    note = f"{name} left the device unusable for its process (a sticky CUDA fault)"
    rows[culprit]["reason"] += f"; {note}"
    final = {i for i, r in enumerate(rows)  # the roofline has its epoch_ms once computed
             if i == culprit or r["status"] != "ok" or "epoch_ms" in r}
    todo = [e for i, e in enumerate(entries) if i not in final]
    if console is not None and todo:
        console.print(f"  {note}: {len(todo)} row(s) run again in a fresh process")
    again = {r["impl"]: r for r in rerun(todo)} if rerun and todo else {}
    out = []
    for i, e in enumerate(entries):
        if i in final:
            out.append(summarize_row(rows[i]))
        elif e.name in again:
            out.append({**again[e.name], "fresh_process_after": name})
        else:
            out.append({**base_row(e), **{k: rows[i].get(k) for k in ("device", "precision")
                                            if i < len(rows)},
                        "status": "failed", "reason": f"not run: {note}"})
    return out


def _time_rows(entries, rows, data, cfg, env, repeats, console, quiet, usable,
               repeat_limit=None) -> None:
    """The computed rows, then `repeats` interleaved rounds of the checked ones (in place)."""
    peaks = None
    for i, (e, row) in enumerate(zip(entries, rows, strict=True)):
        if row["status"] == "ok" and e.load().computed:
            peaks = peaks or env.get("peaks")
            rows[i] = computed_row(e, row, data, cfg, peaks)
    timed = [i for i, e in enumerate(entries) if rows[i]["status"] == "ok"
             and not e.load().computed]
    for rep in range(repeats):
        for i in timed:
            if rows[i]["status"] != "ok" or "repeat_limit_s" in rows[i]:
                continue  # failed in an earlier repeat, or too slow to repeat
            label = f"{entries[i].name} {rep + 1}/{repeats}"
            try:
                rows[i]["repeats"].append(_time_with_progress(entries[i], data, cfg, console,
                                                              quiet, label))
            except Exception as e:  # a broken row must not take the others down; keep traceback
                traceback.print_exc(file=sys.stderr)
                rows[i].update(status="failed",
                               reason=f"repeat {rep + 1}: {type(e).__name__}: {e}".splitlines()[0])
            _say(console, label, rows[i], "time")
            if _lost(rows[i], cfg, usable):
                raise DeviceLost(i)
            if rows[i]["status"] == "ok" and repeat_limit is not None and rep + 1 < repeats:
                last = rows[i]["repeats"][-1]
                if last["setup_ms"] + last["total_ms"] > 1e3 * repeat_limit:
                    rows[i]["repeat_limit_s"] = repeat_limit


def bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.env import resolve_device

    if not math.isfinite(args.lr):
        raise UserError(f"--lr must be a finite number > 0, got {args.lr}")
    epochs = args.epochs if args.epochs is not None else (
        QUICK_EPOCHS if args.quick else DEFAULT_EPOCHS)
    repeats = args.repeats if args.repeats is not None else (
        QUICK_REPEATS if args.quick else DEFAULT_REPEATS)
    if repeats <= 0:
        raise UserError(f"--repeats must be a positive integer, got {repeats}")
    limit = args.repeat_limit
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise UserError(f"--repeat-limit must be a number of seconds > 0, got {limit}")
    entries = select(args.impl)
    cfg = ladder.LadderConfig(epochs=epochs, batch_size=args.batch_size, lr=args.lr,
                              seed=args.seed, device=resolve_device(args.device))
    report.check_outputs((args.json, "--json"), (args.plot, "--plot"))

    console = Console(stderr=True)
    try:
        data, dataset, env = _prepare(args, cfg, entries, console)
    except KeyboardInterrupt:
        console.print("interrupted before any row ran: no table, nothing written")
        return 130
    interrupted = False
    try:
        rows = run_rows(entries, data, cfg, env, repeats, console, args.no_progress,
                        rerun=lambda todo: fresh_process(todo, args, cfg, repeats),
                        repeat_limit=limit)
    except Interrupted as cut:
        rows, interrupted = cut.rows, True
    interrupted = interrupted or any(r.get("interrupted") for r in rows)  # in a fresh process
    if interrupted:
        console.print("interrupted: each row below stands on the repeats it finished")
    result = {
        "schema": SCHEMA,
        "env": env,
        "config": {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                   "seed": cfg.seed, "data": dataset.name, "synthetic": dataset.synthetic,
                   "data_source": dataset.source, "device": cfg.device, "repeats": repeats,
                   "repeat_limit_s": limit,
                   "impl": [e.name for e in entries], "interrupted": interrupted},
        "rows": rows,
    }
    report.wide_console().print(report.bench_table(result))
    if args.json:
        report.write_json(args.json, result)
        console.print(f"wrote {args.json}")
    if args.plot and not any(r["status"] == "ok" for r in result["rows"]):
        console.print(f"no plot: no row ran ({args.plot} not written)")
    elif args.plot:
        report.bench_plot(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 130 if interrupted else 0


def load_warning(env: dict) -> str | None:
    """One line when other processes already keep the CPU's cores busy: every row's time (the
    CPU rows', and the GPU rows' host side) then includes their share."""
    load, cores = env.get("load_1min"), env.get("cores")
    if load is None or not cores or load <= cores:
        return None
    return (f"warning: load average {load:.1f} on {cores} cores before any row ran: other "
            f"processes share the CPU and the times below include their share (kept in the "
            f"JSON as env.load_1min); compare rows of one run, or bench on a quiet machine")


def _prepare(args: argparse.Namespace, cfg, entries, console):
    """The data, its ladder form, and the env block (with the measured peaks where the roofline
    row needs them), said on the console: what the bench does before any row runs."""
    from fasttrain.data import load_dataset
    from fasttrain.env import env_block, hardware_line

    dataset = load_dataset(args.data, args.data_dir, seed=args.seed)
    n = len(dataset.train_y)
    # Rows size their scratch by the batch (a kernel's tests may run a lone partial batch of a
    # larger one; the bench has no reason to): one line here, not each row failing its own way.
    if cfg.batch_size > n:
        raise UserError(f"--batch-size {cfg.batch_size} is more than the {n:,} training samples "
                        f"of {dataset.name}; one step an epoch is --batch-size {n}")
    data = ladder.make_ladder_data(dataset, cfg)
    env = env_block()
    console.print(f"[bold]fasttrain bench[/bold] on {hardware_line(env)}")
    console.print(f"data: {dataset.name} from {dataset.source}: {data.n_train} train / "
                  f"{len(data.test_y)} test" + (" [bold red](synthetic)[/bold red]"
                                                 if dataset.synthetic else ""))
    if load_warning(env):
        console.print(f"[yellow]{load_warning(env)}[/yellow]")
    if "roofline" in [e.name for e in entries]:
        from fasttrain.peaks import machine_peaks

        env["peaks"] = machine_peaks(env, cfg.device)
        if env["peaks"]:
            console.print(f"peaks ({env['peaks']['source']}): "
                          f"{env['peaks']['fp32_flops'] / 1e9:,.0f} GFLOP/s fp32 FMA, "
                          f"{env['peaks']['bandwidth'] / 1e9:,.1f} GB/s")
    return data, dataset, env


def fresh_process(entries, args: argparse.Namespace, cfg, repeats: int) -> list[dict]:
    """`entries` checked and timed by `fasttrain bench` in a new process (this one's settings;
    its table is not shown, its progress is), their rows read from its JSON. A row that faults
    there too is handed on the same way, one process further."""
    argv = [sys.executable, "-m", "fasttrain", "bench", "--impl",
            ",".join(e.name for e in entries), "--epochs", str(cfg.epochs), "--repeats",
            str(repeats), "--batch-size", str(cfg.batch_size), "--lr", repr(cfg.lr),
            "--seed", str(cfg.seed), "--data", args.data, "--device", cfg.device,
            "--no-progress",
            *(["--data-dir", args.data_dir] if args.data_dir else []),
            *(["--repeat-limit", repr(args.repeat_limit)] if args.repeat_limit else [])]
    rows, config = child_rows(argv, entries)
    cut = config.get("interrupted", False)
    return [{**r, "interrupted": True} if cut else r for r in rows]


def child_rows(argv: list[str], entries) -> tuple[list[dict], dict]:
    """(rows, config) of the bench-schema JSON that `argv + ["--json", PATH]` writes, run in a
    new process (its stdout discarded); every entry failed with the exit status where it wrote
    none. Ctrl-C reaches the child too: it is waited for, to write what it finished."""
    import json
    import os
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory(prefix="fasttrain-bench-") as tmp:
        out = os.path.join(tmp, "rows.json")
        child = subprocess.Popen([*argv, "--json", out], stdout=subprocess.DEVNULL)
        try:
            code = child.wait()
        except KeyboardInterrupt:  # the child had the same SIGINT: it writes what it finished
            code = child.wait()
        if not os.path.exists(out):
            return [{**base_row(e), "status": "failed",
                     "reason": f"the fresh process that ran it again exited with {code}"}
                    for e in entries], {}
        with open(out) as f:
            result = json.load(f)
    return result["rows"], result.get("config", {})


def _say(console, label: str, row: dict, stage: str) -> None:
    """One line per check and per timed repeat on stderr (a log of what ran, in order)."""
    if console is None:
        return
    if row["status"] != "ok":
        console.print(f"  {label:<22} {row['status']}: {row['reason']}")
    elif stage == "check" and row.get("check"):
        console.print(f"  {label:<22} check ok (max |Δ| {row['check']['max_abs_err']:.1e} "
                      f"vs float64)")
    elif stage == "time":
        r = row["repeats"][-1]
        console.print(f"  {label:<22} {r['epoch_ms']:>10,.2f} ms/epoch   "
                      f"setup {r['setup_ms']:,.0f} ms")


def _time_with_progress(entry, data, cfg, console, quiet: bool, label: str) -> dict:
    """Time one repeat under a progress bar on a terminal, or with a plain line at most every
    LOG_EVERY_S seconds when stderr is a file or a pipe (a slow row in a log is not silent).
    Both advance once per epoch, after the harness has already synchronized and stopped the
    clock: they add no host-device sync of their own. The bar is redrawn only then: rich's
    refresh thread would wake 10 times a second inside the timed epochs, on the cores the
    CPU rows use."""
    if console is None:
        return time_row(entry, data, cfg)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    live = not quiet and console.is_terminal
    logged = not quiet and not console.is_terminal
    last_line = time.monotonic()
    with Progress(TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), console=console, transient=True,
                  auto_refresh=False, disable=not live) as progress:
        task = progress.add_task(label, total=cfg.epochs, last="setup…")

        def on_epoch(epoch: int, ms: float, loss) -> None:
            nonlocal last_line
            tail = f"  loss {loss:.4f}" if loss is not None else ""
            progress.update(task, advance=1, last=f"{ms:,.1f} ms/epoch{tail}", refresh=True)
            if logged and epoch + 1 < cfg.epochs and time.monotonic() - last_line >= LOG_EVERY_S:
                console.print(f"  {label:<22} epoch {epoch + 1}/{cfg.epochs}, "
                              f"{ms:,.1f} ms/epoch{tail}")
                last_line = time.monotonic()

        return time_row(entry, data, cfg, on_epoch)

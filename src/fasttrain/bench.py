"""`fasttrain bench`: the main job — every row of the ladder, timed the same way, one table.

    fasttrain bench                          # every row available here, MNIST, 20 epochs
    fasttrain bench --impl numpy-cpu,numba-fused --epochs 5 --json out.json --plot out.png
"""

from __future__ import annotations

import argparse
import math
import sys
import traceback

from fasttrain import ladder
from fasttrain.errors import UserError
from fasttrain.timing import synchronizer, time_call, time_epochs

SCHEMA = "fasttrain.bench/1"


def bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bench",
        help="train MNIST logistic regression every way the ladder knows and time each",
        description="Run the optimization ladder: the same model, data, init and shuffle order "
        "implemented many ways, timed by one harness, printed as one table.",
    )
    p.add_argument("--impl", default="all", help="comma-separated rows to run (default: all). "
                   f"Known: {', '.join(ladder.NAMES)}")
    p.add_argument("--epochs", type=int, default=20, help="passes over the training set")
    p.add_argument("--batch-size", type=int, default=128, help="samples per SGD step")
    p.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    p.add_argument("--seed", type=int, default=0, help="seeds the init and the shuffle orders")
    p.add_argument("--data", default="mnist", choices=("mnist", "fashion-mnist", "synthetic"),
                   help="dataset ('synthetic': a deterministic stand-in, labelled as such)")
    p.add_argument("--data-dir", default=None, help="folder holding <dataset>/ "
                   "(default: $FASTTRAIN_DATA, then ~/.cache/fasttrain)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="device of the rows that can run on either")
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
    return [ladder.entry(n) for n in dict.fromkeys(names)]


def run_row(entry: ladder.Entry, data, cfg: ladder.LadderConfig, env: dict, on_epoch=None) -> dict:
    """Set up, time and evaluate one implementation; never raises for a row's own failure."""
    row = {"impl": entry.name, "reproduces": None, "report_ms": None, "device": None,
           "precision": None, "status": "ok", "reason": None}
    try:
        cls = entry.load()
    except ImportError as e:
        return {**row, "status": "unavailable", "reason": f"cannot import: {e}"}
    row.update(reproduces=cls.reproduces, report_ms=cls.report_ms)
    reason = cls.unavailable(env, cfg)
    if reason:
        return {**row, "device": cls.device, "status": "unavailable", "reason": reason}
    try:
        impl = entry.create(cfg.device)
        sync = synchronizer(impl.device)
        _, setup_ms = time_call(lambda: impl.setup(data, cfg), sync)
        times, losses = time_epochs(impl.train_epoch, cfg.epochs, sync, on_epoch)
        test_loss, test_acc = impl.evaluate()
    except Exception as e:  # a broken row must not take the others down; keep its traceback
        traceback.print_exc(file=sys.stderr)
        return {**row, "status": "failed", "reason": f"{type(e).__name__}: {e}".splitlines()[0]}
    read = [x for x in losses if x is not None]
    return {
        **row,
        "device": impl.device,
        "precision": impl.precision,
        "setup_ms": setup_ms,
        **times.summary(),
        "epoch_ms_all": list(times.ms),
        "train_loss": read[-1] if read else None,
        "train_loss_per_epoch": losses,
        "test_accuracy": test_acc,
        "test_loss": test_loss,
    }


def bench(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.data import load_dataset
    from fasttrain.env import env_block, hardware_line, resolve_device

    if not math.isfinite(args.lr):
        raise UserError(f"--lr must be a finite number > 0, got {args.lr}")
    entries = select(args.impl)
    cfg = ladder.LadderConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                              seed=args.seed, device=resolve_device(args.device))
    for path, flag in ((args.json, "--json"), (args.plot, "--plot")):
        if path:
            report.check_writable(path, flag)

    console = Console(stderr=True)
    dataset = load_dataset(args.data, args.data_dir, seed=args.seed)
    data = ladder.make_ladder_data(dataset, cfg)
    env = env_block()
    console.print(f"[bold]fasttrain bench[/bold] on {hardware_line(env)}")
    console.print(f"data: {dataset.name} from {dataset.source}: {data.n_train} train / "
                  f"{len(data.test_y)} test" + (" [bold red](synthetic)[/bold red]"
                                                 if dataset.synthetic else ""))
    rows = [_run_with_progress(e, data, cfg, env, console, args.no_progress) for e in entries]
    result = {
        "schema": SCHEMA,
        "env": env,
        "config": {"epochs": cfg.epochs, "batch_size": cfg.batch_size, "lr": cfg.lr,
                   "seed": cfg.seed, "data": dataset.name, "synthetic": dataset.synthetic,
                   "data_source": dataset.source, "device": cfg.device,
                   "impl": [e.name for e in entries]},
        "rows": rows,
    }
    out = Console()
    if not out.is_terminal:  # piped or redirected: keep every column whole rather than 80 wide
        out = Console(width=160)
    out.print(report.bench_table(result))
    if args.json:
        report.write_json(args.json, result)
        console.print(f"wrote {args.json}")
    if args.plot:
        report.bench_plot(result, args.plot)
        console.print(f"wrote {args.plot}")
    return 0


def _run_with_progress(entry, data, cfg, env, console, quiet: bool) -> dict:
    """Run one row under a progress bar. The bar advances once per epoch, after the harness has
    already synchronized and stopped the clock: it adds no host-device sync of its own."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    with Progress(TextColumn("{task.description:<16}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[last]}"), console=console, transient=True,
                  disable=quiet or not console.is_terminal) as progress:
        task = progress.add_task(entry.name, total=cfg.epochs, last="setup…")

        def on_epoch(epoch: int, ms: float, loss) -> None:
            tail = f"  loss {loss:.4f}" if loss is not None else ""
            progress.update(task, advance=1, last=f"{ms:,.1f} ms/epoch{tail}")

        row = run_row(entry, data, cfg, env, on_epoch)
    if row["status"] == "ok":
        console.print(f"  {entry.name:<16} {row['epoch_ms']:>10,.2f} ms/epoch   "
                      f"setup {row['setup_ms']:,.0f} ms")
    else:
        console.print(f"  {entry.name:<16} {row['status']}: {row['reason']}")
    return row

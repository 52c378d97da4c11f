"""Input pipeline: samples/s of fasttrain, Lightning, Accelerate and a hand-written PyTorch loop
training from PNG files on disk through the same Dataset and DataLoader (issue 23).

    FASTTRAIN_DATA=DIR PYTHONPATH=src python benchmarks/input_pipeline.py [--rounds 5] [--limit N]
        [--workers 2] [--batch-size 128] [--warmup 20] [--steps 200] [--images-dir D] [--json PATH]
        [--threads N]

Data: Fashion-MNIST's training images (read from $FASTTRAIN_DATA/fashion-mnist or --data-dir)
are written once as PNG files into a class-folder tree (DIR/train/<class>/<index>.png, default
under the system temp folder, reused when present; --limit N writes and trains on the first N
only). A map-style Dataset decodes each file with PIL and draws, per sample, a random crop (pad 2,
crop 28) and a random horizontal flip (numpy). Every contender gets the same DataLoader settings:
batch size, workers, pin_memory (on CUDA), persistent workers, shuffle, drop_last and one seeded
generator (same order, same worker seeds); the same model class with the same initial weights;
AdamW at a constant learning rate; cross-entropy; fp32.

Contenders, each through its public API: fasttrain (`fasttrain.build(model=, data=loader)` +
`fasttrain.fit(run)`; the data path it took — run.batches.path and .why — is printed and stored,
since only a streamed path is comparable), Lightning (`Trainer` on the CPU or one GPU with progress
bar, logger, checkpointing and model summary off), Accelerate (`Accelerator.prepare`) and a
hand-written loop (`for x, y in loader`, `.to(device, non_blocking=True)`).

Regimes: input-bound (logreg: decoding and augmenting dominate) and compute-bound (the bundled
cnn). Each (round, contender) is a fresh process (no contender inherits another's imports,
thread pools, allocator or worker processes); rounds are interleaved, the order rotated each round.

Steady state: each run trains --warmup + --steps optimizer steps; the clock starts at the end of
step --warmup (process start, worker start-up, first batches, kernel selection excluded) and stops
at the end of the last step (the device synchronized at both ends); samples/s = steps × batch /
elapsed. Over the same window, the CPU time of the main process (all its threads) and of the
DataLoader workers, per step (Window): a figure far less sensitive to other load than wall time,
and while the workers are the bottleneck the main process's CPU is what it takes from them.
Per contender: the median over rounds, min and max, the ratios of medians to the hand loop and to
the best framework peer (Lightning, Accelerate), and the CPU medians. Targets (issue 23):
fasttrain ≥ the best peer when input-bound, within 2% of the hand loop when compute-bound. The
load average before and after goes into the JSON (benchmarks/results/DATE-HARDWARE-input-
pipeline.json by default).
Each run's 1-minute load average goes in too.

What the CPU columns showed on the 2-core EPYC (loaded; torch 2.13 CPU, libgomp): the main
process's CPU per step is mostly its intra-op thread pool. An OpenMP thread spins ~3.6 ms after
each parallel region before it sleeps (measured: CPU burnt in a 50 ms sleep after one parallel
op), on the cores the workers need; the hand loop's main process took 5-24 ms CPU per logreg
step with torch's 2 threads and ~1.2-2 ms with torch.set_num_threads(1). No contender changes the
pool, fasttrain neither (the cnn's compute-bound steps need its threads); on a machine with few
cores per worker, OMP_NUM_THREADS or torch.set_num_threads is the lever for input-bound runs:
--threads N sets it, for every contender alike.

Runtime: (process start and setup, ~5 s, + warmup + steps) per run × 4 contenders × 2 regimes ×
rounds, plus writing the 60,000 PNG files once (~0.4 ms each: ~30 s). Estimated from single-step
timings on the 2-core EPYC (decode + augment ~0.14 ms per sample per worker; cnn ~0.1-0.2 s per
step of 128), the defaults take ~3 min input-bound and ~10 min compute-bound: ~15 min in all. An
engine that reads the DataLoader's dataset into memory (before issue 23) adds its read (~10 s) to
each of its setups. On a GPU the 28×28 cnn is input-bound too with 2 workers: there the
compute-bound regime needs --workers large enough for the cnn to be the bottleneck.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from input_pipeline_results import default_name, summarize, table, targets  # benchmarks/
from PIL import Image
from torch.utils.data import DataLoader, Dataset

SCHEMA = "fasttrain.input_pipeline/1"
CONTENDERS = ("fasttrain", "lightning", "accelerate", "hand-written")
REGIMES = {"input-bound": "logreg", "compute-bound": "cnn"}
PAD, SIZE = 2, 28
RESULTS = Path(__file__).resolve().parent / "results"
_MARK = "input_pipeline row: "  # how a child process's stdout line with its row begins


@dataclasses.dataclass(frozen=True)
class Settings:
    images_dir: str
    limit: int = 60_000  # images written and trained on
    batch_size: int = 128
    workers: int = 2
    warmup: int = 20  # optimizer steps before the clock starts
    steps: int = 200  # optimizer steps timed
    lr: float = 1e-3
    seed: int = 0
    device: str = "cpu"
    threads: int = 0  # the main process's intra-op threads, every contender's (0: torch's own)

    @property
    def cuda(self) -> bool:
        return torch.device(self.device).type == "cuda"

    @property
    def pin_memory(self) -> bool:  # page-locked batches: only a copy to a GPU gains from them
        return self.cuda


# -- data: PNG files on disk, decoded and augmented per sample ----------------------------------


def write_pngs(root: str | os.PathLike, images: np.ndarray, labels: np.ndarray) -> list:
    """Write images [N, 28, 28] uint8 as root/train/<label>/<index>.png, skipping files already
    there; returns the (path, label) samples in index order."""
    samples = []
    for i, (img, label) in enumerate(zip(images, labels, strict=True)):
        path = Path(root) / "train" / str(int(label)) / f"{i:05d}.png"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            Image.fromarray(img).save(tmp, format="PNG")  # uint8 [28, 28]: mode L
            os.replace(tmp, path)  # an interrupted write never leaves a truncated PNG to reuse
        samples.append((str(path), int(label)))
    return samples


def list_pngs(root: str, limit: int) -> list:
    """The (path, label) samples write_pngs wrote, in index order."""
    found = sorted((int(p.stem), str(p), int(p.parent.name))
                   for p in Path(root, "train").glob("*/*.png"))
    return [(path, label) for i, path, label in found if i < limit]


def augment(img: np.ndarray, rng: random.Random) -> np.ndarray:
    """A random 28×28 crop of the image zero-padded by 2, flipped left-right with p = 1/2."""
    padded = np.pad(img, PAD)
    dy, dx = rng.randrange(2 * PAD + 1), rng.randrange(2 * PAD + 1)
    out = padded[dy:dy + SIZE, dx:dx + SIZE]
    return out[:, ::-1] if rng.random() < 0.5 else out


class PngFolder(Dataset):
    """(x float32 [1, 28, 28] in [0, 1], label) per file. The draws use Python's `random`, which
    the DataLoader seeds per worker from its generator (or `measure`, without workers): the same
    stream for every contender that leaves the loader's seeding as it is."""

    def __init__(self, samples: list, augmented: bool = True):
        self.samples, self.augmented = samples, augmented

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        with Image.open(path) as im:
            img = np.asarray(im)
        if self.augmented:
            img = augment(img, random)
        x = torch.from_numpy(np.ascontiguousarray(img, dtype=np.float32) / 255.0)
        return x.unsqueeze(0), label


def make_loader(dataset: Dataset, s: Settings) -> DataLoader:
    return DataLoader(dataset, batch_size=s.batch_size, shuffle=True, num_workers=s.workers,
                      pin_memory=s.pin_memory, persistent_workers=s.workers > 0, drop_last=True,
                      generator=torch.Generator().manual_seed(s.seed))


def make_model(regime: str, s: Settings) -> torch.nn.Module:
    from fasttrain.models import build_model

    torch.manual_seed(s.seed)  # the same initial weights for every contender
    return build_model(REGIMES[regime], in_shape=(1, SIZE, SIZE), num_classes=10)


def endless(loader):
    while True:
        yield from loader


# -- the clock -----------------------------------------------------------------------------------


def children_cpu_s(proc: str = "/proc") -> float | None:
    """CPU seconds (user + system) used so far by this process's live children, the DataLoader
    workers, read from /proc (Linux; None elsewhere). Clock-tick resolution (10 ms). Daemons
    that leave the process tree (torch_shm_manager: a message per shared segment) are not
    counted."""
    try:
        pids = [p for p in os.listdir(proc) if p.isdigit()]
    except FileNotFoundError:
        return None
    me, hz, total = os.getpid(), os.sysconf("SC_CLK_TCK"), 0.0
    for pid in pids:
        try:
            with open(os.path.join(proc, pid, "stat")) as f:
                stat = f.read()
        except OSError:  # exited meanwhile
            continue
        # After "pid (comm)": state, ppid, ... utime and stime are the 12th and 13th.
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me:
            total += (int(fields[11]) + int(fields[12])) / hz
    return total


class Window:
    """Called after every optimizer step: starts the clock after `warmup` steps and stops it
    `steps` later. On CUDA it synchronizes at those two steps only, so that the window holds the
    device's work and no sync is added in between.

    Over the same window it reads the CPU time of this process (all its threads: the step's
    intra-op pool, a pin-memory thread) and of its live children (the workers; those that live
    through the window): far less sensitive to other load than wall time, the main process's
    share shows its overhead directly, and while the workers are the bottleneck every ms of it
    is taken from them. Read outside the timed interval."""

    def __init__(self, s: Settings):
        self.warmup, self.steps, self.device = s.warmup, s.steps, torch.device(s.device)
        self.done, self.t0 = 0, time.perf_counter()
        self.start = self.end = None
        self.cpu: dict[str, list] = {"main": [], "workers": []}

    def tick(self) -> None:
        self.done += 1
        if self.done in (self.warmup, self.warmup + self.steps):
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if self.done == self.warmup:
                self._read_cpu()
                self.start = time.perf_counter()
            else:
                self.end = time.perf_counter()
                self._read_cpu()

    def _read_cpu(self) -> None:
        self.cpu["main"].append(time.process_time())
        self.cpu["workers"].append(children_cpu_s())

    def cpu_ms_per_step(self, who: str) -> float | None:
        first, last = self.cpu[who]
        return None if first is None or last is None else 1e3 * (last - first) / self.steps

    @property
    def total(self) -> int:
        return self.warmup + self.steps

    def row(self, batch_size: int) -> dict:
        if self.end is None:
            raise RuntimeError(f"only {self.done} of {self.total} steps ran")
        return {"samples_per_s": self.steps * batch_size / (self.end - self.start),
                "warmup_s": self.start - self.t0, "window_s": self.end - self.start,
                "main_cpu_ms_per_step": self.cpu_ms_per_step("main"),
                "workers_cpu_ms_per_step": self.cpu_ms_per_step("workers")}


# -- the contenders: one training run each, through their public APIs ---------------------------


def train_fasttrain(model, loader, s: Settings, clock: Window) -> dict:
    import contextlib
    import io

    import fasttrain

    class Tick:
        def on_step(self, run):
            clock.tick()

    err = io.StringIO()
    with contextlib.redirect_stderr(err):  # keep the start line for the row
        run = fasttrain.build(model=model, data=loader, loss=F.cross_entropy,
                              batch_size=s.batch_size, lr=s.lr, optimizer="adamw",
                              weight_decay=0.0, schedule="constant", device=s.device,
                              seed=s.seed, epochs=math.ceil(clock.total / len(loader)),
                              max_steps=clock.total, log_every=10**9, progress=False)
    fasttrain.fit(run, callbacks=[Tick()])
    # run.batches.path/why: issue 23's data paths; an engine before it reports neither.
    batches, lines = run.batches, err.getvalue().splitlines()
    return {"path": getattr(batches, "path", None), "why": getattr(batches, "why", None),
            "start_line": next((x for x in lines if x.startswith("training ")), None)}


def train_lightning(model, loader, s: Settings, clock: Window) -> dict:
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = model

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.net.parameters(), lr=s.lr, weight_decay=0.0)

    class Tick(pl.Callback):
        def on_train_batch_end(self, *_):
            clock.tick()

    trainer = pl.Trainer(accelerator="gpu" if s.cuda else "cpu", devices=1,
                         max_steps=clock.total, max_epochs=-1, precision="32-true",
                         logger=False, enable_progress_bar=False, enable_checkpointing=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         callbacks=[Tick()])
    trainer.fit(Module(), train_dataloaders=loader)
    return {}


def train_accelerate(model, loader, s: Settings, clock: Window) -> dict:
    from accelerate import Accelerator

    acc = Accelerator(cpu=not s.cuda)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    model, opt, loader = acc.prepare(model, opt, loader)
    for x, y in itertools.islice(endless(loader), clock.total):
        loss = F.cross_entropy(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick()
    return {}


def train_hand(model, loader, s: Settings, clock: Window) -> dict:
    dev = torch.device(s.device)
    model = model.to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr, weight_decay=0.0)
    for x, y in itertools.islice(endless(loader), clock.total):
        x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.tick()
    return {}


TRAIN = {"fasttrain": train_fasttrain, "lightning": train_lightning,
         "accelerate": train_accelerate, "hand-written": train_hand}


def unavailable(contender: str) -> str | None:
    """Why `contender` cannot run here (its package is not installed: `pip install
    fasttrain[bench]`), or None."""
    import importlib.util

    package = {"lightning": "lightning", "accelerate": "accelerate"}.get(contender)
    if package and importlib.util.find_spec(package) is None:
        return f"{package} is not installed (pip install 'fasttrain[bench]')"
    return None


def measure(contender: str, regime: str, s: Settings, samples: list) -> dict:
    """One steady-state measurement of `contender` in this process."""
    random.seed(s.seed)  # the augmentation's stream when the main process loads (no workers)
    if s.threads:
        torch.set_num_threads(s.threads)  # before any worker starts: they set their own to 1
    clock = Window(s)
    loader = make_loader(PngFolder(samples), s)
    extra = TRAIN[contender](make_model(regime, s), loader, s, clock)
    return {**clock.row(s.batch_size), **extra}


def run_child(script: str, job: dict, mark: str) -> dict:
    """`script --child JOB` in a fresh Python process; its row is the stdout line that begins
    with `mark` (libraries print too: Lightning's notices). A failure raises its last line."""
    proc = subprocess.run([sys.executable, script, "--child", json.dumps(job)],
                          capture_output=True, text=True, timeout=1800)
    if proc.returncode:
        raise RuntimeError(proc.stderr.strip().splitlines()[-1] if proc.stderr.strip()
                           else f"exit code {proc.returncode}")
    line = next(x for x in reversed(proc.stdout.splitlines()) if x.startswith(mark))
    return json.loads(line[len(mark):])


def attempt(measure_one, name: str, *args) -> dict:
    """One run of contender `name`: {"status": "ok", **measure_one(name, *args)}, or a row
    saying why not (its package missing, or what it raised: a contender that fails is a row,
    not a crash)."""
    if why := unavailable(name):
        return {"status": "unavailable", "reason": why}
    try:
        return {"status": "ok", **measure_one(name, *args)}
    except Exception as e:
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}


def measure_in_child(contender: str, regime: str, s: Settings, samples: list) -> dict:
    """`measure` in a fresh Python process (the samples are the files under s.images_dir)."""
    return run_child(__file__, {"contender": contender, "regime": regime,
                                "settings": dataclasses.asdict(s)}, _MARK)


# -- the benchmark: interleaved rounds (statistics and table: input_pipeline_results.py) ------


def run_all(s: Settings, samples: list, rounds: int, measure_one=measure_in_child,
            contenders=CONTENDERS, regimes=tuple(REGIMES), echo=print) -> dict:
    load_before = os.getloadavg()
    if load_before[0] > 0.25 * (os.cpu_count() or 1):
        echo(f"note: load average {load_before[0]:.2f} on {os.cpu_count()} CPUs before the "
             f"first run: other work shares the machine and the figures will be noisy")
    runs = []
    for regime in regimes:
        for r in range(rounds):
            k = r % len(contenders)  # rotate the order: no contender always runs first
            for name in contenders[k:] + contenders[:k]:
                load = os.getloadavg()[0]  # what else the machine was doing, run by run
                got = attempt(measure_one, name, regime, s, samples)
                runs.append({"regime": regime, "round": r, "contender": name,
                             "load_1min_before": load, **got})
                if got["status"] != "ok":
                    said = f"{got['status']}: {got['reason']}"
                else:
                    said = f"{got['samples_per_s']:,.0f} samples/s"
                    if got.get("main_cpu_ms_per_step") is not None:
                        said += f", main process {got['main_cpu_ms_per_step']:.2f} ms CPU/step"
                if name == "fasttrain" and got["status"] == "ok":
                    said += f"  [data path: {got.get('path') or 'not reported'}]"
                    if r == 0:
                        echo(f"fasttrain's start line: {got.get('start_line')}")
                echo(f"{regime:>13} round {r + 1}/{rounds} {name:>12}: {said}")
    from fasttrain.env import env_block

    return {"schema": SCHEMA, "env": env_block(),
            "config": {**dataclasses.asdict(s), "pin_memory": s.pin_memory,
                       "persistent_workers": s.workers > 0, "shuffle": True, "drop_last": True,
                       "rounds": rounds, "images": len(samples), "optimizer": "adamw",
                       "precision": "fp32", "models": {g: REGIMES[g] for g in regimes},
                       "augment": f"pad {PAD} + random crop {SIZE}, random horizontal flip",
                       "isolation": "a fresh process per run" if measure_one is
                       measure_in_child else "in process"},
            "load": {"before": list(load_before), "after": list(os.getloadavg()),
                     "cpu_count": os.cpu_count()},
            "rows": summarize(runs, contenders, {g: REGIMES[g] for g in regimes}),
            "runs": runs}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images-dir", default=str(Path(tempfile.gettempdir()) /
                                                "fasttrain-fashion-mnist-png"))
    ap.add_argument("--data-dir", help="folder holding fashion-mnist/ (default: $FASTTRAIN_DATA)")
    ap.add_argument("--limit", type=int, default=60_000, help="write and train on N images")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=20, help="steps before the clock starts")
    ap.add_argument("--steps", type=int, default=200, help="steps timed per run")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--threads", type=int, default=0,
                    help="the main process's intra-op threads, for every contender (default: "
                         "torch's); see the CPU columns")
    ap.add_argument("--regimes", nargs="+", choices=tuple(REGIMES), default=tuple(REGIMES))
    ap.add_argument("--contenders", nargs="+", choices=CONTENDERS, default=CONTENDERS,
                    help="a subset, e.g. fasttrain hand-written for a longer paired A/B")
    ap.add_argument("--json", help=f"result file (default: {RESULTS}/DATE-HW-input-pipeline.json)")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one run, in a fresh process
    args = ap.parse_args(argv)
    if args.child:
        job = json.loads(args.child)
        s = Settings(**job["settings"])
        got = measure(job["contender"], job["regime"], s, list_pngs(s.images_dir, s.limit))
        print(_MARK + json.dumps(got))
        return 0

    from fasttrain.data.sources import load_dataset
    from fasttrain.errors import UserError
    from fasttrain.report import wide_console, write_json

    if args.limit < args.batch_size:
        ap.error(f"--limit {args.limit} is less than one batch of {args.batch_size}")
    if args.threads < 0:
        ap.error(f"--threads {args.threads}: give a count of threads, or 0 for torch's default")
    try:
        ds = load_dataset("fashion-mnist", args.data_dir, download=False)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    s = Settings(images_dir=args.images_dir, limit=args.limit, batch_size=args.batch_size,
                 workers=args.workers, warmup=args.warmup, steps=args.steps, device=args.device,
                 threads=args.threads)
    samples = write_pngs(s.images_dir, ds.train_x[:s.limit], ds.train_y[:s.limit])
    print(f"{len(samples)} PNG files under {s.images_dir}")
    result = run_all(s, samples, args.rounds, contenders=tuple(args.contenders),
                     regimes=tuple(args.regimes))
    result["targets"] = targets(result["rows"])
    path = Path(args.json) if args.json else RESULTS / default_name(result["env"])
    write_json(path, result)
    wide_console().print(table(result))
    for regime, t in result["targets"].items():
        ratio = "-" if t["ratio"] is None else f"{t['ratio']:.3f}"
        verdict = "not judged (fasttrain did not stream)" if t["met"] is None else t["met"]
        print(f"target {regime}: {t['rule']}: ratio {ratio} → {verdict} (largest spread "
              f"over rounds: {t['largest_spread'] or 0:.1%})")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

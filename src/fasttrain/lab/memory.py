"""`fasttrain memory`: where a training step's memory goes, part by part, beside the measured peak,
and the batch size that trains fastest in the memory there is.

    fasttrain memory --model cnn --batch-size 64 --precision bf16
    fasttrain memory --model gpt --data synthetic-text --find-batch-size             # CUDA
    fasttrain memory --model cnn --find-batch-size --memory-limit 2                  # CPU, GiB

The parts (bytes, exact for this model and these switches; on CUDA each tensor is rounded up to the
caching allocator's 512-byte blocks, as `max_memory_allocated` counts them):

  weights        parameters and buffers
  gradients      one per trainable parameter, in its dtype (fp32 under autocast as well)
  optimizer      the optimizer's state after one real step (AdamW: 2 fp32 tensors per parameter,
                 SGD with momentum: 1); the 0-dim step counters are left out (4 bytes each)
  activations    unique storages saved for backward by one micro-batch, counted with
                 `saved_tensors_hooks` in the dtype the switches give (bf16 autocast saves bf16;
                 checkpointed blocks keep only their inputs)
  weight copies  half-precision casts of weights that autocast saves for backward (part of the
                 saved tensors, shown apart: the seed lab's "FP16 copy")
  inputs         the step's micro-batches, where no layer saved them already
  data           the dataset resident on an accelerator (0 on the CPU: host memory either way)
  workspace      CUDA only, measured: what stays allocated after a warm-up step beyond the parts
                 above — cuBLAS/cuBLASLt workspaces (8–32 MiB per stream), scalars
  step temp      the optimizer step's temporaries (foreach AdamW: one fp32 copy of the weights)

    predicted peak = weights + optimizer + data + workspace + inputs + gradients
                     + max(activations + weight copies, step temp)

because activations die during backward while gradients are born, and the optimizer's temporaries
exist only after both. The measured peak is `torch.cuda.max_memory_allocated` around one full
step (reset before it) on CUDA; on the CPU the allocator keeps no statistics, so the "measured"
peak there is the hook-based count: weights + gradients + optimizer + saved tensors + inputs.
What the prediction cannot see on CUDA: cuDNN's per-call workspaces, the gradients of activations
alive together during backward, and up to 1 MiB per large block that the allocator hands out
unsplit. It aims at 10% of the measured peak; that is untested here (no GPU).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import math
import statistics
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from fasttrain.engine.loop import step
from fasttrain.errors import UserError

SCHEMA = "fasttrain.memory/1"
_BLOCK = 512  # the CUDA caching allocator's rounding: every block is a multiple of 512 bytes
_WARMUP_MAX = 8  # fp16: steps skipped by the GradScaler (overflow) create no optimizer state
_MIN_GAIN = 0.02  # throughput must beat the best by 2% to count as better: timing noise


# -- counting bytes ------------------------------------------------------------------------------


def _alloc(nbytes: int, cuda: bool) -> int:
    """What one storage of `nbytes` costs the device (512-byte blocks on CUDA)."""
    if not cuda or nbytes == 0:
        return nbytes
    return -(-nbytes // _BLOCK) * _BLOCK


def _storages(tensors) -> dict[int, int]:
    """data_ptr → bytes of the distinct storages under `tensors` (views share their base's)."""
    out: dict[int, int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            s = t.untyped_storage()
            out.setdefault(s.data_ptr(), s.nbytes())
    return out


def _bytes(tensors, cuda: bool) -> int:
    return sum(_alloc(n, cuda) for n in _storages(tensors).values())


@dataclass(frozen=True)
class Saved:
    """What one micro-batch's forward/backward keeps: bytes, and the storages it saved."""

    activations: int
    weight_copies: int
    gradients: int
    storages: frozenset[int]


def _is_weight_cast(t: torch.Tensor, params: set[int]) -> bool:
    """True for autocast's half copy of a parameter (or a view of one, e.g. its transpose)."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    if fn is None or fn.name() != "ToCopyBackward0":
        return False
    return any(id(getattr(n, "variable", None)) in params for n, _ in fn.next_functions if n)


def count_saved(trainer, micro_batch, autocast=None) -> Saved:
    """Run one forward/backward of `micro_batch` as `step` would (autocast, loss
    scaling), counting every storage saved for backward once, parameters excluded (they are
    `weights`). Leaves the trainer as it found it: no gradients, same buffers, same RNG stream."""
    model, dev = trainer.model, trainer.device
    cuda = dev.type == "cuda"
    owned = set(_storages([*model.parameters(), *model.buffers()]))
    params = {id(p) for p in model.parameters()}
    saved: dict[int, int] = {}
    copies: set[int] = set()

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        ptr = s.data_ptr()
        if ptr not in owned and ptr not in saved:
            saved[ptr] = s.nbytes()
            if _is_weight_cast(t, params):
                copies.add(ptr)
        return t  # keep the tensor itself: we count, we do not change what is stored

    # CUDA graphs replay from a static memory pool and do not run hooks: count on the eager
    # module, which saves the same tensors (compile's fusions aside).
    forward = trainer.model if trainer.cfg.cuda_graphs else trainer.forward
    buffers = [(b, b.clone()) for b in model.buffers()]  # BatchNorm statistics must not move
    autocast = autocast if autocast is not None else trainer.autocast
    with torch.random.fork_rng(devices=[dev] if cuda else []):
        # Hooks for the forward only: backward's recomputation (checkpointing) saves nothing.
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), autocast:
            loss = trainer.compute_loss(forward, micro_batch)[0] / trainer.cfg.accum_steps
        trainer.scaler.scale(loss).backward()
    grads = _bytes([p.grad for p in model.parameters() if p.grad is not None], cuda)
    del loss
    trainer.opt.zero_grad(set_to_none=True)
    with torch.no_grad():
        for b, value in buffers:
            b.copy_(value)
    activations = sum(_alloc(n, cuda) for p, n in saved.items() if p not in copies)
    weight_copies = sum(_alloc(saved[p], cuda) for p in copies)
    return Saved(activations, weight_copies, grads, frozenset(saved))


def _optimizer_bytes(opt: torch.optim.Optimizer, cuda: bool) -> int:
    # 0-dim tensors are the step counters: host-side unless fused/capturable, 4 bytes each.
    return _bytes([t for s in opt.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0], cuda)


def _step_temp(trainer, cuda: bool) -> int:
    """Bytes the optimizer allocates during its step (see torch/optim/adam.py, sgd.py): foreach
    AdamW makes one fp32 temporary per parameter (sqrt of the second moment); SGD only with
    weight decay (grad + wd·w). Fused kernels make none; the CPU's per-tensor loop one at a time."""
    cfg = trainer.cfg
    if cfg.fused_optimizer or not (cfg.optimizer == "adamw" or cfg.weight_decay > 0):
        return 0
    sizes = [_alloc(p.nbytes, cuda) for p in trainer.model.parameters() if p.requires_grad]
    if not sizes:
        return 0
    foreach = trainer.device.type in ("cuda", "xpu")  # torch's foreach kernels: not on the CPU
    return sum(sizes) if foreach else max(sizes)


def resident_data(trainer, cuda: bool) -> int:
    """Bytes of the dataset kept on an accelerator (0 on the CPU, or on the DataLoader path)."""
    b = trainer.batches
    if trainer.device.type == "cpu" or not b.on_device:
        return 0
    return _bytes([b.train.x, b.train.y, b.test.x, b.test.y,
                   getattr(b.train, "offsets", None), getattr(b.test, "offsets", None)], cuda)


# -- the breakdown -------------------------------------------------------------------------------


@dataclass
class Breakdown:
    """One step's memory, part by part (bytes), the measured peak, and the seed lab's formula."""

    device: str
    precision: str
    optimizer_name: str
    momentum: float
    batch_size: int
    micro_batch: int
    params: int  # distinct parameters (a count, not bytes)
    weights: int
    gradients: int
    optimizer: int
    activations: int
    weight_copies: int
    inputs: int
    data: int
    workspace: int
    step_temp: int
    activations_fp32: int  # the same micro-batch counted without autocast: the formula's input
    measured_peak: int
    measured_by: str

    @property
    def predicted_peak(self) -> int:
        return (self.weights + self.optimizer + self.data + self.workspace + self.inputs
                + self.gradients + max(self.activations + self.weight_copies, self.step_temp))

    @property
    def error(self) -> float:
        """(predicted − measured) / measured."""
        return (self.predicted_peak - self.measured_peak) / max(self.measured_peak, 1)

    def seed_formula(self) -> dict[str, dict[str, int]]:
        """The seed lab's "weights + gradients + optimizer + activations" for this model, fp32 and
        mixed precision as its ResNet-50 example counts them: mixed keeps fp32 master weights plus
        a half copy, half gradients, fp32 optimizer state, and half the fp32 activations. (PyTorch
        autocast in fact keeps fp32 gradients and casts only what matmuls and convolutions use.)"""
        P = self.params
        per_param = {"adamw": 8, "sgd": 4 if self.momentum else 0}.get(self.optimizer_name, 8)
        fp32 = {"weights": 4 * P, "weight_copies": 0, "gradients": 4 * P,
                "optimizer": per_param * P, "activations": self.activations_fp32}
        mixed = {"weights": 4 * P, "weight_copies": 2 * P, "gradients": 2 * P,
                 "optimizer": per_param * P, "activations": self.activations_fp32 // 2}
        return {name: {**parts, "total": sum(parts.values())}
                for name, parts in (("fp32", fp32), ("mixed", mixed))}

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "predicted_peak": self.predicted_peak,
                "error": self.error, "seed_formula": self.seed_formula()}


def breakdown(trainer, micro_batches: list, measured_peak: int | None = None,
              workspace: int = 0) -> Breakdown:
    """The parts for a trainer that has taken at least one step (so its optimizer state exists).
    Without `measured_peak` (the CPU), the hook-based count stands in for the measurement."""
    from fasttrain.models import param_count

    cfg, dev = trainer.cfg, trainer.device
    cuda = dev.type == "cuda"
    model = trainer.model
    count = count_saved(trainer, micro_batches[0])
    fp32 = count if cfg.precision in ("fp32", "tf32") else count_saved(
        trainer, micro_batches[0], contextlib.nullcontext())
    inputs = {p: n for p, n in _storages(t for mb in micro_batches for t in mb).items()
              if p not in count.storages}
    parts = dict(
        weights=_bytes([*model.parameters(), *model.buffers()], cuda),
        gradients=count.gradients,
        optimizer=_optimizer_bytes(trainer.opt, cuda),
        activations=count.activations,
        weight_copies=count.weight_copies,
        inputs=sum(_alloc(n, cuda) for n in inputs.values()),
        data=resident_data(trainer, cuda),
        workspace=workspace,
        step_temp=_step_temp(trainer, cuda),
    )
    if measured_peak is None:
        measured_peak = sum(parts[k] for k in ("weights", "gradients", "optimizer",
                                               "activations", "weight_copies", "inputs"))
        how = ("hook count (CPU: the allocator keeps no statistics): weights + gradients + "
               "optimizer state + tensors saved for backward + inputs")
    else:
        how = "torch.cuda.max_memory_allocated around one full step"
    return Breakdown(device=str(dev), precision=cfg.precision, optimizer_name=cfg.optimizer,
                     momentum=cfg.momentum, batch_size=cfg.batch_size, micro_batch=cfg.micro_batch,
                     params=param_count(model),
                     activations_fp32=fp32.activations + fp32.weight_copies,
                     measured_peak=measured_peak, measured_by=how, **parts)


def endless_batches(run) -> Iterator[list]:
    """The run's optimizer-step batches, epoch after epoch, for as many steps as wanted."""
    from fasttrain.engine.loop import endless_batches

    return endless_batches(run)


def measure(trainer, batches: Iterator[list] | None = None) -> Breakdown:
    """Warm up (one step, or more while fp16 skips them), then — on CUDA — measure one full
    step's peak, then count the parts. Consumes its steps from `batches`."""
    batches = batches if batches is not None else endless_batches(trainer)
    dev = trainer.device
    cuda = dev.type == "cuda"
    micro_batches = next(batches)
    for _ in range(_WARMUP_MAX):
        scale = trainer.scaler.get_scale() if trainer.scaler.is_enabled() else None
        step(trainer, micro_batches)
        if scale is None or trainer.scaler.get_scale() >= scale:  # a step that was not skipped
            break
    if not cuda:
        return breakdown(trainer, micro_batches)
    torch.cuda.synchronize(dev)
    resident = (_bytes([*trainer.model.parameters(), *trainer.model.buffers()], True)
                + _optimizer_bytes(trainer.opt, True) + resident_data(trainer, True)
                + _bytes([t for mb in micro_batches for t in mb], True))
    # Gradients were freed by the warm-up step (set_to_none): what is left beyond the known
    # residents is cuBLAS workspaces and small state.
    workspace = max(0, torch.cuda.memory_allocated(dev) - resident)
    torch.cuda.reset_peak_memory_stats(dev)
    step(trainer, micro_batches)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    return breakdown(trainer, micro_batches, measured_peak=peak, workspace=workspace)


# -- finding the batch size ----------------------------------------------------------------------


@dataclass
class Try:
    """One batch size tried: did it fit, how fast was it, and the peak it was judged on."""

    batch: int
    fits: bool
    samples_per_s: float | None = None
    peak: int | None = None  # CUDA: measured; CPU: predicted (what "fits" was judged on)
    predicted: int | None = None
    reason: str | None = None  # why it does not fit


def free_memory() -> None:
    """Return what a finished try held: compiled code (which references the module it traced),
    Python references (a Run holds reference cycles), then the allocator's cached blocks."""
    torch.compiler.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def try_batch(cfg, task, batch: int, usable: int, steps: int) -> Try:
    """Build a trainer at `batch`, measure it and time `steps` real steps after the warm-up.
    Out of memory — anywhere, construction included — is "does not fit", never a crash."""
    try:
        result = _try(cfg, task, batch, usable, steps)
    except torch.OutOfMemoryError:
        result = Try(batch, False, reason="out of memory")
    # After the except block: its traceback (and the frames holding the tensors) is gone.
    free_memory()
    return result


def _try(cfg, task, batch: int, usable: int, steps: int) -> Try:
    from fasttrain.engine.run import build
    from fasttrain.timing import synchronizer, time_call

    trainer = build(dataclasses.replace(cfg, batch_size=batch), data=task, verbose=False)
    dev = trainer.device
    cuda = dev.type == "cuda"
    batches = endless_batches(trainer)
    b = measure(trainer, batches)
    if not cuda and b.predicted_peak > usable:
        return Try(batch, False, peak=b.predicted_peak, predicted=b.predicted_peak,
                   reason="predicted peak over the limit")
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)
    sync = synchronizer(dev.type)
    ms = [time_call(lambda: step(trainer, next(batches)), sync)[1] for _ in range(steps)]
    peak = max(b.measured_peak, torch.cuda.max_memory_allocated(dev)) if cuda else b.predicted_peak
    sps = batch / (statistics.median(ms) / 1e3)
    if peak > usable:
        return Try(batch, False, sps, peak, b.predicted_peak, "peak over the safety margin")
    return Try(batch, True, sps, peak, b.predicted_peak)


def search(try_fn: Callable[[int], Try], floor: int, unit: int, cap: int,
           min_gain: float = _MIN_GAIN) -> tuple[Try | None, list[Try]]:
    """The batch with the highest samples/s that fits — not merely the largest.

    Doubles from `floor` while the batch fits and throughput improves by more than `min_gain`,
    then bisects (in multiples of `unit`) between the best batch and the first one that failed or
    was slower. `cap` (the training set) bounds every try. Returns (best or None, every try)."""
    tries: list[Try] = []

    def attempt(b: int) -> Try:
        t = try_fn(b)
        tries.append(t)
        return t

    def better(t: Try, best: Try | None) -> bool:
        return t.fits and (best is None or t.samples_per_s > best.samples_per_s * (1 + min_gain))

    best, b = None, floor
    while b <= cap:
        t = attempt(b)
        if not better(t, best):
            break
        best, b = t, 2 * b
    if best is None:
        return None, tries
    lo, hi = best.batch, min(b, cap + unit)  # hi: failed, slower, or past the training set
    while hi - lo > unit:
        mid = lo + max(unit, (hi - lo) // 2 // unit * unit)
        if mid > cap:  # the engine cannot build a batch larger than the training set
            hi = mid
            continue
        t = attempt(mid)
        if better(t, best):
            best, lo = t, mid
        else:
            hi = mid
    return best, tries


def train_samples(task, block_size: int) -> int:
    """How many samples one epoch has: the largest batch the engine can build."""
    if task.kind == "language":
        return (len(task.train_x) - 1) // block_size
    return len(task.train_y)


# -- shared by the lab commands ------------------------------------------------------------------


def lab_config(args: argparse.Namespace, command: str):
    """The TrainConfig of a lab command, with its data loaded once: (cfg, task).

    Without --data, the dataset is the real one when it is on disk (mnist, tinyshakespeare for
    gpt) and its synthetic stand-in otherwise — never a download; outputs say which."""
    from fasttrain.data.tasks import load_task
    from fasttrain.engine.config import from_args, load_toml
    from fasttrain.engine.inputs import resolve_data
    from fasttrain.models import MODEL_KINDS

    cfg = from_args(args)
    if cfg.out or cfg.resume:
        raise UserError(f"fasttrain {command} writes no run directory: drop --out/--resume "
                        f"(results go to --json PATH)")
    if getattr(cfg, "parallel", "none") != "none":
        raise UserError(f"fasttrain {command} measures one process: drop --parallel")
    given = "data" in vars(args) or bool(args.config and "data" in load_toml(args.config))
    if given:
        cfg = cfg.validate(MODEL_KINDS)
        return cfg, resolve_data(cfg.data, cfg)  # a bundled name or pkg.module:factory
    real, stand_in = (("tinyshakespeare", "synthetic-text")
                      if MODEL_KINDS.get(cfg.model) == "language" else ("mnist", "synthetic"))
    cfg = dataclasses.replace(cfg, data=real).validate(MODEL_KINDS)
    try:
        task = load_task(real, cfg.data_dir, seed=cfg.seed, block_size=cfg.block_size,
                         download=False)
    except UserError:
        cfg = dataclasses.replace(cfg, data=stand_in)
        task = load_task(stand_in, seed=cfg.seed, block_size=cfg.block_size)
    return cfg, task


def data_label(task) -> str:
    return task.name + (" (SYNTHETIC stand-in, not real data)" if task.synthetic else "")


def gib_arg(flag: str, value: float | None) -> int | None:
    """A --memory-limit in GiB as bytes, after checking it."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{flag} must be a positive number of GiB, got {value}")
    return int(value * 2**30)


# -- tables ------------------------------------------------------------------------------------


_PARTS = (("weights", "weights (parameters, buffers)"),
          ("weight_copies", "half weight copies (saved)"),
          ("gradients", "gradients"),
          ("optimizer", "optimizer state"),
          ("activations", "activations (saved for backward)"),
          ("inputs", "inputs (not saved)"),
          ("data", "dataset on the device"),
          ("workspace", "workspace (measured)"),
          ("step_temp", "optimizer step temporaries"))


def breakdown_table(b: Breakdown, title: str):
    """Parts as rows: this run's exact bytes beside the seed lab's fp32 and mixed formula."""
    from fasttrain import report

    seed = b.seed_formula()
    rows = [{"part": label, "ours": getattr(b, key), "fp32": seed["fp32"].get(key),
             "mixed": seed["mixed"].get(key)} for key, label in _PARTS]
    rows.append({"part": "predicted peak", "ours": b.predicted_peak,
                 "fp32": seed["fp32"]["total"], "mixed": seed["mixed"]["total"]})
    rows.append({"part": "measured peak", "ours": b.measured_peak, "fp32": None, "mixed": None})
    fmt = report.fmt_bytes
    error = (f"prediction error {b.error:+.1%} (the goal: within 10%)" if b.device.startswith(
        "cuda") else "on the CPU the two differ only by the step temporaries")
    caption = (f"measured: {b.measured_by}. Predicted peak = weights + optimizer + data + "
               f"workspace + inputs + gradients + max(activations + copies, step temporaries); "
               f"{error}. Seed formula: P = {b.params:,} parameters, weights + "
               f"gradients + optimizer + activations (mixed: + half copy, half gradients, half "
               f"the fp32 activations; torch autocast keeps fp32 gradients). Micro-batch "
               f"{b.micro_batch} on {b.device}.")
    return report.rows_table(title, [
        ("part", lambda r: r["part"]),
        ("this run", lambda r: fmt(r["ours"])),
        ("seed formula, fp32", lambda r: fmt(r["fp32"])),
        ("seed formula, mixed", lambda r: fmt(r["mixed"])),
    ], rows, caption)


def search_table(tries: list[Try], cuda: bool, title: str):
    from fasttrain import report

    judged = "measured (CUDA allocator)" if cuda else "predicted (CPU: hook count)"
    return report.rows_table(title, [
        ("batch", lambda r: r["batch"]),
        ("fits", lambda r: "yes" if r["fits"] else f"no: {r['reason']}"),
        ("samples/s", lambda r: f"{r['samples_per_s']:,.0f}" if r["samples_per_s"] else "-"),
        ("peak", lambda r: report.fmt_bytes(r["peak"])),
        ("predicted", lambda r: report.fmt_bytes(r["predicted"])),
    ], [dataclasses.asdict(t) for t in tries], caption=f"fit judged on the peak {judged}; "
        f"each try: one warm-up step, then timed steps (median)")


# -- the command ---------------------------------------------------------------------------------


def memory_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.config import add_arguments

    p = sub.add_parser("memory", help="where a training step's memory goes, predicted part by "
                       "part beside the measured peak; --find-batch-size",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    g = p.add_argument_group("memory")
    g.add_argument("--find-batch-size", action="store_true",
                   help="search for the batch size with the highest samples/s that fits")
    g.add_argument("--memory-limit", type=float, metavar="GIB",
                   help="memory to fit in, GiB (required on the CPU for --find-batch-size; on "
                   "CUDA at most the device's memory, which is the default)")
    g.add_argument("--margin", type=float, default=0.1, metavar="FRACTION",
                   help="safety margin kept free, a fraction of the limit (default: 0.1)")
    g.add_argument("--floor", type=int, default=8, metavar="N",
                   help="first batch size of the search (default: 8)")
    g.add_argument("--try-steps", type=int, default=3, metavar="N",
                   help="timed steps per try, after one warm-up step (default: 3)")
    g.add_argument("--json", metavar="PATH", help="write the result JSON here")
    add_arguments(p)
    p.set_defaults(func=memory)


def memory(args: argparse.Namespace) -> int:
    from rich.console import Console

    from fasttrain import report
    from fasttrain.env import env_block

    limit = gib_arg("--memory-limit", args.memory_limit)
    if not 0 <= args.margin < 1:
        raise UserError(f"--margin must be a fraction in [0, 1), got {args.margin}")
    if args.json:
        report.check_writable(args.json, "--json")
    cfg, task = lab_config(args, "memory")
    from fasttrain.env import resolve_device

    cuda = resolve_device(cfg.device) == "cuda"
    if args.find_batch_size:
        if args.floor < 1 or args.floor % cfg.accum_steps:
            raise UserError(f"--floor {args.floor} must be a positive multiple of --accum-steps "
                            f"{cfg.accum_steps}")
        if args.try_steps < 1:
            raise UserError(f"--try-steps must be ≥ 1, got {args.try_steps}")
        if not cuda and limit is None:
            raise UserError("--find-batch-size on the CPU needs --memory-limit GiB: the CPU "
                            "allocator keeps no statistics, so fit is judged from the predicted "
                            "peak against the limit you give")
    out, err = report.wide_console(), Console(stderr=True)
    env = env_block()
    config = {**cfg.to_dict(), "data_source": task.source, "synthetic": task.synthetic,
              "find_batch_size": args.find_batch_size, "memory_limit_gib": args.memory_limit,
              "margin": args.margin}
    result = {"schema": SCHEMA, "env": env, "config": config, "rows": []}
    if args.find_batch_size:
        if cuda:
            total = torch.cuda.get_device_properties(0).total_memory
            limit = min(limit or total, total)
        usable = int(limit * (1 - args.margin))
        config.update(floor=args.floor, try_steps=args.try_steps, usable_bytes=usable)
        err.print(f"searching batch sizes for {cfg.model} on {data_label(task)}, {cfg.precision}, "
                  f"usable memory {report.fmt_bytes(usable)} "
                  f"({report.fmt_bytes(limit)} less {args.margin:.0%} margin)")

        def one(batch: int) -> Try:
            t = try_batch(cfg, task, batch, usable, args.try_steps)
            err.print(f"  batch {t.batch:>6}: {'fits' if t.fits else 'does not fit'}"
                      + (f", {t.samples_per_s:,.0f} samples/s" if t.samples_per_s else "")
                      + (f", peak {report.fmt_bytes(t.peak)}" if t.peak else "")
                      + (f" ({t.reason})" if t.reason else ""))
            return t

        unit = math.lcm(8, cfg.accum_steps)
        cap = train_samples(task, cfg.block_size)
        if args.floor > cap:
            raise UserError(f"--floor {args.floor} is more than the {cap} training samples of "
                            f"{task.name}; choose a smaller floor")
        best, tries = search(one, args.floor, unit, cap)
        result["rows"] = [{"kind": "try", **dataclasses.asdict(t)} for t in tries]
        result["best_batch_size"] = best.batch if best else None
        out.print(search_table(tries, cuda, f"fasttrain memory --find-batch-size — "
                               f"{cfg.model} on {data_label(task)}, {cfg.precision}"))
        if best is not None:
            out.print(f"best batch size: {best.batch} ({best.samples_per_s:,.0f} samples/s, "
                      f"peak {report.fmt_bytes(best.peak)})")
    else:
        from fasttrain.engine.run import build

        b = measure(build(cfg, data=task, verbose=False))
        result["rows"] = [{"kind": "breakdown", **b.to_dict()}]
        out.print(breakdown_table(b, f"fasttrain memory — {cfg.model} on {data_label(task)}, "
                                  f"batch {cfg.batch_size}, {cfg.precision}, {cfg.optimizer}"))
        if limit is not None:
            fits = b.predicted_peak <= limit * (1 - args.margin)
            out.print(f"fits in {report.fmt_bytes(limit)} less {args.margin:.0%} margin: "
                      f"{'yes' if fits else 'no'}")
    if args.json:
        report.write_json(args.json, result)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.find_batch_size and result["best_batch_size"] is None:  # a search that found nothing
        raise UserError(f"even batch {args.floor} does not fit in "
                        f"{report.fmt_bytes(config['usable_bytes'])}: lower --floor, or try "
                        f"--activation-checkpointing / --precision bf16")
    return 0

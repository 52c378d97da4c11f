"""`build(config, model, data) -> Run`: every switch validated and resolved once, in wrap order.

    run = build(TrainConfig(precision="bf16", compile=True), model=MyNet(), data=(x, y),
                loss=torch.nn.functional.mse_loss)
    fit(run)

The config is validated before any process group is joined or data loaded. Then, in order (each
depends on the one before): process group (torchrun's, for --parallel ddp/fsdp/zero1; it decides
the device) → seed → device → precision (autocast, GradScaler, TF32) → data (this rank's share)
→ loss and metrics → model (the same initial weights on every rank) → channels_last →
parallelize: activation checkpointing → DDP / fully_shard / DataParallel → compile (see
distributed.parallelize) → optimizer (ZeRO-1 partitions it) → schedule → clip → run directory →
resume (after everything it restores exists). The bundled models and datasets go through this
same path: a name is only looked up in its registry (`inputs.resolve_model`/`resolve_data`).
The switches that resolve alone (seed, precision, data placement, clipping) are switches.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fasttrain.engine import (
    agree,
    augment,
    distributed,
    graphed,
    inputs,
    optim,
    steps,
    switches,
    usercode,
)
from fasttrain.engine.batches import Batches
from fasttrain.engine.config import TrainConfig
from fasttrain.engine.configfile import to_toml
from fasttrain.engine.loop import accumulate, accumulate_tokens, step, step_batches
from fasttrain.engine.output import RunDir
from fasttrain.engine.signals import StopSignals
from fasttrain.engine.steps import Metric, default_metrics
from fasttrain.engine.steps import accuracy as accuracy  # noqa: F401 - importable from here too
from fasttrain.engine.stream import Stream
from fasttrain.engine.streamdata import StreamData
from fasttrain.engine.switches import seed_everything
from fasttrain.errors import UserError


class Run:
    """The resolved objects of one training run, and where it stands. `build` makes it; `step`,
    `fit`, callbacks and the lab read it."""

    cfg: TrainConfig
    world: distributed.World
    device: torch.device
    autocast: Any  # a context manager: torch.autocast or a null context
    scaler: torch.amp.GradScaler  # disabled unless fp16
    data: Any  # the TaskData (in memory) or streamdata.StreamData trained on
    batches: Any  # batches.Batches (in memory) or stream.Stream: the same interface
    model: nn.Module  # owns the parameters: saved, loaded, measured
    forward: nn.Module  # what the step calls: model wrapped by DDP/FSDP/compile
    no_sync: Callable  # the context of non-final micro-steps
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.LRScheduler  # built-in: a LambdaLR of optim.lr_factor
    sched_name: str  # the scheduler as 'pkg.mod:fn', for messages
    clip: Callable[[], Any]
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # the default step's
    compute_loss: steps.ComputeLoss  # (forward, micro_batch) -> (loss, extras): steps.py
    evaluate_loss: steps.ComputeLoss  # the same for evaluation, with the default's metrics
    forward_backward: Callable  # (run, micro_batches) -> None: loop.accumulate by default
    step_inputs: Callable  # (run, epoch) -> each remaining step's input: loop.step_batches, or
    train_step: Callable  # (run, input) -> None: loop.step, or the whole-step CUDA graph's
    graph: Any  # graphed.GraphStep when --cuda-graphs captures the whole step, else None
    graph_why: str | None  # why --cuda-graphs does not capture the whole step (graphed.why_not)
    step_name: str  # the user's step as 'pkg.mod:fn', for messages ("" for the default step)
    metrics: dict[str, Metric]
    perplexity: bool  # evaluations report exp(loss) as {split}_perplexity (token cross-entropy)
    total_steps: int
    epochs: float  # the passes the run may make (cfg.epoch_limit): inf for a stream without length
    flops_per_step: float | None  # for MFU: counted only where a peak FLOP/s is known
    rundir: RunDir
    checkpoints: Path | None

    def __init__(self) -> None:
        self.epoch = self.step = self.step_in_epoch = 0
        self.last_log = (time.perf_counter(), 0)  # (clock, step) of the last train log
        self.history: list[dict] = []
        self.stop: str | None = None  # set (e.g. by early stopping) to end fit() cleanly
        self.early_stop = None  # --early-stop's callbacks.EarlyStop: built, checkpointed
        # A resumed checkpoint's counts of the EarlyStop callbacks passed to fit (None: not
        # resumed); fit hands them over as it starts (callbacks.restore_early_stops)
        self.resumed_early_stops: list[dict] | None = None
        self.signals = StopSignals()  # SIGTERM/SIGUSR1/SIGINT received: stop (signals.py)
        self.callbacks: list = []  # fit()'s, while it runs
        self.step_inputs, self.train_step = step_batches, step  # graphed.attach replaces them
        self.graph, self.graph_why = None, None
        self.grads_to_none = True  # loop.step's zero_grad; False: in place (graphed.py)
        self.restore_flags: Callable[[], None] = lambda: None  # switches.process_flags

    @property
    def main(self) -> bool:
        return self.world.main


def build(config: TrainConfig | None = None, model: nn.Module | str | None = None,
          data=None, *, loss: Callable | str | None = None,
          metrics: dict[str, Metric] | None = None, checkpoint: tuple[str, ...] = (),
          step: Callable | str | None = None, optimizer: Callable | str | None = None,
          scheduler: Callable | str | None = None, tp_plan: dict | None = None,
          verbose: bool = True, signals: StopSignals | None = None, **overrides) -> Run:
    """A Run for `config` (or `TrainConfig(**overrides)`; overrides also apply to a config).

    model: an nn.Module, a bundled name or 'pkg.module:factory' (default: config.model).
    data: (x, y) tensors, a Dataset, a DataLoader, a dict of 'train'/'val'/'test' splits of
        those, a TaskData, a bundled name or 'pkg.module:factory' (default: config.data).
    loss: a callable (output, target) -> scalar, or a name as for --loss (default: config.loss).
    metrics: name -> callable (output, target) -> scalar mean, evaluated as test_<name> and
        val_<name> beside the defaults (accuracy for integer targets).
    checkpoint: names of the submodules to recompute under --activation-checkpointing (default:
        model.blocks, a Hugging Face layout's model.layers or transformer.h (models.BLOCK_LISTS),
        or each child of an nn.Sequential).
    step: your step instead of loss: fn(model, micro_batch) -> scalar loss, or a dict holding
        "loss" and extra scalar metrics (steps.py); or 'pkg.module:fn' (default: config.step).
    optimizer: fn(param_groups) -> torch.optim.Optimizer, 'sgd'/'adamw' or 'pkg.module:fn'
        (default: config.optimizer); scheduler: fn(optimizer) -> LRScheduler, or an import path
        (default: config.scheduler, else the built-in --schedule). See optim.py.
    tp_plan: under --tp, {submodule name: ColwiseParallel() | RowwiseParallel() | ...} for
        torch's parallelize_module (default: the model's parallelize(tp_mesh); tensor_parallel.py).
    signals: stop-signal handlers the caller installed already (`with StopSignals() as s:`), so
        that a signal during build is not lost; else fit installs the Run's own.
    """
    cfg = dataclasses.replace(config or TrainConfig(), **overrides)
    if isinstance(model, nn.Module):  # recorded (config.toml, resume checks) by its class
        cfg = dataclasses.replace(cfg, model=f"python:{type(model).__qualname__}")
    elif model is not None:
        cfg = dataclasses.replace(cfg, model=model)
    if isinstance(data, str):
        cfg = dataclasses.replace(cfg, data=data)
    elif data is not None and not hasattr(data, "train_x"):  # a TaskData keeps config.data
        cfg = dataclasses.replace(cfg, data="python:data")
    if isinstance(loss, str):
        cfg = dataclasses.replace(cfg, loss=loss)
    elif loss is not None:
        cfg = dataclasses.replace(cfg, loss=f"python:{getattr(loss, '__name__', 'loss')}")
    user = {"step": step, "optimizer": optimizer, "scheduler": scheduler}
    for key, given in user.items():  # recorded (config.toml, resume checks) by their names
        if isinstance(given, str):
            cfg = dataclasses.replace(cfg, **{key: given})
        elif given is not None:
            cfg = dataclasses.replace(cfg, **{key: f"python:{usercode.name_of(given)}"})
    cfg = cfg.validate()
    for flag, path in (("--model", cfg.model), ("--data", cfg.data), ("--loss", cfg.loss)):
        if ":" in path and not path.startswith("python:"):
            inputs.import_object(path, flag)  # a bad import path fails before any data loads
    for key, given in user.items():
        path = getattr(cfg, key) or ""
        if not callable(given) and ":" in path and not path.startswith("python:"):
            user[key] = inputs.import_object(path, f"--{key}")
            if not callable(user[key]):
                raise UserError(f"--{key} {path}: {type(user[key]).__name__} is not callable; "
                                f"point at a function")
    from fasttrain.env import resolve_device

    world = distributed.init(cfg.parallel, torch.device(resolve_device(cfg.device)), cfg.tp,
                             cfg.pp)
    run = Run()
    run.signals = signals or run.signals
    try:
        return _setup(run, cfg, world, model if model is not None else cfg.model,
                      data if data is not None else cfg.data,
                      loss if loss is not None else cfg.loss, metrics or {}, tuple(checkpoint),
                      {k: v for k, v in user.items() if callable(v)}, verbose, tp_plan)
    except BaseException:
        if getattr(run, "rundir", None) is not None:
            run.rundir.close()  # give the run directory's lock back (in-process callers)
        world.close()  # a UserError on one rank must not leave the group behind
        run.restore_flags()
        raise


def _setup(run: Run, cfg: TrainConfig, world, model, data, loss, metrics: dict, names: tuple,
           user: dict[str, Callable], verbose: bool, tp_plan: dict | None = None) -> Run:
    from fasttrain.engine import checkpoint

    if world.restarts and cfg.out and not cfg.resume:
        # torchrun restarted the workers after a failure (--max-restarts): continue from the
        # last complete checkpoint rather than from scratch.
        cfg = dataclasses.replace(cfg, resume="auto")
    if cfg.pin_memory and world.device.type != "cuda":
        # As torch's DataLoader does: a script written for a GPU still runs on a CPU.
        if world.main:
            print(f"warning: --pin-memory speeds up host-to-GPU copies; on "
                  f"{world.device.type} there are none: ignored", file=sys.stderr)
        cfg = dataclasses.replace(cfg, pin_memory=False)
    run.cfg, run.world = cfg, world
    for line in cfg.unread() if world.main else ():  # recorded, yet nothing reads them
        print(f"warning: {line}", file=sys.stderr)
    seed_everything(cfg.seed)
    run.restore_flags = switches.process_flags()  # called as the run ends (loop.fit)
    switches.deterministic(cfg)
    run.device = dev = world.device  # cuda:LOCAL_RANK under torchrun on GPUs
    run.autocast, run.scaler = switches.precision(cfg, dev, world.sharded)

    # Data is dealt over the data-parallel ranks only: the ranks of a tp group (or a pipeline)
    # compute one forward together and must see the same samples (mesh.py).
    task, why = inputs.load_data(data, cfg, world.dp_size)
    run.data = task
    flip_crop = augment.for_task(cfg.augment, task, cfg.seed, dev, world.dp_rank)  # in memory
    if isinstance(task, StreamData):
        # A stream without length: the ranks agree where each pass ends (all ranks: a tp
        # group's or a pipeline's read the same share and step together).
        run.batches = Stream(task, cfg, dev, world.dp_rank, world.dp_size,
                             (lambda: agree.int_gather(world)) if world.size > 1 else None)
    else:
        run.batches = Batches(task, dev, cfg.batch_size, cfg.accum_steps, cfg.seed,
                              on_device=switches.data_on_device(cfg, dev, task),
                              workers=cfg.workers, pin_memory=cfg.pin_memory,
                              channels_last=cfg.channels_last, block_size=cfg.block_size,
                              rank=world.dp_rank, world=world.dp_size, augment=flip_crop, why=why)
    if user.get("step") is None and task.kind == "other":
        raise UserError(f"the batches of {task.name} are not (input, target) pairs, which the "
                        f"default step needs: give step=fn(model, batch) returning the loss "
                        f"(--step pkg.module:fn)")
    run.loss_fn = inputs.resolve_loss(loss, task, user_step=user.get("step") is not None)
    # exp(loss) is a perplexity where the loss is the mean cross-entropy of next tokens: the
    # bundled text, or your token sequences (int64 [T] pairs) under the default step and the
    # built-in cross-entropy. Not a loss of yours, nor your step's: it may hold anything.
    run.perplexity = run.batches.language or bool(
        run.batches.sequences and user.get("step") is None
        and run.loss_fn is inputs.cross_entropy)
    run.metrics = {**default_metrics(task), **metrics}
    run.step_name = (usercode.name_of(user["step"], cfg.step) if "step" in user else "")
    run.compute_loss = steps.compute_loss(run, user.get("step"), run.step_name)
    run.evaluate_loss = steps.evaluate_loss(run)
    if cfg.early_stop:  # a metric the evaluations never report: refused before the model
        from fasttrain.engine.callbacks import EarlyStop

        EarlyStop(cfg.early_stop, label=f"--early-stop {cfg.early_stop}").check(run)
    run.forward_backward = accumulate  # under --pp, pipeline.attach puts its schedule here
    if steps.weighs_tokens(run, user.get("step")):  # padded token sequences: by their tokens
        run.compute_loss, run.forward_backward = steps.token_sums(run), accumulate_tokens
    # --cuda-graphs: the whole step in one graph where it can be (graphed.py), else the model's
    # forward and backward only (compile's reduce-overhead mode), with the reason on the start line.
    run.graph_why = graphed.why_not(run) if cfg.cuda_graphs else None

    module, label = inputs.resolve_model(model, task)
    run.label = label
    module = module.to(dev)
    if cfg.channels_last:
        module = module.to(memory_format=torch.channels_last)
    if world.tp > 1:  # a tp_plan key naming no module: refused on every rank alike
        from fasttrain.engine.tensor_parallel import check_plan

        check_plan(module, tp_plan)
    if world.pp > 1:  # pipeline.py: cut into stages; this rank's become the model
        from fasttrain.engine import pipeline

        # Each stage parallelized there (tp, checkpointing, DDP/FSDP); the schedule runs them.
        module = agree.together(world, pipeline.attach, run, module, world, cfg, names, tp_plan)
        run.forward, run.no_sync = module, contextlib.nullcontext
    # On the plain module: exact, once (a pipeline stage alone cannot run the step).
    run.flops_per_step = _count_flops(run, module) if world.pp == 1 else None
    run.model = module
    if world.pp == 1:
        # tensor parallel → activation checkpointing → DDP / fully_shard / DataParallel →
        # compile, in that order. A model that cannot be split (--tp) stops every rank with the
        # same line. Loss parallel for the default step's loss (under --pp the schedule
        # computes the loss).
        from fasttrain.engine import tensor_parallel

        sharded_logits = world.tp > 1 and tensor_parallel.wants_loss_parallel(run, module,
                                                                              tp_plan)
        run.forward, run.no_sync = agree.together(
            world, distributed.parallelize, module, world,
            activation_checkpointing=cfg.activation_checkpointing, compile=cfg.compile,
            cuda_graphs=cfg.cuda_graphs and run.graph_why is not None, checkpoint=names,
            tp_plan=tp_plan,
            loss_parallel=sharded_logits)
        if sharded_logits:  # the loss on vocab shards (tensor_parallel.py)
            tensor_parallel.attach_loss_parallel(run)
        if cfg.cuda_graphs and run.graph_why is not None:
            graphed.model_graphs_only(run, module)
    if world.size > 1:
        distributed.seed_ranks(world, cfg.seed, dev)  # dropout's streams, after the same init

    run.opt = optim.optimizer(cfg, module, world, user.get("optimizer"),
                              usercode.name_of(user.get("optimizer"), cfg.optimizer))
    per_epoch = run.batches.steps_per_epoch  # None: a stream without length (then max_steps)
    # A stream without length: --max-steps is the run's length, its passes (epochs) restarted
    # as often as that takes; --epochs, given, ends it sooner (under torchrun too: the ranks
    # end each pass together, stream.py).
    run.epochs = cfg.epoch_limit(sized=per_epoch is not None)
    run.total_steps = run.epochs * per_epoch if per_epoch is not None else cfg.max_steps
    if cfg.max_steps:
        run.total_steps = min(run.total_steps, cfg.max_steps)
        if cfg.max_steps > run.total_steps and world.main:  # a limit, not a length
            print(f"warning: --max-steps {cfg.max_steps} is never reached: --epochs "
                  f"{run.epochs} of {per_epoch} steps end the run at step {run.total_steps}; "
                  f"raise --epochs to train longer", file=sys.stderr)
    if cfg.warmup_steps >= run.total_steps and world.main:  # a limit cut it short, say
        peak = cfg.lr * run.total_steps / cfg.warmup_steps
        decay = (f", and --schedule {cfg.schedule} never decays it"
                 if cfg.schedule != "constant" else "")
        print(f"warning: --warmup-steps {cfg.warmup_steps} is not shorter than the run's "
              f"{run.total_steps} steps: the whole run is warm-up, its learning rate rising "
              f"only to {peak:.3g} (--lr {cfg.lr:g}){decay}; lower --warmup-steps or train "
              f"longer", file=sys.stderr)
    run.sched_name = usercode.name_of(user.get("scheduler"), cfg.scheduler)
    run.sched = optim.scheduler(cfg, run, run.opt, user.get("scheduler"), run.sched_name)
    run.clip = switches.clipper(run, module)
    run.loss_sum = torch.zeros((), device=dev)
    run.extra_sums = {}  # a user step's extra metrics, summed like loss_sum (steps.py)
    run.skipped = torch.zeros((), device=dev, dtype=torch.int64)

    # Rank 0 writes (and claims: rundir.py) the run directory; its error stops every rank.
    run.rundir = agree.together(world, RunDir, cfg.out if world.main else None, bool(cfg.resume))
    # Every rank takes part in checkpoints (collectives; FSDP shards): all need the path.
    run.checkpoints = Path(cfg.out) / "checkpoints" if cfg.out else None
    if cfg.early_stop:  # its count is a run's state: restored by the resume below
        from fasttrain.engine.callbacks import EarlyStop

        run.early_stop = EarlyStop(cfg.early_stop, cfg.patience,
                                   label=f"--early-stop {cfg.early_stop}")
    agree.together(world, checkpoint.resume, run)  # a bad checkpoint stops every rank
    if cfg.cuda_graphs and run.graph_why is None:
        graphed.attach(run)  # after the restore: it sets the optimizer's flags the graph needs
    run.rundir.write_text("config.toml", to_toml(cfg))
    # A module passed from Python is recorded as cfg.model's "python:<class>": load() then asks
    # for it rather than try its class path as an import path.
    about = cfg.model if cfg.model.startswith("python:") else label
    run.rundir.write_json("model.json", {"model": about, "in_shape": list(task.in_shape or ()),
                                         "num_classes": task.num_classes})
    if verbose and world.main:
        print(describe(run), file=sys.stderr)
    return run


def describe(run: Run) -> str:
    """The derived values that matter, in one line (rank 0 prints it at build)."""
    cfg, b, task = run.cfg, run.batches, run.data
    used = {"fp16": "fp16 autocast + GradScaler", "bf16": "bf16 autocast",
            "tf32": "TF32 matmuls"}.get(cfg.precision, "fp32")
    synthetic = task.synthetic and "synthetic" not in task.name  # not "synthetic (synthetic)"
    return (f"training {run.label} on {task.name}{' (synthetic)' if synthetic else ''} on "
            f"{run.device}, {cfg.precision}, {run.total_steps} steps of {cfg.batch_size}"
            f"{_passes(run)}: "
            f"micro-batch {b.micro} per rank × {cfg.accum_steps} accumulation × "
            f"{run.world.size} process(es){_layout(run)}; data {b.path} ({b.why}), "
            f"{'on the device' if b.on_device else 'from the host'}; precision used: {used}"
            f"{graphed.describe(run)}")


def _passes(run: Run) -> str:
    """How a stream without length fills the steps: restarted as often as it takes (ended
    sooner by --epochs where given); '' for data with length (its epochs make the steps)."""
    if run.batches.steps_per_epoch is not None:
        return ""
    if run.epochs == math.inf:
        return " (a stream without length, restarted as often as it takes)"
    return f" (or {run.epochs} pass(es) of a stream without length, if they end first)"


def _layout(run: Run) -> str:
    """How the processes hold the model, as `fasttrain memory` names layouts (lab/layouts.py):
    ' (fsdp)'; under --tp/--pp ' (dp 2 fsdp × tp 2 × pp 2 1f1b, m 4: the micro-batch is per
    data-parallel rank)'; '' for one plain process."""
    world, cfg = run.world, run.cfg
    if world.tp * world.pp == 1:
        return f" ({cfg.parallel})" if cfg.parallel != "none" else ""
    pp = f"pp {world.pp}"
    if world.pp > 1:
        from fasttrain.engine.pipeline import microbatches

        pp += f" {cfg.pp_schedule}, m {microbatches(cfg, run.batches.micro * run.batches.accum)}"
    dp = f"dp {world.dp_size}" + (f" {cfg.parallel}" if world.dp_size > 1 else "")
    return f" ({dp} × tp {world.tp} × {pp}: the micro-batch is per data-parallel rank)"


def _count_flops(run: Run, model: nn.Module) -> float | None:
    """FLOPs of one optimizer step (forward + backward of every micro-batch), counted once by
    torch's FLOP counter on a real micro-batch: the numerator of MFU. Only where MFU can be
    computed (a CUDA GPU whose peak is known): elsewhere the count would cost setup time for a
    figure that is null."""
    from fasttrain.env import gpu_peaks

    if run.device.type != "cuda" or not gpu_peaks(torch.cuda.get_device_name(run.device)):
        return None
    from torch.utils.flop_counter import FlopCounterMode

    # One rank's micro-batch, scaled to the whole step of all ranks (FLOPs are linear in the
    # batch): the count never holds more than one rank's activations.
    batch = next(iter(run.batches.eval_batches(run.batches.micro, "train")), None)
    if batch is None:
        return None
    counter = FlopCounterMode(display=False)
    # Eval mode and a forked RNG: counting must not move BatchNorm statistics or the random
    # stream, or the run would differ from one that does not count.
    with torch.random.fork_rng(devices=[run.device]), counter:
        model.eval()
        run.compute_loss(model, batch)[0].backward()
    model.train()
    model.zero_grad(set_to_none=True)
    return float(counter.get_total_flops()) * run.cfg.accum_steps * run.batches.world


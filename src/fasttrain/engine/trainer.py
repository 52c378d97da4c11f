"""The training engine: every switch of TrainConfig resolved once, then a straight-line step loop.

    from fasttrain.engine import TrainConfig, Trainer
    Trainer(TrainConfig(model="cnn", data="mnist", precision="bf16", compile=True)).fit()

Setup applies the switches in a fixed order (each depends on the one before):
  process group (torchrun's, for --parallel ddp/fsdp/zero1; it decides the device) → seed →
  device → precision (autocast, GradScaler, TF32) → data (this rank's share) → model (the same
  initial weights on every rank) → channels_last → parallelize: activation checkpointing →
  DDP / fully_shard / DataParallel → compile (see distributed.parallelize) → optimizer (ZeRO-1
  partitions it) → schedule → resume (after everything it restores exists).
The step loop has no feature branches: each switch became an object (a context manager, a scaler
that may be disabled, a clip function that may do nothing).

Host–device syncs happen only at log steps (the loss is summed on the device in between, and
all-reduced over ranks at the log), at evaluation, and at checkpoints.

Exit codes of `fasttrain train` (for schedulers that requeue): 0 done; 2 bad input; 3 the loss
became non-finite (the last good checkpoint is kept); 75 preempted by SIGTERM/SIGUSR1, a
checkpoint was saved at the step boundary — run again with `--resume auto`. Under torchrun
every rank exits 75 (torchrun itself reports any non-zero worker exit as its own failure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import random
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from fasttrain.engine import agree, checkpoint, distributed, resume
from fasttrain.engine.batches import Batches
from fasttrain.engine.config import TrainConfig
from fasttrain.engine.output import RunDir
from fasttrain.engine.signals import EXIT_PREEMPTED, StopSignals
from fasttrain.errors import UserError

EXIT_DIVERGED = 3
_NO_CONTEXT = contextlib.nullcontext()  # reusable: entered once per final micro-step


class Preempted(Exception):
    """Stopped by a signal at a step boundary (75 SIGTERM/SIGUSR1, 130 Ctrl-C)."""

    def __init__(self, message: str, exit_code: int = EXIT_PREEMPTED):
        super().__init__(message)
        self.exit_code = exit_code


class Diverged(Exception):
    exit_code = EXIT_DIVERGED


def resolve_device(requested: str) -> torch.device:
    available = {
        "cuda": torch.cuda.is_available(),
        "mps": hasattr(torch.backends, "mps") and torch.backends.mps.is_available(),
        "xpu": hasattr(torch, "xpu") and torch.xpu.is_available(),
        "cpu": True,
    }
    if requested == "auto":
        return torch.device(next(d for d in ("cuda", "mps", "xpu", "cpu") if available[d]))
    if not available[requested]:
        raise UserError(f"--device {requested}: not available on this machine; use --device "
                        f"auto or cpu (`fasttrain env` lists what torch sees)")
    return torch.device(requested)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


class Trainer:
    """`Trainer(cfg).fit()`. `task` replaces `cfg.data` with data of your own (a
    `fasttrain.data.TaskData`); everything else comes from `cfg`. `stop`: signal handlers the
    caller installed already (so that a signal during setup is not lost); else fit installs
    its own."""

    def __init__(self, cfg: TrainConfig, task=None, stop: StopSignals | None = None):
        from fasttrain.models import MODEL_KINDS

        self.stop = stop or StopSignals()  # issue 13: SIGTERM/SIGUSR1/SIGINT → flag

        cfg = cfg.validate(MODEL_KINDS)
        self.world = distributed.init(cfg.parallel, resolve_device(cfg.device))
        try:
            self._setup(cfg, task)
        except BaseException:
            if getattr(self, "run", None) is not None:
                self.run.close()  # give the run directory's lock back (in-process callers)
            self.world.close()  # a UserError on one rank must not leave the group behind
            raise

    def _setup(self, cfg: TrainConfig, task) -> None:
        from fasttrain.data.tasks import load_task
        from fasttrain.models import build_model

        world = self.world
        if world.restarts and cfg.out and not cfg.resume:
            # torchrun restarted the workers after a failure (--max-restarts): continue from the
            # last complete checkpoint rather than from scratch.
            cfg = dataclasses.replace(cfg, resume="auto")
        self.cfg = cfg
        seed_everything(cfg.seed)
        if cfg.deterministic:
            # cuBLAS needs a fixed workspace to be deterministic; must be set before it starts.
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            torch.use_deterministic_algorithms(True, warn_only=False)
            torch.backends.cudnn.benchmark = False
        self.device = dev = world.device  # cuda:LOCAL_RANK under torchrun on GPUs
        self._resolve_precision()

        if task is None:
            task = load_task(cfg.data, cfg.data_dir, seed=cfg.seed, block_size=cfg.block_size)
        self.task = task
        self.batches = Batches(task, dev, cfg.batch_size, cfg.accum_steps, cfg.seed,
                               on_device=self._data_on_device(task), workers=cfg.workers,
                               pin_memory=cfg.pin_memory, channels_last=cfg.channels_last,
                               block_size=cfg.block_size, rank=world.rank, world=world.size)
        self.loss_fn = self._language_loss if task.kind == "language" else F.cross_entropy

        model = build_model(cfg.model, in_shape=task.in_shape, num_classes=task.num_classes)
        model = model.to(dev)
        if cfg.channels_last:
            model = model.to(memory_format=torch.channels_last)
        self.flops_per_step = self._count_flops(model)  # on the plain module: exact, once
        self.model = model  # the module that owns the parameters (saved, loaded)
        # activation checkpointing → DDP / fully_shard / DataParallel → compile, in that order.
        self.forward, self.no_sync = distributed.parallelize(
            model, world, activation_checkpointing=cfg.activation_checkpointing,
            compile=cfg.compile, cuda_graphs=cfg.cuda_graphs)
        if world.size > 1:
            # Same weights everywhere (seeded above), but each rank's dropout masks its own
            # samples with its own stream.
            torch.manual_seed(cfg.seed * 1_000_003 + 7919 * world.rank)

        self.opt = self._optimizer()
        self.total_steps = cfg.epochs * self.batches.steps_per_epoch
        if cfg.max_steps:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, self._lr_factor)
        params = [p for p in model.parameters() if p.requires_grad]  # sharded ones under FSDP
        self.clip = ((lambda: torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip,
                                                             foreach=True))
                     if cfg.grad_clip else (lambda: None))

        # rank 0 writes (and claims: rundir.py) the run directory; its error stops every rank.
        self.run = agree.together(world, RunDir, cfg.out if world.main else None, bool(cfg.resume))
        # Every rank takes part in checkpoints (collectives; FSDP shards): all need the path.
        self.checkpoints = Path(cfg.out) / "checkpoints" if cfg.out else None
        # A stop request is acted on only when all ranks agree on the step (see advance).
        self._stop_now = ((lambda: self.stop.requested) if world.size == 1 else
                          (lambda: self.step % cfg.log_every == 0
                           and world.any(self.stop.requested)))
        self.epoch = self.step = self.step_in_epoch = 0
        self._tick = (time.perf_counter(), 0)  # (clock, step) of the last log
        self.loss_sum = torch.zeros((), device=dev)
        self.skipped = torch.zeros((), device=dev, dtype=torch.int64)
        self.history: list[dict] = []
        agree.together(world, self._resume)  # issue 13: a bad checkpoint stops every rank
        self.run.write_text("config.toml", _toml(cfg))

    # -- setup ----------------------------------------------------------------------------------

    def _resolve_precision(self) -> None:
        cfg, dev = self.cfg, self.device
        if cfg.precision == "tf32" and dev.type != "cuda":
            raise UserError(f"--precision tf32 is a mode of NVIDIA tensor cores; on {dev.type} "
                            f"use fp32 or bf16")
        if cfg.cuda_graphs and dev.type != "cuda":
            raise UserError(f"--cuda-graphs needs a CUDA GPU, not {dev.type}; drop the flag")
        if cfg.pin_memory and dev.type != "cuda":
            raise UserError("--pin-memory speeds up host-to-GPU copies; on "
                            f"{dev.type} there are none: drop the flag")
        if dev.type == "cuda":
            tf32 = cfg.precision == "tf32"
            torch.backends.cuda.matmul.allow_tf32 = tf32
            torch.backends.cudnn.allow_tf32 = tf32
        low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
        self.autocast = (torch.autocast(dev.type, dtype=low) if low
                         else contextlib.nullcontext())
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range.
        self.scaler = torch.amp.GradScaler(dev.type, enabled=cfg.precision == "fp16")
        if self.scaler.is_enabled():
            # A skipped step shows as a smaller scale after update(). Compared on the device
            # (the scaler's own scale tensor) so that counting adds no sync.
            self._scale_now = lambda: self.scaler._scale.clone()
            self._count_skip = lambda before: self.skipped.add_(
                (self.scaler._scale < before).to(torch.int64))
        else:
            self._scale_now = lambda: None
            self._count_skip = lambda before: None

    def _data_on_device(self, task) -> bool:
        mode = self.cfg.data_on_device
        if mode != "auto":
            return mode == "on"
        if self.cfg.workers:
            return False  # asking for workers means asking for the DataLoader path
        if self.device.type != "cuda":
            return True  # host memory is the device's memory: nothing to copy per step
        size = sum(t.numel() * t.element_size() for t in (task.train_x, task.train_y,
                                                          task.test_x, task.test_y)
                   if t is not None)
        free, _ = torch.cuda.mem_get_info(self.device)
        return size < free / 4

    def _optimizer(self) -> torch.optim.Optimizer:
        cfg = self.cfg
        kw = {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
              "fused": True if cfg.fused_optimizer else None}
        params = self.model.parameters()
        try:
            if cfg.optimizer == "sgd":
                return distributed.optimizer(torch.optim.SGD, params, self.world,
                                             momentum=cfg.momentum, **kw)
            return distributed.optimizer(torch.optim.AdamW, params, self.world, **kw)
        except RuntimeError as e:  # fused kernels exist only for some devices and dtypes
            raise UserError(f"--fused-optimizer is not supported here ({e}); drop the flag") \
                from None

    def _lr_factor(self, step: int) -> float:
        cfg, total = self.cfg, max(self.total_steps, 1)
        warm = cfg.warmup_steps
        if cfg.schedule == "onecycle" and not warm:
            warm = max(1, int(0.3 * total))
        if step < warm:
            return (step + 1) / warm
        if cfg.schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warm) / max(1, total - warm))
        return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine / the annealing of onecycle

    def _language_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def _count_flops(self, model: torch.nn.Module) -> float:
        """FLOPs of one optimizer step (forward + backward of every micro-batch), counted once
        by torch's FLOP counter on a real micro-batch: the numerator of MFU."""
        from torch.utils.flop_counter import FlopCounterMode

        # One rank's micro-batch, scaled to the whole step of all ranks (FLOPs are linear in the
        # batch): the count never holds more than one rank's activations.
        x, y = next(iter(self.batches.eval_batches(self.batches.micro)))
        counter = FlopCounterMode(display=False)
        # Eval mode and a forked RNG: counting must not move BatchNorm statistics or the random
        # stream, or the run would differ from one that does not count.
        with torch.random.fork_rng(devices=[]), counter:
            model.eval()
            self.loss_fn(model(x), y).backward()
        model.train()
        model.zero_grad(set_to_none=True)
        return float(counter.get_total_flops()) * self.cfg.accum_steps * self.batches.world

    # -- the loop -------------------------------------------------------------------------------

    def train_step(self, micro_batches: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        last = len(micro_batches) - 1
        for i, (x, y) in enumerate(micro_batches):
            # Gradients are averaged over ranks once per step: the micro-steps before the last
            # only accumulate locally (DDP/FSDP no_sync; nothing to skip for one process).
            with self.no_sync() if i < last else _NO_CONTEXT:
                with self.autocast:
                    loss = self.loss_fn(self.forward(x), y) / self.cfg.accum_steps
                self.scaler.scale(loss).backward()
            self.loss_sum += loss.detach()
        self.scaler.unscale_(self.opt)  # so that clipping sees true gradients (no-op unless fp16)
        self.clip()
        scale = self._scale_now()
        self.scaler.step(self.opt)  # skips the update if fp16 gradients overflowed
        self.scaler.update()
        self._count_skip(scale)
        self.opt.zero_grad(set_to_none=True)
        self.sched.step()

    def step_batches(self, epoch: int) -> Iterator[list]:
        group: list = []
        for batch in self.batches.micro_batches(epoch, self.step_in_epoch):
            group.append(batch)
            if len(group) == self.cfg.accum_steps:
                yield group
                group = []

    def fit(self) -> dict:
        """Train to the end (or to a preemption or divergence); returns the last metrics."""
        cfg = self.cfg
        progress = progress_bar(cfg.progress and self.world.main, self.total_steps, self.step)
        self._tick = (time.perf_counter(), self._tick[1])
        together = False  # did every rank get here the same way (the end, or an agreed stop)?
        try:
            with progress as bar, self.stop:
                if self.world.any(self.stop.requested):  # a signal during setup
                    self._stopped()
                while self.epoch < cfg.epochs and self.step < self.total_steps:
                    for micro_batches in self.step_batches(self.epoch):
                        self.advance(micro_batches, bar)
                        if self.step >= self.total_steps:
                            break
                    if self.step_in_epoch >= self.batches.steps_per_epoch:
                        if self.step > self._tick[1]:  # the epoch's last steps, before its eval
                            bar.describe(self._log())
                        self.epoch += 1
                        self.step_in_epoch = 0
                        self._evaluate()
                if self.step > self._tick[1]:
                    self._log()
                if self.batches.steps_per_epoch and self.step_in_epoch:
                    self._evaluate()  # stopped mid-epoch by max_steps
                self._checkpoint()
            self.run.save_weights(distributed.full_weights(self.model, self.world))
            self.run.plot_loss()
            together = True
        except (Preempted, Diverged):
            together = True  # raised on every rank at the same step
            raise
        except torch.OutOfMemoryError:
            from fasttrain.engine.memory import explain_oom

            raise UserError(explain_oom(self)) from None
        finally:
            self.run.close()
            self.world.close(together)
        return self.history[-1] if self.history else {}

    def advance(self, micro_batches: list, bar: _Bar) -> None:
        """One optimizer step and its bookkeeping: logs, checkpoints, preemption."""
        cfg = self.cfg
        self.train_step(micro_batches)
        self.step += 1
        self.step_in_epoch += 1
        bar.advance()
        if self.step % cfg.log_every == 0:
            bar.describe(self._log())
        if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
            self._checkpoint()
        if self._stop_now():
            self._stopped()

    def _stopped(self) -> None:
        """Every rank, at the same step boundary: checkpoint (if there is a step to save), stop."""
        if self.step:
            self._checkpoint()
        raise Preempted(self.stop.message(self.step, saved=self.checkpoints is not None),
                        self.stop.exit_code)

    # -- reads (the only host syncs) ------------------------------------------------------------

    def _log(self) -> str:
        now, then = time.perf_counter(), self._tick
        steps = self.step - then[1]
        summed = self.world.all_sum(self.loss_sum.clone())  # ranks' losses, at log steps only
        loss = summed.item() / max(steps, 1) / self.world.size  # sync: the one read between logs
        self.loss_sum.zero_()
        if not math.isfinite(loss):
            raise Diverged(f"the training loss became {loss} by step {self.step}; the last good "
                           f"checkpoint is kept. Try a lower --lr, --grad-clip, or bf16 "
                           f"instead of fp16")
        dt = max(now - then[0], 1e-9)
        samples = steps * self.cfg.batch_size / dt
        record = {"kind": "train", "step": self.step, "epoch": self.epoch, "loss": loss,
                  "lr": self.sched.get_last_lr()[0], "samples_per_s": samples,
                  "step_ms": 1e3 * dt / max(steps, 1), **self._device_stats(steps / dt),
                  **self._state_bytes()}
        if self.task.kind == "language":
            record["tokens_per_s"] = samples * self.cfg.block_size
        if self.scaler.is_enabled():
            record["loss_scale"] = self.scaler.get_scale()
            record["skipped_steps"] = int(self.skipped.item())
        self.run.log(record)
        self.history.append(record)
        self._tick = (time.perf_counter(), self.step)
        return f"loss {loss:.4f}  {samples:,.0f} samples/s"

    def _state_bytes(self) -> dict:
        """Rank 0's parameters, gradients and optimizer state in bytes (sizes only: no sync)."""
        from fasttrain.engine.memory import rank_memory

        held = rank_memory(self.model, self.opt)
        return {"param_bytes": held.params, "grad_bytes": held.grads,
                "optimizer_bytes": held.optimizer}

    def _device_stats(self, steps_per_s: float) -> dict:
        from fasttrain.env import gpu_peaks

        if self.device.type == "cuda":
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30  # this rank's
            peaks = gpu_peaks(torch.cuda.get_device_name(self.device)) or {}
            key = {"tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}.get(self.cfg.precision, "fp32")
            flops = peaks.get(key)
            gpus = self.world.size if self.world.parallel != "dp" else torch.cuda.device_count()
            mfu = self.flops_per_step * steps_per_s / (flops * gpus) if flops else None
            return {"peak_memory_gb": peak, "mfu": mfu}
        import resource

        # CPU: the process's peak resident set (KiB on Linux), the closest honest "peak memory".
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return {"peak_rss_gb": rss, "mfu": None}

    @torch.no_grad()
    def _evaluate(self) -> None:
        self.model.eval()
        total = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        # Each rank evaluates its share of the test set; the sums are added over ranks.
        for x, y in self.batches.eval_shard(max(self.cfg.micro_batch, 256)):
            with self.autocast:
                logits = self.forward(x)
            logits = logits.float()
            total += self.loss_fn(logits, y).double() * y.numel()
            correct += (logits.argmax(-1) == y).sum()
        self.model.train()
        count = self.batches.eval_targets
        self.world.all_sum(total)
        self.world.all_sum(correct)
        loss = total.item() / count  # sync: once per evaluation
        record = {"kind": "eval", "step": self.step, "epoch": self.epoch, "test_loss": loss}
        if self.task.kind == "language":
            record["test_perplexity"] = math.exp(min(loss, 50.0))
            record["test_token_accuracy"] = correct.item() / count
        else:
            record["test_accuracy"] = correct.item() / count
        self.run.log(record)
        self.history.append(record)

    # -- checkpoints ----------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        """Every rank calls this at the same step; rank 0 writes (FSDP: every rank its shard)."""
        if self.checkpoints is None:
            return
        world = self.world
        # sync: never save a run that has already diverged (summed, so all ranks agree)
        pending = world.all_sum(self.loss_sum.detach().clone()).item()
        if not math.isfinite(pending):
            raise Diverged(f"the training loss became {pending} before step {self.step}; the "
                           f"last good checkpoint is kept. Try a lower --lr or --grad-clip")
        # What differs per rank: dropout streams and the loss summed since the last log.
        ranks = world.gather({"rng": checkpoint.rng_state(),
                              "loss_sum": self.loss_sum.detach().cpu()})
        state = {
            "format": checkpoint.FORMAT,
            "metrics_records": self.run.records,  # issue 13: metrics.jsonl lines seen (rank 0)
            "config": self.cfg.to_dict(),
            "scheduler": self.sched.state_dict(),
            "scaler": self.scaler.state_dict(),
            "epoch": self.epoch, "step": self.step, "step_in_epoch": self.step_in_epoch,
            "loss_sum": ranks[0]["loss_sum"], "skipped": self.skipped.cpu(),
            "last_log_step": self._tick[1],
            "rng": ranks[0]["rng"], "world_size": world.size,
        }
        if world.size > 1:
            state["ranks"] = ranks
        keep = self.cfg.keep_checkpoints
        if world.parallel == "fsdp":
            checkpoint.save_sharded(self.checkpoints, self.step,
                                    distributed.sharded_state(self.model, self.opt), state,
                                    keep, world.main, world.barrier)
            return
        optimizer = distributed.optimizer_state(self.opt, world)  # ZeRO-1: a collective
        if world.main:
            state.update(model=self.model.state_dict(), optimizer=optimizer)
            checkpoint.save(self.checkpoints, self.step, state, keep)
        world.barrier()  # nobody leaves (or exits on preemption) before the file is in place

    def _resume(self) -> None:
        cfg = self.cfg
        if not cfg.resume:
            return
        if cfg.resume == "auto":
            found = checkpoint.latest(self.checkpoints, map_location=self.device)
            if found is None:  # nothing saved yet: a fresh start is the right resume,
                self.run.truncate_metrics(0, 0)  # without the records of the start it repeats
                return
            path, state = found
        else:
            path, state = cfg.resume, checkpoint.load(cfg.resume, map_location=self.device)
        saved = state["config"]
        changed = resume.check_config(saved, cfg, path)  # issue 13: refuse or list changes
        sharded, fsdp = bool(state.get("sharded")), self.world.parallel == "fsdp"
        if sharded != fsdp:
            raise UserError(f"checkpoint {path} is {'sharded' if sharded else 'a single file'} "
                            f"(written with --parallel {saved.get('parallel', 'none')}) and "
                            f"--parallel {self.world.parallel} reads only "
                            f"{'sharded' if fsdp else 'single-file'} ones; resume with --parallel "
                            f"{'fsdp' if sharded else saved.get('parallel', 'none')}")
        try:
            if sharded:  # FSDP: each rank reads its shards (DCP), then they are set in place
                tensors = distributed.sharded_state(self.model, self.opt)
                checkpoint.load_sharded(Path(path), tensors)
                distributed.load_sharded_state(self.model, self.opt, tensors)
            else:
                self.model.load_state_dict(state["model"])
                self.opt.load_state_dict(state["optimizer"])
            self.sched.load_state_dict(state["scheduler"])
            self.scaler.load_state_dict(state["scaler"])
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
            raise UserError(f"checkpoint {path} does not fit this model/optimizer "
                            f"({(str(e).splitlines() or [type(e).__name__])[0]}); resume with "
                            f"the same settings") from None
        resume.apply_lr(self.opt, self.sched, cfg.lr)  # issue 13: a changed --lr is honoured
        self.epoch, self.step = state["epoch"], state["step"]
        self.step_in_epoch = state["step_in_epoch"]
        ranks = state.get("ranks") or [{"rng": state["rng"], "loss_sum": state["loss_sum"]}]
        if len(ranks) == self.world.size:
            mine = ranks[self.world.rank]
        else:  # another number of processes: the same logged mean, fresh-looking streams
            mean = sum(r["loss_sum"] for r in ranks) / len(ranks)
            mine = {"rng": ranks[0]["rng"], "loss_sum": mean}
        self.loss_sum.copy_(mine["loss_sum"])
        self._tick = (time.perf_counter(), state["last_log_step"])
        self.skipped.copy_(state["skipped"])
        try:
            checkpoint.set_rng_state(mine["rng"])
        except (RuntimeError, ValueError, KeyError, TypeError) as e:
            raise UserError(f"checkpoint {path} has a damaged random state ({e}); resume from "
                            f"another checkpoint") from None
        self.run.truncate_metrics(state.get("metrics_records"), self.step)  # issue 13
        if self.world.main:
            print(f"resumed from {path} (epoch {self.epoch}, step {self.step})"
                  + (f"; changed: {', '.join(changed)}" if changed else ""))


def _toml(cfg: TrainConfig) -> str:
    from fasttrain.engine.config import to_toml

    return to_toml(cfg)


class _Bar:
    """A rich progress bar driven from the loop. It only counts steps and shows the text of the
    last log: it never reads a device tensor, so it adds no sync."""

    def __init__(self, enabled: bool, total: int, done: int):
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.progress = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(),
                                 TimeRemainingColumn(), TextColumn("{task.description}"),
                                 disable=not enabled, transient=False)
        self.task = self.progress.add_task("", total=total, completed=done)

    def __enter__(self):
        self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        return self.progress.__exit__(*exc)

    def advance(self) -> None:
        self.progress.advance(self.task)

    def describe(self, text: str) -> None:
        self.progress.update(self.task, description=text)


def progress_bar(enabled: bool, total: int, done: int) -> _Bar:
    import sys

    return _Bar(enabled and sys.stderr.isatty(), total, done)

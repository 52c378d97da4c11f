"""What happens around the steps of `fit`: each a callback, in this order.

    Logger       reads the loss every --log-every steps and at each epoch's end (the host syncs)
    Evaluator    evaluates the validation and test sets after each epoch, and at a mid-epoch end
    EarlyStop    stops when --early-stop's metric has not improved for --patience evaluations
    Checkpointer saves every --checkpoint-every steps and at the end
    Preemption   on SIGTERM/SIGUSR1 (agreed by all ranks at a log step): checkpoint, then exit 75
    RunFiles     the run directory: each record to metrics.jsonl (and TensorBoard), at the end
                 the final weights and loss.png

A callback is any object with some of these methods, each called with the Run first:
on_start, on_step, on_epoch_end, on_log(record), on_eval(record), on_checkpoint(path), on_end.
Records reach callbacks through `emit`, the one place a metrics record is made public.
"""

from __future__ import annotations

import math
import time

import torch

from fasttrain.engine.loop import Diverged, Preempted, notify
from fasttrain.errors import UserError


def standard(run) -> list:
    cfg = run.cfg
    early = [EarlyStop(cfg.early_stop, cfg.patience)] if cfg.early_stop else []
    return [Logger(), Evaluator(), *early, Checkpointer(), Preemption(), RunFiles()]


def emit(run, record: dict) -> None:
    """Keep `record` in run.history and hand it to every callback (on_log / on_eval)."""
    run.history.append(record)
    notify(run, "on_eval" if record["kind"] == "eval" else "on_log", record)


class Logger:
    def on_step(self, run) -> None:
        if run.step % run.cfg.log_every == 0:
            log(run, run.epoch)

    def on_epoch_end(self, run) -> None:
        if run.step > run.last_log[1]:  # the epoch's last steps, before its evaluation
            log(run, run.epoch - 1)

    def on_end(self, run) -> None:
        if run.step > run.last_log[1]:
            log(run, run.epoch)


def log(run, epoch: int) -> None:
    """The train record of the steps since the last log: mean loss (all ranks), speed, memory."""
    now, then = time.perf_counter(), run.last_log
    steps = run.step - then[1]
    summed = run.world.all_sum(run.loss_sum.clone())  # ranks' losses, at log steps only
    loss = summed.item() / max(steps, 1) / run.world.size  # sync: the one read between logs
    run.loss_sum.zero_()
    if not math.isfinite(loss):
        raise Diverged(f"the training loss became {loss} by step {run.step}; the last good "
                       f"checkpoint is kept. Try a lower --lr, --grad-clip, or bf16 instead of "
                       f"fp16")
    dt = max(now - then[0], 1e-9)
    samples = steps * run.cfg.batch_size / dt
    record = {"kind": "train", "step": run.step, "epoch": epoch, "loss": loss,
              "lr": run.sched.get_last_lr()[0], "samples_per_s": samples,
              "step_ms": 1e3 * dt / max(steps, 1), **_device_stats(run, steps / dt),
              **_state_bytes(run)}
    if run.batches.language:
        record["tokens_per_s"] = samples * run.cfg.block_size
    if run.scaler.is_enabled():
        record["loss_scale"] = run.scaler.get_scale()
        record["skipped_steps"] = int(run.skipped.item())
    run.last_log = (time.perf_counter(), run.step)
    run.bar.describe(f"loss {loss:.4f}  {samples:,.0f} samples/s")
    emit(run, record)


def _state_bytes(run) -> dict:
    """Rank 0's parameters, gradients and optimizer state in bytes (sizes only: no sync)."""
    from fasttrain.engine.memory import rank_memory

    held = rank_memory(run.model, run.opt)
    return {"param_bytes": held.params, "grad_bytes": held.grads,
            "optimizer_bytes": held.optimizer}


def _device_stats(run, steps_per_s: float) -> dict:
    from fasttrain.env import gpu_peaks

    if run.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(run.device) / 2**30  # this rank's
        peaks = gpu_peaks(torch.cuda.get_device_name(run.device)) or {}
        key = {"tf32": "tf32", "bf16": "bf16", "fp16": "fp16"}.get(run.cfg.precision, "fp32")
        flops = peaks.get(key) if run.flops_per_step else None
        gpus = run.world.size if run.world.parallel != "dp" else torch.cuda.device_count()
        mfu = run.flops_per_step * steps_per_s / (flops * gpus) if flops else None
        return {"peak_memory_gb": peak, "mfu": mfu}
    import resource

    # CPU: the process's peak resident set (KiB on Linux), the closest honest "peak memory".
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return {"peak_rss_gb": rss, "mfu": None}


class Evaluator:
    def on_epoch_end(self, run) -> None:
        evaluate_record(run)

    def on_end(self, run) -> None:
        if run.step_in_epoch:  # stopped mid-epoch (max_steps, early stop)
            evaluate_record(run)


def evaluate_record(run) -> None:
    record = {"kind": "eval", "step": run.step, "epoch": run.epoch}
    for split in ("val", "test"):
        record.update(evaluate(run, split))
    if len(record) > 3:
        emit(run, record)


@torch.no_grad()
def evaluate(run, split: str = "test") -> dict[str, float]:
    """{split_loss, split_<metric>...} over the whole split (each rank its share, summed), under
    the run's autocast; {} when the data has no such split. One host sync."""
    if not run.batches.has_split(split):
        return {}
    run.model.eval()
    fns = [run.loss_fn, *run.metrics.values()]
    # The last sum counts the samples: a streamed split's length may be unknown.
    sums = torch.zeros(len(fns) + 1, device=run.device, dtype=torch.float64)
    one = torch.ones((), device=run.device, dtype=torch.float64)
    for x, y in run.batches.eval_shard(max(run.cfg.micro_batch, 256), split):
        with run.autocast:
            out = run.forward(x)
        out = out.float()
        # Means of a batch, weighted by its samples: the mean over the split.
        sums += torch.stack([*(torch.as_tensor(f(out, y), device=run.device).double()
                               for f in fns), one]) * len(y)
    run.model.train()
    run.world.all_sum(sums)
    values = (sums[:-1] / sums[-1]).tolist()  # sync: once per evaluation
    out = {f"{split}_loss": values[0]}
    if run.batches.language:
        out[f"{split}_perplexity"] = math.exp(min(values[0], 50.0))
    out.update({f"{split}_{name}": v for name, v in zip(run.metrics, values[1:], strict=True)})
    return out


class EarlyStop:
    """Stop when `metric` (a key of the eval records, e.g. val_loss) has not improved for
    `patience` evaluations: losses must fall, anything else rise."""

    def __init__(self, metric: str, patience: int = 3, mode: str | None = None):
        self.metric, self.patience = metric, patience
        self.sign = {"min": 1, "max": -1}.get(mode or ("min" if "loss" in metric else "max"))
        self.best, self.waited = math.inf, 0

    def on_eval(self, run, record: dict) -> None:
        if self.metric not in record:
            have = ", ".join(k for k in record if "_" in k) or "none"
            raise UserError(f"--early-stop {self.metric}: the evaluations report {have}; give a "
                            f"validation set (--val-fraction, or a 'val' split) or name one of "
                            f"them")
        value = self.sign * record[self.metric]
        if value < self.best:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.stop = (f"early stop: {self.metric} has not improved for {self.patience} "
                        f"evaluations")


class Checkpointer:
    def on_step(self, run) -> None:
        every = run.cfg.checkpoint_every
        if every and run.step % every == 0:
            checkpoint(run)

    def on_end(self, run) -> None:
        checkpoint(run)


def checkpoint(run) -> None:
    from fasttrain.engine.checkpoint import save_run

    path = save_run(run)
    if path is not None:
        notify(run, "on_checkpoint", path)


class Preemption:
    """Acts on the flag the signal handlers (run.signals, signals.py) set. One process: at the
    next step boundary; several: at a log step, where all ranks agree (a collective), so that
    all checkpoint the same step. A signal that came during setup stops before the first step."""

    def on_start(self, run) -> None:
        if run.world.any(run.signals.requested):
            self.stop(run)

    def on_step(self, run) -> None:
        if run.world.size == 1:
            stop = run.signals.requested
        else:
            stop = (run.step % run.cfg.log_every == 0
                    and run.world.any(run.signals.requested))
        if stop:
            self.stop(run)

    @staticmethod
    def stop(run) -> None:
        """Every rank, at the same step boundary: checkpoint (if there is a step to save), stop."""
        if run.step:
            checkpoint(run)
        raise Preempted(run.signals.message(run.step, saved=run.checkpoints is not None),
                        run.signals.exit_code)


class RunFiles:
    """The run directory's records and final files (rank 0; RunDir is inert elsewhere)."""

    def on_log(self, run, record: dict) -> None:
        run.rundir.log(record)

    on_eval = on_log

    def on_end(self, run) -> None:
        from fasttrain.engine.distributed import full_weights

        run.rundir.save_weights(full_weights(run.model, run.world))  # FSDP: a collective
        run.rundir.plot_loss()

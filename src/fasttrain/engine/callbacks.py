"""What happens around the steps of `fit`: each a callback, in this order.

    Logger       reads the loss every --log-every steps and at each epoch's end (the host syncs)
    Evaluator    evaluates the validation and test sets after each epoch, and at a mid-epoch end
    EarlyStop    stops when --early-stop's metric has not improved for --patience evaluations
    Checkpointer saves every --checkpoint-every steps and at the end
    Preemption   on SIGTERM/SIGUSR1 (agreed by all ranks at a log step): checkpoint, then exit 75
    RunFiles     the run directory: each record to metrics.jsonl (and TensorBoard), at the end
                 the final weights and loss.png
    PlainLog     when stderr is no terminal (a log file, nohup, SLURM) and --progress is on: one
                 line per record instead of the progress bar, from values already read

A callback is any object with some of these methods, each called with the Run first:
on_start, on_step, on_epoch_end, on_log(record), on_eval(record), on_checkpoint(path), on_end.
Records reach callbacks through `emit`, the one place a metrics record is made public.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from fasttrain.engine.loop import Diverged, Preempted, notify
from fasttrain.engine.tree import leading_size
from fasttrain.errors import UserError


def standard(run) -> list:
    cfg = run.cfg
    early = [run.early_stop] if run.early_stop is not None else []  # built, maybe restored
    plain = [PlainLog()] if cfg.progress and run.main and not sys.stderr.isatty() else []
    return [Logger(), Evaluator(), *early, Checkpointer(), Preemption(), RunFiles(), *plain]


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
    then = run.last_log
    steps = run.step - then[1]
    # The loss and a user step's extras, summed over ranks in one collective, at log steps only.
    summed = run.world.all_sum(torch.stack([run.loss_sum, *run.extra_sums.values()]))
    loss, *extras = [v / max(steps, 1) / run.world.size
                     for v in summed.tolist()]  # sync: the one read between logs
    # The clock is read after that sync, so the window holds the steps' device time too: read
    # before it, a GPU-bound run would time only how fast the host queued its steps.
    now = time.perf_counter()
    run.loss_sum.zero_()
    for v in run.extra_sums.values():
        v.zero_()
    if not math.isfinite(loss):
        from fasttrain.engine.resume import diverged

        raise Diverged(diverged(run, f"the training loss became {loss} by step {run.step}"))
    dt = max(now - then[0], 1e-9)
    samples = steps * run.cfg.batch_size / dt
    record = {"kind": "train", "step": run.step, "epoch": epoch, "loss": loss,
              "lr": run.sched.get_last_lr()[0], "samples_per_s": samples,
              "step_ms": 1e3 * dt / max(steps, 1), **_device_stats(run, steps / dt),
              **_state_bytes(run)}
    if run.batches.tokens_per_sample:  # token sequences (the bundled text, or yours)
        record["tokens_per_s"] = samples * run.batches.tokens_per_sample
    elif run.batches.sequences:  # padded per batch by your collate_fn: counted (stream.py)
        record["tokens_per_s"] = run.batches.take_tokens() * run.batches.world / dt
    clash = set(run.extra_sums) & set(record)
    if clash:
        raise UserError(f"your step {run.step_name} returns {sorted(clash)}, which the train "
                        f"record already holds; rename it")
    record.update(zip(run.extra_sums, extras, strict=True))
    if run.graph is not None:  # --cuda-graphs, whole step: a replay per step once captured
        record["graph_replays"] = run.graph.take_replays()
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
    the run's autocast; {} when the data has no such split. One host sync. Metrics: the default
    step's accuracy and metrics=, or a user step's extras (run.evaluate_loss, steps.py)."""
    if not run.batches.has_split(split):
        return {}
    run.model.eval()
    # Every rank must all-reduce the same vector: its names are fixed before the first batch
    # (a user step's extras by the training steps' ones), else taken from the first batch.
    names = list(run.metrics if getattr(run.compute_loss, "step", None) is None
                 else run.extra_sums) or None
    sums = None
    for batch in run.batches.eval_shard(max(run.cfg.micro_batch, 256), split):
        loss, metrics = run.evaluate_loss(run.forward, batch)
        names = names or list(metrics)
        if sums is None:  # [loss, metrics..., samples], on the device until the end
            sums = torch.zeros(len(names) + 2, device=run.device, dtype=torch.float64)
        n = leading_size(batch)
        # Means of a batch, weighted by its samples: the mean over the split.
        sums[:-1] += torch.stack([loss.double(), *(metrics[k].double() for k in names)]) * n
        sums[-1] += n
    run.model.train()
    if sums is None:
        sums = torch.zeros(len(names or ()) + 2, device=run.device, dtype=torch.float64)
    run.world.all_sum(sums)
    *values, count = sums.tolist()  # sync: once per evaluation
    if not count:  # every rank's share empty: a mean of nothing is no loss of 0
        raise UserError(f"the {split} data gave no samples to evaluate: a stream's __iter__ "
                        f"must start it afresh on every call (not hand back a generator made "
                        f"once) and hold at least one sample")
    values = [v / max(count, 1) for v in values]
    out = {f"{split}_loss": values[0]}
    if run.perplexity:  # the loss is a token cross-entropy (run.py)
        out[f"{split}_perplexity"] = math.exp(min(values[0], 50.0))
    out.update({f"{split}_{name}": v for name, v in zip(names or (), values[1:], strict=True)})
    return out


# Words of a metric's name that make it one to minimise (val_loss, val_perplexity, val_mae).
FALLING = {"loss", "perplexity", "ppl", "error", "err", "mae", "mse", "rmse", "wer", "cer"}


class EarlyStop:
    """Stop when `metric` (a key of the eval records, e.g. val_loss) has not improved for
    `patience` evaluations: losses, perplexities and errors (FALLING) must fall, anything else
    rise.

    Checkpointed: its best value and the evaluations waited since (`state`), so that a resumed
    run stops where an uninterrupted one does, and a run that stopped early, resumed as it is,
    stays stopped (`restore`). --early-stop's is built with the run (run.early_stop) and
    restored with it; yours, passed to `fit` (with standard=True or False), are kept in the
    checkpoint in their order and restored as `fit` starts (`restore_early_stops`)."""

    def __init__(self, metric: str, patience: int = 3, mode: str | None = None,
                 label: str | None = None):
        self.metric, self.patience = metric, patience
        self.label = label or f"your EarlyStop({metric!r})"  # in messages (--early-stop's)
        falls = bool(FALLING & set(metric.lower().split("_")))
        self.mode = mode or ("min" if falls else "max")
        self.sign = {"min": 1, "max": -1}.get(self.mode)
        self.best, self.waited = math.inf, 0

    def state(self) -> dict:
        """What a checkpoint keeps: the metric, its best value so far, evaluations waited, and
        whether it falls or rises (min/max)."""
        return {"metric": self.metric, "best": self.sign * self.best, "waited": self.waited,
                "mode": self.mode}

    def restore(self, run, saved: dict | None) -> str:
        """Take up a checkpoint's `state()` (none from a run without --early-stop or from an
        older checkpoint: counted afresh, as is another metric). A run that has waited
        --patience evaluations is stopped (run.stop): a larger --patience lets it go on. Says,
        for the `resumed from` line, where the count stands."""
        if not saved or saved["metric"] != self.metric or saved.get("mode",
                                                                     self.mode) != self.mode:
            return f"{self.metric} counted afresh"
        self.best, self.waited = self.sign * saved["best"], saved["waited"]
        if self.waited >= self.patience:
            run.stop = self.reason()
            return f"{self.metric} has not improved for {self.waited} evaluations: stopped"
        return (f"{self.metric} has not improved for {self.waited} of {self.patience} "
                f"evaluations: goes on")

    def reason(self) -> str:
        return f"early stop: {self.metric} has not improved for {self.patience} evaluations"

    def check(self, run) -> None:
        """Refuse, before the first step, a metric the evaluations will never report: found
        at the first evaluation instead, it would cost an epoch of training. A step of yours
        reports the extras of its first step, unknown until then: only the split is checked."""
        split = self.metric.split("_", 1)[0]
        splits = [s for s in ("val", "test") if run.batches.has_split(s)]
        yours = getattr(run.compute_loss, "step", None) is not None  # its extras, not metrics=
        names = ["loss", *(["perplexity"] if run.perplexity else []),
                 *([] if yours else run.metrics)]
        have = [f"{s}_{n}" for s in splits for n in names]
        if split == "val" and "val" not in splits:
            raise UserError(f"{self.label}: this run has no validation set; give one "
                            f"(--val-fraction F, or a 'val' split), or name a metric its "
                            f"evaluations report: {', '.join(have) or 'none'}")
        if split not in splits or not (yours or self.metric in have):
            raise UserError(f"{self.label}: the evaluations report {', '.join(have)}"
                            f"{' and the extras of your step' if yours else ''}; name one of "
                            f"them")

    def on_eval(self, run, record: dict) -> None:
        if self.metric not in record:  # a step of yours: its extras are known by now
            have = ", ".join(k for k in record if "_" in k) or "none"
            raise UserError(f"{self.label}: the evaluations report {have}; name one of them")
        value = self.sign * record[self.metric]
        if value < self.best:
            self.best, self.waited = value, 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.stop = self.reason()


def user_early_stops(run) -> list[EarlyStop]:
    """The EarlyStop callbacks passed to `fit`, in order (not --early-stop's: run.early_stop)."""
    return [c for c in run.callbacks if isinstance(c, EarlyStop) and c is not run.early_stop]


def restore_early_stops(run) -> None:
    """As `fit` starts on a resumed run: your EarlyStop callbacks take up the counts the
    checkpoint kept for them (run.resumed_early_stops), the n-th the n-th, each said in one line
    (rank 0). One the checkpoint has no count for (written by a fit without it, or before they
    were checkpointed) counts afresh, with a warning: it stops later than an uninterrupted run."""
    for early in user_early_stops(run):  # before the first step, resumed or not
        early.check(run)
    saved, run.resumed_early_stops = run.resumed_early_stops, None  # taken up once
    if saved is None:  # not resumed
        return
    for i, early in enumerate(user_early_stops(run)):
        said = early.restore(run, saved[i] if i < len(saved) else None)
        if not run.main:
            continue
        if i < len(saved):
            print(f"resumed your EarlyStop({early.metric!r}): {said}")
        else:
            print(f"warning: the checkpoint resumed holds no count for your EarlyStop("
                  f"{early.metric!r}) (written by a fit without it): counted afresh, so it "
                  f"may stop up to {early.patience} evaluations later than an uninterrupted "
                  f"run would", file=sys.stderr)


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


class PlainLog:
    """Plain lines for logs that are files (no terminal, so no progress bar): the train record
    every --log-every steps and each evaluation, on stderr. Reads only the records (values the
    Logger and Evaluator already synced): adds no sync."""

    def on_log(self, run, record: dict) -> None:
        speed = (f"{record['tokens_per_s']:,.0f} tokens/s" if "tokens_per_s" in record
                 else f"{record['samples_per_s']:,.0f} samples/s")
        eta = (run.total_steps - record["step"]) * record["step_ms"] / 1e3
        extras = "".join(f"  {k} {record[k]:.4g}" for k in run.extra_sums)
        _say(f"step {record['step']}/{run.total_steps}  loss {record['loss']:.4f}{extras}  "
             f"{speed}  ETA {_duration(eta)}")

    def on_eval(self, run, record: dict) -> None:
        values = "  ".join(f"{k} {v:.4g}" for k, v in record.items()
                           if k.startswith(("val_", "test_")))
        _say(f"eval at step {record['step']} (epoch {record['epoch']}): {values}")


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")  # one write: ranks and other writers do not interleave
    sys.stderr.flush()  # a log file is block-buffered: show progress as it happens


def _duration(seconds: float) -> str:
    s = int(max(seconds, 0))
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"

"""Checkpoints that never lose a run: complete or absent, loaded without arbitrary unpickling.

A checkpoint is one `torch.save`d dict of tensors and plain Python values (numbers, strings,
lists, dicts), so `torch.load(weights_only=True)` reads it: a checkpoint file can never execute
code. It is written to a temp file beside its final name, fsynced, then renamed (and the folder
fsynced), so a process killed mid-write leaves at most a stray `.tmp` file that is never resumed
from. Names carry the step (`step-00001200.pt`); the newest `keep` are kept.

Sharded checkpoints (--parallel fsdp, --tp, --pp) are a directory per step, `step-00001200/`:
every rank writes its shards of model and optimizer state through torch.distributed.checkpoint
(DCP) into `.step-00001200.tmp/`, rank 0 adds `extras.pt` (the same plain-data dict as a
single-file checkpoint, minus model and optimizer) and, after all ranks are done, renames the
folder into place: a directory named `step-*` is complete. DCP reshards on load, so a sharded
checkpoint resumes under another layout (tested: tp=2 → fsdp=2 → one process) and in any mode
but zero1. Single-file checkpoints (none, ddp, zero1, dp) hold whole, unsharded state, written
by rank 0, so they resume on any number of processes, but not into a sharded layout.
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fasttrain.errors import UserError, first_line
from fasttrain.files import write_atomic

FORMAT = "fasttrain.checkpoint/1"
_NAME = re.compile(r"^step-(\d{8,})(\.pt)?$")
EXTRAS = "extras.pt"  # in a sharded checkpoint: everything but the DCP tensors


# -- a Run's state -------------------------------------------------------------------------------


def state(run) -> dict[str, Any]:
    """Everything of `run` but the model and optimizer tensors, as plain data; every rank calls
    it (the per-rank parts are gathered: dropout streams, the loss summed since the last log)."""
    ranks = run.world.gather({"rng": rng_state(), "loss_sum": run.loss_sum.detach().cpu(),
                              "extra_sums": {k: v.cpu() for k, v in run.extra_sums.items()}})
    out = {
        "format": FORMAT,
        "metrics_records": run.rundir.records,  # metrics.jsonl lines seen (rank 0's count)
        "config": run.cfg.to_dict(),
        "scheduler": run.sched.state_dict(),
        "scaler": run.scaler.state_dict(),
        "epoch": run.epoch, "step": run.step, "step_in_epoch": run.step_in_epoch,
        "loss_sum": ranks[0]["loss_sum"], "skipped": run.skipped.cpu(),
        "last_log_step": run.last_log[1],
        "rng": ranks[0]["rng"], "world_size": run.world.size,
        "data": run.batches.state(run.step_in_epoch),  # where the data resumes (stream.py)
    }
    if run.early_stop is not None:  # best value, evaluations waited (callbacks.EarlyStop)
        out["early_stop"] = run.early_stop.state()
    from fasttrain.engine.callbacks import user_early_stops

    yours = user_early_stops(run)
    if yours:  # EarlyStop callbacks passed to fit, in order: restored as fit starts
        out["callback_early_stops"] = [e.state() for e in yours]
    if run.world.size > 1:
        out["ranks"] = ranks
    return out


def save_run(run) -> Path | None:
    """Checkpoint `run` at its step. Every rank calls this at the same step; rank 0 writes
    (FSDP: every rank its shard). A run whose loss or weights are no longer finite is never
    saved: it raises Diverged (resume.diverged says what was kept)."""
    from fasttrain.engine import distributed
    from fasttrain.engine.loop import Diverged
    from fasttrain.engine.resume import diverged

    if run.checkpoints is None:
        return None
    world = run.world
    # sync: never save a run that has already diverged (summed, so all ranks agree): by its
    # loss since the last log, or by its weights (a step whose loss was finite may have made
    # them inf or NaN: its gradients were), which would make the "last good" checkpoint bad.
    bad = torch.zeros((), device=run.device)
    for p in run.model.parameters():
        p = p.detach()
        bad += (p.to_local() if hasattr(p, "to_local") else p).isfinite().logical_not().sum()
    pending, bad = world.all_sum(torch.stack([run.loss_sum.detach().float(), bad])).tolist()
    if not math.isfinite(pending):
        raise Diverged(diverged(run, f"the training loss became {pending} before step "
                                     f"{run.step}"))
    if bad:
        raise Diverged(diverged(run, f"the weights became inf or NaN by step {run.step} "
                                     f"({int(bad)} values: the gradients were)"))
    extras, keep = state(run), run.cfg.keep_checkpoints
    if world.sharded:  # FSDP, tensor or pipeline parallel: DTensor shards, through DCP
        return save_sharded(run.checkpoints, run.step,
                            distributed.sharded_state(run.model, run.opt), extras, keep,
                            world.main, world.barrier)
    optimizer = distributed.optimizer_state(run.opt, world)  # ZeRO-1: a collective
    path = None
    if world.main:
        extras.update(model=run.model.state_dict(), optimizer=optimizer)
        path = save(run.checkpoints, run.step, extras, keep)
    world.barrier()  # nobody leaves (or exits on preemption) before the file is in place
    return path or run.checkpoints / f"step-{run.step:08d}.pt"


def resume(run) -> None:
    """Restore `run` from --resume (a path, or 'auto': the newest complete checkpoint). The one
    place a run's saved state comes back."""
    cfg = run.cfg
    if not cfg.resume:
        return
    if cfg.resume == "auto":
        found = latest(run.checkpoints, map_location=run.device)
        if found is None and run.checkpoints is not None and (
                complete(run.checkpoints) or (run.checkpoints.parent
                                              / "weights.safetensors").exists()):
            raise UserError(f"--resume auto: {run.checkpoints.parent} holds a run but no "
                            f"readable checkpoint; starting over would replace its metrics and "
                            f"weights: choose a new --out, or --resume PATH")
        if found is None:  # nothing saved yet: a fresh start is the right resume,
            run.rundir.truncate_metrics(0, 0)  # without the records of the start it repeats
            if run.world.main:
                from fasttrain.engine.resume import diverged_before

                diverged_before(run)  # it diverged before its first checkpoint last time
            return
        path, saved = found
    else:
        path, saved = cfg.resume, load(cfg.resume, map_location=run.device)
    changed = restore(run, saved, path)
    run.rundir.truncate_metrics(saved.get("metrics_records"), run.step)
    if run.world.main:
        print(f"resumed from {path} (epoch {run.epoch}, step {run.step})"
              + (f"; changed: {', '.join(changed)}" if changed else ""))
        from fasttrain.engine.resume import diverged_before

        diverged_before(run)  # it diverged after this step last time, with these settings


def restore(run, saved: dict[str, Any], path: str | Path = "checkpoint") -> list[str]:
    """Put `saved` (as `state` made it, with model and optimizer) back into `run`; the settings
    the user changed since (resume.MAY_CHANGE) are applied, and returned as 'name old → new'
    (a changed --early-stop/--patience with where early stopping stands)."""
    from fasttrain.engine import distributed, optim, resume

    cfg, world = run.cfg, run.world
    config = saved["config"]
    changed = resume.check_config(config, cfg, path)  # refuses what would make another run
    # A sharded checkpoint is read by DCP into whatever this run holds, shards or whole tensors
    # (it reshards: tp=2 → fsdp=2 → one process), except ZeRO-1's partitioned optimizer; a
    # single file holds whole tensors, which a sharded run does not take as they are.
    sharded, written = bool(saved.get("sharded")), config.get("parallel", "none")
    if sharded and world.parallel == "zero1":  # its optimizer state is partitioned by hand
        raise UserError(f"checkpoint {path} is sharded (written with --parallel {written}) and "
                        f"--parallel zero1 reads only single-file ones; resume with --parallel "
                        f"fsdp, ddp or none")
    if not sharded and world.sharded:
        raise UserError(f"checkpoint {path} is a single file (written with --parallel "
                        f"{written}) and this layout (--parallel {world.parallel}, --tp "
                        f"{world.tp}, --pp {world.pp}) reads only sharded ones; resume with "
                        f"--parallel {written} and no --tp/--pp")
    try:
        if sharded:  # each rank reads its shards (DCP), then they are set in place
            tensors = distributed.sharded_state(run.model, run.opt)
            load_sharded(Path(path), tensors)
            distributed.load_sharded_state(run.model, run.opt, tensors)
        else:
            run.model.load_state_dict(saved["model"])  # copies into the parameters
            optim.load_state(run.opt, saved["optimizer"])  # into the state tensors held
        run.sched.load_state_dict(optim.merge_schedule(saved["scheduler"], run.opt))
        run.scaler.load_state_dict(saved["scaler"])
    except (RuntimeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise UserError(f"checkpoint {path} does not fit this model/optimizer "
                        f"({first_line(e)}); resume with the "
                        f"same settings") from None
    optim.check_length(run.sched, run, run.sched_name, restored=True)
    if optim.owns_lr(cfg):  # a user's optimizer or scheduler sets its own
        resume.apply_lr(run.opt, run.sched, cfg.lr)  # a changed --lr is honoured
    run.epoch, run.step = saved["epoch"], saved["step"]
    run.step_in_epoch = saved["step_in_epoch"]
    data = saved.get("data")  # absent from checkpoints older than the streamed path
    now = run.batches.state(run.step_in_epoch)
    if data and data.get("resume") != now["resume"]:
        raise UserError(f"checkpoint {path} was written reading the data by "
                        f"{data.get('resume')} ({data.get('path')}); this run reads it "
                        f"another way, so the position would not match: resume with the same "
                        f"data and --data-in-memory setting")
    readers = now.get("readers")
    if data and data.get("readers") not in (None, readers) and run.step_in_epoch and run.main:
        print(f"warning: checkpoint {path} was written reading the stream with "
              f"{data['readers']} readers (processes × --workers), this run has {readers}: the "
              f"items of the interrupted pass are dealt anew, so the rest of it trains on "
              f"other items than the uninterrupted run would (some twice, some not at all); "
              f"resume with the same processes and --workers for the same batches",
              file=sys.stderr)
    ranks = saved.get("ranks") or [{"rng": saved["rng"], "loss_sum": saved["loss_sum"]}]
    if len(ranks) == world.size:
        mine = ranks[world.rank]
    else:  # another number of processes: the same logged mean, fresh-looking streams
        mean = sum(r["loss_sum"] for r in ranks) / len(ranks)
        mine = {"rng": ranks[0]["rng"], "loss_sum": mean,
                "extra_sums": {k: sum(r.get("extra_sums", {})[k] for r in ranks) / len(ranks)
                               for k in ranks[0].get("extra_sums", {})}}
    run.loss_sum.copy_(mine["loss_sum"])
    run.extra_sums = {k: v.to(run.device) for k, v in mine.get("extra_sums", {}).items()}
    run.last_log = (run.last_log[0], saved["last_log_step"])
    if run.early_stop is not None:  # absent from older checkpoints: counted afresh
        said = run.early_stop.restore(run, saved.get("early_stop"))
        at = [i for i, c in enumerate(changed) if c.startswith(("early_stop ", "patience "))]
        if at:  # what the changed --early-stop/--patience make of it
            changed[at[-1]] += f" ({said})"
    # Your EarlyStop callbacks are fit's, not yet known: fit restores them (restore_early_stops).
    run.resumed_early_stops = saved.get("callback_early_stops", [])
    run.skipped.copy_(saved["skipped"])
    try:
        set_rng_state(mine["rng"])
    except (RuntimeError, ValueError, KeyError, TypeError) as e:
        raise UserError(f"checkpoint {path} has a damaged random state ({e}); resume from "
                        f"another checkpoint") from None
    return changed


# -- files ---------------------------------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Every random state a training run draws from: torch CPU and CUDA, NumPy, Python."""
    np_state = np.random.get_state()
    py_version, py_internal, py_gauss = random.getstate()
    return {
        "torch_cpu": torch.get_rng_state(),
        "torch_cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": {"kind": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
        "python": {"version": py_version, "internal": list(py_internal), "gauss": py_gauss},
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()`'s states. Its tensors may have been loaded onto the run's device
    (`map_location`); every setter takes a CPU tensor."""
    torch.set_rng_state(state["torch_cpu"].cpu())
    if state["torch_cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["torch_cuda"]])
    n = state["numpy"]
    np.random.set_state((n["kind"], n["keys"].cpu().numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    p = state["python"]
    random.setstate((p["version"], tuple(p["internal"]), p["gauss"]))


def save(directory: Path, step: int, state: dict[str, Any], keep: int) -> Path:
    """Write `state` atomically as `directory/step-<step>.pt`; prune to the newest `keep`."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / f"step-{step:08d}.pt"
    write_atomic(final, lambda f: torch.save(state, f))
    _fsync_dir(directory)
    prune(directory, keep)
    return final


def prune(directory: Path, keep: int) -> None:
    """Delete all but the newest `keep` complete checkpoints (files or sharded folders)."""
    for _, old in complete(directory)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def save_sharded(directory: Path, step: int, tensors: dict[str, Any], extras: dict[str, Any],
                 keep: int, main: bool, barrier: Callable[[], None]) -> Path:
    """Every rank: write this rank's shards of `tensors` (DCP); rank 0: `extras`, then commit by
    renaming the temp folder. All ranks return after the commit."""
    import torch.distributed.checkpoint as dcp

    final = directory / f"step-{step:08d}"
    tmp = directory / f".{final.name}.tmp"
    if main:
        directory.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)  # left by a run killed mid-write
        tmp.mkdir()
    barrier()  # the folder exists before anyone writes into it
    # Each rank writes (and fsyncs) its own file; the coordinator writes .metadata after
    # gathering every rank's result, so on return all shards are on disk.
    dcp.save(tensors, checkpoint_id=tmp)
    if main:
        with open(tmp / EXTRAS, "wb") as f:
            torch.save(extras, f)
            f.flush()
            os.fsync(f.fileno())
        _fsync_dir(tmp)
        if final.exists():  # the same step saved twice (a periodic and the final checkpoint)
            # Folders cannot be renamed over: a crash between these renames loses this step's
            # folder (resume falls back to the one before), never a half-written one.
            old = directory / f".{final.name}.old"
            shutil.rmtree(old, ignore_errors=True)
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        _fsync_dir(directory)
        prune(directory, keep)
    barrier()  # nobody leaves (or exits on preemption) before the commit
    return final


def load_sharded(path: Path, tensors: dict[str, Any]) -> None:
    """Fill `tensors` (this rank's shards, as `sharded_state` makes them) from `path`, in place."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        dcp.load(tensors, checkpoint_id=path)
    # Missing or damaged shard files, a different model. DCP wraps a rank's failure in a
    # CheckpointException, which derives from BaseException, not Exception.
    except (Exception, CheckpointException) as e:
        raise UserError(f"sharded checkpoint {path} cannot be loaded here ({first_line(e)}); "
                        f"resume with the same settings or from another checkpoint") from None


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable (POSIX: the directory entry lives in the folder)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def complete(directory: Path | None) -> list[tuple[int, Path]]:
    """(step, path) of every finished checkpoint in `directory`, oldest first: `step-N.pt` files
    and `step-N/` folders (sharded). Temp files and folders of interrupted writes start with '.'
    and never match."""
    if directory is None or not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _NAME.match(p.name)) and (p.is_dir() != bool(m.group(2)))]
    return sorted(found)


def load(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Read a checkpoint (tensors and plain values only); a bad file is a one-line UserError.
    For a sharded checkpoint (a folder) this is its extras, marked `"sharded": True`: the
    tensors are read later, by `load_sharded`, into the sharded model."""
    from fasttrain.engine.resume import validate_state

    p = Path(path)
    sharded = p.is_dir()
    state = _load_file(p / EXTRAS if sharded else p, map_location)
    state["sharded"] = sharded
    validate_state(state, p)  # issue 13: every field the restore reads, with its type
    return state


def _load_file(p: Path, map_location) -> dict[str, Any]:
    if not p.is_file():
        raise UserError(f"checkpoint {p}: no such file; give an existing path or --resume auto")
    try:
        state = torch.load(p, map_location=map_location, weights_only=True)
    except Exception as e:  # truncated zip, garbage, or a pickle that is not plain data
        raise UserError(f"checkpoint {p} is unreadable or not a fasttrain checkpoint "
                        f"({first_line(e)}); "
                        f"delete it or resume from another") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise UserError(f"checkpoint {p} is not a fasttrain checkpoint (format "
                        f"{state.get('format') if isinstance(state, dict) else None!r}); "
                        f"resume from a file written by fasttrain train")
    return state


def latest(directory: Path, map_location: str | torch.device = "cpu"):
    """The newest checkpoint in `directory` that loads, as (path, state), or None. A complete
    but unreadable file (a damaged disk, a copy cut short) is skipped with a warning."""
    for _, path in reversed(complete(directory)):
        try:
            return path, load(path, map_location)
        except UserError as e:
            print(f"warning: skipping {e}", file=sys.stderr)
    return None


"""Resuming honours the user: what may change on resume is applied, the rest is refused.

A checkpoint fixes what makes a run *that* run (model, data, batch, optimizer and its
hyper-parameters, schedule shape, seed): resuming with another value is refused with one line.
What a user legitimately changes when continuing — the learning rate (the advice after a
divergence is "try a lower --lr"), the schedule's length (--epochs / --max-steps, to extend a
run), log and checkpoint cadence, --grad-clip, how many checkpoints to keep, early stopping's
--early-stop and --patience — is applied to the restored optimizer, scheduler and early stop,
recorded in config.toml and reported in one line. Early stopping's count is restored with the
run (callbacks.EarlyStop): a run that stopped early stays stopped unless --patience is raised
(or --early-stop names another metric, counted afresh). So are the counts of EarlyStop callbacks
passed to `fit` (`callback_early_stops`, restored as fit starts: callbacks.restore_early_stops).

`validate_state` checks a loaded checkpoint's fields and their types, so that a crafted or
damaged file with the right format tag is one clear error, not a KeyError deep in the restore.

A run that diverged (exit 3) says what was kept and what to try (`diverged`), and records it in
OUT/diverged.json: resumed from before that step with the same --lr, --grad-clip and
--precision, it would diverge again (a resume replays the run bit for bit), so the resume says
so (`diverged_before`) instead of looping through the same divergence without a hint.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

from fasttrain.errors import UserError

MUST_MATCH = ("model", "data", "block_size", "batch_size", "accum_steps", "optimizer",
              "momentum", "weight_decay", "schedule", "warmup_steps", "seed", "loss",
              "val_fraction", "augment", "step", "scheduler", "decay_norm_and_bias")
MAY_CHANGE = ("lr", "epochs", "max_steps", "log_every", "checkpoint_every", "grad_clip",
              "keep_checkpoints", "early_stop", "patience")
# Not taken from the run (a run may resume on another machine) but said when they differ from
# it: they change the numbers it computes (`--resume auto --epochs 40` after a bf16 run is fp32).
SAID = ("precision",)


def check_config(saved: dict[str, Any], cfg, path) -> list[str]:
    """Refuse a resume that would be another run; the changed settings as 'name old → new'."""
    for key in MUST_MATCH:
        if saved.get(key) != getattr(cfg, key):
            raise UserError(f"checkpoint {path} was written with {key}={saved.get(key)!r}, this "
                            f"run has {getattr(cfg, key)!r}; use the same value to resume, or "
                            f"start a new --out")
    from fasttrain.engine.optim import owns_lr

    if "lr" in saved and saved["lr"] != cfg.lr and not owns_lr(cfg):
        raise UserError(f"--lr {cfg.lr}: your --optimizer/--scheduler sets the learning rate "
                        f"(the checkpoint's was run with --lr {saved['lr']}), so a new --lr "
                        f"would not apply; resume with --lr {saved['lr']}")
    return [f"{k} {saved.get(k)!r} → {getattr(cfg, k)!r}" for k in MAY_CHANGE
            if k in saved and saved[k] != getattr(cfg, k)] + [
        f"{k} {saved[k]!r} → {getattr(cfg, k)!r} (a speed switch: the flags' own, not the "
        f"run's; --{k.replace('_', '-')} {saved[k]} keeps it)" for k in SAID
        if k in saved and saved[k] != getattr(cfg, k)]


def apply_lr(opt: torch.optim.Optimizer, sched: torch.optim.lr_scheduler.LambdaLR,
             lr: float) -> None:
    """Make `lr` the peak learning rate of a restored optimizer and LambdaLR schedule.

    Both restore the checkpoint's lr (the scheduler's base_lrs, the groups' initial_lr and lr);
    set them from `lr` and recompute the current lr exactly as LambdaLR does
    (base_lr × factor(step)), so an unchanged lr gives bit-identical values."""
    sched.base_lrs = [lr for _ in opt.param_groups]
    for group, factor in zip(opt.param_groups, sched.lr_lambdas, strict=True):
        group["initial_lr"] = lr
        group["lr"] = lr * factor(sched.last_epoch)
    sched._last_lr = [g["lr"] for g in opt.param_groups]


_INT = (int,)
# field → accepted types; "model"/"optimizer" are absent from sharded checkpoints (DCP holds them).
FIELDS: dict[str, tuple[type, ...]] = {
    "config": (dict,), "scheduler": (dict,), "scaler": (dict,), "epoch": _INT, "step": _INT,
    "step_in_epoch": _INT, "loss_sum": (torch.Tensor,), "skipped": (torch.Tensor,),
    "last_log_step": _INT, "rng": (dict,), "world_size": _INT,
}
TENSORS = {"model": (dict,), "optimizer": (dict,)}
# Fields that older checkpoints lack (or a run without --early-stop): checked when present.
OPTIONAL = {"early_stop": (dict,), "callback_early_stops": (list,)}
EARLY_STOP = {"metric": (str,), "best": (float, int), "waited": _INT}
RNG = {"torch_cpu": (torch.Tensor,), "torch_cuda": (list,), "numpy": (dict,), "python": (dict,)}


def validate_state(state: dict[str, Any], path) -> None:
    """Every field the restore reads is present with the right type (and the counters are
    non-negative); else one UserError naming the first bad field."""
    wanted = dict(FIELDS) if state.get("sharded") else {**FIELDS, **TENSORS}
    wanted.update({k: v for k, v in OPTIONAL.items() if k in state})
    early = state.get("early_stop")
    yours = state.get("callback_early_stops") or []
    for where, fields, obj in (("", wanted, state), ("rng.", RNG, state.get("rng")),
                               *((("early_stop.", EARLY_STOP, early),) if early else ()),
                               *((f"callback_early_stops[{i}].", EARLY_STOP, e)
                                 for i, e in enumerate(yours))):
        for key, types in fields.items():
            v = obj.get(key) if isinstance(obj, dict) else None
            if not isinstance(v, types) or isinstance(v, bool):
                raise UserError(f"checkpoint {path} is damaged or was not written by fasttrain "
                                f"train: field {where}{key} is "
                                f"{'missing' if v is None else type(v).__name__}; resume from "
                                f"another checkpoint or start a new --out")
    counts = {k: state[k] for k in ("epoch", "step", "step_in_epoch", "last_log_step",
                                    "world_size")}
    if early:
        counts["early_stop.waited"] = early["waited"]
    counts.update({f"callback_early_stops[{i}].waited": e["waited"] for i, e in enumerate(yours)})
    for key, value in counts.items():
        if value < 0 or (key == "world_size" and value < 1):
            raise UserError(f"checkpoint {path} is damaged: {key} = {value}; resume from "
                            f"another checkpoint or start a new --out")
    if not isinstance(state["config"].get("seed"), int):
        raise UserError(f"checkpoint {path} is damaged: its config has no seed; resume from "
                        f"another checkpoint or start a new --out")


# What tames a divergence: a resume that changes none of these diverges again.
TAMING = ("lr", "grad_clip", "precision")
DIVERGED = "diverged.json"


def diverged(run, what: str) -> str:
    """The one line of a run that diverged (`what`: 'the training loss became nan by step 8'):
    what was kept and what to try. Recorded for the next resume (rank 0; OUT/diverged.json)."""
    from fasttrain.engine.checkpoint import complete

    cfg = run.cfg
    saved = complete(run.checkpoints)
    kept = (f"the last good checkpoint, step {saved[-1][0]}, is kept: resume it with "
            f"--resume auto and" if saved else
            "nothing was saved (no --out was given): run again with" if run.checkpoints is None
            else "no checkpoint had been saved yet: run again with")
    fp16 = ", or bf16 instead of fp16" if cfg.precision == "fp16" else ""
    run.rundir.write_json(DIVERGED, {"what": what, "step": run.step,
                                     "from_step": saved[-1][0] if saved else 0,
                                     **{k: getattr(cfg, k) for k in TAMING}})
    return f"{what}; {kept} {_taming(cfg)}{fp16}"


def _taming(cfg) -> str:
    from fasttrain.engine.optim import owns_lr

    return (f"a lower --lr (this run's: {cfg.lr:g})" if owns_lr(cfg)
            else "a lower learning rate in your --optimizer/--scheduler") + " or --grad-clip"


def diverged_before(run) -> None:
    """On resume (rank 0): warn when this run diverged after this step last time, with the
    settings it has now."""
    path = Path(run.cfg.out) / DIVERGED if run.cfg.out else None
    try:
        last = json.loads(path.read_text()) if path and path.is_file() else None
    except (OSError, ValueError):
        return  # a damaged note is no reason to stop a resume
    if (not isinstance(last, dict) or not isinstance(last.get("step"), int)
            or run.step >= last["step"]
            or any(last.get(k) != getattr(run.cfg, k) for k in TAMING)):
        return
    settings = ", ".join(f"--{k.replace('_', '-')} {getattr(run.cfg, k)}"
                         if getattr(run.cfg, k) else f"no --{k.replace('_', '-')}"
                         for k in TAMING)
    print(f"warning: this run diverged after this step last time, with the same settings "
          f"({settings}): {last.get('what')}; a resume replays it, so it will again: resume "
          f"with {_taming(run.cfg)}", file=sys.stderr)

"""What the lab's commands share: the TrainConfig and data of a command's flags, and flag checks."""

from __future__ import annotations

import argparse
import dataclasses
import math

from fasttrain.errors import UserError


def refuse_run_directory(cfg, command: str) -> None:
    """A lab command measures and writes --json; an --out or --resume (from the flags or a
    --config) is one line."""
    if cfg.out or cfg.resume:
        raise UserError(f"fasttrain {command} writes no run directory: drop --out/--resume "
                        f"(results go to --json PATH)")


def refuse_layouts(cfg, command: str) -> None:
    """A lab command measures one process; layouts are predicted by `memory --gpus` and `plan
    --gpus`. Checked before the config is validated, which would ask for torchrun."""
    if getattr(cfg, "parallel", "none") != "none":
        raise UserError(f"fasttrain {command} measures one process: drop --parallel")
    if cfg.tp > 1 or cfg.pp > 1:
        raise UserError(f"fasttrain {command} models one process a GPU: drop --tp/--pp "
                        f"(`fasttrain memory --gpus W --tp N --pp M` predicts a tensor and "
                        f"pipeline layout's memory per rank)")


def lab_config(args: argparse.Namespace, command: str):
    """The TrainConfig of a lab command, with its data loaded once: (cfg, task).

    Without --data, the dataset is the real one when it is on disk (mnist, tinyshakespeare for
    gpt) and its synthetic stand-in otherwise — never a download; outputs say which."""
    from fasttrain.data.tasks import load_task
    from fasttrain.engine.configfile import from_args, load_toml
    from fasttrain.engine.inputs import resolve_data
    from fasttrain.models import MODEL_KINDS

    cfg = from_args(args)
    refuse_run_directory(cfg, command)
    refuse_layouts(cfg, command)
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


def positive_ints(flag: str, spec: str, example: str) -> tuple[int, ...]:
    """A comma-separated list of positive integers (`flag` SPEC), sorted, each once."""
    try:
        values = tuple(int(s) for s in spec.split(",") if s.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise UserError(f"{flag} {spec!r}: give positive integers separated by commas, e.g. "
                        f"{example}")
    return tuple(sorted(set(values)))

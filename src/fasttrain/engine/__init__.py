"""The training engine: `build(config, model, data) -> Run`, then `fit(run)`.

    from fasttrain.engine import TrainConfig, build, fit
    fit(build(TrainConfig(model="gpt", data="tinyshakespeare", precision="bf16")))

config.py (the switches; configfile.py reads flags and TOML) → run.py (`build`: resolved once, in
wrap order) → loop.py (step, fit) with callbacks.py (logging, evaluation, checkpoints, preemption,
early stopping, run files); checkpoint.py holds the checkpoint format, distributed.py the
scale-out. Names are imported on first use, so that `fasttrain --help` does not import torch.
"""

from __future__ import annotations

import importlib

_WHERE = {
    "TrainConfig": "config", "build": "run", "Run": "run", "fit": "loop", "step": "loop",
    "Preempted": "loop", "Diverged": "loop", "EXIT_DIVERGED": "loop",
    "EXIT_PREEMPTED": "signals", "EXIT_INTERRUPTED": "signals", "StopSignals": "signals",
    "EarlyStop": "callbacks", "load": "output",
}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'fasttrain.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"fasttrain.engine.{_WHERE[name]}"), name)


def train(cfg, **kw) -> dict:
    """Train with `cfg` (and build's keyword arguments); returns the last metrics record."""
    from fasttrain.engine.loop import fit
    from fasttrain.engine.run import build

    return fit(build(cfg, **kw))


__all__ = [*_WHERE, "train"]

"""A run directory: the resolved config, metrics (JSON lines, TensorBoard), loss plot, weights.

    OUT/config.toml          the resolved TrainConfig
    OUT/metrics.jsonl        one JSON object per log step ("train") and per epoch ("eval")
    OUT/tensorboard/         the same scalars as TensorBoard events (if tensorboard is installed)
    OUT/loss.png             training and test loss against steps
    OUT/weights.safetensors  the final weights (no pickle)
    OUT/model.json           what `fasttrain.load(OUT)` needs to rebuild the model
    OUT/diverged.json        where a run that diverged stopped, for its next resume (resume.py)
    OUT/checkpoints/         see checkpoint.py
    OUT/.lock                held (flock) while a process writes the run; see rundir.py
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path

import torch

from fasttrain.errors import UserError, first_line
from fasttrain.files import write_atomic, write_png


class RunDir:
    """`resume`: the run continues one already in `path` (else `path` must hold no run)."""

    def __init__(self, path: str | os.PathLike | None, resume: bool = False):
        from fasttrain.engine import rundir

        self.path = Path(path) if path else None
        self.tb = None
        self.claim = None
        self.records = 0  # complete lines in metrics.jsonl: a checkpoint stores the count
        if self.path is None:
            return
        self.claim = rundir.claim(self.path, resume)  # type checks, reuse, lock, clean-up
        self.records = self.claim.metrics_records
        try:
            with tempfile.TemporaryFile(dir=self.path):  # fail now, not after an hour
                pass
        except OSError as e:
            self.close()
            raise UserError(f"--out {self.path}: cannot write there ({e.strerror or e}); "
                            f"choose another folder") from None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # optional: metrics.jsonl holds the same numbers
            SummaryWriter = None
        if SummaryWriter is not None:
            self.tb = SummaryWriter(str(self.path / "tensorboard"))

    @property
    def checkpoints(self) -> Path | None:
        return self.path / "checkpoints" if self.path else None

    def write_text(self, name: str, text: str) -> None:
        if self.path:
            write_atomic(self.path / name, text.encode())

    def write_json(self, name: str, value) -> None:
        if self.path:
            write_atomic(self.path / name, json.dumps(value).encode())

    def log(self, record: dict) -> None:
        if self.path is None:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                 for k, v in record.items()}
        try:
            with open(self.path / "metrics.jsonl", "a") as f:
                f.write(json.dumps(clean) + "\n")
        except OSError as e:  # a torn line this leaves is cut off on resume (metrics_log)
            from fasttrain.files import write_error

            raise write_error(self.path / "metrics.jsonl", e) from None
        self.records += 1
        if self.tb is not None:
            prefix = record.get("kind", "train")
            for k, v in record.items():
                if isinstance(v, int | float) and not isinstance(v, bool) and k != "step":
                    self.tb.add_scalar(f"{prefix}/{k}", v, record.get("step", 0))
            self.tb.flush()

    def save_weights(self, state_dict: dict[str, torch.Tensor]) -> None:
        if self.path is None:
            return
        from safetensors.torch import save

        tensors = {k: v.detach().cpu().contiguous() for k, v in state_dict.items()}
        write_atomic(self.path / "weights.safetensors", save(tensors))

    def plot_loss(self) -> None:
        if self.path is None or not (self.path / "metrics.jsonl").exists():
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        records = [json.loads(line) for line in (self.path / "metrics.jsonl").open()]
        train = [(r["step"], r["loss"]) for r in records if r["kind"] == "train" and r["loss"]]
        fig, ax = plt.subplots(figsize=(7, 4))
        if train:
            ax.plot(*zip(*train, strict=True), label="train loss (mean since last log)")
        for split in ("val", "test"):
            points = [(r["step"], r[f"{split}_loss"]) for r in records
                      if r["kind"] == "eval" and r.get(f"{split}_loss") is not None]
            if points:
                ax.plot(*zip(*points, strict=True), "o-", label=f"{split} loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("loss")
        ax.legend()
        ax.grid(alpha=0.3)
        write_png(self.path / "loss.png", fig)

    def truncate_metrics(self, records: int | None, step: int) -> None:
        """On resume: keep the metrics the checkpoint had seen (see metrics_log.truncate)."""
        if self.path is not None:
            from fasttrain.engine import metrics_log

            self.records = metrics_log.truncate(self.path / "metrics.jsonl", records, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.claim is not None:
            self.claim.release()


def load(run_dir: str | os.PathLike, model: torch.nn.Module | None = None) -> torch.nn.Module:
    """The trained module of a finished run: `model` (or the one the run names — a bundled
    model or a factory import path — rebuilt) with the run's final weights, in eval mode."""
    from safetensors.torch import load_file

    from fasttrain.engine.inputs import resolve_model

    path = Path(run_dir)
    weights, about = path / "weights.safetensors", path / "model.json"
    if not weights.is_file():
        raise UserError(f"{path}: no weights.safetensors; give the --out folder of a finished "
                        f"run")
    if model is None:
        if not about.is_file():
            raise UserError(f"{path}: no model.json; pass the module: load(run_dir, model=...)")
        info = json.loads(about.read_text())
        if info["model"].startswith("python:"):
            raise UserError(f"{path} trained a module passed from Python ({info['model']}); "
                            f"pass a fresh one: fasttrain.load(run_dir, model=...)")
        shapes = _Shapes(tuple(info["in_shape"]), info["num_classes"])
        model, _ = resolve_model(info["model"], shapes)
    try:
        model.load_state_dict(load_file(weights))
    except RuntimeError as e:
        raise UserError(f"{weights} does not fit {type(model).__name__} "
                        f"({first_line(e)}); pass the model the run trained") from None
    return model.eval()


class _Shapes:
    def __init__(self, in_shape: tuple[int, ...], num_classes: int):
        self.in_shape, self.num_classes = in_shape, num_classes

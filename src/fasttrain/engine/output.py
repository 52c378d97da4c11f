"""A run directory: the resolved config, metrics (JSON lines, TensorBoard), loss plot, weights.

    OUT/config.toml          the resolved TrainConfig
    OUT/metrics.jsonl        one JSON object per log step ("train") and per epoch ("eval")
    OUT/tensorboard/         the same scalars as TensorBoard events (if tensorboard is installed)
    OUT/loss.png             training and test loss against steps
    OUT/weights.safetensors  the final weights (no pickle)
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

from fasttrain.errors import UserError
from fasttrain.files import write_atomic


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
        test = [(r["step"], r["test_loss"]) for r in records if r["kind"] == "eval"]
        fig, ax = plt.subplots(figsize=(7, 4))
        if train:
            ax.plot(*zip(*train, strict=True), label="train loss (mean since last log)")
        if test:
            ax.plot(*zip(*test, strict=True), "o-", label="test loss")
        ax.set_xlabel("optimizer step")
        ax.set_ylabel("cross-entropy")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        from io import BytesIO

        buf = BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        write_atomic(self.path / "loss.png", buf.getvalue())

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

"""The training engine: any model of `fasttrain.models`, every GPU-training technique as a switch.

    from fasttrain.engine import TrainConfig, Trainer
    Trainer(TrainConfig(model="gpt", data="tinyshakespeare", precision="bf16")).fit()
"""

from fasttrain.engine.config import TrainConfig
from fasttrain.engine.signals import EXIT_PREEMPTED
from fasttrain.engine.trainer import EXIT_DIVERGED, Diverged, Preempted, Trainer


def train(cfg: TrainConfig) -> dict:
    """Train with `cfg`; returns the last metrics record."""
    return Trainer(cfg).fit()


__all__ = ["TrainConfig", "Trainer", "train", "Preempted", "Diverged", "EXIT_PREEMPTED",
           "EXIT_DIVERGED"]

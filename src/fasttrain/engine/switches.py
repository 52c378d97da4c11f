"""Single switches resolved once into what the step uses, so that the hot loop has no `if` for them.

    seed_everything(cfg.seed); deterministic(cfg)    --seed, --deterministic
    restore = process_flags()                        what the run ends by putting back
    autocast, scaler = precision(cfg, dev, sharded)  --precision (and TF32), --cuda-graphs' device
    on_device = data_on_device(cfg, dev, task)       --data-on-device auto
    clip = clipper(run, module)                      --grad-clip: clip() once a step

run.py calls them, in its order (see its docstring): the clipper needs the parallelized model.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import nn

from fasttrain.engine.config import TrainConfig
from fasttrain.errors import UserError


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def process_flags() -> Callable[[], None]:
    """What puts back the process-wide flags that deterministic() and precision() set
    (deterministic algorithms, cuDNN's benchmark, TF32): a run calls it as it ends (loop.fit),
    so that its caller's code after it, or the next run in the process, starts from the flags
    it had, not from this run's --deterministic or --precision."""
    algorithms = (torch.are_deterministic_algorithms_enabled(),
                  torch.is_deterministic_algorithms_warn_only_enabled())
    cudnn = torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32
    matmul = torch.backends.cuda.matmul.allow_tf32

    def restore() -> None:
        torch.use_deterministic_algorithms(algorithms[0], warn_only=algorithms[1])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.allow_tf32 = cudnn
        torch.backends.cuda.matmul.allow_tf32 = matmul

    return restore


def deterministic(cfg: TrainConfig) -> None:
    """Deterministic algorithms only, under --deterministic (slower on GPU)."""
    if cfg.deterministic:
        # cuBLAS needs a fixed workspace to be deterministic; must be set before it starts.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=False)
        torch.backends.cudnn.benchmark = False


def precision(cfg: TrainConfig, dev: torch.device, sharded: bool = False):
    """(autocast context, GradScaler) for --precision on `dev`; TF32 set on CUDA. `sharded`:
    FSDP, tensor or pipeline parallel, where fp16's skip decision is taken over all ranks."""
    if cfg.precision == "tf32" and dev.type != "cuda":
        raise UserError(f"--precision tf32 is a mode of NVIDIA tensor cores; on {dev.type} "
                        f"use fp32 or bf16")
    if cfg.cuda_graphs and dev.type != "cuda":
        raise UserError(f"--cuda-graphs needs a CUDA GPU, not {dev.type}; drop the flag")
    if dev.type == "cuda":
        tf32 = cfg.precision == "tf32"
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
    low = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(cfg.precision)
    autocast = torch.autocast(dev.type, dtype=low) if low else contextlib.nullcontext()
    # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range.
    fp16 = cfg.precision == "fp16"
    if fp16 and sharded:
        from fasttrain.engine.scaler import sharded_scaler

        return autocast, sharded_scaler(dev)
    return autocast, torch.amp.GradScaler(dev.type, enabled=fp16)


def data_on_device(cfg: TrainConfig, dev: torch.device, task) -> bool:
    """Whether in-memory data is kept on `dev` (auto: when it fits in a quarter of free memory)."""
    if cfg.data_on_device != "auto":
        return cfg.data_on_device == "on"
    if cfg.workers:
        return False  # asking for workers means asking for the DataLoader path
    if dev.type != "cuda":
        return True  # host memory is the device's memory: nothing to copy per step
    size = sum(t.numel() * t.element_size() for t in (task.train_x, task.train_y, task.test_x,
                                                      task.test_y, task.val_x, task.val_y)
               if t is not None)
    free, _ = torch.cuda.mem_get_info(dev)
    return size < free / 4


def clipper(run, module: nn.Module) -> Callable[[], Any]:
    """Gradient clipping to --grad-clip: the norm over this layout's gradients (clipping.py
    under --tp/--pp), or nothing to do."""
    cfg, world = run.cfg, run.world
    if not cfg.grad_clip:
        return lambda: None
    params = [p for p in module.parameters() if p.requires_grad]  # sharded ones under FSDP
    if world.pp > 1 or world.tp > 1:  # DTensors on their meshes, plain tensors, stages
        from fasttrain.engine import clipping

        if world.pp > 1:  # squares summed over the stages, a tied weight counted once
            return clipping.clipper(params, cfg.grad_clip, counted=run.pipeline.counted,
                                    group=run.pipeline.group)
        return clipping.clipper(params, cfg.grad_clip)
    return lambda: torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip, foreach=True)

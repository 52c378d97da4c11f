"""What memory a run holds per rank, and what to say when it does not fit.

`rank_memory` measures the training state one rank holds (parameters, gradients, optimizer state)
on the live objects; `predicted_rank_memory` says the same from the parameter count alone, for
any --parallel mode and number of processes, before anything is launched. Activations are not
part of either: they depend on the micro-batch and are what activation checkpointing trades.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

# Optimizer state values per parameter (fp32): AdamW keeps two moments, SGD one momentum buffer.
STATE_PER_PARAM = {"adamw": 2, "sgd": 1}


@dataclass(frozen=True)
class RankMemory:
    """Bytes of training state on one rank."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of `t`: an FSDP parameter is a DTensor whose local shard is the storage."""
    return t.to_local() if hasattr(t, "to_local") else t


def _nbytes(t: torch.Tensor) -> int:
    t = _local(t)
    return t.numel() * t.element_size()


def rank_memory(model: torch.nn.Module, opt: torch.optim.Optimizer) -> RankMemory:
    """Measured on this rank: local parameter shards (FSDP) or whole parameters, one gradient per
    local trainable parameter (their size whenever they exist; they are freed between steps, and
    under DDP they are views into the all-reduce buckets), and the optimizer state this rank
    keeps (ZeRO-1: its partition only, held by the inner optimizer). No host sync."""
    params = list({id(p): p for p in model.parameters()}.values())  # a tied weight counts once
    inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer steps a local optimizer
    state = sum(_nbytes(v) for s in inner.state.values() for v in s.values()
                if torch.is_tensor(v))
    return RankMemory(params=sum(_nbytes(p) for p in params),
                      grads=sum(_nbytes(p) for p in params if p.requires_grad),
                      optimizer=state)


def predicted_rank_memory(n_params: int, parallel: str, world: int, optimizer: str = "adamw",
                          momentum: float = 0.9, bytes_per_value: int = 4) -> RankMemory:
    """Per-rank bytes of `n_params` fp32 parameters trained by `world` processes:

        none, dp, ddp   P       P       S        (every rank/GPU a full replica)
        zero1           P       P       S / W    (optimizer state partitioned: ZeRO-1)
        fsdp            P / W   P / W   S / W    (everything sharded: ZeRO-3)

    with S = 2P for AdamW, P for SGD with momentum, 0 without. ZeRO-1 partitions whole
    parameters and FSDP pads each one to a multiple of W, so measured shares are close, not
    exact. FSDP also holds, transiently, one block's unsharded parameters and gradients."""
    per = STATE_PER_PARAM[optimizer] if (optimizer != "sgd" or momentum) else 0
    p = n_params * bytes_per_value
    s = per * p
    if parallel == "fsdp":
        return RankMemory(params=-(-p // world), grads=-(-p // world), optimizer=-(-s // world))
    if parallel == "zero1":
        return RankMemory(params=p, grads=p, optimizer=-(-s // world))
    return RankMemory(params=p, grads=p, optimizer=s)


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def _layout_flags(cfg) -> str:
    """'--parallel fsdp --tp 2 --pp 2': the flags that decide what one rank holds."""
    return f"--parallel {cfg.parallel}" + "".join(
        f" --{k} {v}" for k, v in (("tp", cfg.tp), ("pp", cfg.pp)) if v > 1)


def explain_oom(trainer) -> str:
    """One line for the error, after printing the breakdown of the run that ran out."""
    import sys

    cfg = trainer.cfg
    held = rank_memory(trainer.model, trainer.opt)
    lines = [f"out of memory on {trainer.device} at step {trainer.step}:",
             f"  weights {_gib(held.params)}, gradients {_gib(held.grads)}, optimizer state "
             f"{_gib(held.optimizer)} (this rank's share under {_layout_flags(cfg)}; "
             f"`fasttrain memory` with the same flags predicts it per rank);",
             "  the rest of the peak is activations, which grow with the micro-batch "
             f"({trainer.batches.micro} samples per data-parallel rank)."]
    if trainer.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(trainer.device)
        total = torch.cuda.get_device_properties(trainer.device).total_memory
        lines.append(f"  peak allocated {_gib(peak)} of {_gib(total)}.")
    print("\n".join(lines), file=sys.stderr)
    fixes = [f"--batch-size {cfg.batch_size} --accum-steps {cfg.accum_steps * 2} (same update, "
             f"half the activations)"]
    if not cfg.activation_checkpointing:
        fixes.append("--activation-checkpointing")
    if cfg.precision in ("fp32", "tf32"):
        fixes.append("--precision bf16")
    if cfg.parallel in ("ddp", "zero1"):
        fixes.append("--parallel fsdp (shards weights, gradients and optimizer state)")
    return "the run does not fit in memory; try " + ", or ".join(fixes)

"""Per-rank memory and the two costs of a parallel layout (data × FSDP × tensor × pipeline), as
pure arithmetic: what `fasttrain memory` and the scaling model need to say which layout to pick.
Nothing here runs a model; engine/mesh.py lays out the real ranks the same way.

Division, per rank, for P parameters of `bytes_per_param` (fp32: 4), with tp × pp × dp ranks:
- parameters and gradients: P / (tp · pp), and / dp again under FSDP (ZeRO-3);
- optimizer state (`optimizer_factor` · P · 4 bytes: AdamW 2, SGD with momentum 1): the same
  division (ZeRO-1 would divide only this one by dp);
- activations of one micro-batch: `activation_bytes` (one process, whole model) / (tp · pp),
  since tp splits the [B, T, 4C] and per-head tensors (the replicated norms and residual stream
  are counted as split: an optimistic bound without sequence parallel) and each stage holds its
  own blocks'; under a pipeline the first stage keeps up to min(m, pp) micro-batches in flight
  under 1F1B (all m under GPipe) before their backward frees them.

Costs: the pipeline bubble (pp − 1) / (m + pp − 1) of a step idle (GPipe and 1F1B alike;
interleaving v stages per rank divides it by v), and tensor-parallel communication: per block,
2 all-reduces forward and 2 backward of the [B, T, C] activation, each moving 2 (tp − 1) / tp of
its bytes per rank (ring).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    fsdp: bool = False  # the data dimension shards (FSDP) or replicates (DDP)
    microbatches: int = 1  # pipeline micro-batches per step
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved-1f1b
    stages_per_rank: int = 1  # interleaved-1f1b: 2 here


@dataclass(frozen=True)
class RankMemory:
    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict[str, int]:
        return {**asdict(self), "total": self.total}


def rank_memory(n_params: int, activation_bytes: int, layout: Layout, *,
                bytes_per_param: int = 4, optimizer_factor: int = 2) -> RankMemory:
    """Predicted bytes on one rank (the first pipeline stage: it holds the most in flight)."""
    split = layout.tp * layout.pp * (layout.dp if layout.fsdp else 1)
    weights = -(-n_params * bytes_per_param // split)  # ceil: shards round up
    in_flight = (layout.microbatches if layout.schedule == "gpipe"
                 else min(layout.microbatches, layout.pp)) if layout.pp > 1 else 1
    # A pipeline micro-batch is 1/m of the rank's batch: m of them in flight under GPipe hold
    # one batch's activations, min(m, pp) under 1F1B hold min(m, pp)/m of it.
    per_micro = activation_bytes // (layout.tp * layout.pp) // max(layout.microbatches, 1)
    return RankMemory(params=weights, grads=weights,
                      optimizer=-(-n_params * 4 * optimizer_factor // split),
                      activations=per_micro * in_flight)


def bubble(pp: int, microbatches: int, stages_per_rank: int = 1) -> float:
    """Fraction of a pipeline step spent idle: (p − 1) / (m + p − 1), / v when interleaved."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / stages_per_rank / (microbatches + (pp - 1) / stages_per_rank)


def tp_bytes_per_step(tp: int, n_layer: int, tokens: int, n_embd: int,
                      bytes_per_value: int = 4) -> int:
    """Bytes each rank sends per optimizer step for tensor parallelism: 4 ring all-reduces of
    the [tokens, C] activation per block (2 forward, 2 backward), 2 (tp − 1)/tp of it each."""
    if tp <= 1:
        return 0
    activation = tokens * n_embd * bytes_per_value
    return int(4 * n_layer * activation * 2 * (tp - 1) / tp)

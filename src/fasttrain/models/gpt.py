"""`gpt`: a small character-level GPT — a decoder-only transformer in the GPT-2 layout.

tokens int64 [B, T] → token embedding + learned position embedding → `n_layer` pre-LayerNorm
blocks (x + attn(ln1(x)), then x + mlp(ln2(x))) → final LayerNorm → logits [B, T, vocab], where
the output head reuses the token embedding matrix (weight tying: one [vocab, n_embd] tensor, one
state_dict key). Attention is causal multi-head self-attention through
`F.scaled_dot_product_attention(..., is_causal=True)`, which picks a fused (flash /
memory-efficient) kernel where the device has one; the MLP is n_embd → 4·n_embd → GELU → n_embd.

`in_shape` = (block_size,) sizes the position table, `num_classes` is the vocabulary size.
T may be anything up to block_size; longer inputs fail in the position lookup (an IndexError —
not checked here, since that would be a check per step). Options: `n_layer`, `n_head`, `n_embd`
(divisible by n_head) and `dropout` (on embeddings, attention weights and residual writes).

Pipeline parallel (`--pp`, engine/pipeline.py): `pipeline_split(n)` cuts the model into n stages
at block boundaries — embeddings and the first blocks on stage 0, the last blocks, final norm and
head on stage n−1 — each stage naming its parameters as the whole model does ("blocks.3.…").
The last stage holds its own copy of the tied embedding as "wte.weight": the pipeline sums the
two copies' gradients, so they stay equal.

Size with the defaults (4 layers, 4 heads, 128 wide) and a 65-character vocabulary:
801,664 + 128·block_size parameters (818,048 at block_size 128; the position table is the only
part that grows with it); forward ≈ 2·N + 4·n_layer·n_embd·T ≈ 1.9 MFLOP per token at T = 128
(1.6 M of it the weights, 0.26 M attention scores and mixing), i.e. ≈ 0.24 GFLOP per sequence.

Tensor parallel (`--tp N`, engine/tensor_parallel.py): `parallelize(tp_mesh)` splits each block
Megatron-style — qkv and the MLP's first linear column-wise, the two output projections
row-wise — so each rank holds n_head / N heads and 4·n_embd / N hidden units. The fused qkv
rows are laid out head by head (head h's q, k, v adjacent), so that a column-wise split cuts
between whole heads; attention reshapes by the head size and so runs on whatever number of heads
this rank holds. Between the pairs runs sequence parallelism (Megatron-LM's, torchtitan's
layouts): the residual stream is this rank's T / N positions [B, T/N, C], on which the
LayerNorms and dropouts run (SequenceParallel); each pair all-gathers the normed sequence on
entry and reduce-scatters its output back into shards, the same traffic as the all-reduce it
replaces, with the activations outside the pairs divided by N. The tied embedding is split by
vocabulary rows (each rank vocab / N of them, an uneven split where N does not divide it): the
lookup is row-wise (masked, then reduce-scattered into sequence shards), and the head against
the same rows gives each rank its vocab / N columns of the logits. With `loss_parallel` they
stay so (a DTensor sharded on the last dimension) and the engine computes the cross-entropy on
the shards under torch's loss_parallel(), so the [B, T, vocab] logits are never whole on one
rank; without it they are all-gathered. The sequence length (block_size) must divide by N.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from fasttrain.errors import UserError
from fasttrain.models import positive_int, probability


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, n_embd // n_head, dropout
        # The three projections as one GEMM; output rows [head, (q, k, v), head_dim].
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.resid_drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # [B, T, 3·h·d] -> 3 × [B, h, T, d]: h = n_head, or this rank's n_head / tp under tensor
        # parallelism (qkv's output is then this rank's column shard: whole heads, see above).
        q, k, v = self.qkv(x).view(B, T, -1, 3, self.head_dim).permute(3, 0, 2, 1, 4)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).reshape(B, T, -1)  # heads side by side again
        return self.resid_drop(self.proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.proj(F.gelu(self.fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd, dropout)

    def parallelize(self, tp_mesh) -> None:
        """Megatron's split of this block over `tp_mesh`, with sequence parallelism between the
        pairs (see the module docstring). The block's input and output, the residual stream,
        are this rank's sequence shard [B, T/tp, C] as a plain tensor."""
        from torch.distributed.tensor import Replicate, Shard
        from torch.distributed.tensor.parallel import (
            ColwiseParallel,
            PrepareModuleInput,
            RowwiseParallel,
            SequenceParallel,
            parallelize_module,
        )

        # The norm's output, a DTensor sharded on the sequence, is all-gathered on the way into
        # each pair (a rank's column shard computes its heads / hidden units for every
        # position); the row-wise linear's partial sums are reduce-scattered straight back into
        # sequence shards: plain tensor parallelism's all-reduce cut in its two halves, the
        # same bytes on the wire, with the norm and dropout between on T/tp positions.
        gather = PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))
        parallelize_module(self, tp_mesh, {
            "ln1": SequenceParallel(),
            "attn": gather,
            "attn.qkv": ColwiseParallel(),
            "attn.proj": RowwiseParallel(output_layouts=Shard(1)),
            "attn.resid_drop": SequenceParallel(use_local_output=True),
            "ln2": SequenceParallel(),
            "mlp": gather,
            "mlp.fc": ColwiseParallel(),
            "mlp.proj": RowwiseParallel(output_layouts=Shard(1)),
            "mlp.drop": SequenceParallel(use_local_output=True),
        })

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [B, T, C] -> [B, T, C]
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TiedHead(nn.Module):
    """The output head, tied: logits against the token embeddings, [B, T, C] @ [C, vocab]. It
    holds no parameter (so no state_dict key); it is a module so that the tensor-parallel plan
    can lay out its two inputs."""

    def forward(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x, weight)


def _parallelize(model: nn.Module, blocks, block_size: int, tp_mesh,
                 loss_parallel: bool) -> None:
    """gpt's tensor- and sequence-parallel plan on `model`: the whole GPT, or one pipeline
    stage (--pp with --tp), which holds `blocks` and whichever of the embeddings, the final norm
    and the tied head are its own: the plan is applied to the modules present, so that a stage
    boundary carries this rank's sequence shard [B, T/tp, C] to the same tp rank of the next
    stage, and the last stage's copy of the tied matrix is split as the first stage's is."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        PrepareModuleInput,
        PrepareModuleOutput,
        RowwiseParallel,
        SequenceParallel,
        parallelize_module,
    )

    tp, n_head = tp_mesh.size(), blocks[0].attn.n_head
    if n_head % tp:
        raise UserError(f"--tp {tp}: gpt's {n_head} attention heads do not split over {tp} "
                        f"ranks; choose a --tp that divides {n_head} (or n_head=)")
    if block_size % tp:
        raise UserError(f"--tp {tp}: sequence parallelism splits each sequence of "
                        f"{block_size} tokens over {tp} ranks; choose a --block-size "
                        f"that is a multiple of {tp}")
    for block in blocks:
        block.parallelize(tp_mesh)
    plan = {
        # Vocabulary-sharded lookup (each rank holds vocab/tp rows of the tied matrix); its
        # partial sums are reduce-scattered into sequence shards [B, T/tp, C].
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        # The position table stays whole (T × C, small); each rank keeps its rows [T/tp, C].
        "wpe": PrepareModuleOutput(output_layouts=Replicate(), desired_output_layouts=Shard(0)),
        "drop": SequenceParallel(use_local_output=True),
        "ln_f": SequenceParallel(),
        # The tied head against the same vocab-sharded matrix: the normed sequence is
        # all-gathered, each rank computes its vocab/tp columns of the logits (no
        # communication), DTensor [B, T, vocab] sharded on the last dimension.
        "head": PrepareModuleInput(input_layouts=(Shard(1), Shard(0)),
                                   desired_input_layouts=(Replicate(), Shard(0))),
    }
    parallelize_module(model, tp_mesh, {k: v for k, v in plan.items() if hasattr(model, k)})
    if hasattr(model, "head") and not loss_parallel:  # whole logits: a loss or step of yours
        parallelize_module(model.head, tp_mesh, PrepareModuleOutput(
            output_layouts=Shard(-1), desired_output_layouts=Replicate()))


class GPT(nn.Module):
    def __init__(self, in_shape: tuple[int, ...], num_classes: int, *, n_layer: int = 4,
                 n_head: int = 4, n_embd: int = 128, dropout: float = 0.0):
        super().__init__()
        n_layer = positive_int("gpt", "n_layer", n_layer)
        n_head = positive_int("gpt", "n_head", n_head)
        n_embd = positive_int("gpt", "n_embd", n_embd)
        dropout = probability("gpt", "dropout", dropout)
        if n_embd % n_head:
            raise UserError(f"gpt: n_embd {n_embd} is not divisible by n_head {n_head}; choose "
                            f"an n_embd that is a multiple of n_head")
        (self.block_size,) = in_shape
        self.wte = nn.Embedding(num_classes, n_embd)
        self.wpe = nn.Embedding(self.block_size, n_embd)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = TiedHead()
        self._init_weights(n_layer)

    def parallelize(self, tp_mesh, loss_parallel: bool = False) -> None:
        """Tensor and sequence parallelism over `tp_mesh` (engine/tensor_parallel.py calls it
        under --tp). `loss_parallel`: the logits stay a DTensor sharded over the vocabulary
        (the engine then computes the loss under torch's loss_parallel()); else they are
        all-gathered into whole [B, T, vocab] tensors on every rank."""
        _parallelize(self, self.blocks, self.block_size, tp_mesh, loss_parallel)

    def _init_weights(self, n_layer: int) -> None:
        # GPT-2: N(0, 0.02) for every matrix and embedding, zero biases, LayerNorm at (1, 0); the
        # two projections per block that write into the residual stream get 0.02/sqrt(2·n_layer),
        # so the stream's variance stays O(1) however many blocks add to it.
        residual_std = 0.02 / math.sqrt(2 * n_layer)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.mlp.proj.weight, std=residual_std)

    def pipeline_split(self, n_stages: int) -> list[nn.Module]:
        """The model as `n_stages` consecutive stages (activations [B, T, C] between them), the
        blocks dealt as evenly as possible, earlier stages taking the remainder (the last one
        also runs the head). The stages share this model's modules, except the last stage's
        copy of the tied embedding."""
        n_layer = len(self.blocks)
        if not 1 <= n_stages <= n_layer:
            raise UserError(f"gpt has {n_layer} blocks and cannot be cut into {n_stages} "
                            f"pipeline stages: use --pp × virtual stages ≤ {n_layer} (or a "
                            f"deeper model, n_layer={n_stages})")
        bounds = [i * (n_layer // n_stages) + min(i, n_layer % n_stages)
                  for i in range(n_stages + 1)]
        return [_Stage(self, range(bounds[i], bounds[i + 1]), i == 0, i == n_stages - 1)
                for i in range(n_stages)]

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.shape[1]  # must be ≤ block_size (see the module docstring)
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))  # [B, T, C]
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x), self.wte.weight)  # [B, T, vocab]


class _Stage(nn.Module):
    """Blocks `index` of `gpt`, with the embeddings on the first stage and the final norm and
    tied head on the last. Its parameter names are the whole model's."""

    def __init__(self, gpt: GPT, index: range, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        if first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        elif last:
            # The head's own copy of the tied matrix (a stage cannot reach another rank's
            # parameter): equal at the start; the pipeline sums the two gradients every step.
            self.wte = nn.Embedding(*gpt.wte.weight.shape, device=gpt.wte.weight.device)
            with torch.no_grad():
                self.wte.weight.copy_(gpt.wte.weight)
        self.blocks = nn.ModuleDict({str(i): gpt.blocks[i] for i in index})
        self.block_size = gpt.block_size
        if last:
            self.ln_f, self.head = gpt.ln_f, gpt.head

    def parallelize(self, tp_mesh) -> None:
        """gpt's plan on this stage (--pp with --tp: engine/pipeline.py splits each stage after
        the cut): its blocks, and its embeddings or its final norm and head. The pipeline
        computes the loss from whole logits (no loss parallel)."""
        _parallelize(self, list(self.blocks.values()), self.block_size, tp_mesh, False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:  # int64 tokens [B, T] -> [B, T, C]
            x = self.drop(self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device)))
        for block in self.blocks.values():
            x = block(x)
        if self.last:  # -> logits [B, T, vocab]
            x = self.head(self.ln_f(x), self.wte.weight)
        return x

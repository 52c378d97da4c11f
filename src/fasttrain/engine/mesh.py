"""The layout of the processes: one DeviceMesh of dims ("pp", "dp", "tp") from --pp and --tp.

    torchrun --nproc-per-node 8 -m fasttrain train --model gpt --tp 2 --pp 2 --parallel fsdp

makes a 2 × 2 × 2 mesh: ranks 0–1 are one tensor-parallel group, ranks 0–3 one pipeline stage's
data-parallel × tensor-parallel square, and so on. The order is torchtitan's and it matters:
the innermost dimension has neighbouring ranks, which torchrun places on the same node, so
tensor parallelism (a collective per layer, forward and backward) stays on NVLink; data
parallelism (one reduction per step) spans nodes; the pipeline (point-to-point activations only)
is outermost. Every dimension is kept, size 1 included, so that `mesh["dp"]` and `mesh["tp"]`
always exist and a size-1 dimension costs nothing (no collective runs over one rank).

What each dimension divides: tensor parallelism splits each layer's weights and every rank of a
tp group gets the SAME batch (they compute parts of one forward); pipeline parallelism splits
the layers and every stage of a pipeline gets the same batch too; only the data-parallel
dimension deals out different samples. So the data path shards over (dp_rank, dp_size), never
over the global rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from fasttrain.errors import UserError

DIMS = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Layout:
    """Sizes of the three dimensions; their product is the number of processes."""

    pp: int = 1
    dp: int = 1
    tp: int = 1

    @property
    def size(self) -> int:
        return self.pp * self.dp * self.tp

    def coordinates(self, rank: int) -> dict[str, int]:
        """(pp, dp, tp) of `rank` in the row-major mesh (tp fastest), without a process group."""
        return {"pp": rank // (self.dp * self.tp), "dp": rank // self.tp % self.dp,
                "tp": rank % self.tp}


def layout(world: int, tp: int, pp: int) -> Layout:
    """The layout of `world` processes under --tp/--pp: dp takes what tp × pp leave."""
    if tp < 1 or pp < 1:
        raise UserError(f"--tp and --pp must be ≥ 1, got --tp {tp} --pp {pp}")
    if world % (tp * pp):
        raise UserError(f"--tp {tp} × --pp {pp} = {tp * pp} does not divide the {world} "
                        f"processes torchrun started; launch a multiple of {tp * pp} "
                        f"(--nproc-per-node × --nnodes)")
    return Layout(pp=pp, dp=world // (tp * pp), tp=tp)


def check_data_mode(parallel: str, lay: Layout) -> None:
    """How the data-parallel ranks of a --tp/--pp layout hold the state: the rules training
    (distributed.check_launch) and `fasttrain memory --gpus` (lab/layouts.layout) share."""
    flags = " ".join(f"--{k} {v}" for k, v in (("tp", lay.tp), ("pp", lay.pp)) if v > 1)
    if lay.tp * lay.pp > 1 and parallel in ("zero1", "dp"):
        why = ("ZeroRedundancyOptimizer partitions plain tensors over every rank and knows "
               "nothing of tensor-parallel shards or pipeline stages" if parallel == "zero1"
               else "DataParallel is one process")
        raise UserError(f"--parallel {parallel} with {flags}: {why}; use --parallel fsdp "
                        f"(shards the optimizer state too)" + (" or ddp" if lay.tp == 1 else ""))
    if lay.dp > 1 and parallel == "ddp" and lay.tp > 1:
        raise UserError(f"--parallel ddp with {flags}: DistributedDataParallel broadcasts and "
                        f"buckets plain tensors and refuses the DTensor shards of tensor "
                        f"parallelism; use --parallel fsdp (dp × tp, as torchtitan does)")
    if lay.dp > 1 and parallel == "none":
        raise UserError(f"{flags or 'the layout'} leaves {lay.dp} data-parallel groups of "
                        f"{lay.tp * lay.pp} processes, which --parallel none would train as "
                        f"unrelated copies: add --parallel fsdp" + (" (or ddp)" if lay.tp == 1
                                                                    else ""))


def device_mesh(device_type: str, lay: Layout):
    """The one DeviceMesh of this run (a collective: every rank calls it, the group exists)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (lay.pp, lay.dp, lay.tp), mesh_dim_names=DIMS)

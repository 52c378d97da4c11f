"""Scale-out on torchrun: the process group, the order in which parallelism wraps the model, and
the few collectives the engine needs. No launcher, collective or RPC of our own (DESIGN.md).

    torchrun --standalone --nproc-per-node 8 -m fasttrain train --parallel ddp ...

torchrun starts one process per device and sets WORLD_SIZE, RANK, LOCAL_RANK (and the rendezvous
address); `init` reads them, uses NCCL with device cuda:LOCAL_RANK on GPUs and gloo on the CPU,
and `World.close` destroys the group at exit. What every --parallel mode shares:

- `--batch-size` is the GLOBAL batch: each process trains batch_size / world / accum_steps
  samples per micro-step (validated divisible at config time).
- Data: the one-process epoch order `epoch_order(seed, epoch)`, cut to whole steps, dealt out
  to the ranks as DistributedSampler does (rank r takes positions r, r + world, ...). At step s
  the ranks' samples together are exactly the one-process batch of step s, and micro-step a
  of every rank together is exactly the one-process micro-batch a (see batches.py). The
  order is a function of (seed, epoch), so there is no sampler `set_epoch` to forget.
- Gradients are averaged over ranks, the loss of each rank is a mean over its micro-batch
  divided by accum_steps: the update is the one-process update up to the order of the sums.
- Rank 0 alone writes logs, metrics, plots, weights and checkpoint files (FSDP: every rank writes
  its shard, rank 0 commits); every rank reaches the same collectives and barriers.
- A stop request (SIGTERM/SIGUSR1) is agreed at log steps only, so all ranks checkpoint at the
  same step; the loss is all-reduced at log steps only: no extra sync between logs.

The modes: `ddp` (DistributedDataParallel), `zero1` (DDP + ZeroRedundancyOptimizer: optimizer
state partitioned over ranks), `fsdp` (FSDP2 `fully_shard`, ZeRO-3: parameters, gradients and
optimizer state sharded), and `dp` (nn.DataParallel, one process driving ≥ 2 GPUs: the slow
baseline that DDP replaced, kept as a comparison row).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fasttrain.errors import UserError

DISTRIBUTED = ("ddp", "fsdp", "zero1")  # the modes that run one process per device
TORCHRUN_VARS = ("WORLD_SIZE", "RANK", "LOCAL_RANK")
_TORCHRUN = "torchrun --nproc-per-node N -m fasttrain train ..."


def launch_env() -> dict[str, int] | None:
    """torchrun's WORLD_SIZE, RANK and LOCAL_RANK, or None when not launched by it."""
    if not all(v in os.environ for v in TORCHRUN_VARS):
        return None
    try:
        return {v: int(os.environ[v]) for v in TORCHRUN_VARS}
    except ValueError:
        raise UserError(f"{'/'.join(TORCHRUN_VARS)} must be integers (they are torchrun's); "
                        f"launch with {_TORCHRUN}") from None


def check_launch(parallel: str, device: str, tp: int = 1, pp: int = 1) -> int:
    """The number of processes, after checking that `parallel` (and --tp/--pp) fits how this
    process was launched and the devices present. Called by TrainConfig.validate: bad launches
    fail at config time."""
    env = launch_env()
    world = env["WORLD_SIZE"] if env else 1
    cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    if tp * pp > 1:
        _check_layout(parallel, env, world, tp, pp)
    if parallel in DISTRIBUTED:
        if env is None:
            raise UserError(f"--parallel {parallel} runs one process per device under torchrun "
                            f"(it sets {', '.join(TORCHRUN_VARS)}): launch with {_TORCHRUN} "
                            f"(N = 1 works too), or use --parallel none")
        if device in ("mps", "xpu"):
            raise UserError(f"--parallel {parallel} runs on CUDA (NCCL) or the CPU (gloo), not "
                            f"{device}: use --device cuda or cpu")
        if cuda and env["LOCAL_RANK"] >= torch.cuda.device_count():
            raise UserError(f"LOCAL_RANK {env['LOCAL_RANK']} but this node has "
                            f"{torch.cuda.device_count()} CUDA GPUs: launch at most one process "
                            f"per GPU (--nproc-per-node {torch.cuda.device_count()})")
    elif world > tp * pp:  # with --tp/--pp and dp = 1, --parallel none is the whole layout
        raise UserError(f"torchrun started {world} processes, but --parallel {parallel} would "
                        f"train {world} unrelated copies: add --parallel ddp (or fsdp, zero1)")
    if parallel == "dp":
        gpus = torch.cuda.device_count() if cuda else 0
        if gpus < 2:
            raise UserError(f"--parallel dp splits each batch over ≥ 2 CUDA GPUs in one process "
                            f"and this run has {gpus}: use --parallel none, or ddp under "
                            f"torchrun")
    return world


def _check_layout(parallel: str, env, world: int, tp: int, pp: int) -> None:
    from fasttrain.engine.mesh import check_data_mode, layout

    if env is None:
        flags = " ".join(f"--{k} {v}" for k, v in (("tp", tp), ("pp", pp)) if v > 1)
        raise UserError(f"{flags} splits the model over processes that torchrun starts (it sets "
                        f"{', '.join(TORCHRUN_VARS)}): launch with {_TORCHRUN}")
    if parallel in ("zero1", "dp"):  # before the sizes: whatever the world, they do not compose
        check_data_mode(parallel, layout(tp * pp, tp, pp))
    check_data_mode(parallel, layout(world, tp, pp))


@dataclass
class World:
    """Where this process stands, and the collectives the engine needs. For one process
    (--parallel none or dp) every collective is the identity and costs nothing."""

    parallel: str = "none"
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    rank: int = 0
    local_rank: int = 0
    size: int = 1
    restarts: int = 0  # TORCHELASTIC_RESTART_COUNT: > 0 after torchrun restarted the workers
    owns_group: bool = False
    tp: int = 1
    pp: int = 1
    mesh: Any = None  # the DeviceMesh ("pp", "dp", "tp") under torchrun (mesh.py), else None
    dp_rank: int = 0  # where this rank's samples come from: the data path shards over dp only
    dp_size: int = 1

    @property
    def sharded(self) -> bool:
        """State held as DTensor shards (FSDP, tensor parallel) or per stage (pipeline): saved
        and loaded through DCP, gathered for the final weights."""
        return self.parallel == "fsdp" or self.tp > 1 or self.pp > 1

    @property
    def main(self) -> bool:
        """Rank 0: the process that writes files and prints."""
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """Sum `t` over ranks, in place (a device tensor: NCCL needs it on the GPU)."""
        if self.size > 1:
            dist.all_reduce(t)
        return t

    def any(self, flag: bool) -> bool:
        """True on every rank if `flag` is True on any (a collective and a host sync)."""
        if self.size == 1:
            return flag
        t = torch.tensor(float(flag), device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def barrier(self) -> None:
        if self.size > 1:
            dist.barrier()

    def gather(self, obj: Any) -> list[Any]:
        """`obj` of every rank, on every rank (pickled: small things only, e.g. RNG states)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def close(self, together: bool = False) -> None:
        """Destroy the process group this World created (idempotent). `together`: every rank is
        closing here (the run ended, or all agreed to stop), so they first meet at a barrier.

        Then a short sleep, for a race in torch (2.13, gloo): a gloo worker thread frees a
        finished collective's tensors just after the main thread got the result; if the
        interpreter has begun to exit by then, the thread cannot take the GIL to release their
        Python objects and the process aborts ("terminate called without an active exception",
        about 1 exit in 25 here, before the sleep). Sleeping releases the GIL to it."""
        if self.owns_group and dist.is_initialized():
            if together:
                dist.barrier()
            dist.destroy_process_group()
            time.sleep(0.05)
        self.owns_group = False


def init(parallel: str, device: torch.device, tp: int = 1, pp: int = 1) -> World:
    """Join torchrun's process group (DDP/FSDP/ZeRO-1, --tp/--pp) and build the run's mesh, or
    describe the single process."""
    if parallel not in DISTRIBUTED and tp * pp == 1:
        return World(parallel=parallel, device=device)
    env = launch_env()
    assert env is not None  # check_launch ran at config time
    if device.type == "cuda":
        # One GPU per process; set before any CUDA work so NCCL and allocations use it.
        device = torch.device("cuda", env["LOCAL_RANK"])
        torch.cuda.set_device(device)
    restarts = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if device.type == "cuda" else "gloo"
        # device_id binds NCCL to this GPU eagerly (no guessing in barrier()).
        dist.init_process_group(backend, device_id=device if device.type == "cuda" else None,
                                **_restart_store(env, restarts))
    from fasttrain.engine.mesh import device_mesh, layout

    lay = layout(dist.get_world_size(), tp, pp)
    mesh = device_mesh(device.type, lay)
    return World(parallel=parallel, device=device, rank=dist.get_rank(),
                 local_rank=env["LOCAL_RANK"], size=dist.get_world_size(), restarts=restarts,
                 owns_group=owns, tp=tp, pp=pp, mesh=mesh,
                 dp_rank=mesh["dp"].get_local_rank(), dp_size=lay.dp)


def _restart_store(env: dict[str, int], restarts: int) -> dict[str, Any]:
    """After an elastic restart, the process group's rendezvous in a namespace of its own.

    torchrun's agent shares its TCPStore with the workers and keeps it across restarts, with
    the previous attempt's process-group keys in it (the peers' addresses): restarted gloo
    workers then connect to dead peers and fail ("Connection refused"), measured here with
    torch 2.13. A key prefix per attempt, on torchrun's own store, gives each attempt a clean
    slate. The first attempt uses plain env:// (nothing to do)."""
    if not restarts or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return {}
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          is_master=False)
    return {"store": dist.PrefixStore(f"fasttrain/attempt-{restarts}", store),
            "rank": env["RANK"], "world_size": env["WORLD_SIZE"]}


# gloo's own diagnosis when a collective's peer went away (third_party/gloo's tcp/pair.cc, torch
# 2.13): the process at the other end raised, crashed or was killed. NCCL's errors are not
# recognized (not run on a GPU here): they keep their traceback.
_PEER_GONE = "caused by a remote worker crashing"


def peer_failure(error: BaseException) -> str | None:
    """One line for `error` when it is this rank's collective failing because another process of
    the torchrun job went away first, else None. That process printed its own error (the user's
    frames, a traceback): a second traceback here, through gloo and the engine, would only bury
    it."""
    env = launch_env()
    if env is None or env["WORLD_SIZE"] == 1:
        return None
    chain = [error]
    while (chain[-1].__cause__ or chain[-1].__context__) and len(chain) < 16:  # no cycles
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    gone = next((e for e in chain if _PEER_GONE in str(e)), None)
    if gone is None:
        return None
    # "[.../pair.cc:553] Connection closed by peer [127.0.0.1]:14493. This is typically ..."
    what = re.sub(r"^\[[^\]]*\] ", "", str(gone).strip()).split(". This is typically")[0]
    return (f"rank {env['RANK']} stopped: another process of this run failed first (its error "
            f"is above, and torchrun's report names its rank as the root cause); here: {what}")


# -- wrapping ----------------------------------------------------------------------------------


def parallelize(model: nn.Module, world: World, *, activation_checkpointing: bool,
                compile: bool, cuda_graphs: bool, checkpoint: tuple[str, ...] = (),
                tp_plan: dict | None = None,
                loss_parallel: bool = False) -> tuple[nn.Module, Callable]:
    """Wrap `model` (already on its device, same initial weights on every rank) and return
    (forward, no_sync): the module the step calls, and the context the non-final micro-steps of
    an accumulated step run under. `model` keeps owning the parameters.

    The order is fixed; each step must see the result of the one before:
      0. tensor parallelism (--tp) — parallelize_module swaps parameters for DTensor shards in
         place, addressed by the model's own module names (tensor_parallel.py), so it runs on
         the bare model, before anything wraps or renames its submodules (torchtitan's order);
      1. activation checkpointing — it replaces the units of the model (`models.units`: the
         modules named in `checkpoint`, model.blocks, or a Sequential's children), so DDP must
         bucket, FSDP must shard and compile must trace the final module tree;
      2. data parallelism — DDP / fully_shard per block, then the root / DataParallel;
      3. torch.compile, of the wrapped module (`cuda_graphs`: in reduce-overhead mode, the
         model's own CUDA graphs). This is PyTorch's documented recommendation for DDP
         (compile the DDP module: dynamo's DDPOptimizer splits the graph at bucket
         boundaries so each bucket's all-reduce overlaps the rest of backward); one order for
         every mode keeps the engine to one code path. torchtitan compiles each block before
         fully_shard instead; with FSDP2 ours also works (its hooks run between compiled
         regions), at the cost of graph breaks at every block.
    Under --tp, compile moves to 0b: each block's forward alone, before checkpointing wraps it
    (tensor_parallel.compile_blocks).
    """
    from fasttrain.models import apply_activation_checkpointing, units

    per_block = False
    if world.tp > 1:  # 0.
        from fasttrain.engine import tensor_parallel

        tensor_parallel.apply(model, world.mesh["tp"], tp_plan, loss_parallel)
        per_block = compile and tensor_parallel.compile_blocks(units(model, checkpoint))  # 0b.
    if activation_checkpointing:  # 1.
        apply_activation_checkpointing(model, checkpoint)
    forward: nn.Module = model  # 2.
    no_sync: Callable = contextlib.nullcontext
    # Under --tp/--pp a data-parallel dimension of size 1 has nothing to replicate or shard.
    data_parallel = world.dp_size > 1 or world.tp * world.pp == 1
    if world.parallel in ("ddp", "zero1") and data_parallel:
        from torch.nn.parallel import DistributedDataParallel

        # gradient_as_bucket_view: gradients live in the all-reduce buckets (no second copy).
        # Under --pp (model: one stage) the schedule runs m backwards per step and arms DDP's
        # reducer for the last only; DDP's one-time bucket rebuild then collects the parameter
        # order twice and asserts on the next forward (torch 2.13, gloo: "rebuilt parameter
        # indices size is not same", gpipe, or 1f1b with m = 2). find_unused_parameters turns
        # that rebuild off, for one walk of the last micro-batch's autograd graph per step.
        ddp = DistributedDataParallel(
            model, device_ids=[world.device] if world.device.type == "cuda" else None,
            gradient_as_bucket_view=True, find_unused_parameters=world.pp > 1,
            process_group=world.mesh["dp"].get_group())  # tp/pp groups replicate nothing
        forward, no_sync = ddp, ddp.no_sync
    elif world.parallel == "fsdp" and data_parallel:
        from torch.distributed.fsdp import fully_shard

        # Over the dp dimension only; under --tp the parameters are already DTensors on the tp
        # dimension and FSDP shards them again (2D: torchtitan's dp_shard × tp).
        mesh = world.mesh["dp"]
        # Each unit (a block) is one all-gather/reduce-scatter (what overlaps with compute); the
        # root takes what is left (embeddings, heads, a tied weight).
        for parent, key in units(model, checkpoint):
            fully_shard(parent.get_submodule(key), mesh=mesh)
        fully_shard(model, mesh=mesh)
        no_sync = lambda: _fsdp_no_sync(model)  # noqa: E731
    elif world.parallel == "dp":
        forward = nn.DataParallel(model)  # scatters each micro-batch over every visible GPU
    if (compile or cuda_graphs) and not per_block:  # 3.
        # reduce-overhead = torch.compile's CUDA graphs of the model alone: --cuda-graphs where
        # the whole step cannot be captured (graphed.py; single process only, see config).
        forward = torch.compile(forward, mode="reduce-overhead" if cuda_graphs else None)
    return forward, no_sync


@contextlib.contextmanager
def _fsdp_no_sync(model):
    """FSDP2's no_sync: keep the unsharded gradients, reduce-scatter only on the last micro-step
    (less communication, more memory: the same trade as DDP's no_sync)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def optimizer(cls: type[torch.optim.Optimizer], params, world: World,
              **kw) -> torch.optim.Optimizer:
    """`cls(params, **kw)`; under zero1 each rank keeps (and steps) only its partition of the
    state, then broadcasts its updated parameters."""
    if world.parallel == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return ZeroRedundancyOptimizer(params, optimizer_class=cls, **kw)
    return cls(params, **kw)


# -- state for checkpoints and final weights --------------------------------------------------


def full_weights(model: nn.Module, world: World) -> dict[str, torch.Tensor]:
    """The whole model's state_dict on rank 0 (FSDP, TP: gathered from the shards, a collective;
    other ranks get an empty dict). Under --pp each rank holds only its stages: every rank
    gathers its stages' full tensors, then rank 0 takes all of them (a tied weight held by two
    stages is equal on both; the later copy wins)."""
    if world.sharded:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_model_state_dict,
        )

        # cpu_offload keeps the gathered tensors on global rank 0 only, which under --pp
        # would drop the other stages: there every rank keeps its own and sends them.
        state = get_model_state_dict(model, options=StateDictOptions(
            full_state_dict=True, cpu_offload=world.pp == 1))
        if world.pp == 1:
            return state
        merged: dict[str, torch.Tensor] = {}
        for part in world.gather({k: v.detach().cpu() for k, v in state.items()}):
            merged.update(part)
        return merged if world.main else {}
    return model.state_dict()


def optimizer_state(opt: torch.optim.Optimizer, world: World) -> dict | None:
    """A single-file optimizer state, on rank 0. ZeRO-1 consolidates its partitions onto rank 0
    (a collective every rank must join), so the file is world-size independent."""
    if world.parallel == "zero1":
        opt.consolidate_state_dict(to=0)
        return opt.state_dict() if world.main else None
    return opt.state_dict()


def sharded_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """FSDP, tensor parallel: this rank's shards of model and optimizer state (DTensors), for
    DCP."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, opt, options=_flat())
    return {"model": msd, "optimizer": osd}


def _flat():
    """DCP options: the optimizer's state and param-group settings keyed by parameter name, not
    by group index. Pipeline stages hold different parameters; an index-keyed param_groups list
    (saved once, from one rank) would hand every stage the first stage's groups."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def load_sharded_state(model: nn.Module, opt: torch.optim.Optimizer,
                       state: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_state_dict

    set_state_dict(model, opt, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=_flat())


def seed_ranks(world: World, seed: int, device: torch.device) -> None:
    """Seed each rank's stream for dropout, once the weights are made (the same everywhere):
    each data-parallel rank masks its own samples with its own stream; the ranks of a tp group
    draw the same masks, as their replicated activations must stay equal."""
    seed = seed * 1_000_003 + 7919 * world.dp_rank
    if world.tp > 1 and device.type == "cuda":
        # Dropout on sequence shards is a DTensor random op: each rank draws its shard's part
        # of one mask, at offsets into this stream, through DTensor's tracker. Made here on
        # every rank with its seed (torchtitan's way), not lazily by the first such op: that
        # broadcasts rank 0's stream over the whole world, which a pipeline's stages reach at
        # different times. A CPU mesh has no tracker (docs/distributed.md).
        from torch.distributed.tensor._random import manual_seed

        manual_seed(seed, world.mesh["tp"])
    else:
        torch.manual_seed(seed)

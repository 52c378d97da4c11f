"""Pipeline parallelism (`--pp N`): the model cut into stages at block boundaries, one group of
stages per rank of the pipeline group, run by torch.distributed.pipelining's schedules. No
schedule, send or receive of ours: PyTorch's `PipelineStage` and `Schedule*` do all of it.

    module = attach(run, module, world, cfg)   # engine/run.py under --pp: build(...) over
    # world.mesh["pp"], then run.forward_backward and run.evaluate_loss from it; module: the
    # module holding this rank's stages, which becomes run.model

Stages and ranks: `model.pipeline_split(n)` (gpt: models/gpt.py) returns n = pp × virtual
consecutive stages; stage s runs on pipeline rank s mod pp (the "loop" placement that the
interleaved schedule expects), so rank 0 holds the first stage and rank pp−1 the last.
`--pp-schedule`: gpipe (all forwards, then all backwards: peak memory grows with the number of
micro-batches), 1f1b (one forward, one backward in the steady state: at most pp micro-batches in
flight), interleaved-1f1b (2 virtual stages per rank: the bubble shrinks by about half for twice
the point-to-point messages). The idle fraction of a step is the bubble (p−1)/(m+p−1) for p
stages and m micro-batches (interleaved: about (p−1)/(v·m+p−1) with v virtual stages).

Scaling: the schedule splits this rank's batch of the step (its accumulation micro-batches,
concatenated) into m equal micro-batches, takes the loss as the mean over each one, and scales
gradients by 1/m (`scale_grads`): the gradient is that of the mean loss over the batch, as
`loop.accumulate` computes it. The loss of the step (mean over micro-batches, detached) is
added to run.loss_sum on the last stage's ranks only, times pp, and nothing elsewhere: the
logger's sum over all ranks ÷ the number of ranks (callbacks.log, at log steps) is then the mean
over the data-parallel ranks (the tp ranks of a group add equal losses), as without a pipeline,
and no collective is added for it (a broadcast from the last stage at log steps would give the
same figure for one more collective).

Layouts: the pipeline is the outer dimension of the run's mesh ("pp", "dp", "tp", mesh.py).
Each stage is parallelized after the cut as the whole model is without a pipeline (torchtitan's
order; `attach`): tensor parallel over mesh["tp"] (the model's plan applied to the stage: gpt's
stages split their blocks), activation checkpointing, then DDP or fully_shard over mesh["dp"]
(nothing when dp = 1: the layout is pp × tp alone). The schedule runs the wrapped stages and drives
their gradient reduction itself (DDP's no_sync and FSDP's post-backward, once per step). Every
stage of one pipeline and every tp rank of one group takes the same batch; only dp ranks differ.

Tied weights (gpt's embedding and head) live on two stages as two copies of one parameter under
the same name; their gradients are summed over the pipeline group after the backward (after DDP
and FSDP reduced them over dp), so the copies, stepped by the same optimizer from the same
gradient, stay equal. Under FSDP or tensor parallelism the local shards are summed: each copy
must be split alike (checked at build; gpt's plan splits both by vocabulary rows, and fully_shard
cuts both copies into the same dim-0 rows).

Limits, checked at build: the default (x, y) step only (the loss is computed on the last stage
from its output, a user step needs the whole model); bf16 runs every stage under autocast, fp16
too, with engine/scaler.py's scaler (the found-inf flag all-reduced over every rank, so all
stages skip the same steps); no compile (the schedule calls the stages eagerly).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fasttrain.engine.config import PP_SCHEDULES
from fasttrain.errors import UserError

# Stages per rank, by --pp-schedule: 2 for the interleaved one (as torchtitan's default).
VIRTUAL = {name: 2 if name.startswith("interleaved") else 1 for name in PP_SCHEDULES}


def microbatches(cfg, rank_batch: int) -> int:
    """The schedule's number of micro-batches for this rank's `rank_batch` samples per step:
    --pp-microbatches, or 2 × pp (enough to fill the pipeline twice over, bubble ≤ 1/3)."""
    pp, m = cfg.pp, cfg.pp_microbatches or 2 * cfg.pp
    if m < 1 or rank_batch % m:
        raise UserError(f"--pp-microbatches {m} must divide each pipeline's batch of "
                        f"{rank_batch} samples per step: choose a divisor of {rank_batch} "
                        f"(or change --batch-size)")
    if VIRTUAL[cfg.pp_schedule] > 1 and m % pp:
        raise UserError(f"--pp-schedule {cfg.pp_schedule} needs --pp-microbatches a multiple "
                        f"of --pp {pp}, not {m}")
    return m


def _cut(model: nn.Module, n_stages: int) -> list[nn.Module]:
    cut = getattr(model, "pipeline_split", None)
    if not callable(cut):
        raise UserError(f"--pp: {type(model).__name__} names no split points; give it a method "
                        f"pipeline_split(n_stages) returning its n consecutive stages (see "
                        f"fasttrain/models/gpt.py), or drop --pp")
    stages = list(cut(n_stages))
    if len(stages) != n_stages:
        raise UserError(f"--pp: {type(model).__name__}.pipeline_split({n_stages}) returned "
                        f"{len(stages)} stages; it must return exactly {n_stages}")
    _check_names(model, stages)
    return stages


def _check_names(model: nn.Module, stages: list[nn.Module]) -> None:
    """Each stage must name its parameters as the model does: the rank's Held module, hence
    its checkpoint keys, weights file and tied copies (found by name), take the stages' names.
    A split into nn.Sequential slices names two stages' blocks alike ("1.up.weight"), which
    would tie unrelated weights and make their shards overwrite each other in a checkpoint.
    A parameter that is not the model's own (a tied weight's copy, as gpt's last stage holds)
    must bear the name and shape of the model's parameter it copies. Every parameter of the
    model must be on some stage (a split that leaves blocks over would not train them)."""
    names: dict[int, set[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), set()).add(name)
    shapes = {name: p.shape for name, p in model.named_parameters(remove_duplicate=False)}
    for s, stage in enumerate(stages):
        for name, p in stage.named_parameters():
            own = names.get(id(p))
            if own is None and shapes.get(name) == p.shape or own is not None and name in own:
                continue
            what = (f"the model's {min(own)!r}" if own is not None
                    else "a parameter the model does not have")
            raise UserError(f"--pp: stage {s} of {type(model).__name__}.pipeline_split("
                            f"{len(stages)}) holds {what} as {name!r}; a stage must name each "
                            f"parameter as the model does (checkpoints, weights and tied copies "
                            f"go by these names): keep the model's attribute names in each "
                            f"stage, e.g. blocks in an nn.ModuleDict keyed by their index in the "
                            f"model (see fasttrain/models/gpt.py's _Stage)")
    held = {id(p) for stage in stages for p in stage.parameters()}
    left = [name for name, p in model.named_parameters() if id(p) not in held]
    if left:  # a layer no stage runs: untrained, and missing from the weights and checkpoints
        raise UserError(f"--pp: no stage of {type(model).__name__}.pipeline_split("
                        f"{len(stages)}) holds {left[0]!r}"
                        f"{f' (and {len(left) - 1} more)' if len(left) > 1 else ''}; the stages "
                        f"together must hold every parameter of the model (deal the blocks "
                        f"out so that none is left over)")


def split(model: nn.Module, pp_rank: int, pp_size: int, virtual: int = 1) -> list[nn.Module]:
    """This pipeline rank's stages of `model`, in stage order: stages pp_rank, pp_rank + pp_size,
    ... of the pp_size × virtual stages the model's `pipeline_split` makes."""
    stages = _cut(model, pp_size * virtual)
    return [stages[pp_rank + k * pp_size] for k in range(virtual)]


class Held(nn.Module):
    """This rank's stages as one module whose names are the whole model's (state_dict, optimizer
    groups, checkpoints, weights files): the run's `model`. Stages' ModuleDicts (gpt's blocks)
    are merged into new ones, so the stages' own are left as they are."""

    def __init__(self, stages: list[nn.Module]):
        super().__init__()
        for stage in stages:
            for name, p in stage.named_parameters(recurse=False):
                self.register_parameter(name, p)
            for name, child in stage.named_children():
                if isinstance(child, nn.ModuleDict):
                    if name not in self._modules:
                        self.add_module(name, nn.ModuleDict())
                    self._modules[name].update(child)
                else:
                    if name in self._modules and self._modules[name] is not child:
                        raise UserError(f"--pp: two stages on one rank both hold a {name!r}; "
                                        f"give the copies of a tied weight to different ranks")
                    self.add_module(name, child)


@dataclass
class Pipeline:
    """What `build` resolved: the engine reads these (module docstring)."""

    model: Held  # this rank's parameters
    stages: list[nn.Module]  # this rank's stage modules, in stage order (parallelized in place)
    forward_backward: Callable[[Any, list], None]  # run.forward_backward
    evaluate_loss: Callable  # run.evaluate_loss: (forward, batch) -> (loss, metrics)
    counted: list[nn.Parameter]  # for the gradient's norm: a tied weight's later copies left out
    group: Any  # the pipeline's ProcessGroup (the norm's squares are summed over it)
    microbatches: int
    first: bool
    last: bool


def attach(run, model: nn.Module, world, cfg, checkpoint: tuple[str, ...] = (),
           tp_plan: dict | None = None) -> nn.Module:
    """The engine's --pp: `build` over the mesh's "pp" dimension, each stage parallelized over
    the mesh's "tp" and "dp" dimensions as the whole model would be without a pipeline, then the
    run's step and evaluation from it; returns the module that holds this rank's parameters (the
    run's model: optimizer, checkpoints). The stages run eagerly: config validation refuses
    --compile and --cuda-graphs with --pp."""
    from fasttrain.engine import distributed

    def wrap(stage: nn.Module) -> nn.Module:
        # torchtitan's order, stage by stage once cut: tensor parallel over mesh["tp"] →
        # activation checkpointing → DDP / fully_shard over mesh["dp"] (distributed.parallelize,
        # the one order of every layout). Its no_sync is not needed: the schedule itself keeps
        # DDP and FSDP from reducing before a step's last backward.
        forward, _ = distributed.parallelize(
            stage, world, activation_checkpointing=cfg.activation_checkpointing, compile=False,
            cuda_graphs=False, checkpoint=checkpoint, tp_plan=stage_plan(stage, tp_plan))
        return forward

    pipe = build(run, model, world.mesh["pp"], cfg, wrap,
                 dp_group=world.mesh["dp"].get_group() if world.dp_size > 1 else None)
    run.forward_backward, run.evaluate_loss = pipe.forward_backward, pipe.evaluate_loss
    run.pipeline = pipe  # switches.clipper takes its counted parameters and group
    return pipe.model


def stage_plan(stage: nn.Module, plan: dict | None) -> dict | None:
    """The entries of a tensor-parallel plan dict (names relative to the whole model, `*`
    allowed per component, as parallelize_module matches them) that name a module of `stage`:
    the other stages' modules are not here, and parallelize_module would warn about each."""
    from fasttrain.engine.tensor_parallel import resolves

    if plan is None:
        return None
    return {k: v for k, v in plan.items() if resolves(stage, k)}


def build(run, model: nn.Module, group, cfg,
          wrap: Callable[[nn.Module], nn.Module] | None = None, dp_group=None) -> Pipeline:
    """Cut `model` (the whole model, the same initial weights on every rank) for this rank of
    `group` (a ProcessGroup, or a 1-D DeviceMesh: the pipeline dimension), and build the
    schedule. Reads cfg.pp, pp_schedule, pp_microbatches and precision, and the run's device,
    autocast, loss_fn, metrics, compute_loss and batches.micro/accum.

    `wrap(stage) -> module` parallelizes each of this rank's stages before the schedule sees
    it (torchtitan's order: split, then tensor parallel / activation checkpointing / FSDP or
    DDP per stage; the stage's collectives then run inside the schedule, which knows FSDP and
    DDP modules and reduces their gradients once per step). It must parallelize in place
    (parallelize_module, checkpointing, fully_shard) and may return a wrapper (DDP): the
    stage modules keep holding the parameters the schedule trains."""
    if hasattr(group, "get_group"):
        group = group.get_group()
    pp, rank = dist.get_world_size(group), dist.get_rank(group)
    if getattr(run.compute_loss, "step", None) is not None:
        raise UserError("--pp computes the loss on the last stage from the model's output: it "
                        "takes the default (input, target) step, not --step; drop one of them")
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    virtual = VIRTUAL[cfg.pp_schedule]
    n = pp * virtual
    every = _cut(model, n)
    index = [rank + k * pp for k in range(virtual)]
    mine = [every[i] for i in index]
    for r in range(pp):  # a clash refused on every rank alike, before any collective (no hang)
        Held([every[r + k * pp] for k in range(virtual)])
    m = microbatches(cfg, run.batches.micro * run.batches.accum)
    dev, loss_fn = run.device, run.loss_fn
    first, last = index[0] == 0, index[-1] == n - 1
    last_rank = dist.get_global_rank(group, pp - 1)
    # Tied weights and copies found by name on the whole model, before wrapping renames modules
    # (checkpointing) or swaps parameters (tensor parallel, FSDP); kept as (module, attribute),
    # which survive both, and read back after.
    shared, later = _copies(every, index)
    del every  # the other ranks' stages: their parameters are freed with `model`

    forwards = [wrap(s) for s in mine] if wrap is not None else mine
    held = Held(mine)
    skip = {id(getattr(owner, attr)) for owner, attr in later}
    counted = [p for p in held.parameters() if id(p) not in skip]
    tied = _tied(shared, dev, group)
    stages = [PipelineStage(s, i, n, dev, group=group)
              for s, i in zip(forwards, index, strict=True)]

    def scaled_loss(output, target):
        # What the schedule runs backward from: fp16's GradScaler scale (the identity unless
        # fp16). torch also calls it once on placeholder tensors to infer the gradients' shapes.
        return run.scaler.scale(loss_fn(output, target))

    if virtual > 1:
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=scaled_loss, scale_grads=True)
    else:
        cls = ScheduleGPipe if cfg.pp_schedule == "gpipe" else Schedule1F1B
        schedule = cls(stages[0], m, loss_fn=scaled_loss, scale_grads=True)

    # Roles resolved once: the first stage feeds inputs, the last takes targets and keeps the
    # loss; a middle rank only relays activations and gradients.
    def feed(x: torch.Tensor) -> tuple:
        return (x,) if first else ()

    def forward_backward(run, micro_batches: list) -> None:
        # The step's micro-batches as one batch [accum·micro, ...]; the schedule re-cuts it
        # into its m micro-batches (the same samples: a step's gradient is unchanged).
        x = torch.cat([b[0] for b in micro_batches])
        y = torch.cat([b[1] for b in micro_batches]) if last else None
        losses: list[torch.Tensor] = []  # the last stage's scaled micro-batch losses
        with run.autocast:
            schedule.step(*feed(x), target=y, losses=losses, return_outputs=False)
        tied()  # after the schedule's last backward: DDP/FSDP have reduced over dp by then
        if losses:  # the last stage: the step's loss (mean over its micro-batches) × pp
            loss = torch.stack(losses).detach().float().mean() * pp
            # Unscaled on the device (no sync): the scale is a power of two, so this is exact.
            run.loss_sum += loss / run.scaler._scale if run.scaler.is_enabled() else loss

    evaluate_loss = _evaluator(run, mine, index, n, group, last_rank, last, dp_group)
    return Pipeline(held, mine, forward_backward, evaluate_loss, counted, group, m, first, last)


def _owner(stage: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return stage.get_submodule(path), attr


def _copies(every: list[nn.Module], index: list[int]
            ) -> tuple[dict[str, tuple | None], list[tuple]]:
    """({name of a tied weight: (module, attribute) of this rank's copy, or None}, the
    (module, attribute) of this rank's copies whose name an earlier stage holds too: left out
    of the gradient's norm, so that each of the model's parameters counts once)."""
    holders: dict[str, list[int]] = {}
    for i, stage in enumerate(every):
        for name, _ in stage.named_parameters():
            holders.setdefault(name, []).append(i)
    shared = {name: next((_owner(every[i], name) for i in index if i in stages), None)
              for name, stages in sorted(holders.items()) if len(stages) > 1}
    later = [_owner(every[i], name) for i in index for name, _ in every[i].named_parameters()
             if holders[name][0] != i]
    return shared, later


def _tied(shared: dict[str, tuple | None], dev: torch.device, group) -> Callable[[], None]:
    """The function that sums, over the pipeline group and in place, the gradients of the
    copies of each tied weight (`shared`: name -> this rank's copy as (module, attribute), or
    None). Under FSDP or tensor parallelism a copy is a DTensor: the local shards are summed,
    which is the sum of the whole gradients only if every copy is split alike (checked here,
    once: the same line on every rank). A rank without a copy sends zeros of the copies' local
    shape: an all-reduce needs every rank of the group."""
    from torch.distributed.tensor import DTensor

    if not shared:
        return lambda: None

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t  # a view: reduced in place

    held = {k: getattr(*owner) for k, owner in shared.items() if owner is not None}
    split = {k: (tuple(local(p).shape), p.dtype,
                 str(p.placements) if isinstance(p, DTensor) else "whole")
             for k, p in held.items()}
    seen: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(seen, split, group=group)
    kinds = {k: split_alike(k, seen) for k in shared}  # the same verdict on every rank
    zeros = {k: torch.zeros(kinds[k][0], dtype=kinds[k][1], device=dev)
             for k in shared if k not in held}

    def tie() -> None:
        for k in shared:  # the same order on every rank (sorted names)
            grad = local(_as_param(held[k])) if k in held else zeros[k].zero_()
            dist.all_reduce(grad, group=group)
    return tie


def _as_param(p: torch.Tensor) -> torch.Tensor:
    """p.grad laid out as p is. A DTensor's gradient may come back in another placement (a
    vocab-sharded embedding's lookup returns it Replicate): redistributed to the parameter's
    (Replicate → Shard is a local slice, no communication), so the local shards that are
    summed are the same rows on every copy."""
    from torch.distributed.tensor import DTensor

    g = p.grad
    if isinstance(g, DTensor) and g.placements != p.placements:
        p.grad = g = g.redistribute(p.device_mesh, p.placements)
    return g


def split_alike(name: str, seen: list[dict[str, tuple]]) -> tuple:
    """(local shape, dtype, placements) of the copies of tied weight `name`, from what each
    pipeline rank holds (`seen`: one dict per rank, without `name` where the rank holds no copy);
    a UserError if the copies are split differently (their local shards do not match)."""
    kinds = sorted({s[name] for s in seen if name in s}, key=str)
    if len(kinds) > 1:
        raise UserError(f"--pp: the weight {name!r} is tied across pipeline stages and split "
                        f"differently on them ({kinds[0][2]} vs {kinds[1][2]}); give every copy "
                        f"the same tensor-parallel plan, or untie it in the model")
    return kinds[0]


def _evaluator(run, mine: list[nn.Module], index: list[int], n: int, group, last_rank: int,
               last: bool, dp_group=None) -> Callable:
    """run.evaluate_loss under --pp: (forward, batch) -> (loss, metrics), forward-only through
    the stages (`schedule.eval`, one micro-batch: nothing to overlap without a backward), the
    loss and metrics computed on the last stage from its output and broadcast over the
    pipeline group, so every rank returns the same values (`forward` is unused: no rank holds
    the whole model). Evaluation batches may differ in size (the last one of a split): a stage
    learns its neighbours' activation shapes on its first pass, so each batch shape gets its
    own stages and schedule, built on first use (the same modules, no copy). With data-parallel
    peers (`dp_group`), each batch is padded to the largest of the dp group's (an all-reduce of
    its size; the padding's outputs dropped before the loss): the dp ranks' shares of a split
    differ by a sample, and a new shape's stages run a forward to infer shapes, which under
    FSDP all-gathers over dp: on a rank that met one shape more than its peer, evaluation hung
    (gpt on tinyshakespeare, --pp 2 --parallel fsdp on 4 processes, torch 2.13)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe, ScheduleLoopedBFS

    names = list(run.metrics)
    made: dict[tuple, Any] = {}
    first = index[0] == 0

    def schedule(shape: tuple):
        if shape not in made:
            stages = [PipelineStage(s, i, n, run.device, group=group)
                      for s, i in zip(mine, index, strict=True)]
            made[shape] = (ScheduleGPipe(stages[0], 1) if len(stages) == 1
                           else ScheduleLoopedBFS(stages, 1))
        return made[shape]

    def evaluate_loss(_forward, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x, y = batch
        rows = len(x)
        if dp_group is not None:
            size = torch.tensor([rows], device=run.device)
            dist.all_reduce(size, op=dist.ReduceOp.MAX, group=dp_group)
            pad = int(size) - rows  # sync: evaluation only
            x = torch.cat([x, x[:1].expand(pad, *x.shape[1:])]) if pad else x
        with run.autocast:
            out = schedule(tuple(x.shape)).eval(*((x,) if first else ()))
        if last:
            out = out[:rows].float()
            values = torch.stack([run.loss_fn(out, y).float(),
                                  *(torch.as_tensor(run.metrics[k](out, y), device=out.device)
                                    .float() for k in names)])
        else:
            values = torch.zeros(1 + len(names), device=run.device)
        dist.broadcast(values, src=last_rank, group=group)
        return values[0], dict(zip(names, values[1:], strict=True))
    return evaluate_loss

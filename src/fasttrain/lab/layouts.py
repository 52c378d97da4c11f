"""Per-rank memory of a parallel layout (data × tensor × pipeline), and its two costs: the
pipeline bubble and tensor-parallel traffic. `fasttrain memory --tp/--pp/--parallel --gpus`
prints the rows (lab/memory.predict_layout builds the one-process Run they start from);
lab/layout_choice.py, behind `experiment scaling`, takes the costs. engine/mesh.py lays out the
real ranks.

    lay = layout(gpus=4, tp=2, pp=1, parallel="fsdp")
    rows = per_rank(run.model, run.opt, activations, lay, accum=1)   # one row per rank role

What each dimension divides, per parameter — exact, because the shapes are the engine's own:
- tensor parallel: the model's plan (its `parallelize(tp_mesh)`, or a tp_plan dict) applied by
  engine/tensor_parallel.apply to a meta-device copy, in a one-process group of tp ranks on
  torch's "fake" backend (its testing backend: collectives do nothing, DTensor shapes are
  real). Shapes are tp rank 0's, the largest where a split is uneven (torch.chunk rounds up).
  What the plan leaves alone (gpt: the position table, LayerNorms, row-wise layers' biases)
  stays whole.
- pipeline: the model's `pipeline_split`, cut as engine/pipeline.split cuts it; a pipeline rank
  holds its stages' parameters by name (gpt's last stage: its own copy of the tied embedding).
- data: fsdp shards dim 0 of every (local) parameter again over dp, rank 0's chunk; zero1 gives
  each parameter's optimizer state, whole, to one dp rank (ZeroRedundancyOptimizer's greedy
  partition: largest first, per group, onto the least loaded rank; the heaviest rank is shown);
  ddp and none replicate.
Gradients: one per trainable parameter, in its local shape and dtype. Optimizer state: counted
on the one-process Run after a real step, per parameter: tensors of the parameter's shape
(AdamW's two moments) scale with its local shard, the others (the 0-dim step counter) stay whole.

Activations: the one-process count for one micro-batch of a data-parallel rank (lab/memory:
tensors saved for backward, weight copies included) × the share of it a tp rank keeps
(lab/tp_saved: counted on a copy of the model split by its plan over a fake group; not 1 / tp,
since each column-wise linear saves its whole input and what the plan leaves alone is whole on
every rank). Equal to each gloo rank's count for gpt and a user's plain plan. Under a pipeline
the same count is taken stage by stage (`stage_activations`: the model cut as the pipeline cuts it,
run stage after stage; gpt's last stage holds the logits and the loss's), scaled from the
accumulation micro-batch to the pipeline's (the rank's batch ÷ m), times the chunks the schedule
keeps in flight on pipeline rank r: gpipe m; 1f1b min(m, pp − r) (the first stage pp);
interleaved-1f1b min(m·v, (v − 1)·pp + 2(pp − 1 − r) + 1) (torch's warm-up forwards, then one more
before the first backward), of the mean of r's v stages; under pp × tp each stage's count is
its tp rank's (lab/tp_saved.tp_stage_saved: the stages split over a fake group).

Costs: the bubble, (p − 1)/(m + p − 1) of a pipeline step idle (gpipe and 1f1b alike;
interleaving v chunks per rank: (p − 1)/(v·m + p − 1)); tensor parallel: per block, 2
all-reduces forward and 2 backward of the [B, T, C] activation at the autocast precision, so
4 · n_layer · B·T·C · bytes all-reduced per step, each rank sending 2(tp − 1)/tp of it (ring).
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import asdict, dataclass
from types import SimpleNamespace

import torch
from torch import nn

from fasttrain.engine.mesh import Layout as Mesh
from fasttrain.engine.mesh import check_data_mode
from fasttrain.errors import UserError

DATA_MODES = ("none", "ddp", "fsdp", "zero1")  # how the data-parallel ranks hold the state


@dataclass(frozen=True)
class Layout:
    tp: int = 1
    pp: int = 1
    dp: int = 1
    data: str = "none"  # DATA_MODES: --parallel of the data-parallel dimension
    schedule: str = "1f1b"  # --pp-schedule
    microbatches: int = 1  # pipeline micro-batches per step (pp > 1)

    @property
    def gpus(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def virtual(self) -> int:
        """Stage chunks per pipeline rank (interleaved-1f1b: 2, as engine/pipeline.py)."""
        from fasttrain.engine.pipeline import VIRTUAL

        return VIRTUAL[self.schedule] if self.pp > 1 else 1

    def __str__(self) -> str:
        parts = [f"dp {self.dp}" + (f" {self.data}" if self.dp > 1 else ""), f"tp {self.tp}",
                 f"pp {self.pp}" + (f" {self.schedule}, m {self.microbatches}"
                                    if self.pp > 1 else "")]
        return " × ".join(parts)


def layout(gpus: int, tp: int = 1, pp: int = 1, parallel: str = "none", schedule: str = "1f1b",
           microbatches: int = 0, rank_batch: int | None = None) -> Layout:
    """The layout of `gpus` ranks under --tp/--pp: dp takes what tp × pp leave; `microbatches`
    as --pp-microbatches (0: 2 × pp), checked against `rank_batch` (a dp rank's samples per
    step) as the engine checks it."""
    if min(gpus, tp, pp) < 1:
        raise UserError(f"--gpus, --tp and --pp must be ≥ 1, got {gpus}, {tp}, {pp}")
    if gpus % (tp * pp):
        raise UserError(f"--gpus {gpus} is not a multiple of --tp {tp} × --pp {pp} = {tp * pp}; "
                        f"the ranks left over by tp × pp form the data-parallel dimension")
    if parallel not in DATA_MODES:
        raise UserError(f"--parallel {parallel}: a layout's data-parallel dimension is one of "
                        f"{', '.join(DATA_MODES)}")
    dp = gpus // (tp * pp)
    if dp > 1 and parallel == "none":
        raise UserError(f"--gpus {gpus} leaves {dp} data-parallel groups of --tp {tp} × --pp "
                        f"{pp}: say how they hold the state, --parallel "
                        + ("ddp, fsdp or zero1" if tp * pp == 1 else "fsdp"))
    check_data_mode(parallel, Mesh(pp=pp, dp=dp, tp=tp))  # the engine's own rules
    m = 1
    if pp > 1:
        from fasttrain.engine.pipeline import microbatches as schedule_microbatches

        cfg = SimpleNamespace(pp=pp, pp_microbatches=microbatches, pp_schedule=schedule)
        m = schedule_microbatches(cfg, rank_batch if rank_batch is not None
                                  else (microbatches or 2 * pp))
    return Layout(tp=tp, pp=pp, dp=dp, data=parallel, schedule=schedule, microbatches=m)


@dataclass(frozen=True)
class RankMemory:
    """Predicted bytes on one rank of a role (the heaviest where the role's ranks differ)."""

    role: str
    ranks: int  # how many ranks of the layout play this role
    params: int
    grads: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


# -- what one rank holds -------------------------------------------------------------------------


def meta_copy(model: nn.Module, meta: bool = True) -> nn.Module:
    """`model` with every parameter and buffer on the meta device (shapes, dtypes, ties and
    requires_grad kept; no bytes copied), activation checkpointing's wrappers taken off: the
    plans and cuts below address the model as built (the engine splits it before wrapping).
    `meta=False`: the same copy with its tensors copied where they are (lab/tp_saved runs it)."""
    from fasttrain.models import Checkpointed

    memo: dict[int, torch.Tensor] = {}
    for t in [*model.parameters(), *model.buffers()]:
        if meta and id(t) not in memo:
            m = t.detach().to("meta")
            memo[id(t)] = nn.Parameter(m, t.requires_grad) if isinstance(t, nn.Parameter) else m
    meta = copy.deepcopy(model, memo)
    for parent in list(meta.modules()):
        for key, child in list(parent.named_children()):
            if isinstance(child, Checkpointed):
                parent.register_module(key, child.inner)
    return meta


def plain_name(model: nn.Module):
    """name → the same parameter's name without activation checkpointing's wrapper component
    (torch's CheckpointWrapper: `_checkpoint_wrapped_module.`), for `model`'s names (the names
    `meta_copy` keeps)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import _CHECKPOINT_PREFIX

    def plain(name: str) -> str:
        return name.replace(_CHECKPOINT_PREFIX, "")
    return plain


@contextlib.contextmanager
def fake_mesh(size: int, device_type: str = "cpu"):
    """A 1-D DeviceMesh of `size` ranks in this one process (torch's fake backend), rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    try:  # importing it registers torch's "fake" backend
        from torch.testing._internal.distributed.fake_pg import FakeStore
    except ImportError as e:
        raise UserError(f"torch {torch.__version__} lacks torch.testing._internal.distributed."
                        f"fake_pg (its testing package), whose fake backend `fasttrain memory "
                        f"--tp/--pp` needs to lay out the tensor-parallel shards: install a "
                        f"torch build that ships torch.testing") from e
    if dist.is_initialized():
        raise UserError("the layout prediction runs in one process: run it without torchrun")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=size)
    try:
        yield init_device_mesh(device_type, (size,), mesh_dim_names=("tp",))
    finally:
        dist.destroy_process_group()


def tp_shapes(model: nn.Module, tp: int, plan: dict | None = None) -> dict[str, torch.Size]:
    """name → the shape tp rank 0 holds, after the model's plan splits a meta copy over tp
    ranks (the same refusals as training: no plan, heads not dividing, ...)."""
    model = meta_copy(model)
    if tp > 1:
        from fasttrain.engine import tensor_parallel

        with fake_mesh(tp) as mesh:
            tensor_parallel.apply(model, mesh, plan)
    return {n: p.to_local().shape if hasattr(p, "to_local") else p.shape
            for n, p in model.named_parameters()}


def stage_names(model: nn.Module, pp: int, virtual: int = 1) -> list[list[str]]:
    """The parameter names each pipeline rank holds, its stages' union (a meta copy is cut)."""
    meta = meta_copy(model)
    if pp == 1:
        return [[n for n, _ in meta.named_parameters()]]
    from fasttrain.engine.pipeline import split

    return [list(dict.fromkeys(n for s in split(meta, r, pp, virtual)
                               for n, _ in s.named_parameters())) for r in range(pp)]


def stage_activations(run, micro_batch, n_stages: int) -> list[int]:
    """Bytes each of `n_stages` pipeline stages of the run's model saves for backward on one
    micro-batch (under the run's autocast; the last stage also the loss's), each storage once
    per stage, parameters and buffers aside: lab/bytecount's count, cut where the pipeline cuts.
    The default (input, target) step, as under --pp. Leaves the run as it found it."""
    from fasttrain.lab.bytecount import left_as_found, saved_bytes

    model = run.model
    stage_names(model, n_stages)  # the engine's refusals (no split points, too many stages)
    stages = model.pipeline_split(n_stages)
    owned = [t for m in (model, *stages) for t in (*m.parameters(), *m.buffers())]
    running = [0]  # the stage whose forward is running: its part of the count

    def forward() -> torch.Tensor:
        x, y = micro_batch
        with run.autocast:
            for running[0], stage in enumerate(stages):
                x = stage(x)
            return run.loss_fn(x, y)

    with left_as_found(model, run.device):
        _, saved = saved_bytes(forward, owned, part=lambda t: running[0])
    return [saved.parts.get(i, 0) for i in range(len(stages))]


@dataclass(frozen=True)
class State:
    """One parameter's optimizer state, counted on a one-process run after a real step."""

    per_element: int  # bytes per element of the state tensors shaped like the parameter
    fixed: int  # bytes of the others (0-dim step counters), whole on every rank that steps it
    group: int  # its optimizer param group (ZeRO-1 partitions group by group)


def optimizer_state(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, State]:
    """name (as `meta_copy` names it) → its State."""
    plain = plain_name(model)
    names = {id(p): plain(n) for n, p in model.named_parameters()}
    out = {}
    for g, group in enumerate(opt.param_groups):
        for p in group["params"]:
            tensors = [t for t in opt.state.get(p, {}).values() if torch.is_tensor(t)]
            sized = sum(t.nbytes for t in tensors if t.shape == p.shape)
            out[names[id(p)]] = State(sized // max(p.numel(), 1),
                                      sum(t.nbytes for t in tensors if t.shape != p.shape), g)
    return out


def _fsdp_shard(shape: torch.Size, dp: int) -> int:
    """Elements of rank 0's FSDP2 shard: dim 0 chunked over dp (torch.chunk rounds up)."""
    if not shape:
        return 1
    return -(-shape[0] // dp) * (shape.numel() // max(shape[0], 1))


def _zero1_heaviest(numels: dict[str, int], state: dict[str, State], dp: int) -> int:
    """Optimizer bytes of the heaviest rank under ZeroRedundancyOptimizer's partition: per
    param group, parameters largest first, each to the rank with the fewest elements so far."""
    sizes, held = [0] * dp, [0] * dp
    for g in sorted({s.group for n, s in state.items() if n in numels}):
        group = sorted((n for n, s in state.items() if s.group == g and n in numels),
                       key=lambda n: numels[n], reverse=True)
        for n in group:
            r = sizes.index(min(sizes))
            sizes[r] += numels[n]
            held[r] += state[n].per_element * numels[n] + state[n].fixed
    return max(held)


def _in_flight(lay: Layout, r: int) -> int:
    """Stage chunks whose activations pipeline rank `r` holds at once (module docstring)."""
    m, pp, v = lay.microbatches, lay.pp, lay.virtual
    if lay.schedule == "gpipe":
        return m
    if v > 1:
        return min(m * v, (v - 1) * pp + 2 * (pp - 1 - r) + 1)
    return min(m, pp - r)


def _role(r: int, pp: int) -> str:
    if pp == 1:
        return "every rank"
    return f"pipeline rank {r} ({'first' if r == 0 else 'last' if r == pp - 1 else 'middle'})"


def per_rank(model: nn.Module, opt: torch.optim.Optimizer, activations: list[int], lay: Layout,
             accum: int = 1, tp_plan: dict | None = None,
             tp_share: list[float] | None = None) -> list[RankMemory]:
    """One row per pipeline rank (one row without a pipeline): the bytes a rank of that role
    holds. `model` and `opt`: a one-process Run's, after a step; `activations`: what that Run
    saves for backward on one micro-batch of a data-parallel rank (`accum` of them per step),
    per stage of the lay.pp × lay.virtual the pipeline cuts (`stage_activations`), or one
    figure without a pipeline; `tp_share`: the fraction of each that a tp rank keeps
    (lab/tp_saved; default 1 / tp, which no plan reaches)."""
    shares = tp_share if tp_share is not None else [1 / lay.tp] * len(activations)
    activations = [a * s for a, s in zip(activations, shares, strict=True)]
    shapes = tp_shapes(model, lay.tp, tp_plan)
    state = optimizer_state(model, opt)
    plain = plain_name(model)
    itemsize = {plain(n): p.element_size() for n, p in model.named_parameters()}
    trainable = {plain(n) for n, p in model.named_parameters() if p.requires_grad}
    rows = []
    for r, names in enumerate(stage_names(model, lay.pp, lay.virtual)):
        numel = {n: (_fsdp_shard(shapes[n], lay.dp) if lay.data == "fsdp"
                     else shapes[n].numel()) for n in names}
        params = sum(numel[n] * itemsize[n] for n in names)
        grads = sum(numel[n] * itemsize[n] for n in names if n in trainable)
        stepped = {n: k for n, k in numel.items() if n in state}
        if lay.data == "zero1" and lay.dp > 1:
            optimizer = _zero1_heaviest(stepped, state, lay.dp)
        else:
            optimizer = sum(state[n].per_element * k + state[n].fixed for n, k in stepped.items())
        if lay.pp == 1:
            act = round(activations[0])
        else:  # a chunk: one pipeline micro-batch (rank batch / m) through one of r's stages
            mine = activations[r::lay.pp]
            chunk = sum(mine) / len(mine) * accum / lay.microbatches
            act = int(chunk * _in_flight(lay, r))
        rows.append(RankMemory(_role(r, lay.pp), lay.tp * lay.dp, params, grads, optimizer, act))
    return rows


# -- costs ---------------------------------------------------------------------------------------


def bubble(pp: int, microbatches: int, virtual: int = 1) -> float:
    """Fraction of a pipeline step spent idle: (p − 1)/(v·m + p − 1); v = 1 for gpipe/1f1b."""
    if pp <= 1:
        return 0.0
    return (pp - 1) / (virtual * microbatches + pp - 1)


def tp_volume(tp: int, n_layer: int, tokens: int, d_model: int, bytes_per_value: int = 4) -> int:
    """Bytes all-reduced per step by tensor parallelism: 4 all-reduces per block (2 forward,
    2 backward) of the [tokens, d_model] activation, tokens = batch × sequence of one tp group
    (sequence parallel's all-gather + reduce-scatter pairs move what one all-reduce does). Left
    out: gpt's ends under loss parallel, the embedding's reduce-scatter and the head's
    all-gather with their backward, 2 more of the same size: +2 / (4 · n_layer) of the total."""
    return 0 if tp <= 1 else 4 * n_layer * tokens * d_model * bytes_per_value


def tp_bytes_sent(tp: int, n_layer: int, tokens: int, d_model: int,
                  bytes_per_value: int = 4) -> int:
    """Bytes each rank sends per step for those all-reduces: 2(tp − 1)/tp of each (ring)."""
    return tp_volume(tp, n_layer, tokens, d_model, bytes_per_value) * 2 * (tp - 1) // max(tp, 1)

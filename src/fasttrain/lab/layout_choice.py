"""Which layout for a model on N GPUs: each candidate's memory per GPU and step time, and the
pick, with its reason in figures. `fasttrain experiment scaling --predict-only` prints it; the
bubble and tensor-parallel traffic are lab/layouts.py's, the ring and DDP-bucket model
lab/scaling.py's.

    m = model_of(SPECS[-1])               # gpt-13b: parameters, FLOPs, saved bytes (meta)
    ib = link("ib-ndr", 5)
    rows = candidates(m, 8, 2, 1, link("nvlink4", 5), ib, 0.4, 989e12, 3e-4, 80 * 2**30)
    best, reason = pick(rows, 80 * 2**30, ib)  # or choose("gpt-13b", 1, m, ...): a row of both

A model of yours (`--model pkg.module:factory`) is described by lab/configured.py from one real
step counted here; it has no gpt fields, so only ddp and fsdp are its candidates, and `left_out`
says why tensor and pipeline parallelism are not (no plan, or a plan whose traffic this model
does not know).

The rule is the one docs/distributed.md gives — data parallel while everything fits one GPU,
FSDP when it does not, tensor parallel inside a node when even one sample per micro-batch does
not fit sharded, a pipeline across nodes — and the pick is the first layout of that order that
fits, unless a tensor-parallel or pipeline one that fits is predicted 10% faster or more: a
pipeline across nodes trades the data-parallel traffic over the slow link for the bubble;
tensor parallelism divides each rank's gradients, hence that traffic, by tp.

Candidates (tp × pp × dp = N; tp ≤ GPUs per node and dividing the heads; pp = the number of
nodes, stages across nodes, each node a tp × dp block): ddp, fsdp, fsdp × tp, and with 2+
nodes pp × fsdp (× tp). TP and PP only for gpt (the bundled model with a plan and split points,
whose blocks the traffic below counts); every other model's row says why in `left_out`.
Per candidate, with G = the spec's batch per GPU × N the global batch (as for the DDP rows):
  memory   16 B per parameter — fp32 weights and gradients, AdamW's two moments — ÷ tp·pp, and
           ÷ dp more under FSDP (embeddings counted as split: see `fasttrain memory` for exact
           shards); plus activations a_tp·μ: a_tp = bytes one tp rank saves for backward per
           sample, counted on the meta device in fp32 (bf16 autocast keeps about half: an upper
           bound) on the model split by its plan over a fake group of tp ranks (`saved_bytes`,
           lab/tp_saved's count, attention as its fused kernel saves it: gpt-13b keeps 0.56 of
           its activations at tp 2, 0.34 at 4, 0.23 at 8, not 1/tp — its layer norms,
           residual stream and the column-wise layers' inputs stay whole), μ the micro-batch
           per data-parallel rank, the largest power of 2 that fits in 90% of the GPU (the rest
           of G/dp accumulated). Under 1F1B the first stage keeps pp micro-batches of 1/pp of
           the layers in flight: a_tp·μ again. No fit at μ = 1: the layout is out.
  time     compute: the step's FLOPs ÷ N ÷ (MFU × peak), at least the floor; data parallel: the
           fp32 gradients of a rank's shard (4P/(tp·pp) B) overlapped with backward as DDP's
           buckets are (scaling.step_time), over the inter-node link when dp spans nodes, and
           FSDP's exposed part 1.5× DDP's (two all-gathers and a reduce-scatter); tensor
           parallel: 4 all-reduces per block (2 forward, 2 backward) of the tp group's
           G/dp × T × C activation in bf16 (lab/layouts.tp_volume), ring over the intra-node
           link, not overlapped; pipeline: that step ÷ (1 − bubble), m = G/dp/μ micro-batches
           (μ capped so that m ≥ 2·pp), plus each boundary's activations and their gradients,
           2 × G/dp × T × C × 2 B, over the inter-node link.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from fasttrain.lab import layouts
from fasttrain.lab.scaling import Link, Spec, allreduce_s, count, step_time

STATE_BYTES = 16  # per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments
ACT_BYTES = 2  # bf16: the activations tensor parallelism all-reduces and stages send
USABLE = 0.9  # of the GPU's memory: CUDA context, workspaces, fragmentation
FASTER = 0.9  # another layout replaces the rule's first fit only at ≤ this × its step time
TPS = (2, 4, 8, 16, 32)  # tensor-parallel degrees a candidate may take (≤ GPUs per node)


@dataclass(frozen=True)
class Model:
    """What the layout model needs of a spec: counted once, on the meta device."""

    params: int
    flops_per_sample: float  # forward + backward
    saved_per_sample: int  # bytes saved for backward, fp32
    n_layer: int = 0  # gpt only (0: no tensor-parallel plan or split points)
    n_head: int = 0
    n_embd: int = 0
    seq: int = 0
    # the layouts not among the candidates, and why: (("tp", "..."), ("pp", "...")); () for gpt
    left_out: tuple[tuple[str, str], ...] = ()
    # (tp, bytes tp rank 0 saves per sample), counted on the model split by its plan (gpt)
    saved_tp: tuple[tuple[int, int], ...] = ()

    def saved_on_rank(self, tp: int) -> float:
        """Bytes per sample one of `tp` ranks saves for backward: counted on the split model
        where it was (`saved_tp`), else 1/tp of the whole — which no plan reaches (a floor)."""
        return dict(self.saved_tp).get(tp, self.saved_per_sample / tp)


def left_out_of(module: torch.nn.Module) -> tuple[tuple[str, str], ...]:
    """Why tensor and pipeline parallelism are not candidates for `module`: it has no plan (what
    --tp and --pp need: engine/tensor_parallel.py, engine/pipeline.py), or its plan is its own,
    whose traffic and stages the model here does not know (it counts gpt's blocks)."""
    from fasttrain.models.gpt import GPT

    if isinstance(module, GPT):
        return ()
    name, out = type(module).__name__, []
    for layout, hook, flag in (("tp", "parallelize(tp_mesh)", "--tp"),
                               ("pp", "pipeline_split(n_stages)", "--pp")):
        if not callable(getattr(module, hook.split("(")[0], None)):
            out.append((layout, f"{name} has no {hook}, which {flag} needs"))
        else:
            out.append((layout, f"{name}.{hook}'s traffic is not modelled (gpt's only); "
                                f"`fasttrain memory --gpus W {flag} N` gives its memory per rank"))
    return tuple(out)


def gpt_shape(module: torch.nn.Module, seq: int) -> dict:
    """The gpt fields of Model for a built gpt at sequence length `seq`; {} for any other."""
    from fasttrain.models.gpt import GPT

    if not isinstance(module, GPT):
        return {}
    return dict(n_layer=len(module.blocks), n_head=module.blocks[0].attn.n_head,
                n_embd=module.wte.embedding_dim, seq=seq)


class _FusedAttention(TorchFunctionMode):
    """Attention on the meta device as a GPU (or a CPU) computes it: the fused kernel, which
    saves its output and the rows' logsumexp [B, h, T], where the meta device takes the math
    path and saves the whole [B, h, T, T] of weights (gpt-13b at 2048 tokens: 27 GB a sample
    of the 58 it counted). Where torch lacks the CPU's fused op, the math path stays."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
        if func is not F.scaled_dot_product_attention or op is None or (
                len(args) > 3 or set(kwargs) - {"dropout_p", "is_causal"}):
            return func(*args, **kwargs)
        return op(*args, kwargs.get("dropout_p", 0.0), kwargs.get("is_causal", False))[0]


def saved_bytes(spec: Spec, tp: int = 1) -> int:
    """Bytes one forward and loss of `spec` at its batch save for backward (parameters
    excluded), on the meta device: each storage once (a view shares its base's), no memory
    used; attention as its fused kernel saves it (`_FusedAttention`). `tp` > 1: on tp rank 0
    of the model split by its plan as the engine splits it (gpt's
    own parallelize, its logits' loss parallel) over a fake group of tp ranks, a DTensor's
    storages its local shard's: lab/tp_saved's count, here without a built Run, so that sizes
    no CPU could build are counted too."""
    from torch.distributed.tensor.parallel import loss_parallel

    from fasttrain.engine import tensor_parallel
    from fasttrain.lab import bytecount
    from fasttrain.lab.layouts import fake_mesh
    from fasttrain.models import build_model

    with torch.device("meta"):
        model = build_model(spec.model, in_shape=spec.in_shape, num_classes=spec.classes,
                            **spec.options)
        shape = (spec.batch, *spec.in_shape)
        x = (torch.randint(0, spec.classes, shape) if spec.model == "gpt"
             else torch.rand(shape))

    def forward() -> torch.Tensor:
        logits = model(x)
        y = torch.zeros(logits.shape[:-1], dtype=torch.long, device="meta")
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    def count() -> int:
        with _FusedAttention():
            _, saved = bytecount.saved_bytes(forward, owned=model.parameters())
        return sum(saved.parts.values())

    if tp == 1:
        return count()
    with fake_mesh(tp) as mesh:
        tensor_parallel.apply(model, mesh, loss_parallel=True)
        with loss_parallel():
            return count()


def model_of(spec: Spec) -> Model:
    """`spec` counted on the meta device; for gpt, its saved bytes per sample on a tp rank too,
    for every tp a candidate may take (dividing the heads)."""
    from fasttrain.models import build_model

    params, flops = count(spec)
    with torch.device("meta"):
        module = build_model(spec.model, in_shape=spec.in_shape, num_classes=spec.classes,
                             **spec.options)
    shape = gpt_shape(module, spec.in_shape[0])
    tps = [t for t in TPS if shape and not shape["n_head"] % t]
    return Model(params, flops / spec.batch, saved_bytes(spec) // spec.batch, **shape,
                 left_out=left_out_of(module),
                 saved_tp=tuple((t, saved_bytes(spec, t) // spec.batch) for t in tps))


@dataclass(frozen=True)
class Candidate:
    layout: str  # "ddp", "fsdp", "fsdp × tp 4", "pp 2 × fsdp × tp 8"
    tp: int
    pp: int
    dp: int
    fits: bool
    micro_batch: int  # per data-parallel rank (a pipeline's micro-batch); 0: no fit
    memory: int  # bytes per GPU at that micro-batch (at 1 when nothing fits)
    state: int  # of it: weights, gradients, optimizer state
    compute_s: float
    dp_exposed_s: float
    tp_s: float
    tp_bytes: int  # all-reduced per step per tp group (layouts.tp_volume)
    bubble: float
    p2p_s: float
    step_s: float


def _candidate(m: Model, data: str, tp: int, pp: int, n: int, per_node: int, batch: int,
               intra: Link, inter: Link, mfu: float, peak: float, floor_s: float,
               gpu_bytes: int) -> Candidate:
    dp = n // (tp * pp)
    rank_batch = batch * n // dp  # samples per data-parallel rank per step
    state = STATE_BYTES * m.params // (tp * pp) // (dp if data == "fsdp" else 1)
    usable = USABLE * gpu_bytes
    micro = 0
    top = rank_batch if pp == 1 else max(1, rank_batch // (2 * pp))
    mu = 1
    saved = m.saved_on_rank(tp)  # per sample, on one of the tp ranks
    while mu <= top and state + saved * mu <= usable:
        micro, mu = mu, 2 * mu
    memory = int(state + saved * max(micro, 1))
    compute = max(m.flops_per_sample * batch / (peak * mfu), floor_s)  # G/N samples per GPU
    spans_nodes = pp == 1 and n > per_node  # dp × tp fills a node, then the next
    ring = step_time(compute, 4 * m.params // (tp * pp), dp, inter if spans_nodes else intra)
    dp_exposed = ring["exposed_s"] * (1.5 if data == "fsdp" else 1)
    tokens = rank_batch * m.seq
    volume = layouts.tp_volume(tp, m.n_layer // pp, tokens, m.n_embd, ACT_BYTES)
    calls = 4 * (m.n_layer // pp)  # all-reduces per step, each of volume / calls bytes
    tp_s = calls * allreduce_s(volume / calls, tp, intra) if tp > 1 else 0.0
    bubble = layouts.bubble(pp, rank_batch // max(micro, 1)) if pp > 1 else 0.0
    p2p = (2 * tokens * m.n_embd * ACT_BYTES / inter.bandwidth) if pp > 1 else 0.0
    step = (compute + dp_exposed + tp_s) / (1 - bubble) + p2p
    name = " × ".join([*([f"pp {pp}"] if pp > 1 else []), data,
                       *([f"tp {tp}"] if tp > 1 else [])])
    return Candidate(name, tp, pp, dp, micro > 0, micro, memory, state, compute, dp_exposed,
                     tp_s, volume, bubble, p2p, step)


def candidates(m: Model, per_node: int, nodes: int, batch: int, intra: Link, inter: Link,
               mfu: float, peak: float, floor_s: float, gpu_bytes: int) -> list[Candidate]:
    """Every layout of the rule's order for `m` on nodes × per_node GPUs (module docstring)."""
    n = per_node * nodes
    tps = [t for t in TPS if m.n_head and t <= per_node and not m.n_head % t
           and not per_node % t]
    shapes = [("ddp", 1, 1), ("fsdp", 1, 1), *(("fsdp", t, 1) for t in tps)]
    if nodes > 1 and m.n_layer >= nodes:
        shapes += [("fsdp", t, nodes) for t in (1, *tps)]
    return [_candidate(m, data, tp, pp, n, per_node, batch, intra, inter, mfu, peak, floor_s,
                       gpu_bytes) for data, tp, pp in shapes]


def _gib(n: float) -> str:
    """Bytes in binary units, three significant digits (as report.fmt_bytes writes them)."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} B"


def pick(rows: list[Candidate], gpu_bytes: int, inter: Link) -> tuple[Candidate | None, str]:
    """The first candidate of the rule's order that fits, unless a tensor-parallel or pipeline
    one that fits is predicted at least 10% faster (the model is not finer than that); and
    why, in figures."""
    usable = USABLE * gpu_bytes
    fitting = [r for r in rows if r.fits]
    if not fitting:
        least = min(rows, key=lambda r: r.memory)
        return None, (f"nothing fits {_gib(usable)}: the least, {least.layout}, needs "
                      f"{_gib(least.memory)} at one sample per micro-batch; try activation "
                      f"checkpointing, bf16 activations or more GPUs")
    first = next(r for r in rows if r.fits)  # rows are in the rule's order, pipelines last
    best = min((r for r in fitting if r.tp * r.pp > 1), key=lambda r: r.step_s, default=first)
    if best.step_s > FASTER * first.step_s:
        best = first
    ddp, fsdp = rows[0], rows[1]
    if best is ddp:
        why = (f"the whole model, its gradients and AdamW state ({_gib(ddp.state)}) and "
               f"micro-batch {ddp.micro_batch} fit one GPU: one all-reduce per step, "
               f"{1e3 * ddp.dp_exposed_s:.3g} ms of it exposed")
    elif best is first and best is fsdp:
        why = (f"DDP needs {_gib(ddp.memory)} per GPU, over {_gib(usable)}; FSDP shards the "
               f"state to {_gib(fsdp.state)}")
    elif best is first:
        how = (f"{best.layout} cuts the layers into {best.pp} stages across nodes, for a "
               f"{best.bubble:.0%} bubble" if best.pp > 1 else
               f"tp {best.tp} splits the activations inside a node, for "
               f"{1e3 * best.tp_s:.3g} ms of all-reduces per step")
        why = (f"FSDP still needs {_gib(fsdp.memory)} per GPU at one sample per micro-batch; "
               f"{how}")
    elif best.pp > 1:
        why = (f"{1e3 * best.step_s:.3g} ms a step against {1e3 * first.step_s:.3g} ms for "
               f"{first.layout}, the first that fits: stages across the {best.pp} nodes keep "
               f"the data-parallel traffic inside them ({1e3 * first.dp_exposed_s:.3g} ms "
               f"exposed on {inter.name} → {1e3 * best.dp_exposed_s:.3g} ms) for a "
               f"{best.bubble:.0%} bubble")
    else:
        why = (f"{1e3 * best.step_s:.3g} ms a step against {1e3 * first.step_s:.3g} ms for "
               f"{first.layout}, the first that fits: tp {best.tp} divides each rank's "
               f"gradients, hence the data-parallel traffic ({1e3 * first.dp_exposed_s:.3g} → "
               f"{1e3 * best.dp_exposed_s:.3g} ms exposed), for {1e3 * best.tp_s:.3g} ms of "
               f"all-reduces inside the node")
    return best, why


def choose(label: str, batch: int, m: Model, per_node: int, nodes: int, intra: Link,
           inter: Link, mfu: float, peak: float, floor_s: float, gpu_bytes: int) -> dict:
    """One row of `experiment scaling`'s layout table for the model `label` at `batch` samples
    per GPU: every candidate, the pick and why, and the layouts left out and why."""
    rows = candidates(m, per_node, nodes, batch, intra, inter, mfu, peak, floor_s, gpu_bytes)
    best, why = pick(rows, gpu_bytes, inter)
    return {"model": label, "params": m.params, "batch_per_gpu": batch,
            "gpus": per_node * nodes, "nodes": nodes, "interconnect": (inter if nodes > 1
                                                                       else intra).name,
            "gpu_memory": gpu_bytes, "saved_per_sample": m.saved_per_sample,
            "saved_per_sample_tp": dict(m.saved_tp),
            "pick": asdict(best) if best else None, "reason": why,
            "candidates": [asdict(r) for r in rows], "left_out": dict(m.left_out)}

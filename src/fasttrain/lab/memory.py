"""The memory model of one training step: where its bytes go, part by part, beside the measured
peak. `fasttrain memory` and `fasttrain plan` print it (fasttrain.commands); this module is the
model and its measurement only, the bytes counted by lab/bytecount.py.

    b = predict(TrainConfig(model="cnn", batch_size=64, precision="bf16"))   # builds the Run
    b = measure(run)                      # a Run of yours: one warm-up step, then the count
    b.predicted_peak, b.to_dict()
    b, rows, one = predict_layout(cfg, layouts.layout(8, tp=2, parallel="fsdp"))  # per rank

The parts (bytes, exact for this model and these switches; on CUDA each tensor is rounded up to the
caching allocator's 512-byte blocks, as `max_memory_allocated` counts them):

  weights        parameters and buffers
  gradients      one per trainable parameter, in its dtype (fp32 under autocast as well)
  optimizer      the optimizer's state after one real step (AdamW: 2 fp32 tensors per parameter,
                 SGD with momentum: 1); the 0-dim step counters are left out (4 bytes each)
  activations    unique storages saved for backward by one micro-batch, counted with
                 `saved_tensors_hooks` in the dtype the switches give (bf16 autocast saves bf16;
                 checkpointed blocks keep only their inputs)
  weight copies  half-precision casts of weights that autocast saves for backward (part of the
                 saved tensors, shown apart: the course lab's "FP16 copy")
  inputs         the step's micro-batches, where no layer saved them already
  data           the dataset resident on an accelerator (0 on the CPU: host memory either way)
  workspace      CUDA only, measured: what stays allocated after a warm-up step beyond the parts
                 above — cuBLAS/cuBLASLt workspaces (8–32 MiB per stream), scalars
  conv workspace CUDA only, probed: the largest scratch one convolution call takes and gives
                 back (cuDNN's algorithm workspace), each convolution run alone at its shape,
                 dtype and math mode (lab/conv_workspace.py) — not the step's peak fed back
  step temp      the optimizer step's temporaries (foreach AdamW: one fp32 copy of the weights)

    predicted peak = weights + optimizer + data + workspace + inputs + gradients
                     + max(activations + weight copies + conv workspace, step temp)

because activations die during backward while gradients are born, a convolution's workspace
lives only inside its call (one at a time), and the optimizer's temporaries exist only after all
of them. The measured peak is `torch.cuda.max_memory_allocated` around one full step after the
warm-up (reset before it): the steady state. The warm-up step's own peak (lazy optimizer state,
cuDNN's plans, `cudnn.benchmark`'s trial workspaces when a user turns it on) is reported apart as
`first_step_peak`, not compared. On the CPU the allocator keeps no statistics, so the "measured"
peak there is the hook-based count: weights + gradients + optimizer + saved tensors + inputs.
What the prediction cannot see on CUDA: the gradients of activations alive together during
backward, and up to 1 MiB per large block that the allocator hands out unsplit (it runs a few %
low for that); counted for CUDA on a CPU (`plan`), the conv workspace as well (nothing to probe).
It aims at 10% of the measured peak.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from fasttrain.engine.loop import endless_batches, step
from fasttrain.engine.tree import leaves
from fasttrain.lab import layouts, tp_saved
from fasttrain.lab.bytecount import (
    alloc,
    count_saved,
    optimizer_bytes,
    resident_data,
    step_temp,
    storages,
    total_bytes,
)
from fasttrain.lab.conv_workspace import conv_workspace
from fasttrain.lab.layouts import Layout, RankMemory

if TYPE_CHECKING:
    from torch import nn

    from fasttrain.engine.config import TrainConfig
    from fasttrain.engine.run import Run

_WARMUP_MAX = 8  # fp16: steps skipped by the GradScaler (overflow) create no optimizer state


@dataclass
class Breakdown:
    """One step's memory, part by part (bytes), the measured peak, and the course lab's formula."""

    device: str
    precision: str
    optimizer_name: str
    momentum: float
    batch_size: int
    micro_batch: int
    params: int  # distinct parameters (a count, not bytes)
    weights: int
    gradients: int
    optimizer: int
    activations: int
    weight_copies: int
    inputs: int
    data: int
    workspace: int
    step_temp: int
    activations_fp32: int  # the same micro-batch counted without autocast: the formula's input
    measured_peak: int | None  # None: counted for another device than the run's (plan)
    measured_by: str
    conv_workspace: int = 0  # CUDA: the largest per-call convolution workspace, probed
    first_step_peak: int | None = None  # CUDA: the warm-up step's peak, apart from the steady one

    @property
    def predicted_peak(self) -> int:
        return (self.weights + self.optimizer + self.data + self.workspace + self.inputs
                + self.gradients + max(self.activations + self.weight_copies
                                       + self.conv_workspace, self.step_temp))

    @property
    def error(self) -> float | None:
        """(predicted − measured) / measured; None where nothing was measured."""
        if self.measured_peak is None:
            return None
        return (self.predicted_peak - self.measured_peak) / max(self.measured_peak, 1)

    def lab_formula(self) -> dict[str, dict[str, int]]:
        """The course lab's "weights + gradients + optimizer + activations" for this model, fp32 and
        mixed precision as its ResNet-50 example counts them: mixed keeps fp32 master weights plus
        a half copy, half gradients, fp32 optimizer state, and half the fp32 activations. (PyTorch
        autocast in fact keeps fp32 gradients and casts only what matmuls and convolutions use.)"""
        P = self.params
        per_param = {"adamw": 8, "sgd": 4 if self.momentum else 0}.get(self.optimizer_name, 8)
        fp32 = {"weights": 4 * P, "weight_copies": 0, "gradients": 4 * P,
                "optimizer": per_param * P, "activations": self.activations_fp32}
        mixed = {"weights": 4 * P, "weight_copies": 2 * P, "gradients": 2 * P,
                 "optimizer": per_param * P, "activations": self.activations_fp32 // 2}
        return {name: {**parts, "total": sum(parts.values())}
                for name, parts in (("fp32", fp32), ("mixed", mixed))}

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "predicted_peak": self.predicted_peak,
                "error": self.error, "lab_formula": self.lab_formula()}


def breakdown(run: Run, micro_batches: list, measured_peak: int | None = None,
              workspace: int = 0, device_type: str | None = None,
              first_step_peak: int | None = None) -> Breakdown:
    """The parts for a run that has taken at least one step (so its optimizer state exists).
    Without `measured_peak` (the CPU), the hook-based count stands in for the measurement.

    `device_type` (default: the run's device) is the device the bytes are counted for: "cuda"
    counts a CPU run's tensors as a GPU would hold them — 512-byte allocator blocks, foreach
    optimizer temporaries, the dataset resident when the run keeps it on its device — which is
    how `plan` predicts a GPU it does not have. What a CPU run cannot see stays out: workspaces
    (give `workspace`), and autocast's choice of ops, which differs between CPU and CUDA."""
    from fasttrain.models import param_count

    cfg, dev = run.cfg, run.device
    device_type = device_type or dev.type
    cuda = device_type == "cuda"
    model = run.model
    count = count_saved(run, micro_batches[0], device_type=device_type)
    fp32 = count if cfg.precision in ("fp32", "tf32") else count_saved(
        run, micro_batches[0], contextlib.nullcontext(), device_type)
    inputs = {p: n for p, n in storages(leaves(micro_batches)).items()
              if p not in count.storages}
    parts = dict(
        weights=total_bytes([*model.parameters(), *model.buffers()], cuda),
        gradients=count.gradients,
        optimizer=optimizer_bytes(run.opt, cuda),
        activations=count.activations,
        weight_copies=count.weight_copies,
        inputs=sum(alloc(n, cuda) for n in inputs.values()),
        data=resident_data(run, device_type),
        workspace=workspace,
        step_temp=step_temp(run, device_type),
    )
    if device_type != dev.type:
        # Counted for a device this run is not on (plan: CUDA from a CPU): this run's hook
        # count lacks what that device adds (the resident dataset, 512-byte blocks), so beside
        # the prediction it would read as the model's error (+227% for plan's cnn).
        measured_peak, how = None, f"not measured: counted for {device_type} on {dev}"
    elif measured_peak is None:
        measured_peak = sum(parts[k] for k in ("weights", "gradients", "optimizer",
                                               "activations", "weight_copies", "inputs"))
        how = ("hook count (CPU: the allocator keeps no statistics): weights + gradients + "
               "optimizer state + tensors saved for backward + inputs")
    else:
        how = "torch.cuda.max_memory_allocated around one full step after the warm-up"
    # Probed after the peak was read: the probe resets the allocator's peak statistics.
    parts["conv_workspace"] = (conv_workspace(run, micro_batches[0])
                               if cuda and dev.type == "cuda" else 0)
    where = str(dev) if device_type == dev.type else f"{device_type} (counted on {dev})"
    return Breakdown(device=where, precision=cfg.precision, optimizer_name=cfg.optimizer,
                     momentum=cfg.momentum, batch_size=cfg.batch_size, micro_batch=cfg.micro_batch,
                     params=param_count(model),
                     activations_fp32=fp32.activations + fp32.weight_copies,
                     measured_peak=measured_peak, measured_by=how,
                     first_step_peak=first_step_peak, **parts)


def measure(run: Run, batches: Iterator[list] | None = None,
            device_type: str | None = None) -> Breakdown:
    """Warm up (one step, or more while fp16 skips them), then — on CUDA — measure one full
    step's peak, then count the parts (for `device_type`, see `breakdown`). Consumes its steps
    from `batches` (default: the run's own, from its first epoch)."""
    batches = batches if batches is not None else endless_batches(run)
    dev = run.device
    cuda = dev.type == "cuda"
    micro_batches = next(batches)
    if cuda:
        torch.cuda.reset_peak_memory_stats(dev)  # the warm-up's own peak, reported apart
    for _ in range(_WARMUP_MAX):
        scale = run.scaler.get_scale() if run.scaler.is_enabled() else None
        step(run, micro_batches)
        if scale is None or run.scaler.get_scale() >= scale:  # a step that was not skipped
            break
    if not cuda:
        return breakdown(run, micro_batches, device_type=device_type)
    torch.cuda.synchronize(dev)
    first = torch.cuda.max_memory_allocated(dev)
    resident = (total_bytes([*run.model.parameters(), *run.model.buffers()], True)
                + optimizer_bytes(run.opt, True) + resident_data(run, "cuda")
                + total_bytes(leaves(micro_batches), True))
    # Gradients were freed by the warm-up step (set_to_none): what is left beyond the known
    # residents is cuBLAS workspaces and small state.
    workspace = max(0, torch.cuda.memory_allocated(dev) - resident)
    torch.cuda.reset_peak_memory_stats(dev)
    step(run, micro_batches)
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    return breakdown(run, micro_batches, measured_peak=peak, workspace=workspace,
                     first_step_peak=first)


def predict(cfg: TrainConfig, model: nn.Module | str | None = None, data=None, *,
            loss=None, device_type: str | None = None) -> Breakdown:
    """The breakdown of one step for `cfg`, with `model`, `data` and `loss` injected where given
    (as `fasttrain.engine.build` takes them): builds the Run on the configured device, measures
    it (`measure`), and lets it go before returning. `device_type` as for `breakdown`."""
    return on_run(cfg, model, data, loss, lambda run: measure(run, device_type=device_type))


def predict_layout(cfg: TrainConfig, lay: Layout, model: nn.Module | str | None = None,
                   data=None, *, loss=None, tp_plan: dict | None = None,
                   ) -> tuple[Breakdown, list[RankMemory], RankMemory]:
    """`predict` for one process of `cfg` — whose batch is ONE data-parallel rank's — and, from
    that Run after its step, the bytes each rank role of `lay` holds (lab/layouts.per_rank):
    parameters, gradients and optimizer state exactly, activations as a tp rank saves them
    (lab/tp_saved) and as the pipeline schedule keeps them (estimated there); last,
    the same parts for that one process (the layout's point of comparison)."""
    def both(run: Run) -> tuple[Breakdown, list[RankMemory], RankMemory]:
        b = measure(run)
        act = [b.activations + b.weight_copies]
        n_stages = lay.pp * lay.virtual
        if lay.pp > 1 or lay.tp > 1:
            micro_batch = next(endless_batches(run))[0]
        if lay.pp > 1:  # the same count, stage by stage
            act = layouts.stage_activations(run, micro_batch, n_stages)
        # What a tp rank keeps of each, counted on the model split over tp (lab/tp_saved).
        shares = None
        if lay.tp > 1 and lay.pp > 1:
            mine = tp_saved.tp_stage_saved(run, micro_batch, lay.tp, n_stages, tp_plan)
            shares = [m / a if a else 1 / lay.tp for m, a in zip(mine, act, strict=True)]
        elif lay.tp > 1:
            shares = [tp_saved.tp_share(run, micro_batch, lay.tp, tp_plan)]
        rows = layouts.per_rank(run.model, run.opt, act, lay, cfg.accum_steps, tp_plan, shares)
        (one,) = layouts.per_rank(run.model, run.opt, [b.activations + b.weight_copies],
                                  Layout(), cfg.accum_steps)
        # not the global batch: one process at the batch one data-parallel rank takes
        return b, rows, dataclasses.replace(one, role=f"one process, batch {cfg.batch_size}")
    return on_run(cfg, model, data, loss, both)


def on_run(cfg: TrainConfig, model, data, loss, fn):
    """fn(the Run of cfg, with `model`, `data` and `loss` injected where given), then the Run let
    go before returning (`free_memory`)."""
    from fasttrain.engine.run import build

    run = build(cfg, model=model, data=data, loss=loss, verbose=False)
    try:
        with users_code(run):
            return fn(run)
    finally:
        del run
        free_memory()


@contextlib.contextmanager
def users_code(run: Run) -> Iterator[None]:
    """Around the lab's real steps of `run`: an exception raised in the user's own code (their
    model, loss, step) leaves as `train`'s does (engine/usercode.explain: their frames and one
    line naming the callable, exit 1), not as fasttrain's and torch's traceback; any other
    exception (an internal error, out of memory, bad input) passes unchanged."""
    from fasttrain.engine import usercode

    try:
        yield
    except Exception as e:
        explained = usercode.explain(run, e, None)
        if explained is e:
            raise
        raise explained from None


def free_memory() -> None:
    """Return what a finished Run held: compiled code (which references the module it traced),
    Python references (a Run holds reference cycles), then the allocator's cached blocks."""
    torch.compiler.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()

"""Counting a training step's bytes: distinct storages, the tensors one forward saves for
backward, optimizer state and temporaries, the resident dataset. lab/memory.py adds the counts
up into its breakdown; lab/layouts.py and lab/layout_choice.py count with them per rank.

    loss, saved = saved_bytes(lambda: loss_of(model, x), owned=model.parameters())
    saved.parts, saved.storages           # bytes per part, every storage saved
    count_saved(run, micro_batch)         # a Run's forward/backward: activations, weight copies

On CUDA each storage is rounded up to the caching allocator's 512-byte blocks, as
`max_memory_allocated` counts them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from fasttrain.engine.run import Run

BLOCK = 512  # the CUDA caching allocator's rounding: every block is a multiple of 512 bytes


def alloc(nbytes: int, cuda: bool) -> int:
    """What one storage of `nbytes` costs the device (512-byte blocks on CUDA)."""
    if not cuda or nbytes == 0:
        return nbytes
    return -(-nbytes // BLOCK) * BLOCK


def storage_key(t: torch.Tensor) -> int:
    """The identity of `t`'s storage (views share their base's): its address. On the meta device
    every storage's address is 0, so there it is the storage object itself (`_cdata`: torch has
    no public handle for it). A DTensor's is its local shard's (lab/tp_saved counts a tp rank's)."""
    s = getattr(t, "_local_tensor", t).untyped_storage()
    return s._cdata if s.device.type == "meta" else s.data_ptr()


def _nbytes(t: torch.Tensor) -> int:
    return getattr(t, "_local_tensor", t).untyped_storage().nbytes()


def storages(tensors) -> dict[int, int]:
    """storage_key → bytes of the distinct storages under `tensors`."""
    out: dict[int, int] = {}
    for t in tensors:
        if torch.is_tensor(t):
            out.setdefault(storage_key(t), _nbytes(t))
    return out


def total_bytes(tensors, cuda: bool) -> int:
    return sum(alloc(n, cuda) for n in storages(tensors).values())


@dataclass(frozen=True)
class SavedCount:
    """Bytes saved for backward by one forward (`saved_bytes`)."""

    parts: dict[Hashable, int]  # part → bytes of its storages, each rounded up to the block
    storages: frozenset[int]  # storage_key of every storage saved, in any part


def saved_bytes(run_forward: Callable[[], object], owned: Iterable[torch.Tensor] = (),
                block: int = 1, part: Callable[[torch.Tensor], Hashable] = lambda t: None,
                ) -> tuple[object, SavedCount]:
    """Run `run_forward()` (a forward, and its loss) under `saved_tensors_hooks`, counting every
    storage it saves for backward once per part (`part(t)` names a saved tensor's; default: one
    part), the storages of `owned` (parameters, buffers: counted apart) left out, each rounded up
    to `block` bytes (CUDA's allocator: 512). Returns what `run_forward` returned (the loss, for
    a backward outside the hooks: its recomputation under checkpointing saves nothing new) and
    the count. Counting changes nothing that is saved: each tensor is kept as a detached view of
    its own storage (autograd restores its grad_fn on unpack). Kept as is, a saved output would
    hold its own grad_fn, a cycle through C++ that no gc.collect() breaks: a forward that no
    backward follows (an out-of-memory error, or a count of the forward alone) would keep its
    whole graph allocated for good (pytorch/pytorch#189025)."""
    skip = {storage_key(t) for t in owned}
    seen: dict[tuple[Hashable, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key not in skip:
            seen.setdefault((part(t), key), _nbytes(t))
        return t.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run_forward()
    parts: dict[Hashable, int] = {}
    for (name, _), nbytes in seen.items():
        parts[name] = parts.get(name, 0) + -(-nbytes // block) * block
    return out, SavedCount(parts, frozenset(key for _, key in seen))


@dataclass(frozen=True)
class Saved:
    """What one micro-batch's forward/backward keeps: bytes, and the storages it saved."""

    activations: int
    weight_copies: int
    gradients: int
    storages: frozenset[int]


def _is_weight_cast(t: torch.Tensor, params: set[int]) -> bool:
    """True for autocast's half copy of a parameter (or a view of one, e.g. its transpose)."""
    base = t._base if t._base is not None else t
    fn = base.grad_fn
    if fn is None or fn.name() != "ToCopyBackward0":
        return False
    return any(id(getattr(n, "variable", None)) in params for n, _ in fn.next_functions if n)


@contextlib.contextmanager
def left_as_found(model: torch.nn.Module, device: torch.device) -> Iterator[None]:
    """Inside: an extra forward/backward that must not change the run. Its random draws (dropout)
    come from a forked stream, and `model`'s buffers (BatchNorm statistics) are put back after.
    The gradients are the caller's to clear."""
    buffers = [(b, b.clone()) for b in model.buffers()]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        yield
    with torch.no_grad():
        for b, value in buffers:
            b.copy_(value)


def count_saved(run: Run, micro_batch, autocast=None, device_type: str | None = None) -> Saved:
    """Run one forward/backward of `micro_batch` as `step` would (autocast, loss
    scaling), counting every storage saved for backward once, parameters excluded (they are
    `weights`), in bytes as `device_type` (default: the run's device) would hold them. Leaves the
    run as it found it: no gradients, same buffers, same RNG stream."""
    model, dev = run.model, run.device
    cuda = (device_type or dev.type) == "cuda"
    params = {id(p) for p in model.parameters()}
    copy: dict[int, bool] = {}  # storage → a weight copy or not, as the first tensor saving it is

    def part(t: torch.Tensor) -> bool:
        key = storage_key(t)
        if key not in copy:
            copy[key] = _is_weight_cast(t, params)
        return copy[key]

    # CUDA graphs replay from a static memory pool and do not run hooks: count on the eager
    # module, which saves the same tensors (compile's fusions aside).
    forward = run.model if run.cfg.cuda_graphs else run.forward
    autocast = autocast if autocast is not None else run.autocast

    def forward_loss() -> torch.Tensor:
        with autocast:
            return run.compute_loss(forward, micro_batch)[0] / run.cfg.accum_steps

    with left_as_found(model, dev):
        loss, saved = saved_bytes(forward_loss, [*model.parameters(), *model.buffers()],
                                  BLOCK if cuda else 1, part)
        run.scaler.scale(loss).backward()
        grads = total_bytes([p.grad for p in model.parameters() if p.grad is not None], cuda)
        del loss
        run.opt.zero_grad(set_to_none=True)
    return Saved(saved.parts.get(False, 0), saved.parts.get(True, 0), grads, saved.storages)


def optimizer_bytes(opt: torch.optim.Optimizer, cuda: bool) -> int:
    # 0-dim tensors are the step counters: host-side unless fused/capturable, 4 bytes each.
    return total_bytes([t for s in opt.state.values() for t in s.values()
                   if torch.is_tensor(t) and t.dim() > 0], cuda)


def step_temp(run: Run, device_type: str) -> int:
    """Bytes the optimizer allocates during its step (see torch/optim/adam.py, sgd.py): foreach
    AdamW makes one fp32 temporary per parameter (sqrt of the second moment); SGD only with
    weight decay (grad + wd·w). Fused kernels make none; the CPU's per-tensor loop one at a time."""
    cfg = run.cfg
    if cfg.fused_optimizer or not (cfg.optimizer == "adamw" or cfg.weight_decay > 0):
        return 0
    sizes = [alloc(p.nbytes, device_type == "cuda") for p in run.model.parameters()
             if p.requires_grad]
    if not sizes:
        return 0
    foreach = device_type in ("cuda", "xpu")  # torch's foreach kernels: not on the CPU
    return sum(sizes) if foreach else max(sizes)


def resident_data(run: Run, device_type: str | None = None) -> int:
    """Bytes of the dataset kept on an accelerator of `device_type` (default: the run's; 0 on the
    CPU, whose memory is the host's either way, or on the DataLoader path)."""
    device_type = device_type or run.device.type
    b = run.batches
    if device_type == "cpu" or not b.on_device:
        return 0
    return total_bytes([b.train.x, b.train.y, b.test.x, b.test.y,
                   getattr(b.train, "offsets", None), getattr(b.test, "offsets", None)],
                  device_type == "cuda")

"""The largest per-call workspace of the model's convolutions, probed one convolution at a time
on the device: a part of `fasttrain memory`'s prediction (fasttrain.lab.memory).

cuDNN's convolution algorithms take a scratch workspace for the length of one call, allocated
through PyTorch's caching allocator and freed when the call returns: it never shows in
`memory_allocated` between ops, yet it is part of `max_memory_allocated`. PyTorch tries the
algorithms in the order cuDNN's heuristics give (or, with `torch.backends.cudnn.benchmark`, the
fastest it timed) and takes the first whose workspace it can allocate (pytorch/pytorch#49207),
so the size depends on shape, dtype and math mode. The first H100 run (torch 2.11, cuDNN 9.19,
benchmarks/results/2026-11-26-*-memory-prediction.json) showed what leaving it out costs: fp32
convolutions (TF32 off, as --precision fp32 sets) peaked 91 MB (cnn, batch 128) and 247 MB
(resnet, batch 128) above the other parts, a gap that grows faster than the batch, while bf16
(tensor-core algorithms) and the convolution-free gpt stayed within 10%.

    probe = conv_workspace(run, micro_batch)   # bytes: the largest per-call transient

Each distinct convolution of one forward (module, input shape/strides/dtype, whether its input
needs a gradient) is run alone, forward then backward, twice (the first call may autotune or
build cuDNN's plan: the second is what every step pays), and its transient is what the
allocator's peak rose beyond the call's own outputs. Only one convolution runs at a time, so the
step's peak holds at most the largest. CUDA only: 0 elsewhere (no cuDNN, nothing to probe).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from fasttrain.lab.bytecount import alloc

if TYPE_CHECKING:
    from fasttrain.engine.run import Run

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}  # what autocast runs convolutions in


def _alloc(t: torch.Tensor | None) -> int:
    """What `t`'s storage costs the caching allocator (as lab/bytecount counts every tensor)."""
    return 0 if t is None else alloc(t.untyped_storage().nbytes(), cuda=True)


def conv_calls(run: Run, micro_batch) -> list[tuple[nn.Module, tuple, tuple, torch.dtype, bool]]:
    """The distinct convolution calls of one forward of `micro_batch` on the eager module, as
    (module, input shape, input strides, input dtype, input needs a gradient). Leaves the run as
    it found it: same buffers (BatchNorm statistics), same RNG stream, no gradients."""
    model, dev = run.model, run.device
    found: dict[tuple, tuple] = {}

    def record(module: nn.Module, args: tuple) -> None:
        x = args[0]
        key = (id(module), tuple(x.shape), x.stride(), x.dtype, x.requires_grad)
        found.setdefault(key, (module, *key[1:]))

    handles = [m.register_forward_pre_hook(record) for m in model.modules()
               if isinstance(m, _CONVS)]
    if not handles:
        return []
    buffers = [(b, b.clone()) for b in model.buffers()]
    try:
        with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), run.autocast:
            run.compute_loss(model, micro_batch)  # the graph is dropped unused
    finally:
        for h in handles:
            h.remove()
        with torch.no_grad():
            for b, value in buffers:
                b.copy_(value)
    return list(found.values())


def probe(module: nn.Module, shape: tuple, stride: tuple, dtype: torch.dtype, needs_grad: bool,
          compute: torch.dtype | None = None) -> int:
    """Bytes one call of `module` on such an input holds beyond its outputs, forward or backward,
    whichever is more (the steady state: the second of two calls). `compute`: the dtype autocast
    runs it in (None: the input's). The weights are cast beforehand, as autocast's weight copies
    are counted apart."""
    dev = module.weight.device
    dt = compute or dtype
    x = torch.empty_strided(shape, stride, dtype=dt, device=dev).normal_()
    x.requires_grad_(needs_grad)
    w = module.weight.detach().to(dt).requires_grad_(module.weight.requires_grad)
    b = None if module.bias is None else module.bias.detach().to(dt).requires_grad_(
        module.bias.requires_grad)
    wants = [t for t in (x, w, b) if t is not None and t.requires_grad]
    most = 0
    for _ in range(2):
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        y = module._conv_forward(x, w, b)
        torch.cuda.synchronize(dev)
        forward = torch.cuda.max_memory_allocated(dev) - base - _alloc(y)
        g = torch.ones_like(y)
        backward = 0
        if wants:
            base = torch.cuda.memory_allocated(dev)
            torch.cuda.reset_peak_memory_stats(dev)
            grads = torch.autograd.grad(y, wants, g)
            torch.cuda.synchronize(dev)
            backward = (torch.cuda.max_memory_allocated(dev) - base
                        - sum(_alloc(t) for t in grads))
            del grads
        del y, g
        most = max(forward, backward, 0)  # the last call's: the one every step pays
    return most


def conv_workspace(run: Run, micro_batch) -> int:
    """The largest per-call convolution transient of `run`'s model (bytes); 0 off CUDA or without
    convolutions. Resets the allocator's peak statistics: read the measured peak before."""
    if run.device.type != "cuda":
        return 0
    calls = conv_calls(run, micro_batch)
    if not calls:
        return 0
    compute = _LOW.get(run.cfg.precision)
    seen: dict[tuple, int] = {}
    for module, shape, stride, dtype, needs_grad in calls:
        key = (_layer_key(module), shape, stride, dtype, needs_grad)
        if key not in seen:
            seen[key] = probe(module, shape, stride, dtype, needs_grad, compute)
    return max(seen.values())


def _layer_key(m: nn.Module) -> tuple:
    """What decides a convolution's algorithm besides its input: its shape and options."""
    w = m.weight
    return (type(m), tuple(w.shape), w.stride(), m.stride, m.padding, m.dilation, m.groups,
            m.bias is not None, m.padding_mode)

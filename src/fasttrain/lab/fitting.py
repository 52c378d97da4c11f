"""Will a training step fit on a GPU, and with which switch: the memory one GPU needs
(`fasttrain.lab.memory.predict`'s breakdown, plus DDP's gradient buckets, or FSDP's shards), the
largest micro-batch that fits, and the switches tried in order when the step as given does not
(bf16, activation checkpointing, accumulation, the three together, FSDP over more GPUs), each
verified by predicting with it. `fasttrain plan` asks it for every GPU of its catalogue.

The predictions count one real step of the model on this machine's CPU, as CUDA would hold its
tensors: a model too big for this machine's memory is refused in one line.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from fasttrain.errors import UserError
from fasttrain.lab import cost, steptime

MARGIN = 0.1  # of the card's memory, kept free: CUDA context, cuDNN workspaces, fragmentation
ACCUM = (2, 4, 8)
FSDP = (2, 4, 8)


class Models:
    """Predictions for one configuration and its switched variants, each made once."""

    def __init__(self, task):
        self.task, self._mem, self._work = task, {}, {}

    def memory(self, cfg):
        from fasttrain.lab import memory

        key = repr(cfg)
        if key not in self._mem:
            self._mem[key] = _on_this_host(cfg, lambda: memory.predict(
                cfg, data=self.task, device_type="cuda"))
        return self._mem[key]

    def work(self, cfg) -> steptime.StepWork:
        key = repr(cfg)
        if key not in self._work:
            # counted as CUDA runs it: the optimizer's foreach path (steptime.count_run)
            self._work[key] = _on_this_host(cfg, lambda: steptime.count(
                cfg, data=self.task, foreach=True))
        return self._work[key]


def _on_this_host(cfg, count):
    """`count()`, which runs one real step of the model on this machine's CPU: a model too big
    for this machine's memory is one line, not the allocator's traceback."""
    try:
        return count()
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "allocate memory" not in str(e):
            raise
        raise UserError(f"plan counts one real step of the model here, and at batch "
                        f"{cfg.batch_size} it does not fit in this machine's memory; plan a "
                        f"smaller --batch-size (the memory per sample is linear: the "
                        f"'largest batch' column extrapolates it), or run plan on a machine "
                        f"with more memory") from None


def need(b, n_dp: int) -> int:
    """Bytes one GPU needs: the breakdown's peak, plus DDP's gradient buckets (one more copy of
    the gradients) when it runs data parallel."""
    return b.predicted_peak + (b.gradients if n_dp > 1 else 0)


def fsdp_need(b, k: int) -> int:
    """One of k FSDP GPUs: its 1/k of weights, gradients, optimizer state and step temporaries
    (sharded), the whole of the activations and inputs of its micro-batch."""
    sharded = b.weights + b.gradients + b.optimizer + b.step_temp
    return (sharded // k + b.activations + b.weight_copies + b.conv_workspace + b.inputs + b.data
            + b.workspace)


def largest_micro(models: Models, cfg, usable: int) -> tuple[int, int, int]:
    """The largest micro-batch whose predicted need fits `usable`, extrapolated from the peaks
    at micro-batches m and 2m: (largest, bytes at m, bytes per sample)."""
    m = cfg.micro_batch
    p1 = models.memory(cfg).predicted_peak
    p2 = models.memory(dataclasses.replace(cfg, batch_size=2 * cfg.batch_size)).predicted_peak
    per_sample = max((p2 - p1) / m, 1e-9)
    fixed = p1 - per_sample * m
    return max(0, int((usable - fixed) // per_sample)), p1, int(per_sample)


class Fitting(NamedTuple):
    how: str  # "fits", "fits with <switch>", "does not fit"
    cfg: object  # the configuration that fits (switched), or the least needy one tried
    gpus: int
    need: int  # bytes a GPU needs in it
    least: str = ""  # when nothing fits: how `need` was reached ("as given", "with bf16", ...)


def fit(models: Models, cfg, gpu: cost.GPU, n: int, fsdp: bool = False) -> Fitting:
    """The configuration as given when it fits, else the first switch that does (verified by
    predicting with it), else the switches together, else 'does not fit' with the least need
    found (so a refusal quotes what the best attempt needed). `fsdp`: the n GPUs shard the
    model (--parallel fsdp) rather than replicate it."""
    usable = gpu.memory_bytes * (1 - MARGIN)
    b = models.memory(cfg)
    if fsdp:
        how = f"fits (FSDP over {n} GPUs)" if fsdp_need(b, n) <= usable else "does not fit"
        return Fitting(how, cfg, n, fsdp_need(b, n), "" if how != "does not fit" else
                       f"FSDP over {n} GPUs")
    if need(b, n) <= usable:
        return Fitting("fits", cfg, n, need(b, n))
    best = (need(b, n), "as given", cfg, n)
    tries, together = [], {}
    if cfg.precision in ("fp32", "tf32") and "bf16" in gpu.peaks:
        tries.append(("bf16", {"precision": "bf16"}))
    if not cfg.activation_checkpointing:
        tries.append(("activation checkpointing", {"activation_checkpointing": True}))
    for k in ACCUM:
        a = cfg.accum_steps * k
        if cfg.batch_size % a == 0:
            tries.append((f"accumulation ×{k}", {"accum_steps": a}))
            together["accum_steps"] = a  # the largest that divides the batch
    together.update({k: v for _, change in tries for k, v in change.items()
                     if k != "accum_steps"})
    if len(tries) > 1:
        tries.append((" + ".join(dict.fromkeys(how.split(" ×")[0] for how, _ in tries)),
                      together))
    for how, change in tries:
        variant = dataclasses.replace(cfg, **change)
        try:
            vb = models.memory(variant)
        except UserError:  # a switch this model cannot take (no blocks to checkpoint)
            continue
        if need(vb, n) <= usable:
            return Fitting(f"fits with {how}", variant, n, need(vb, n))
        best = min(best, (need(vb, n), f"with {how}", variant, n), key=lambda t: t[0])
    for k in FSDP:
        if k > n:
            if fsdp_need(b, k) <= usable:
                return Fitting(f"fits with FSDP over {k} GPUs", cfg, k, fsdp_need(b, k))
            best = min(best, (fsdp_need(b, k), f"with FSDP over {k} GPUs", cfg, k),
                       key=lambda t: t[0])
    needed, how, variant, used = best
    return Fitting("does not fit", variant, used, needed, how)

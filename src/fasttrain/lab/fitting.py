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


def counted_here(cfg):
    """The configuration this machine counts for a GPU's: TF32 and CUDA graphs change the speed
    of the same step, not its tensors or op calls, so without CUDA they are counted as fp32 and
    eager (the GPU's TF32 peak and replay, not issue, are applied by plan), not refused."""
    import torch

    if torch.cuda.is_available() and cfg.device != "cpu":
        return cfg
    return dataclasses.replace(cfg, precision="fp32" if cfg.precision == "tf32"
                               else cfg.precision, cuda_graphs=False)


class Models:
    """Predictions for one configuration and its switched variants, each made once."""

    def __init__(self, task):
        self.task, self._mem, self._work = task, {}, {}

    def memory(self, cfg):
        from fasttrain.lab import memory

        cfg = counted_here(cfg)
        key = repr(cfg)
        if key not in self._mem:
            self._mem[key] = on_this_host(cfg, lambda: memory.predict(
                cfg, data=self.task, device_type="cuda"))
        return self._mem[key]

    def work(self, cfg) -> steptime.StepWork:
        cfg = counted_here(cfg)
        key = repr(cfg)
        if key not in self._work:
            # counted as CUDA runs it: the optimizer's foreach path (steptime.count_run)
            self._work[key] = on_this_host(cfg, lambda: steptime.count(
                cfg, data=self.task, foreach=True))
        return self._work[key]


def on_this_host(cfg, count, command: str = "plan"):
    """`count()`, which runs one real step of the model on this machine's CPU: a model too big
    for this machine's memory is one line (naming `command`), not the allocator's traceback."""
    try:
        return count()
    except (MemoryError, RuntimeError) as e:
        if isinstance(e, RuntimeError) and "allocate memory" not in str(e):
            raise
        smaller = ("plan a smaller --batch-size (the memory per sample is linear: the 'largest "
                   "batch' column extrapolates it)" if command == "plan" else
                   "give a smaller --batch-size (the batch per GPU predicted for)")
        raise UserError(f"{command} counts one real step of the model here, and a step of "
                        f"{cfg.batch_size} samples does not fit in this machine's memory; "
                        f"{smaller}, or run {command} on a machine with more memory") from None


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
    """The largest micro-batch whose predicted need fits `usable`, extrapolated from the parts
    that grow with the batch at micro-batches m and 2m: (largest, bytes at m, bytes per sample).

    Not from the peaks: the peak is the larger of the activations' term and the optimizer step's
    temporaries, and while the temporaries are the larger (a small batch of a large model) the
    peak does not move from m to 2m — a slope read from it would say any batch fits."""
    m = cfg.micro_batch
    b1 = models.memory(cfg)
    b2 = models.memory(dataclasses.replace(cfg, batch_size=2 * cfg.batch_size))
    act = lambda b: b.activations + b.conv_workspace  # noqa: E731  (beside the copies)
    per_act, per_in = max((act(b2) - act(b1)) / m, 0.0), max((b2.inputs - b1.inputs) / m, 0.0)
    fixed = b1.predicted_peak - b1.inputs - max(act(b1) + b1.weight_copies, b1.step_temp)
    a0, in0 = act(b1) - per_act * m, b1.inputs - per_in * m  # the batch-0 intercepts
    per_sample = max(per_act + per_in, 1e-9)
    # need(B) = fixed + in0 + per_in·B + max(a0 + copies + per_act·B, step temporaries)
    by_acts = (usable - fixed - in0 - a0 - b1.weight_copies) / per_sample
    by_temps = ((usable - fixed - in0 - b1.step_temp) / per_in if per_in
                else (float("inf") if usable >= fixed + in0 + b1.step_temp else 0.0))
    return max(0, int(min(by_acts, by_temps))), b1.predicted_peak, int(per_sample)


class Fitting(NamedTuple):
    how: str  # "fits", "fits with <switch>", "does not fit"
    cfg: object  # the configuration that fits (switched), or the least needy one tried
    gpus: int
    need: int  # bytes a GPU needs in it
    least: str = ""  # when nothing fits: how `need` was reached ("as given", "with bf16", ...)
    tried: tuple[str, ...] = ()  # the switches predicted, in order


def fit(models: Models, cfg, gpu: cost.GPU, n: int, fsdp: bool = False) -> Fitting:
    """The configuration as given when it fits, else the first switch that does (verified by
    predicting with it), else the switches together, else 'does not fit' with the least need
    found (so a refusal quotes what the best attempt needed). `fsdp`: the n GPUs shard the
    model (--parallel fsdp) rather than replicate it."""
    usable = gpu.memory_bytes * (1 - MARGIN)
    b = models.memory(cfg)
    if fsdp:
        fits = fsdp_need(b, n) <= usable
        return Fitting(f"fits (FSDP over {n} GPUs)" if fits else "does not fit", cfg, n,
                       fsdp_need(b, n), "" if fits else f"FSDP over {n} GPUs",
                       (f"FSDP over {n} GPUs",))
    if need(b, n) <= usable:
        return Fitting("fits", cfg, n, need(b, n))
    best = (need(b, n), "as given", cfg, n)
    tried: list[str] = []

    def attempt(how: str, change: dict):
        """The switched config and its need, or None where the model cannot take the switch
        (no blocks to checkpoint)."""
        variant = dataclasses.replace(cfg, **change)
        try:
            vb = models.memory(variant)
        except UserError:
            return None
        tried.append(how)
        return variant, need(vb, n)

    singles = []
    if cfg.precision in ("fp32", "tf32") and "bf16" in gpu.peaks:
        singles.append(("bf16", {"precision": "bf16"}))
    if not cfg.activation_checkpointing:
        singles.append(("activation checkpointing", {"activation_checkpointing": True}))
    singles += [(f"accumulation ×{k}", {"accum_steps": cfg.accum_steps * k}) for k in ACCUM
                if cfg.batch_size % (cfg.accum_steps * k) == 0]
    taken: dict[str, tuple[str, dict]] = {}  # per field, the last switch the model took
    for how, change in singles:
        done = attempt(how, change)
        if done is None:
            continue
        variant, needed = done
        if needed <= usable:
            return Fitting(f"fits with {how}", variant, n, needed, "", tuple(tried))
        best = min(best, (needed, f"with {how}", variant, n), key=lambda t: t[0])
        taken[next(iter(change))] = (how, change)  # accumulation: the largest factor
    if len(taken) > 1:  # the switches the model took, together
        how = " + ".join(h for h, _ in taken.values())
        done = attempt(how, {k: v for _, change in taken.values() for k, v in change.items()})
        if done is not None:
            variant, needed = done
            if needed <= usable:
                return Fitting(f"fits with {how}", variant, n, needed, "", tuple(tried))
            best = min(best, (needed, f"with {how}", variant, n), key=lambda t: t[0])
    for k in FSDP:
        if k > n:
            tried.append(f"FSDP over {k} GPUs")
            if fsdp_need(b, k) <= usable:
                return Fitting(f"fits with FSDP over {k} GPUs", cfg, k, fsdp_need(b, k), "",
                               tuple(tried))
            best = min(best, (fsdp_need(b, k), f"with FSDP over {k} GPUs", cfg, k),
                       key=lambda t: t[0])
    needed, how, variant, used = best
    return Fitting("does not fit", variant, used, needed, how, tuple(tried))

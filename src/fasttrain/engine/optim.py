"""The optimizer and the learning-rate schedule: the built-ins, or the user's factories.

    built-in   --optimizer adamw | sgd, --lr, --weight-decay, --schedule, --warmup-steps
    yours      optimizer=fn(param_groups) -> torch.optim.Optimizer    (--optimizer pkg.mod:fn)
                 or a list of them (a head with its own), stepped as one (Optimizers)
               scheduler=fn(optimizer) -> LRScheduler, stepped once per optimizer step
                                                                       (--scheduler pkg.mod:fn)

Parameter groups: weights (every parameter with 2 or more dimensions: linear and convolution
weights, and embeddings, which decay as in nanoGPT and timm's generic rule) and the rest (biases,
normalization weights and any other 0/1-dim parameter) in a group with weight_decay 0, since
decaying a scale or an offset pulls it towards 0 and only hurts; `decay_norm_and_bias` puts all in
one group. A factory receives the same groups, the second carrying only weight_decay = 0 (so that
the factory's own lr and weight_decay apply to the first). The built-in optimizers take them as
one group when --weight-decay is 0 (the default), where the two would be equal: torch's foreach
and fused optimizers run once per group, so two equal groups cost every step a second run of
them for the same result, element by element (foreach AdamW: 8 more ops, each a kernel launch
on CUDA, a host tensor and its Python; docs/measurements/engine-overhead.md has the host time).
A checkpoint written with the two groups is merged into the one on resume (`merge_groups`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
from torch import nn

from fasttrain.engine import distributed, usercode
from fasttrain.errors import UserError

BUILTIN_OPTIMIZERS = ("sgd", "adamw")


def param_groups(model: nn.Module, decay_norm_and_bias: bool) -> list[dict]:
    """[decayed, not decayed] trainable parameters in model order (one group if all decay)."""
    params = [p for p in model.parameters() if p.requires_grad]
    if decay_norm_and_bias:
        return [{"params": params}]
    groups = [{"params": [p for p in params if p.ndim >= 2]},
              {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]  # e.g. a model without biases or norms


def owns_lr(cfg) -> bool:
    """Is the learning rate fasttrain's (built-in optimizer and schedule)? Only then does a
    changed --lr apply on resume."""
    return cfg.optimizer in BUILTIN_OPTIMIZERS and not cfg.scheduler


def optimizer(cfg, model: nn.Module, world, factory: Callable | None = None,
              name: str = "") -> torch.optim.Optimizer:
    """The run's optimizer over `model`'s parameter groups; ZeRO-1 partitions a built-in one."""
    groups = param_groups(model, cfg.decay_norm_and_bias)
    if factory is not None:
        opt = usercode.call(factory, f"your optimizer factory {name}", groups)
        if isinstance(opt, list | tuple) and opt and all(
                isinstance(o, torch.optim.Optimizer) for o in opt):
            if world.sharded:  # DCP saves and reshards one optimizer's state dict
                raise UserError(f"--optimizer {name} returned {len(opt)} optimizers, which "
                                f"--parallel fsdp, --tp and --pp cannot checkpoint; return one "
                                f"(param groups may differ in lr and weight decay), or use "
                                f"--parallel ddp")
            opt = Optimizers(opt, name)
        _check_optimizer(opt, model, name)
        return opt
    if not cfg.weight_decay:  # both groups alike: one (decayed first, as the two were ordered)
        groups = [{"params": [p for g in groups for p in g["params"]]}]
    kw = {"lr": cfg.lr, "weight_decay": cfg.weight_decay,
          "fused": True if cfg.fused_optimizer or _fused_unasked(cfg, world) else None}
    try:
        if cfg.optimizer == "sgd":
            return distributed.optimizer(torch.optim.SGD, groups, world,
                                         momentum=cfg.momentum, **kw)
        return distributed.optimizer(torch.optim.AdamW, groups, world, **kw)
    except RuntimeError as e:  # fused kernels exist only for some devices and dtypes
        raise UserError(f"the fused optimizer (--fused-optimizer; taken unasked on CUDA for "
                        f"--compile, --cuda-graphs and fp16) is not supported here ({e}); use "
                        f"fp32 parameters or drop the flag") from None


def _fused_unasked(cfg, world) -> bool:
    """Does a CUDA run take the fused kernel without --fused-optimizer? The foreach one costs
    the host, every step and per parameter group, ~8 launches and two `.item()` reads of each
    parameter's step count (CPU tensors: no sync, but ~2 µs each); the fused one launches two
    kernels per group and keeps the count on the device. Its results differ from foreach's in
    the last bits only (tests/engine/test_trainer.py), so it is taken where results already
    differ that much from eager fp32's:
      - fp16: with foreach, GradScaler.step also reads its inf check on the host (a sync every
        step); the fused kernel skips the update on the device instead;
      - --compile / --cuda-graphs: the switches whose point is the host's time per step (the
        H100's traced cnn step spent a sixth of its host time in the foreach AdamW).
    Not under FSDP, whose sharded parameters it does not take (nor, for the switches, --tp's
    DTensors)."""
    if world.device.type != "cuda" or cfg.parallel == "fsdp":
        return False
    return cfg.precision == "fp16" or ((cfg.compile or cfg.cuda_graphs) and world.tp == 1)


def scheduler(cfg, run, opt: torch.optim.Optimizer, factory: Callable | None = None,
              name: str = "") -> torch.optim.lr_scheduler.LRScheduler:
    """The user's scheduler, or the built-in schedule as a LambdaLR of lr_factor (Constant
    where that is 1 at every step)."""
    if factory is None:
        flat = cfg.schedule == "constant" and not cfg.warmup_steps
        cls = Constant if flat else torch.optim.lr_scheduler.LambdaLR
        return cls(opt, lambda s: lr_factor(cfg, run, s))
    sched = usercode.call(factory, f"your scheduler factory {name}", opt)
    if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau) or not isinstance(
            sched, torch.optim.lr_scheduler.LRScheduler):
        raise UserError(f"--scheduler {name} returned {type(sched).__name__}; return a "
                        f"torch.optim.lr_scheduler.LRScheduler that steps once per optimizer "
                        f"step without arguments (ReduceLROnPlateau needs a metric)")
    check_length(sched, run, name)
    return sched


def check_length(sched, run, name: str, restored: bool = False) -> None:
    """A scheduler with a length (OneCycleLR's total_steps, which stepping past raises) must
    last the run: checked at build, and again after a resume restores its saved length."""
    total = getattr(sched, "total_steps", None)
    if isinstance(total, int) and total < run.total_steps:
        where = " (its length as the checkpoint saved it)" if restored else ""
        raise UserError(f"--scheduler {name} is {total} steps long{where} and this run "
                        f"{run.total_steps}; build it with total_steps={run.total_steps} (or "
                        f"more), or shorten the run with --max-steps {total}")


class Constant(torch.optim.lr_scheduler.LambdaLR):
    """The built-in schedule where its factor is 1 at every step (--schedule constant without
    warm-up): LambdaLR's state, counted as LambdaLR counts it (checkpoints as before), without
    recomputing and setting every step an lr that never changes (LambdaLR.step: 5.2 µs of
    Python a step on the 2-core EPYC, best of 7 × 20,000 calls; this one's 0.1)."""

    def step(self, epoch=None) -> None:
        if self._is_initial or epoch is not None:  # the step __init__ takes: sets the lr
            return super().step(epoch)
        self._step_count += 1
        self.last_epoch += 1
        return None


class Optimizers(torch.optim.Optimizer):
    """The optimizers a factory returned as a list, stepped, zeroed, saved and restored as one
    (`.optimizers`); a scheduler sets the learning rates of all their groups."""

    def __init__(self, optimizers: list | tuple, name: str):
        self.optimizers = list(optimizers)
        try:  # refuses a parameter held twice
            super().__init__([{"params": g["params"]} for o in self.optimizers
                              for g in o.param_groups], {})
        except ValueError as e:
            raise UserError(f"--optimizer {name} returned optimizers that share parameters "
                            f"({e}); give each parameter to one optimizer") from None
        self._share()

    def _share(self) -> None:
        # The inner optimizers' own group dicts, not copies, so that a scheduler's lr reaches
        # them; load_state_dict replaces them (hence called again there).
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]
        self.state = _States(self.optimizers)

    @torch.no_grad()
    def step(self, closure=None):
        for o in self.optimizers:
            o.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.optimizers:
            o.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        saved = state_dict.get("optimizers", [])
        if len(saved) != len(self.optimizers):
            raise UserError(f"the checkpoint holds {len(saved)} optimizer(s) and the factory "
                            f"returned {len(self.optimizers)}; resume with the same factory")
        for o, s in zip(self.optimizers, saved, strict=True):
            o.load_state_dict(s)
        self._share()


class _States(Mapping):
    """Read-only view of the inner optimizers' per-parameter state (memory accounting)."""

    def __init__(self, optimizers: list):
        self.optimizers = optimizers

    def __getitem__(self, p):
        for o in self.optimizers:
            if p in o.state:
                return o.state[p]
        raise KeyError(p)

    def __iter__(self):
        return (p for o in self.optimizers for p in o.state)

    def __len__(self) -> int:
        return sum(len(o.state) for o in self.optimizers)


def _check_optimizer(opt, model: nn.Module, name: str) -> None:
    if not isinstance(opt, torch.optim.Optimizer):
        raise UserError(f"--optimizer {name} returned {type(opt).__name__}; return a "
                        f"torch.optim.Optimizer built on the param_groups it is given (or a "
                        f"list of them)")
    held = {id(p) for g in opt.param_groups for p in g["params"]}
    left = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in held]
    if left:
        raise UserError(f"--optimizer {name} leaves {len(left)} trainable parameter(s) out "
                        f"(e.g. {left[0]}); build it on the param_groups it is given, or set "
                        f"requires_grad=False on what must not train")


def lr_factor(cfg, run, step: int) -> float:
    """The schedule: linear warm-up, then constant, cosine, or onecycle's annealing. Reads
    run.total_steps when called, so that an extended run (--epochs N larger) decays to its end."""
    total, warm = max(run.total_steps, 1), cfg.warmup_steps
    if cfg.schedule == "onecycle" and not warm:
        warm = max(1, int(0.3 * total))
    if step < warm:
        return (step + 1) / warm
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warm) / max(1, total - warm))
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine / the annealing of onecycle


def merge_groups(saved: dict, opt: torch.optim.Optimizer) -> dict:
    """`saved` (an optimizer's state dict) for `opt`, which holds one param group: a built-in
    optimizer's checkpoint from before equal groups were merged (optimizer()) has two with the
    same settings; their parameters become one group, in the same order, so the state's
    parameter indices are unchanged. Anything else is returned as it is (load_state_dict says
    what does not fit)."""
    groups = saved.get("param_groups", [])
    if len(opt.param_groups) != 1 or len(groups) < 2:
        return saved
    settings = [{k: v for k, v in g.items() if k != "params"} for g in groups]
    if any(s != settings[0] for s in settings):
        return saved
    return {**saved, "param_groups": [{**groups[0],
                                       "params": [i for g in groups for i in g["params"]]}]}


def merge_schedule(saved: dict, opt: torch.optim.Optimizer) -> dict:
    """A scheduler's state dict for `opt` after merge_groups: its per-group lists (base_lrs,
    _last_lr, LambdaLR's lr_lambdas), all of one value, cut to one entry a group."""
    n, old = len(opt.param_groups), len(saved.get("base_lrs", ()))
    if n != 1 or old < 2:
        return saved
    return {k: v[:1] if isinstance(v, list) and len(v) == old and all(x == v[0] for x in v)
            else v for k, v in saved.items()}


def load_state(opt: torch.optim.Optimizer, saved: dict) -> None:
    """`opt.load_state_dict(saved)`, its state copied into the tensors `opt` already holds (where
    it holds one of that shape and dtype) rather than replacing them: a captured CUDA graph
    (graphed.py) reads and writes them at the addresses it captured. load_state_dict alone makes
    new tensors (cast to each parameter's device)."""
    held = {p: dict(opt.state[p]) for g in opt.param_groups for p in g["params"]
            if p in opt.state}
    opt.load_state_dict(merge_groups(saved, opt))
    for p, old in held.items():
        new = opt.state[p]
        for key, t in old.items():
            loaded = new.get(key)
            if (torch.is_tensor(t) and torch.is_tensor(loaded) and t.shape == loaded.shape
                    and t.dtype == loaded.dtype and t.device == loaded.device):
                t.copy_(loaded)
                new[key] = t

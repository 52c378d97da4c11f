"""The engine's models — logreg, mlp, cnn, resnet, gpt — one small file each, and the registry.

`build_model(name, in_shape=..., num_classes=..., **kwargs)` is the only constructor the engine
calls. Classification models map float images [B, C, H, W] in [0, 1] to logits [B, num_classes];
`gpt` maps int64 tokens [B, T] to logits [B, T, vocab] (`in_shape` = (block_size,),
`num_classes` = vocabulary size). Size options (`hidden`, `channels`, `width`, `n_layer`, ...) are
each model class's keyword-only constructor arguments; anything else is a UserError.

Every model keeps the units worth checkpointing in `model.blocks` (an `nn.ModuleList`) and runs its
forward through them, so `apply_activation_checkpointing` can swap them in place. Modules are
imported on first use, as in the ladder's registry.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect

import torch
import torch.utils.checkpoint
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from fasttrain.errors import UserError

MODELS: tuple[str, ...] = ("logreg", "mlp", "cnn", "resnet", "gpt")
MODEL_KINDS: dict[str, str] = {
    "logreg": "classification",
    "mlp": "classification",
    "cnn": "classification",
    "resnet": "classification",
    "gpt": "language",
}
_CLASSES = {"logreg": "LogReg", "mlp": "MLP", "cnn": "CNN", "resnet": "ResNet", "gpt": "GPT"}
_IMAGE_DATA = "--data mnist, fashion-mnist, cifar10 or synthetic"


def model_class(name: str) -> type[nn.Module]:
    """The class behind `name`; a UserError listing the valid names for any other."""
    if name not in MODELS:
        raise UserError(f"unknown model {name!r}; choose one of: {', '.join(MODELS)}")
    return getattr(importlib.import_module(f"fasttrain.models.{name}"), _CLASSES[name])


def model_options(name: str) -> dict[str, object]:
    """The size options `name` accepts, with their defaults (its keyword-only arguments)."""
    params = inspect.signature(model_class(name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def build_model(
    name: str, *, in_shape: tuple[int, ...], num_classes: int, **kwargs
) -> nn.Module:
    """A freshly initialized `name` for inputs of `in_shape` (no batch dim) and `num_classes`
    outputs (the vocabulary size for gpt). Checks what a user can get wrong — the name, the
    options, a dataset of the wrong kind — and raises a one-line UserError that names the fix."""
    cls = model_class(name)
    options = model_options(name)
    unknown = sorted(set(kwargs) - set(options))
    if unknown:
        valid = ", ".join(options) or "none"
        raise UserError(f"unknown option {', '.join(unknown)} for model {name}; valid: {valid}")
    in_shape = tuple(in_shape)
    if MODEL_KINDS[name] == "language":
        if len(in_shape) != 1:
            raise UserError(f"{name} trains on text and needs in_shape (block_size,), got "
                            f"{in_shape}: use --data tinyshakespeare or synthetic-text")
    elif len(in_shape) != 3:
        raise UserError(f"{name} trains on images and needs in_shape (C, H, W), got {in_shape}: "
                        f"use {_IMAGE_DATA}, or --model gpt for text")
    for i, n in enumerate(in_shape):
        positive_int(name, f"in_shape[{i}]", n)
    positive_int(name, "num_classes", num_classes)
    return cls(in_shape=in_shape, num_classes=num_classes, **kwargs)


def positive_int(model: str, option: str, value: object) -> int:
    """`value` if it is an int ≥ 1, else a UserError naming the model's option."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"model {model}: {option} must be a positive integer, got {value!r}")
    return value


def positive_ints(model: str, option: str, value: object) -> tuple[int, ...]:
    """A non-empty sequence of positive ints (e.g. per-stage channels), as a tuple."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = (value,)
    if not isinstance(value, (tuple, list)) or not value:
        raise UserError(f"model {model}: {option} must be a non-empty list of positive integers, "
                        f"got {value!r}")
    return tuple(positive_int(model, option, v) for v in value)


def probability(model: str, option: str, value: object) -> float:
    """A float in [0, 1) (a dropout rate)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise UserError(f"model {model}: {option} must be a number in [0, 1), got {value!r}")
    return float(value)


def param_count(model: nn.Module) -> int:
    """Distinct parameters (a tied weight counts once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


# -- activation checkpointing ------------------------------------------------------------------

class Checkpointed(CheckpointWrapper):
    """Runs `inner` under non-reentrant activation checkpointing: its forward keeps only the
    inputs, and backward runs it again to rebuild the activations it needs.

    torch's own wrapper (the one torchtitan applies), so that every reader of names agrees that
    the wrapper is invisible: state_dict keys (its hooks strip `_checkpoint_wrapped_module.` on
    save and add it back on load), named_parameters, and DCP's get/set_state_dict, which maps
    parameters to names by walking the module tree and drops the same prefix. A wrapper of our
    own with another child name made that walk fail (`'Checkpointed' object has no attribute
    'ln1'`), so sharded checkpoints (--parallel fsdp, --tp) could not be saved with
    checkpointing on. A checkpoint saved with or without checkpointing loads into a model built
    either way.
    """

    def __init__(self, inner: nn.Module):
        super().__init__(inner, checkpoint_fn=_checkpoint)

    @property
    def inner(self) -> nn.Module:
        return self._checkpoint_wrapped_module


def _checkpoint(inner: nn.Module, *args, **kwargs):
    # Eager recomputation would run BatchNorm's running-statistics update a second time, so the
    # recompute context puts the buffers back afterwards. Under torch.compile the recomputation
    # is side-effect free already, and a custom context_fn is not allowed.
    # (`checkpoint` is looked up at call time, not imported by name, so tests can count calls.)
    if torch.compiler.is_compiling():
        return torch.utils.checkpoint.checkpoint(inner, *args, use_reentrant=False, **kwargs)
    return torch.utils.checkpoint.checkpoint(
        inner, *args, use_reentrant=False,
        context_fn=lambda: (contextlib.nullcontext(), _buffers_restored(inner)), **kwargs
    )


@contextlib.contextmanager
def _buffers_restored(module: nn.Module):
    """Entered for the recomputation in backward: buffers end as they were before it."""
    saved = [(b, b.clone()) for b in module.buffers()]
    try:
        yield
    finally:  # checkpoint ends the recomputation early by raising once it has what it needs
        with torch.no_grad():
            for buffer, value in saved:
                buffer.copy_(value)


# Where a transformer keeps its blocks: the bundled models, then Hugging Face's layouts (Llama
# and most decoders `model.layers`, GPT-2 `transformer.h`, GPT-NeoX `gpt_neox.layers`).
BLOCK_LISTS = ("blocks", "layers", "h", "model.layers", "transformer.h", "gpt_neox.layers")


def units(model: nn.Module, names: tuple[str, ...] | list[str] = ()) -> list[tuple]:
    """The modules worth checkpointing (and FSDP-sharding) one by one, as (parent, key) pairs:
    each module named in `names` (a ModuleList or Sequential named stands for its children), else
    each module of the first ModuleList of BLOCK_LISTS (`model.blocks` for the bundled models),
    else each child of a model that is itself an nn.Sequential or nn.ModuleList. [] when none of
    these applies."""
    def children(container: nn.Module) -> list[tuple]:
        return [(container, k) for k, _ in container.named_children()]

    if names:
        found = []
        for name in names:
            try:
                module = model.get_submodule(name)
            except AttributeError:
                raise UserError(f"activation checkpointing: {type(model).__name__} has no "
                                f"submodule {name!r}; name one of "
                                f"{', '.join(n for n, _ in model.named_children())}") from None
            if isinstance(module, nn.Sequential | nn.ModuleList | nn.ModuleDict):
                found += children(module)
            else:
                parent, _, key = name.rpartition(".")
                found.append((model.get_submodule(parent) if parent else model, key))
        return found
    for name in BLOCK_LISTS:
        try:
            blocks = model.get_submodule(name)
        except AttributeError:
            continue
        if isinstance(blocks, nn.ModuleList | nn.ModuleDict):  # a dict: a pipeline stage's
            return children(blocks)
    if isinstance(model, nn.Sequential | nn.ModuleList):
        return children(model)
    return []


def apply_activation_checkpointing(model: nn.Module, names: tuple[str, ...] | list[str] = ()
                                   ) -> nn.Module:
    """Wrap every unit of `model` (see `units`) in `Checkpointed`, in place, and return `model`.

    Activations inside a unit are then recomputed in backward instead of stored: peak memory
    falls to roughly the units' inputs plus one unit's internals, for about one extra forward.
    Gradients are unchanged (dropout replays its masks: checkpoint restores the RNG state).
    Wrapping twice is a no-op. Apply it before torch.compile and before FSDP/DDP wrapping.

    BatchNorm's running statistics also match: the recomputation leaves buffers as it found them.
    """
    found = units(model, names)
    if not found:
        raise UserError(f"activation checkpointing: {type(model).__name__} has none of the "
                        f"ModuleLists {', '.join(BLOCK_LISTS)} and is not an nn.Sequential; "
                        f"name the modules to checkpoint: build(..., checkpoint=['layer1', "
                        f"...])")
    for parent, key in found:
        module = parent.get_submodule(key)
        if not isinstance(module, Checkpointed):
            parent.register_module(key, Checkpointed(module))
    return model


__all__ = ["MODELS", "MODEL_KINDS", "build_model", "apply_activation_checkpointing",
           "Checkpointed", "units", "model_class", "model_options", "param_count"]

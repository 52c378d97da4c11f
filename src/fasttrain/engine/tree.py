"""Batches of any structure: trees of tensors (tuples, lists, dicts, namedtuples, dataclasses,
nested) handled as one object. Leaves that are not tensors (strings, numbers, None) pass through
untouched.

    batch = {"input_ids": ids, "labels": labels, "meta": ["a.png", "b.png"]}
    to_device(batch, torch.device("cuda"))     # every tensor copied (non_blocking), rest kept
    leading_size(batch)                        # samples in the batch: the first tensor's dim 0
    shapes(batch)        # "{input_ids: int64[8, 128], labels: int64[8, 128], meta: list}"
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch


def map_tensors(tree: Any, fn: Callable[[torch.Tensor], Any]) -> Any:
    """`tree` with every tensor leaf replaced by `fn(leaf)`; containers rebuilt as their type."""
    if torch.is_tensor(tree):
        return fn(tree)
    if isinstance(tree, dict):
        return type(tree)((k, map_tensors(v, fn)) for k, v in tree.items())
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a namedtuple
        return type(tree)(*(map_tensors(v, fn) for v in tree))
    if isinstance(tree, tuple | list):
        return type(tree)(map_tensors(v, fn) for v in tree)
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        return dataclasses.replace(tree, **{f.name: map_tensors(getattr(tree, f.name), fn)
                                            for f in dataclasses.fields(tree) if f.init})
    return tree  # strings, numbers, None, anything else: untouched


def leaves(tree: Any) -> list[torch.Tensor]:
    """The tensor leaves of `tree`, depth first in container order."""
    found: list[torch.Tensor] = []
    map_tensors(tree, found.append)
    return found


def to_device(tree: Any, device: torch.device, non_blocking: bool = True) -> Any:
    """Every tensor of `tree` on `device`. From pinned host memory to CUDA, `non_blocking`
    copies are queued on the current stream and the host does not wait."""
    return map_tensors(tree, lambda t: t.to(device, non_blocking=non_blocking))


def pin(tree: Any) -> Any:
    """Every CPU tensor of `tree` in page-locked memory (what makes a host→GPU copy async)."""
    return map_tensors(tree, lambda t: t.pin_memory() if t.device.type == "cpu" else t)


def leading_size(tree: Any) -> int:
    """Samples in a batch: dim 0 of its first tensor leaf (0 for a tree without tensors)."""
    for t in leaves(tree):
        return int(t.shape[0]) if t.dim() else 1
    return 0


def shapes(tree: Any) -> str:
    """A short description of a batch's structure, for messages: dtypes and shapes of tensors,
    type names of everything else."""
    if torch.is_tensor(tree):
        return f"{str(tree.dtype).removeprefix('torch.')}{list(tree.shape)}"
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{k}: {shapes(v)}" for k, v in tree.items()) + "}"
    if isinstance(tree, tuple | list):
        inner = ", ".join(shapes(v) for v in tree)
        return f"{type(tree).__name__}({inner})" if hasattr(tree, "_fields") else (
            f"({inner})" if isinstance(tree, tuple) else f"[{inner}]")
    if dataclasses.is_dataclass(tree) and not isinstance(tree, type):
        inner = ", ".join(f"{f.name}={shapes(getattr(tree, f.name))}"
                          for f in dataclasses.fields(tree))
        return f"{type(tree).__name__}({inner})"
    return type(tree).__name__

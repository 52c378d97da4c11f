"""What a user hands to `build`: a model, data and a loss, by name, by import path or as objects.

    build(cfg, model=MyNet(), data=(x, y))                       # tensors: a training set
    build(cfg, model=MyNet(), data={"train": ds, "val": (vx, vy), "test": loader})
    fasttrain train --model mypkg.nets:make_net --data mypkg.data:load --loss mypkg.nets:loss

Data takes one of two paths (`load_data` says which and why). Tensors and the bundled datasets
become one `TaskData` held in memory, batches gathered by index (on the device when they fit:
batches.py). Any Dataset, IterableDataset or DataLoader is streamed: read afresh every epoch, its
transforms re-drawn (stream.py); `--data-in-memory` reads a map-style Dataset once into tensors
instead, refused when its estimated size exceeds the available host memory. Inputs are never
rescaled silently: uint8 inputs of (input, target) pairs are images and become [0, 1] floats
(÷255) on both paths, floating inputs pass unchanged, int64 inputs are indices (tokens) and pass
unchanged; on the in-memory path any other dtype is refused with the fix.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from fasttrain.errors import UserError

_X_DTYPES = "uint8 (images, scaled to [0, 1]), float32/bf16/fp16 (unchanged) or int64 (token ids)"


def import_object(path: str, flag: str) -> Any:
    """`pkg.module:name` → the object. The working directory is importable, as with
    `python -m`, so that `--model mynets:make` finds ./mynets.py from the console script too."""
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise UserError(f"{flag} {path!r}: give a bundled name or an import path "
                        f"'package.module:callable'")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise UserError(f"{flag} {path}: cannot import {module} ({e}); check the module path and "
                        f"that it is importable from {os.getcwd()}") from None
    for part in name.split("."):
        if not hasattr(obj, part):
            raise UserError(f"{flag} {path}: {module} has no {name!r}; check the name after ':'")
        obj = getattr(obj, part)
    return obj


def call_factory(path: str, flag: str) -> Any:
    """Import `path` and call it with no arguments (a factory)."""
    factory = import_object(path, flag)
    if not callable(factory):
        raise UserError(f"{flag} {path}: {type(factory).__name__} is not callable; point at a "
                        f"function taking no arguments")
    from fasttrain.engine import usercode

    return usercode.call(factory, f"your {flag.lstrip('-')} factory {path}")


def resolve_model(model: nn.Module | str, task) -> tuple[nn.Module, str]:
    """(module, label): a bundled name is built for `task`'s shapes, an import path called."""
    from fasttrain.models import MODELS, build_model

    if isinstance(model, nn.Module):
        return model, f"{type(model).__module__}.{type(model).__qualname__}"
    if model in MODELS:
        if not task.in_shape or (getattr(task, "kind", "") == "classification"
                                 and not task.num_classes):
            raise UserError(f"--model {model} needs the input shape and the number of classes; "
                            f"this streamed data tells neither (give the Dataset a `classes` "
                            f"list, as ImageFolder has) or pass your own nn.Module")
        return build_model(model, in_shape=task.in_shape, num_classes=task.num_classes), model
    made = call_factory(model, "--model")
    if not isinstance(made, nn.Module):
        raise UserError(f"--model {model} returned a {type(made).__name__}, not a torch.nn.Module;"
                        f" return the model from the factory")
    return made, model


def resolve_loss(loss: Callable | str, task, user_step: bool = False) -> Callable:
    """The loss callable `(output, target) -> scalar`. 'auto' is cross-entropy over the last
    dimension for integer targets (classes, tokens). A user step computes its own loss: 'auto'
    then asks nothing of the targets."""
    if not user_step and getattr(task, "in_dtype", None) is not None:  # streamed pairs
        y = task.train_y.dtype  # uint8 targets (masks) were taken by torch's losses: kept
        check_dtypes(task.in_dtype, torch.int64 if y == torch.uint8 else y, "train")
    if callable(loss):
        return scalar_loss(loss, "")
    if loss == "auto":
        if (not user_step and task.train_y is not None
                and task.train_y.is_floating_point()):
            raise UserError("float targets need a loss: pass loss=torch.nn.functional.mse_loss "
                            "(or --loss mse / --loss pkg.module:fn)")
        return cross_entropy
    named = {"cross_entropy": cross_entropy, "mse": mse, "l1": l1}
    if loss in named:
        return named[loss]
    fn = import_object(loss, "--loss")
    if not callable(fn):
        raise UserError(f"--loss {loss}: not callable; point at a function (output, target)")
    return scalar_loss(fn, loss)


def scalar_loss(fn: Callable, given: str) -> Callable:
    """A loss of the user's, refusing with one line what is not a scalar tensor (an unreduced
    loss failed inside torch's backward, far from its cause). Reads metadata only: no sync."""
    from fasttrain.engine.usercode import name_of

    @functools.wraps(fn)  # usercode names the loss's frames by the function it wraps
    def checked(output, target):
        loss = fn(output, target)
        if not torch.is_tensor(loss) or loss.dim():
            got = f"shape {list(loss.shape)}" if torch.is_tensor(loss) else type(loss).__name__
            raise UserError(f"your loss {name_of(fn, given)} must return a scalar (0-dim) "
                            f"tensor, got {got}; reduce it (e.g. .mean(), or reduction='mean')")
        return loss
    return checked


def _same_shape(name: str, output: torch.Tensor, target: torch.Tensor) -> None:
    """Refuse an output and targets of different shapes, which an elementwise loss would
    broadcast (a [B, 1] output against [B] targets silently trains on B × B differences). Reads
    shapes only: no sync."""
    if output.shape != target.shape:
        raise UserError(f"--loss {name}: the model's output has shape {tuple(output.shape)} and "
                        f"the targets {tuple(target.shape)}; make the model return the targets' "
                        f"shape (e.g. end it with nn.Flatten(0) for one value per sample)")


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    _same_shape("mse", output, target)
    return F.mse_loss(output, target)


def l1(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    import torch.nn.functional as F

    _same_shape("l1", output, target)
    return F.l1_loss(output, target)


def cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every target: [B, C] vs [B] and [B, T, V] vs [B, T] alike."""
    import torch.nn.functional as F

    if logits.shape[:-1] != target.shape:
        raise UserError(f"--loss cross_entropy: the model's output has shape "
                        f"{tuple(logits.shape)} and the targets {tuple(target.shape)}; it needs "
                        f"one score per class in the last dimension: output [..., classes] for "
                        f"targets [...]")
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


# -- data ----------------------------------------------------------------------------------------


def resolve_data(data, cfg, world: int = 1):
    """The data a run trains on: a `TaskData` (in memory) or a `streamdata.StreamData`."""
    return load_data(data, cfg, world)[0]


def load_data(data, cfg, world: int = 1):
    """(data, why): a `TaskData` from a bundled name, a TaskData, (x, y) tensors or a Dataset
    under --data-in-memory; a `streamdata.StreamData` from any Dataset, IterableDataset or
    DataLoader. `data` may also be an import path (a factory returning data) or a dict of splits
    {"train", "val", "test"}; one streamed split streams them all."""
    from torch.utils.data import DataLoader, Dataset

    from fasttrain.data.tasks import TASKS, TaskData, load_task

    if isinstance(data, str):
        if data in TASKS:
            task = load_task(data, cfg.data_dir, seed=cfg.seed, block_size=cfg.block_size)
            return split_validation(task, cfg.val_fraction, cfg.seed), "a bundled dataset"
        data, label = call_factory(data, "--data"), data
    else:
        label = "your data"  # objects passed from Python: named so in the start line
    if isinstance(data, TaskData):
        return split_validation(data, cfg.val_fraction, cfg.seed), "tensors"
    from fasttrain.engine.streamdata import StreamData, load

    if isinstance(data, StreamData):  # loaded once already (the lab's commands): as it is
        return data, data.why
    splits = data if isinstance(data, dict) else {"train": data}
    unknown = set(splits) - {"train", "val", "test"}
    if unknown or "train" not in splits:
        raise UserError(f"data splits are 'train' (required), 'val' and 'test'; got "
                        f"{sorted(splits)}")
    datasets = [k for k, v in splits.items() if isinstance(v, Dataset | DataLoader)]
    if datasets and not cfg.data_in_memory:
        from torch.utils.data import IterableDataset

        kinds = sorted({"a DataLoader" if isinstance(splits[k], DataLoader) else
                        "an IterableDataset" if isinstance(splits[k], IterableDataset) else
                        "a Dataset" for k in datasets})
        why = f"{' and '.join(kinds)}, read afresh each epoch"
        return load(splits, cfg, world, label, why), why
    tensors = {k: _tensors(v, k) for k, v in splits.items()}
    why = "--data-in-memory" if datasets else "tensors"
    return split_validation(_task(label, tensors), cfg.val_fraction, cfg.seed), why


def _tensors(split, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    from torch.utils.data import DataLoader, Dataset

    if isinstance(split, DataLoader):
        _refuse_loader_work(split, name)
        split = split.dataset  # the engine batches and shuffles itself (seeded, sharded)
    if isinstance(split, tuple | list) and len(split) == 2 and all(map(torch.is_tensor, split)):
        x, y = split
    elif isinstance(split, Dataset):
        check_fits(split, name)
        from fasttrain.engine import usercode

        what = f"your dataset ({type(split).__qualname__}.__getitem__)"
        # Written into tensors allocated once, sample by sample: the set is held once, as
        # check_fits estimated (a list of samples, then stacked, held it twice).
        x = y = None
        for i in range(len(split)):
            sample = usercode.call(split.__getitem__, f"{what} at index {i}", i)
            try:
                sx, sy = (torch.as_tensor(v) for v in sample)
            except (TypeError, ValueError, RuntimeError) as e:
                raise UserError(f"{name} data: a Dataset must give (input, target) pairs of "
                                f"tensors, arrays or numbers ({e})") from None
            if x is None:
                x, y = sx.new_empty((len(split), *sx.shape)), sy.new_empty((len(split), *sy.shape))
            if sx.shape != x.shape[1:] or sy.shape != y.shape[1:]:
                raise UserError(f"{name} data: sample {i} is ({list(sx.shape)}, "
                                f"{list(sy.shape)}), sample 0 ({list(x.shape[1:])}, "
                                f"{list(y.shape[1:])}); give every sample the same shapes (a "
                                f"resize or crop in the Dataset's transform)")
            for v, at, part in ((sx, x, "input"), (sy, y, "target")):
                if torch.promote_types(at.dtype, v.dtype) != at.dtype:  # x[i] = v would cut it
                    raise UserError(f"{name} data: sample {i}'s {part} is {v.dtype}, sample 0's "
                                    f"{at.dtype}; give every sample the same dtype (one "
                                    f"conversion in the Dataset's transform)")
            x[i], y[i] = sx, sy
    else:
        raise UserError(f"{name} data: give (x, y) tensors, a Dataset or a DataLoader, not "
                        f"{type(split).__name__}")
    check_split(x, y, name)
    return x, y


def _refuse_loader_work(loader, name: str) -> None:
    """--data-in-memory stacks the Dataset's samples and orders them itself: refuse a DataLoader
    whose collate_fn or sampler would silently be skipped (a normalization, class weights)."""
    from torch.utils.data import RandomSampler, SequentialSampler, default_collate, default_convert

    from fasttrain.engine.usercode import name_of

    if loader.collate_fn not in (default_collate, default_convert):
        raise UserError(f"--data-in-memory stacks the {name} Dataset's samples itself and would "
                        f"skip your DataLoader's collate_fn ({name_of(loader.collate_fn)}): do its "
                        f"work in the Dataset, or drop --data-in-memory to stream it")
    sampler = loader.sampler if loader.batch_size is not None else loader.batch_sampler
    if sampler is None:  # batch_size=None: the Dataset's items are taken as whole batches
        raise UserError(f"--data-in-memory batches the {name} samples itself and your DataLoader "
                        f"has batch_size=None (items as whole batches): give the Dataset "
                        f"itself, or drop --data-in-memory to stream it")
    if not isinstance(sampler, RandomSampler | SequentialSampler):
        raise UserError(f"--data-in-memory orders the {name} samples itself (seeded shuffle) and "
                        f"would skip your DataLoader's {type(sampler).__name__}: drop "
                        f"--data-in-memory to stream it")


def tokens_per_sample(batch) -> int:
    """T for token sequences, read from a batch of them (or the whole set in memory): an (input,
    target) pair of int64 [n, T] ids (next-token targets), or a dict with int64 input_ids [n, T]
    (Hugging Face's layout); else 0 (no tokens/s, no perplexity)."""
    def ids(v) -> bool:
        return torch.is_tensor(v) and v.dtype == torch.int64 and v.dim() == 2

    if isinstance(batch, dict):
        return batch["input_ids"].shape[1] if ids(batch.get("input_ids")) else 0
    if isinstance(batch, tuple | list) and len(batch) == 2:
        x, y = batch
        if ids(x) and torch.is_tensor(y) and x.shape == y.shape:
            return x.shape[1]
    return 0


def tokens_in(batch) -> int:
    """The token ids a batch of token sequences holds (n × T, padding included; read from
    shapes: no sync); 0 for other batches."""
    per_sample = tokens_per_sample(batch)
    ids = batch["input_ids"] if isinstance(batch, dict) else batch[0]
    return per_sample and ids.shape[0] * per_sample


def check_fits(dataset, name: str) -> None:
    """--data-in-memory: refuse a Dataset without length, or one whose estimated size (length ×
    the first sample's bytes) exceeds the host memory available now."""
    from torch.utils.data import IterableDataset

    try:
        n = len(dataset)
    except TypeError:
        n = None
    if n is None or isinstance(dataset, IterableDataset):
        raise UserError(f"--data-in-memory: the {name} data has no length (a stream) and cannot "
                        f"be read into memory; drop --data-in-memory to stream it")
    from fasttrain.engine import usercode

    first = (usercode.call(dataset.__getitem__, f"your dataset ({type(dataset).__qualname__}"
                           f".__getitem__) at index 0", 0) if n else ())
    if not (isinstance(first, tuple | list) and len(first) == 2):
        raise UserError(f"--data-in-memory reads (input, target) samples; the {name} data gives "
                        f"{type(first).__name__}: drop --data-in-memory to stream it")
    try:
        per = sum(torch.as_tensor(v).numel() * torch.as_tensor(v).element_size() for v in first)
    except (TypeError, RuntimeError, ValueError):
        raise UserError(f"--data-in-memory reads (input, target) samples of tensors, arrays or "
                        f"numbers; the {name} data gives ({type(first[0]).__name__}, "
                        f"{type(first[1]).__name__}): convert them in the Dataset (e.g. a "
                        f"ToTensor() transform for PIL images)") from None
    free = available_memory()
    if free is not None and n * per > free:
        raise UserError(f"--data-in-memory: the {name} data needs about {n * per / 2**30:.1f} "
                        f"GiB ({n} samples × {per} bytes) and {free / 2**30:.1f} GiB of host "
                        f"memory is available; drop --data-in-memory to stream it")


def available_memory() -> int | None:
    """Bytes of host memory available now (MemAvailable; psutil may not be installed)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_split(x: torch.Tensor, y: torch.Tensor, name: str) -> None:
    """Refuse what would fail later, or silently train on the wrong numbers."""
    if len(x) != len(y):
        raise UserError(f"{name} data: {len(x)} inputs but {len(y)} targets; give one target per "
                        f"input")
    if len(x) == 0:
        raise UserError(f"{name} data is empty")
    check_dtypes(x.dtype, y.dtype, name)


def check_dtypes(x: torch.dtype, y: torch.dtype, name: str) -> None:
    """Refuse (input, target) dtypes the default step would fail on, or train wrongly with:
    tensors, and the first batch of streamed pairs (a Dataset's samples as collated)."""
    if x == torch.float64:
        raise UserError(f"{name} inputs are float64 and the model float32: convert with "
                        f"x.float() (NumPy makes float64: np.array(img) / 255.0 is)")
    if not (x in (torch.uint8, torch.int64) or x.is_floating_point):
        raise UserError(f"{name} inputs are {x}; use {_X_DTYPES}")
    if y == torch.float64:
        raise UserError(f"{name} targets are float64: convert with y.float()")
    if not (y == torch.int64 or y.is_floating_point):
        raise UserError(f"{name} targets are {y}; use int64 class indices (y.long()) or "
                        f"float values")


def _task(label: str, splits: dict[str, tuple[torch.Tensor, torch.Tensor]]):
    from fasttrain.data.tasks import TaskData

    x, y = splits["train"]
    test = splits.get("test") or splits.get("val") or (x[:0], y[:0])
    val = splits.get("val") if "test" in splits else None
    for split, name in ((test, "test"), (val, "val")):
        if split is not None and split[0].shape[1:] != x.shape[1:]:
            raise UserError(f"{name} inputs have shape {tuple(split[0].shape[1:])}, train inputs "
                            f"{tuple(x.shape[1:])}; give every split the same sample shape")
    classes = int(y.max()) + 1 if y.dtype == torch.int64 else 0
    return TaskData(name=label, kind="classification" if classes else "regression",
                    train_x=x, train_y=y, test_x=test[0], test_y=test[1], num_classes=classes,
                    in_shape=tuple(x.shape[1:]), source=label, synthetic=False,
                    val_x=val[0] if val else None, val_y=val[1] if val else None)


def split_validation(task, fraction: float, seed: int):
    """Hold out `fraction` of the training samples (a seeded draw; for a token stream, its
    tail) as the validation set, unless the data brings one."""
    if not fraction or task.val_x is not None:
        return task
    if task.train_y is None:  # language: a contiguous tail keeps the windows whole
        cut = int(len(task.train_x) * (1 - fraction))
        return dataclasses.replace(task, train_x=task.train_x[:cut], val_x=task.train_x[cut:])
    train, val = held_out(len(task.train_y), fraction, seed)
    return dataclasses.replace(task, train_x=task.train_x[train], train_y=task.train_y[train],
                               val_x=task.train_x[val], val_y=task.train_y[val])


def held_out(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, validation) indices of `n` samples, sorted: a seeded draw of `fraction` held out
    (the same draw for tensors and for a streamed Dataset)."""
    held = int(n * fraction)
    if held < 1 or held == n:
        raise UserError(f"--val-fraction {fraction} of {n} samples leaves an empty split; "
                        f"choose a fraction between {1 / n:.2g} and {1 - 1 / n:.2g}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 17))
    return order[held:].sort().values, order[:held].sort().values

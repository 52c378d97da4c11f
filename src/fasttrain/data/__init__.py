"""Datasets: the MNIST family read strictly from verified IDX files, CIFAR-10 from its verified
binary archive, Tiny Shakespeare as characters, and synthetic stand-ins for each.

`load_task("cifar10")` is what the engine trains on: a `TaskData` of torch tensors, train_x uint8
[50000, 3, 32, 32]. `load_dataset("mnist")` is the ladder's: an `ImageDataset` of read-only uint8
arrays, train_x [60000, 28, 28]. Both find files under --data-dir, $FASTTRAIN_DATA or the cache
(else download them).
"""

from fasttrain.data.idx import ImageDataset, load_split, read_idx
from fasttrain.data.sources import DATASETS, default_cache_dir, fetch, load_dataset, locate
from fasttrain.data.synthetic import synthetic_cifar, synthetic_dataset, synthetic_text
from fasttrain.data.tasks import TASKS, TaskData, load_task

__all__ = [
    "DATASETS",
    "TASKS",
    "ImageDataset",
    "TaskData",
    "default_cache_dir",
    "fetch",
    "load_dataset",
    "load_split",
    "load_task",
    "locate",
    "read_idx",
    "synthetic_cifar",
    "synthetic_dataset",
    "synthetic_text",
]

"""Datasets: the MNIST family read strictly from verified IDX files, and a synthetic stand-in.

`load_dataset("mnist")` finds the files under --data-dir, $FASTTRAIN_DATA or the cache (else
downloads them) and returns an `ImageDataset` of read-only uint8 arrays, train_x [60000, 28, 28].
"""

from fasttrain.data.idx import ImageDataset, load_split, read_idx
from fasttrain.data.sources import DATASETS, default_cache_dir, fetch, load_dataset, locate
from fasttrain.data.synthetic import synthetic_dataset

__all__ = [
    "DATASETS",
    "ImageDataset",
    "default_cache_dir",
    "fetch",
    "load_dataset",
    "load_split",
    "locate",
    "read_idx",
    "synthetic_dataset",
]

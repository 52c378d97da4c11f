"""Batch trees: every container kind rebuilt as itself, tensors moved, the rest untouched."""

import dataclasses
from collections import namedtuple

import torch

from fasttrain.engine import tree

Pair = namedtuple("Pair", "x y")


@dataclasses.dataclass
class Sample:
    pixels: torch.Tensor
    name: str


def test_map_keeps_every_container_kind_and_non_tensors():
    batch = {"a": (torch.zeros(2, 3), [torch.ones(2)]), "p": Pair(torch.zeros(2), "s"),
             "d": Sample(torch.zeros(2, 1), "img.png"), "n": None, "k": 3}
    out = tree.map_tensors(batch, lambda t: t + 1)
    assert isinstance(out["a"], tuple) and isinstance(out["a"][1], list)
    assert isinstance(out["p"], Pair) and out["p"].y == "s"
    assert isinstance(out["d"], Sample) and out["d"].name == "img.png"
    assert out["n"] is None and out["k"] == 3
    assert torch.equal(out["a"][0], torch.ones(2, 3)) and torch.equal(out["d"].pixels,
                                                                       torch.ones(2, 1))
    assert len(tree.leaves(batch)) == 4


def test_leading_size_and_shapes():
    batch = {"ids": torch.zeros(8, 5, dtype=torch.int64), "labels": torch.zeros(8)}
    assert tree.leading_size(batch) == 8
    assert tree.leading_size(["only strings"]) == 0
    assert tree.shapes(batch) == "{ids: int64[8, 5], labels: float32[8]}"
    assert tree.shapes(Pair(torch.zeros(2), "s")) == "Pair(float32[2], str)"


def test_to_device_moves_tensors():
    batch = (torch.zeros(2), "name")
    moved = tree.to_device(batch, torch.device("meta"))
    assert moved[0].device.type == "meta" and moved[1] == "name"

"""What the streamed path learns from a batch is what the collate_fn makes of the samples: a
user's collate_fn that converts or normalizes is honoured, and a batch torch's default
collate_fn cannot make (samples of different shapes, a picture object) is one line naming the
fix, read in the main process or in a DataLoader worker."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

import fasttrain
from fasttrain.engine import usercode
from fasttrain.errors import UserError
from tests.engine.streamdata import Flipped, plain
from tests.engine.test_stream import FAST, one_line, stream_of


def normalize(samples):
    x, y = default_collate(samples)
    return (x.float() / 255 - 0.5) / 0.25, y  # the user's own scaling, done in the collate_fn


def test_a_collate_fn_that_makes_floats_of_uint8_samples_is_not_rescaled():
    s = stream_of(DataLoader(Flipped(64), batch_size=8, shuffle=True, collate_fn=normalize))
    x, _ = next(s.micro_batches(0))
    assert x.abs().max() > 1  # as normalize made it: not divided by 255 a second time


class Picture:
    """What a PIL image is to torch's default collate_fn: an object it cannot batch."""

    def __init__(self, i: int):
        self.pixels = torch.full((1, 4, 4), i % 200, dtype=torch.uint8)


class Pictures(Dataset):
    classes = ["a", "b", "c", "d"]

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        return Picture(i), i % 4


def to_tensors(samples):
    return torch.stack([p.pixels for p, _ in samples]), torch.tensor([y for _, y in samples])


def test_a_collate_fn_that_makes_tensors_of_pictures_trains_with_the_default_step():
    loader = DataLoader(Pictures(), batch_size=16, shuffle=True, collate_fn=to_tensors)
    run = fasttrain.build(model=plain(), data=loader, batch_size=16, max_steps=2, **FAST)
    assert run.data.kind == "classification" and run.data.in_shape == (1, 4, 4)
    fasttrain.fit(run)


def test_pictures_without_a_conversion_are_one_line_at_build():
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=Pictures(), batch_size=16, max_steps=2, **FAST)
    one_line(e, "Picture", "ToTensor()", "collate_fn")


class Sizes(Flipped):
    """Every third image a row short, as images of different sizes without a resize (from the
    third: the build's probe batches the first two)."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return (x[:, :3] if i % 3 == 2 else x), y


@pytest.mark.parametrize("workers", [0, 2])
def test_samples_of_different_shapes_are_one_line_naming_the_fix(workers):
    run = fasttrain.build(model=plain(), data=Sizes(64), batch_size=16, max_steps=2,
                          workers=workers, **FAST)
    with pytest.raises(UserError) as e:
        next(usercode.pulled(run.batches.micro_batches(0)))
    one_line(e, "different shapes", "uint8[1, 4, 4]", "uint8[1, 3, 4]", "resize or crop")


def test_data_in_memory_refuses_what_it_would_skip_or_cannot_read():
    # It stacks the Dataset's samples and orders them itself: a DataLoader's collate_fn (here a
    # normalization) or sampler (class weights) would silently be skipped.
    loader = DataLoader(Flipped(64), batch_size=16, shuffle=True, collate_fn=normalize)
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=loader, data_in_memory=True, batch_size=16, **FAST)
    one_line(e, "normalize", "drop --data-in-memory")
    weighted = torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=DataLoader(Flipped(64), batch_size=16,
                                                       sampler=weighted),
                        data_in_memory=True, batch_size=16, **FAST)
    one_line(e, "WeightedRandomSampler", "drop --data-in-memory")
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=Pictures(), data_in_memory=True, batch_size=16,
                        **FAST)
    one_line(e, "Picture", "ToTensor()")
    run = fasttrain.build(model=plain(), data=DataLoader(Flipped(64), batch_size=16,
                                                         shuffle=True),
                          data_in_memory=True, batch_size=16, **FAST)
    assert run.batches.path == "in memory"


_PEAK = """
import resource, torch
from fasttrain.engine import inputs

class Big(torch.utils.data.Dataset):  # 1000 images of 64 KiB: 62.5 MiB, made on the fly
    def __len__(self):
        return 1000

    def __getitem__(self, i):
        return torch.full((1, 256, 256), i % 256, dtype=torch.uint8), i % 10

before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
x, y = inputs._tensors(Big(), "train")
print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) * 1024 / x.nbytes)
"""


def test_data_in_memory_holds_the_set_once_while_reading_it():
    # check_fits refuses a set larger than the memory available: reading it must not need
    # twice that (a list of samples, then stacked), or a set that passed the check is killed.
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _PEAK], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert float(proc.stdout) < 1.5, proc.stdout  # peak growth ÷ the set's bytes


class Float64(Flipped):
    """The classic np.array(img) / 255.0: float64 images."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return x.numpy() / 255.0, y


class Int32Targets(Flipped):
    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return x, torch.tensor(y, dtype=torch.int32)


@pytest.mark.parametrize("data, words", [(Float64, ("float64", "x.float()")),
                                         (Int32Targets, ("int32", "y.long()"))])
def test_streamed_pairs_of_dtypes_the_step_fails_on_are_one_line_at_build(data, words):
    # as on the in-memory path: not the model's or the loss's traceback at the first step
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=data(64), batch_size=16, max_steps=2, **FAST)
    one_line(e, *words)


class Counted(torch.utils.data.IterableDataset):
    """A stream with length: items (tensor([i]), i % 4) for i < 96."""

    def __len__(self) -> int:
        return 96

    def __iter__(self):
        return ((torch.tensor([float(i)]), i % 4) for i in range(96))


def test_resuming_a_stream_with_other_workers_says_it_is_dealt_anew(tmp_path, capsys):
    from tests.engine.streamdata import tiny

    common = dict(batch_size=8, epochs=1, out=str(tmp_path), **FAST)
    fasttrain.fit(fasttrain.build(model=tiny(), data=Counted(), max_steps=5, **common))
    capsys.readouterr()
    run = fasttrain.build(model=tiny(), data=Counted(), max_steps=8, resume="auto", workers=2,
                          **common)
    assert run.step_in_epoch == 5
    assert "1 readers" in capsys.readouterr().err  # written by 1, resumed by 2: not exact


class Mixed(Dataset):
    """uint8 pixels, but one sample a float image in [0, 1] (a transform applied to some)."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        x = torch.full((1, 2, 2), 0.5) if i == 3 else torch.full((1, 2, 2), 7, dtype=torch.uint8)
        return x, 0


def test_data_in_memory_refuses_a_sample_whose_dtype_the_first_ones_would_truncate():
    # The set is written into tensors of sample 0's dtype: a float sample written into uint8
    # would silently become 0 (stacking promoted it; the single allocation must say so).
    from fasttrain.engine import inputs

    with pytest.raises(UserError) as e:
        inputs._tensors(Mixed(), "train")
    one_line(e, "sample 3", "float32", "uint8", "same dtype")


def test_data_in_memory_names_a_loader_without_batch_size():
    # batch_size=None: no batch_sampler, and the refusal named "your DataLoader's NoneType".
    with pytest.raises(UserError) as e:
        fasttrain.build(model=plain(), data=DataLoader(Flipped(64), batch_size=None),
                        data_in_memory=True, batch_size=16, **FAST)
    one_line(e, "batch_size=None", "drop --data-in-memory")
    assert "NoneType" not in str(e.value)


def test_collate_blames_the_samples_only_for_what_they_cause():
    """Torch's collate failing on samples of one shape for another reason (a worker out of
    shared memory) keeps its own error: the one-line advice on samples would be wrong there."""
    from fasttrain.engine.sampling import Collate

    def out_of_shm(samples):
        raise RuntimeError("unable to allocate shared memory(shm) for file </torch_1_2>")

    same = [(torch.zeros(3), 0), (torch.zeros(3), 1)]
    with pytest.raises(RuntimeError, match="shared memory"):
        Collate("train data", out_of_shm)(same)
    with pytest.raises(UserError, match="different shapes"):
        Collate("train data")([(torch.zeros(3), 0), (torch.zeros(4), 1)])
    with pytest.raises(UserError, match="ToTensor"):
        Collate("train data")([(object(), 0)])


def mix_pairs(samples):
    """A collate_fn that mixes each sample with its neighbour, as timm's Mixup does: it needs an
    even batch, so a probe of one sample fails where training never would."""
    assert len(samples) % 2 == 0, "batch size should be even when using this"
    x, y = default_collate(samples)
    x = x.float() / 255
    return (x + x.roll(1, 0)) / 2, y


def test_a_collate_fn_that_needs_a_pair_passes_the_build_probe():
    loader = DataLoader(Flipped(64), batch_size=8, shuffle=True, collate_fn=mix_pairs)
    run = fasttrain.build(model=plain(), data=loader, batch_size=8, max_steps=2, **FAST)
    assert run.data.kind == "classification"
    fasttrain.fit(run)

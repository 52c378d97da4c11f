"""The streamed data path (engine/stream.py): Datasets, IterableDatasets and DataLoaders read
afresh each epoch, batches of any structure, shares of ranks and workers, exact resume."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import fasttrain
from fasttrain.engine import inputs, stream, streamdata
from fasttrain.engine.config import TrainConfig
from fasttrain.engine.run import default_metrics
from fasttrain.errors import UserError
from tests.engine.launch import Part
from tests.engine.streamdata import Flipped, Numbers, SplitNumbers, net, plain, tiny

CPU = torch.device("cpu")
FAST = dict(device="cpu", progress=False, verbose=False, log_every=4, lr=1e-2)


def stream_of(data, rank: int = 0, world: int = 1, **kw) -> stream.Stream:
    cfg = TrainConfig(**{"batch_size": 8, "device": "cpu", "max_steps": 1000, **kw})
    splits = data if isinstance(data, dict) else {"train": data}
    return stream.Stream(streamdata.load(splits, cfg, world, "test", "why"), cfg, CPU, rank, world)


def weights(run) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


def one_line(e: pytest.ExceptionInfo, *words: str) -> None:
    msg = str(e.value)
    assert "\n" not in msg, msg
    for w in words:
        assert w in msg, msg


class Indexed(Dataset):
    """(random-flipped image, index): which sample, and how it was drawn this time."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int):
        x = torch.arange(16, dtype=torch.float32).reshape(1, 4, 4)
        return (x.flip(2) if torch.rand(()) < 0.5 else x), i


def flips(s: stream.Stream, epoch: int) -> dict[int, bool]:
    """index → flipped, over one epoch of `s`."""
    out = {}
    for x, i in s.micro_batches(epoch):
        for img, j in zip(x, i.tolist(), strict=True):
            out[j] = bool(img[0, 0, 0] == 3)
    return out


def test_a_dataset_is_read_every_epoch_and_its_transforms_redrawn():
    ds = Flipped(512)
    run = fasttrain.build(model=net(), data=ds, epochs=3, batch_size=64, **FAST)
    from fasttrain.engine.run import describe

    assert "data streamed (a Dataset, read afresh each epoch)" in describe(run)
    ds.reads = 0  # build read the first sample (its shapes)
    fasttrain.fit(run)
    assert ds.reads == 3 * 512
    a, b = flips(stream_of(Indexed()), 0), flips(stream_of(Indexed()), 1)
    assert a.keys() == b.keys() == set(range(64))
    assert 10 < sum(a[i] != b[i] for i in a) < 54  # re-drawn: about half differ
    assert flips(stream_of(Indexed()), 0) == a  # the same seed draws the same
    assert flips(stream_of(Indexed(), seed=1), 0) != a


def test_streamed_tensors_train_exactly_as_the_in_memory_path():
    x = torch.randint(0, 256, (256, 1, 4, 4), dtype=torch.uint8)
    y = torch.randint(0, 4, (256,))
    runs = []
    for data in ((x, y), TensorDataset(x, y)):
        run = fasttrain.build(model=net(), data=data, epochs=2, batch_size=32, **FAST)
        fasttrain.fit(run)
        runs.append(run)
    assert [r.batches.path for r in runs] == ["in memory", "streamed"]
    for k, v in weights(runs[0]).items():
        assert torch.equal(weights(runs[1])[k], v), k


@pytest.mark.parametrize("data", [Numbers(96), SplitNumbers(96)], ids=["skip", "splits_itself"])
def test_an_iterable_dataset_with_two_workers_gives_every_sample_once_per_pass(data):
    s = stream_of(data, workers=2)
    seen = [int(v) for x, _ in s.micro_batches(0) for v in x[:, 0]]
    assert sorted(seen) == list(range(96))


def test_ranks_take_disjoint_complete_shares_of_map_and_iterable_data():
    class Ids(Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            return torch.tensor([float(i)]), 0

    for data, steps in ((Ids(), None), (Numbers(64), 8)):
        shares = []
        for rank in (0, 1):
            s = stream_of(data, rank=rank, world=2)
            # a stream without length is endless under several processes: one pass's worth
            batches = itertools.islice(s.micro_batches(0), steps)
            shares.append({int(v) for x, _ in batches for v in x[:, 0]})
        assert not shares[0] & shares[1]
        assert shares[0] | shares[1] == set(range(64))


class Files(torch.utils.data.IterableDataset):
    """7 "files" of 8 items, split by file (as a WebDataset of shards): shares of 4 and 3 files
    over two ranks, uneven as real shard counts make them."""

    splits_itself = True

    def __len__(self) -> int:
        return 56

    def __iter__(self):
        from fasttrain.engine.sampling import shard

        k, n = shard()
        return ((torch.tensor([float(i)]), 0) for f in range(k, 7, n)
                for i in range(f * 8, f * 8 + 8))


def test_ranks_of_a_stream_split_unevenly_by_itself_take_the_same_steps(capsys):
    # Every step is a collective: a rank whose own share ends sooner must not end its pass
    # sooner (gloo dies of a collective mismatch; NCCL hangs). It is topped up from its next pass.
    runs = [stream_of(Files(), rank=r, world=2) for r in (0, 1)]
    assert [len(list(s.micro_batches(0))) for s in runs] == [runs[0].steps_per_epoch] * 2 == [7, 7]
    assert "rank 1's share" in capsys.readouterr().err
    # One process, two workers: shares of 32 and 24 items make 2 + 1 batches of 14, and a pass
    # is len / workers / batch = 2 steps per worker: the pass must not end a step short (the
    # start line's steps, and the schedule's end, would not be reached).
    s = stream_of(Files(), batch_size=14, workers=2)
    assert len(list(s.micro_batches(0))) == s.steps_per_epoch == 4


def test_one_rank_of_two_sees_the_one_process_batch_halves():
    data = TensorDataset(torch.arange(64.0)[:, None], torch.zeros(64, dtype=torch.long))
    one = [x for x, _ in stream_of(data).micro_batches(0)]
    halves = [[x for x, _ in stream_of(data, rank=r, world=2).micro_batches(0)] for r in (0, 1)]
    for whole, a, b in zip(one, *halves, strict=True):
        assert torch.equal(whole[0::2], a) and torch.equal(whole[1::2], b)


def test_random_transforms_do_not_depend_on_the_workers_that_read_them():
    epochs = [[torch.cat(b) for b in zip(*stream_of(Indexed(), workers=w).micro_batches(3),
                                          strict=True)] for w in (0, 1, 2)]
    for other in epochs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(epochs[0], other, strict=True))


def test_a_stream_without_length_runs_for_max_steps_and_counts_passes():
    run = fasttrain.build(model=tiny(), data=Numbers(64), epochs=3, batch_size=8,
                          max_steps=100, **FAST)
    assert run.batches.steps_per_epoch is None and run.total_steps == 100
    fasttrain.fit(run)
    assert (run.step, run.epoch) == (24, 3)
    with pytest.raises(UserError) as e:
        fasttrain.build(model=tiny(), data=Numbers(64), batch_size=8, **FAST)
    one_line(e, "--max-steps")


class Noisy(torch.utils.data.IterableDataset):
    """A stream whose items draw random numbers as they are made (a random transform)."""

    def __iter__(self):
        return ((torch.rand(3), i % 4) for i in range(80))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_stream_skips_what_was_trained_on_and_gives_the_same_batches(workers):
    whole = [x for x, _ in stream_of(Noisy(), workers=workers).micro_batches(1)]
    torch.rand(5)  # the model's stream moves: the data's must not care
    tail = [x for x, _ in stream_of(Noisy(), workers=workers).micro_batches(1, start_step=4)]
    assert len(whole) == 10 and len(tail) == 6
    assert all(torch.equal(a, b) for a, b in zip(whole[4:], tail, strict=True))
    other = [x for x, _ in stream_of(Noisy(), workers=workers).micro_batches(2)]
    assert not torch.equal(other[0], whole[0])  # another pass, other draws


class Records(Dataset):
    """Hugging Face-style samples: a dict of tensors and a string."""

    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int):
        return {"input_ids": torch.full((6,), i), "labels": torch.tensor(i % 3), "id": f"s{i}"}


def test_dict_batches_flow_to_the_device_and_strings_pass_through():
    s = stream_of(Records())
    batch = next(s.micro_batches(0))
    assert set(batch) == {"input_ids", "labels", "id"}
    assert batch["input_ids"].shape == (8, 6) and batch["input_ids"].device == CPU
    assert isinstance(batch["id"], list) and all(v.startswith("s") for v in batch["id"])
    data = streamdata.load({"train": Records()}, TrainConfig(), 1, "t", "w")
    assert data.kind == "other" and default_metrics(data) == {}


class Holding(Dataset):
    def __init__(self, sample):
        self.sample = sample

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        return self.sample


@pytest.mark.parametrize("data, words", [
    (Holding((torch.zeros(2), {1, 2})), ["set", "tuples, lists, dicts"]),
    (DataLoader(Holding(torch.zeros(2)), batch_size=8,
                collate_fn=lambda s: (torch.zeros(8), torch.zeros(7))), ["leading sizes", "dim 0"]),
    (DataLoader(Holding(torch.zeros(2)), batch_size=8,
                collate_fn=lambda s: (t for t in s)), ["generator", "collate_fn"]),
    (DataLoader(Holding(torch.zeros(2)), batch_size=8, collate_fn=lambda s: ["a"] * 8),
     ["no tensor"]),
], ids=["set", "sizes", "generator", "no-tensor"])
def test_a_batch_the_engine_cannot_handle_is_one_line_naming_the_fix(data, words):
    with pytest.raises(UserError) as e:
        next(stream_of(data).micro_batches(0))
    one_line(e, *words)


@pytest.mark.parametrize("workers", [0, 2])
def test_mid_epoch_resume_of_streamed_data_is_bit_identical(tmp_path, workers):
    common = dict(epochs=2, batch_size=32, workers=workers, **FAST)  # 8 steps an epoch
    whole = fasttrain.build(model=net(), data=Flipped(256), max_steps=16, **common)
    fasttrain.fit(whole)
    cut = fasttrain.build(model=net(), data=Flipped(256), max_steps=11, out=str(tmp_path),
                          **common)
    fasttrain.fit(cut)  # checkpoints at its end: step 11, mid-epoch 1
    ds = Flipped(256)
    resumed = fasttrain.build(model=net(), data=ds, max_steps=16, out=str(tmp_path),
                              resume="auto", **common)
    assert (resumed.epoch, resumed.step_in_epoch) == (1, 3)
    ds.reads = 0
    fasttrain.fit(resumed)
    if not workers:  # (workers count in their own copies)
        assert ds.reads == 5 * 32  # the sampler starts at the step: nothing read twice
    for k, v in weights(whole).items():
        assert torch.equal(weights(resumed)[k], v), k


def test_data_in_memory_reads_once_and_refuses_what_cannot_fit(monkeypatch):
    ds = Flipped(512)
    run = fasttrain.build(model=net(), data=ds, epochs=3, batch_size=64, data_in_memory=True,
                          **FAST)
    assert run.batches.path == "in memory" and run.batches.why == "--data-in-memory"
    read = ds.reads
    fasttrain.fit(run)
    assert ds.reads == read  # no reads after build: the flips were drawn once
    with pytest.raises(UserError) as e:
        fasttrain.build(model=tiny(), data=Numbers(64), data_in_memory=True, **FAST)
    one_line(e, "no length", "drop --data-in-memory")
    with pytest.raises(UserError) as e:
        fasttrain.build(model=net(), data=Flipped(64), data_on_device="on", **FAST)
    one_line(e, "--data-in-memory")
    monkeypatch.setattr(inputs, "available_memory", lambda: 1000)
    with pytest.raises(UserError) as e:
        fasttrain.build(model=net(), data=Flipped(512), data_in_memory=True, **FAST)
    one_line(e, "GiB", "512 samples", "drop --data-in-memory")


def test_a_user_dataloader_keeps_its_collate_fn_and_its_batch_size_must_match():
    def collate(samples):
        x, y = torch.utils.data.default_collate(samples)
        return x, y + 100  # visible in every batch

    s = stream_of(DataLoader(Flipped(64), batch_size=8, shuffle=True, collate_fn=collate))
    assert s.sampler is not None  # shuffle=True became the seeded, resumable order
    assert all(bool((y >= 100).all()) for _, y in s.micro_batches(0))
    with pytest.raises(UserError) as e:
        stream_of(DataLoader(Flipped(64), batch_size=16))
    one_line(e, "batch_size=8")
    sampler = torch.utils.data.WeightedRandomSampler([1.0] * 64, 64)
    with pytest.raises(UserError) as e:
        stream_of(DataLoader(Flipped(64), batch_size=4, sampler=sampler), world=2)
    one_line(e, "WeightedRandomSampler", "2 processes")


def test_streamed_splits_are_evaluated_over_their_samples():
    x = torch.randint(0, 256, (64, 1, 4, 4), dtype=torch.uint8)
    tx, ty = torch.randint(0, 256, (48, 1, 4, 4), dtype=torch.uint8), torch.randint(0, 4, (48,))
    data = {"train": Flipped(128), "val": (x, torch.randint(0, 4, (64,))),
            "test": DataLoader(TensorDataset(tx, ty), batch_size=5)}
    run = fasttrain.build(model=net(), data=data, epochs=1, batch_size=32, **FAST)
    fasttrain.fit(run)
    evals = [r for r in run.history if r["kind"] == "eval"]
    assert {"val_loss", "val_accuracy", "test_loss", "test_accuracy"} <= set(evals[-1])
    from fasttrain.engine.callbacks import evaluate

    run.model.eval()
    with torch.no_grad():  # the mean over the 48 samples, whatever the batches
        want = torch.nn.functional.cross_entropy(run.model(tx.float() / 255), ty).item()
    assert evaluate(run, "test")["test_loss"] == pytest.approx(want, rel=1e-5)


STREAMED = ["--model", "tests.engine.streamdata:plain", "--data", "tests.engine.streamdata:ordered",
            "--batch-size", "32", "--accum-steps", "2", "--optimizer", "sgd", "--lr", "0.05",
            "--epochs", "2", "--device", "cpu", "--no-progress"]
ITERABLE = ["--model", "tests.engine.streamdata:tiny", "--data", "tests.engine.streamdata:numbers",
            "--batch-size", "16", "--parallel", "ddp", "--device", "cpu", "--no-progress"]


# This module's 2-process runs, in the session's shared 2-process launch (launch.Part), in
# order: the streamed ddp run, the two recorded shares (each writing to its own --out:
# $FT_SEEN, set while it runs), then the iterable stream's whole run, its cut and the resume of
# the cut (one directory). They were six launches of their own.
TWO = Part(__name__, 2, [])
TWO.add("ddp", *STREAMED, "--parallel", "ddp", "--workers", "1")
for _data in ("ids", "numbers"):
    TWO.add(f"shares-{_data}", "--model", "tests.engine.streamdata:recording", "--data",
            f"tests.engine.streamdata:{_data}", "--batch-size", "16", "--max-steps", "16",
            "--parallel", "ddp", "--device", "cpu", "--no-progress", env={"FT_SEEN": "{out}"})
# A rank's share: 128 items, 16 steps a pass; 40 steps restart it twice.
TWO.add("whole", *ITERABLE, "--max-steps", "40")
TWO.add("cut", *ITERABLE, "--max-steps", "21")
TWO.add("cut-resumed", *ITERABLE, "--max-steps", "40", "--resume", "auto", out="cut")


@pytest.fixture(scope="module")
def two(shared) -> Part:
    return TWO.bound(shared)


@pytest.mark.slow
def test_ddp_on_two_gloo_processes_equals_one_process_for_streamed_data(tmp_path, two):
    from safetensors.torch import load_file

    from tests.engine.test_tensor_parallel import train_here

    proc = train_here(tmp_path / "one", args=STREAMED)  # one process: pytest's
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data streamed" in proc.stderr
    ddp = two("ddp").ok()
    assert "data streamed" in ddp.stderrs[0], ddp.log
    got = {name: load_file(out / "weights.safetensors")
           for name, out in (("one", tmp_path / "one"), ("ddp", two.root / "ddp"))}
    for k, v in got["one"].items():
        torch.testing.assert_close(got["ddp"][k], v, rtol=1e-5, atol=1e-6, msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("data", ["ids", "numbers"])
def test_two_gloo_ranks_train_on_disjoint_complete_shares(two, data):
    two(f"shares-{data}").ok()  # in the shared launch, its $FT_SEEN its --out
    seen_in = two.root / f"shares-{data}"
    seen = [[int(v) for v in (seen_in / f"rank{r}.txt").read_text().split()] for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 128  # 16 steps of 8 samples each
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(256))


@pytest.mark.slow
def test_an_iterable_stream_trains_evaluates_and_resumes_under_torchrun(two):
    """Trained, evaluated, cut in the middle of its second pass and resumed, under torchrun
    (the shared 2-process launch: the cut, then its resume, in the same processes)."""
    import json

    from safetensors.torch import load_file

    two("whole").ok()
    records = [json.loads(line)
               for line in (two.root / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["kind"] == "eval" and "test_loss" in records[-1]
    assert max(r["step"] for r in records) == 40
    # Cut in the middle of the second pass, resumed: the same weights, bit for bit.
    two("cut").ok()
    two("cut-resumed").ok()
    whole, resumed = (load_file(two.root / d / "weights.safetensors") for d in ("whole", "cut"))
    for k, v in whole.items():
        assert torch.equal(resumed[k], v), k


def test_plain_is_importable():
    assert plain()(torch.zeros(2, 1, 4, 4)).shape == (2, 4)


def test_a_dataloader_of_a_stream_of_whole_batches_is_dealt_batch_by_batch():
    class Batched(torch.utils.data.IterableDataset):
        def __iter__(self):
            return ((torch.arange(i * 8, i * 8 + 8).float()[:, None], torch.zeros(8).long())
                    for i in range(12))

    s = stream_of(DataLoader(Batched(), batch_size=None, num_workers=2))
    seen = [int(v) for x, _ in s.micro_batches(0) for v in x[:, 0]]
    assert sorted(seen) == list(range(96))
    with pytest.raises(UserError) as e:
        sampler = torch.utils.data.BatchSampler(range(64), 4, False)
        stream_of(DataLoader(Flipped(64), batch_sampler=sampler), world=2)
    one_line(e, "BatchSampler", "2 processes")


class Few(torch.utils.data.IterableDataset):
    """6 items, no length: rank 1 of 2 keeps 3, less than its micro-batch of 4."""

    def __iter__(self):
        return ((torch.tensor([float(i)]), 0) for i in range(6))


class OneFile(Few):
    """One "file" of 6 items, split by file: every reader but the first gets none."""

    splits_itself = True

    def __iter__(self):
        from fasttrain.engine.sampling import shard

        return super().__iter__() if shard()[0] == 0 else iter(())


def test_a_share_without_a_step_names_its_rank_and_cause():
    # Under torchrun a pass of a stream without length ends where the shortest share does
    # (agree.steps_together): a share that cannot start one must stop every rank with one line,
    # naming what made it short for this stream.
    with pytest.raises(UserError) as e:
        next(stream_of(Few(), rank=1, world=2).micro_batches(0))
    one_line(e, "rank 1", "micro-batch(es) of 4", "--batch-size", "fewer --workers")
    assert "splits_itself" not in str(e.value)  # it deals items by skipping
    with pytest.raises(UserError) as e:
        next(stream_of(OneFile(), rank=1, world=2).micro_batches(0))
    one_line(e, "rank 1", "splits_itself", "shards")


class SizedFile(OneFile):
    def __len__(self) -> int:
        return 16


def test_an_empty_share_of_an_endless_stream_names_its_cause():
    # With length, a rank's share restarts where it ends: an empty one must stop with one line
    # (it looped over empty passes).
    with pytest.raises(UserError) as e:
        next(stream_of(SizedFile(), rank=1, world=2).micro_batches(0))
    one_line(e, "rank 1", "splits_itself", "shards")


def test_the_builds_probe_reads_a_stream_as_its_only_reader():
    # shard() is what the last reader in this process set: a build after a rank-1 read (a
    # notebook's second run) probed OneFile as reader 1 of 2 and said the data was empty.
    next(iter(stream.Sharded(OneFile(), rank=1, world=2)), None)
    x, _ = next(stream_of(OneFile(), batch_size=2).micro_batches(0))  # no "train data is empty"
    assert x.flatten().tolist() == [0.0, 1.0]


class OnceOnly(Few):
    """A stream whose __iter__ hands back one generator made once: read whole at its first
    evaluation, empty at every later one."""

    def __init__(self):
        self.items = super().__iter__()

    def __iter__(self):
        return self.items


def test_an_empty_evaluation_split_is_one_line_not_a_crash_or_a_loss_of_zero():
    # A map-style split of no samples crashed in torch's collate after the training; a stream
    # that gives nothing when evaluated was reported as test_loss 0 and accuracy 0.
    with pytest.raises(UserError) as e:
        fasttrain.build(model=net(), data={"train": Flipped(64), "test": Flipped(0)},
                        epochs=1, batch_size=32, **FAST)
    one_line(e, "test data is empty")
    run = fasttrain.build(model=tiny(), data={"train": Numbers(32), "test": OnceOnly()},
                          max_steps=16, batch_size=4, **FAST)  # two passes of 8 steps
    with pytest.raises(UserError) as e:
        fasttrain.fit(run)  # the first evaluation reads it whole; the second gets nothing
    one_line(e, "test data gave no samples", "__iter__")
    assert [r["test_loss"] > 0 for r in run.history if r["kind"] == "eval"] == [True]


def weighted(workers: int) -> DataLoader:
    """A DataLoader of the user's with a sampler the engine keeps as built, drawing from torch's
    stream (no generator of its own)."""
    sampler = torch.utils.data.WeightedRandomSampler(torch.ones(256), 256)
    return DataLoader(Flipped(256), batch_size=32, sampler=sampler, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataloader_with_its_own_sampler_resumes_mid_epoch_bit_identically(tmp_path,
                                                                             workers):
    # Its iterator drew its workers' base seed from torch's global stream, the model's dropout
    # stream (and with workers its sampler drew there too): a resumed run's dropout and order
    # differed from an uninterrupted one's.
    common = dict(epochs=3, batch_size=32, **FAST)  # 8 steps an epoch
    whole = fasttrain.build(model=net(), data=weighted(workers), max_steps=24, **common)
    fasttrain.fit(whole)
    cut = fasttrain.build(model=net(), data=weighted(workers), max_steps=19, out=str(tmp_path),
                          **common)
    fasttrain.fit(cut)  # checkpoints at its end: step 19, mid-epoch 2
    torch.rand(7)  # the resumed run must restore every random stream itself
    resumed = fasttrain.build(model=net(), data=weighted(workers), max_steps=24,
                              out=str(tmp_path), resume="auto", **common)
    assert (resumed.epoch, resumed.step_in_epoch) == (2, 3)
    fasttrain.fit(resumed)
    for k, v in weights(whole).items():
        assert torch.equal(weights(resumed)[k], v), k


def test_workers_a_dataloader_of_yours_would_not_take_are_named(capsys):
    # --workers was dropped without a word where the train data is a DataLoader of the user's
    # (it keeps its own num_workers).
    loader = DataLoader(Flipped(64), batch_size=8, shuffle=True, num_workers=0)
    stream_of(loader, workers=2)
    err = capsys.readouterr().err
    assert "--workers 2" in err and "num_workers=0" in err, err
    assert len(err.strip().splitlines()) == 1, err
    stream_of(loader)  # no --workers: nothing to say
    stream_of(Flipped(64), workers=2)  # a Dataset: the engine's loader takes them
    assert capsys.readouterr().err == ""

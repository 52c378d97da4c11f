"""Scale-out without processes: how data is dealt to ranks, sharded checkpoint folders, per-rank
memory arithmetic, and the launches and switch combinations that are refused."""

from __future__ import annotations

import pytest
import torch

from fasttrain.engine import TrainConfig, build
from fasttrain.engine.batches import Batches
from fasttrain.errors import UserError
from fasttrain.models import MODEL_KINDS
from tests.engine.conftest import image_task


def numbered_task(n_train: int, n_test: int):
    """Labels are the sample indices, so a batch's labels say which samples it holds."""
    from dataclasses import replace

    task = image_task(n_train=n_train, n_test=n_test)
    return replace(task, train_y=torch.arange(n_train), test_y=torch.arange(n_test))


def ids(batches, epoch=0, start=0) -> list[list[int]]:
    return [y.tolist() for _, y in batches.micro_batches(epoch, start)]


@pytest.mark.parametrize("world, accum", [(2, 1), (2, 2), (4, 2), (3, 1)])
@pytest.mark.parametrize("start", [0, 3])
def test_ranks_together_see_exactly_the_one_process_micro_batches(world, accum, start):
    batch = 24 if world == 3 else 32
    task = numbered_task(n_train=300, n_test=10)

    def make(rank, w):
        return Batches(task, torch.device("cpu"), batch, accum, seed=5, on_device=True,
                       rank=rank, world=w)

    one = ids(make(0, 1), epoch=1, start=start)
    ranks = [ids(make(r, world), epoch=1, start=start) for r in range(world)]
    assert all(len(r) == len(one) for r in ranks)  # same number of micro-steps everywhere
    for i, micro in enumerate(one):
        together = sorted(x for r in ranks for x in r[i])
        assert together == sorted(micro), i
        assert all(len(r[i]) == batch // accum // world for r in ranks)


def test_the_dataloader_path_deals_the_same_shares():
    task = numbered_task(n_train=200, n_test=10)
    common = dict(batch_size=32, accum_steps=2, seed=1, rank=1, world=2)
    device = Batches(task, torch.device("cpu"), on_device=True, **common)
    loader = Batches(task, torch.device("cpu"), on_device=False, workers=0, **common)
    assert ids(device) == ids(loader)


@pytest.mark.parametrize("n_test, world", [(64, 2), (1001, 3), (5, 4), (513, 2)])
def test_each_test_sample_is_evaluated_once_in_equal_numbers_of_batches(n_test, world):
    task = numbered_task(n_train=64, n_test=n_test)
    shards = [[y.tolist() for _, y in Batches(task, torch.device("cpu"), 8, 1, 0, True,
                                              rank=r, world=world).eval_shard(256)]
              for r in range(world)]
    assert len({len(s) for s in shards}) == 1  # FSDP: every rank runs the same forwards
    assert all(batch and len(batch) <= 256 for s in shards for batch in s)
    assert sorted(x for s in shards for b in s for x in b) == list(range(n_test))


def test_checkpoint_folders_count_only_when_committed(tmp_path):
    from fasttrain.engine.checkpoint import complete

    (tmp_path / "step-00000010").mkdir()
    (tmp_path / ".step-00000020.tmp").mkdir()  # a sharded write cut short
    (tmp_path / "step-00000005.pt").write_bytes(b"")
    (tmp_path / "step-00000030.pt").mkdir()  # a folder with a file's name is not one
    assert [step for step, _ in complete(tmp_path)] == [5, 10]


def test_a_sharded_checkpoint_without_its_shards_is_one_line(tmp_path):
    from fasttrain.engine import checkpoint

    common = dict(model="mlp", batch_size=64, max_steps=2, progress=False, device="cpu",
                  out=str(tmp_path))
    folder = tmp_path / "checkpoints" / "step-00000001"
    folder.mkdir(parents=True)
    # A complete sharded checkpoint's extras (every field a restore reads), as FSDP writes them.
    fresh = build(TrainConfig(**{**common, "out": None}), data=image_task(), verbose=False)
    extras = checkpoint.state(fresh)
    extras["config"] = {**extras["config"], "parallel": "fsdp", "out": str(tmp_path)}
    torch.save(extras, folder / checkpoint.EXTRAS)
    # A single process reads sharded checkpoints through DCP too (it reshards: see
    # test_tensor_parallel.py); this one has no shards to read.
    with pytest.raises(UserError, match="sharded checkpoint .* cannot be loaded here"):
        build(TrainConfig(resume="auto", **common), data=image_task(), verbose=False)


def test_predicted_rank_memory():
    from fasttrain.engine.memory import predicted_rank_memory

    p = 1000 * 4
    assert predicted_rank_memory(1000, "ddp", 8).as_dict() == \
        {"params": p, "grads": p, "optimizer": 2 * p, "total": 4 * p}
    assert predicted_rank_memory(1000, "zero1", 8).optimizer == 2 * p // 8
    assert predicted_rank_memory(1000, "fsdp", 8).total == 4 * p // 8
    assert predicted_rank_memory(1000, "none", 1, "sgd", momentum=0.0).optimizer == 0


# -- refused launches and combinations --------------------------------------------------------


@pytest.fixture
def torchrun_env(monkeypatch):
    """Pretend to be rank 0 of `n` processes started by torchrun."""

    def set_world(n: int) -> None:
        monkeypatch.setenv("WORLD_SIZE", str(n))
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("LOCAL_RANK", "0")

    for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    return set_world


@pytest.mark.parametrize("world, kw, fix", [
    (None, dict(parallel="ddp"), "torchrun --nproc-per-node"),
    (None, dict(parallel="fsdp"), "or use --parallel none"),
    (None, dict(parallel="zero1"), "torchrun"),
    (2, dict(parallel="none"), "add --parallel ddp"),
    (None, dict(parallel="dp", device="cpu"), "≥ 2 CUDA GPUs"),
    (4, dict(parallel="ddp", batch_size=6), "multiple of 4"),
    (2, dict(parallel="ddp", batch_size=64, accum_steps=64), "multiple of 128"),
    (2, dict(parallel="ddp", cuda_graphs=True), "drop --cuda-graphs"),
    (None, dict(parallel="dp", compile=True), "--parallel ddp"),
    (2, dict(parallel="ddp", device="mps"), "--device cuda or cpu"),
])
def test_bad_launches_and_combinations_name_the_fix(torchrun_env, world, kw, fix):
    if world:
        torchrun_env(world)
    with pytest.raises(UserError) as e:
        TrainConfig(**kw).validate(MODEL_KINDS)
    assert fix in str(e.value)


def test_the_cli_refuses_ddp_without_torchrun_in_one_line(torchrun_env, capsys):
    from fasttrain.cli import main

    assert main(["train", "--parallel", "ddp", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "torchrun" in err


def test_fp16_on_sharded_layouts_takes_a_scaler_that_agrees_over_ranks():
    """FSDP shards and pipeline stages see part of the gradients each: the scaler must decide
    on all of them (ShardedGradScaler all-reduces its found-inf flag), and a first stage, which
    never scales a loss, must still hold a scale for unscale_ and update."""
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    from fasttrain.engine.switches import precision

    cpu = torch.device("cpu")
    _, scaler = precision(TrainConfig(precision="fp16"), cpu, sharded=True)
    assert isinstance(scaler, ShardedGradScaler) and scaler.get_scale() == 2.0 ** 16
    _, plain = precision(TrainConfig(precision="fp16"), cpu, sharded=False)
    assert not isinstance(plain, ShardedGradScaler) and plain.is_enabled()
    _, off = precision(TrainConfig(precision="bf16"), cpu, sharded=True)
    assert not off.is_enabled()

import pytest
import torch

from fasttrain.engine import TrainConfig, build
from fasttrain.engine import fit as fit_run


def image_task(n_train=256, n_test=64, shape=(1, 28, 28), seed=0, name="tiny"):
    """A small learnable image task made here: class prototypes plus noise."""
    from fasttrain.data.tasks import TaskData

    g = torch.Generator().manual_seed(seed)
    protos = torch.randint(0, 256, (10, *shape), generator=g)

    def split(n):
        y = torch.randint(0, 10, (n,), generator=g)
        noise = torch.randint(-50, 51, (n, *shape), generator=g)
        return (protos[y] + noise).clamp(0, 255).to(torch.uint8), y

    (tx, ty), (vx, vy) = split(n_train), split(n_test)
    return TaskData(name=name, kind="classification", train_x=tx, train_y=ty, test_x=vx,
                    test_y=vy, num_classes=10, in_shape=shape, source="tests", synthetic=True)


def text_task(n_train_tokens=3600, n_test_tokens=400, vocab=12, block_size=16, seed=0):
    from fasttrain.data.tasks import TaskData

    g = torch.Generator().manual_seed(seed)
    # A learnable stream: the next symbol is the previous one plus 0, 1 or 2.
    steps = torch.randint(0, 3, (n_train_tokens + n_test_tokens,), generator=g)
    tokens = (torch.cumsum(steps, 0) % vocab).to(torch.int64)
    cut = n_train_tokens
    return TaskData(name="tiny-text", kind="language", train_x=tokens[:cut], train_y=None,
                    test_x=tokens[cut:], test_y=None, num_classes=vocab,
                    in_shape=(block_size,), source="tests", synthetic=True,
                    vocab="abcdefghijkl"[:vocab])


def fit(task=None, **kw):
    """Train on `task` (default: a tiny image task) and return the run."""
    kw.setdefault("progress", False)
    kw.setdefault("device", "cpu")
    if task is None:
        task = image_task()
    if task.kind == "language":
        kw.setdefault("data", "synthetic-text")
        kw.setdefault("model", "gpt")
        kw.setdefault("block_size", task.in_shape[0])
    run = build(TrainConfig(**kw), data=task, verbose=False)
    fit_run(run)
    return run


def weights(run):
    return {k: v.detach().clone() for k, v in run.model.state_dict().items()}


@pytest.fixture
def tiny_images():
    return image_task()


@pytest.fixture(scope="session")
def one(tmp_path_factory):
    """One process's gpt run of `steps` steps, as the tp, pp and checkpointing tests train it
    (test_tensor_parallel.ARGS), trained once per session, in pytest's process
    (test_tensor_parallel.train_here): its directory. The same reference serves every module
    that compares a layout with one process (CI runs close to its 20 minutes)."""
    from tests.engine.test_tensor_parallel import train_here

    done = {}

    def run(steps: int):
        if steps not in done:
            out = tmp_path_factory.mktemp(f"one-{steps}")
            proc = train_here(out, "--max-steps", str(steps))
            assert proc.returncode == 0, proc.stdout + proc.stderr
            done[steps] = out
        return done[steps]

    return run



@pytest.fixture(scope="session")
def pipeline_runs(tmp_path_factory):
    """tests/engine/pipeline_driver.py's runs (test_pipeline.Runs), each trained once per
    session: test_pipeline and test_pipeline_layouts compare with the same one-process run."""
    from tests.engine.test_pipeline import Runs

    return Runs(tmp_path_factory.mktemp("pipeline"))

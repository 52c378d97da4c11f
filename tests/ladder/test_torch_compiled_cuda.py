"""The torch.compile variants of torch-graphs and torch-optimized on a GPU: each variant's row
trains like the float64 reference (partial batch included, and a second instance too: the
bench sets a row up for its check and again for its timing), the kernels a compiled step
launches, and graph trees replaying one graph a call, never falling back to eager. Written, not
yet run on a GPU."""

import numpy as np
import pytest
import torch

from fasttrain.ladder import torch_graphs as tg
from fasttrain.ladder import torch_optimized as to
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.torch_compiled import STEP, compiled, step_output
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CFG = LadderConfig(epochs=2, batch_size=64, device="cuda")  # 150 samples: 64, 64, 22
VARIANTS = ([(tg.TorchGraphs, v) for v in tg.SWEEP if v.compiled]
            + [(to.TorchOptimized, v) for v in (*(v for v in to.SWEEP if v.compiled),
                                                  to.Variant(k=2))])


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test's graphs its own: Dynamo keeps at most 8 graphs a step function (recompile_limit;
    past it, eager), and the classes step alone has 3 variants × 3 batch shapes in this file."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def row(base, v):
    return type(base.__name__, (base,), {"variant": v})


def train(cls, data):
    impl = cls("cuda") if issubclass(cls, to.TorchOptimized) else cls()
    impl.setup(data, CFG)
    for epoch in range(CFG.epochs):
        impl.train_epoch(epoch)
    return impl


@pytest.mark.parametrize("base, v", VARIANTS, ids=[f"{b.name} [{v.tag}]" for b, v in VARIANTS])
def test_each_compiled_variant_trains_like_the_reference_twice(base, v):
    from torch._dynamo.utils import counters

    data = make_ladder_data(tiny_images(n_train=150), CFG)
    w_ref, b_ref = reference_sgd(data, CFG, CFG.epochs)
    skips = counters["inductor"]["cudagraph_skips"]
    for _ in range(2):  # the second: compiled graphs reused, CUDA graphs recorded anew
        w, b = train(row(base, v), data).params()
        np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
        np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)
    assert counters["inductor"]["cudagraph_skips"] == skips  # graph trees never fell back


def kernels(fn) -> list[str]:
    """The CUDA kernels fn() launches, as CUPTI sees them."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
            and "memcpy" not in e.name.lower() and "memset" not in e.name.lower()]


@pytest.mark.parametrize("v", [v for v in tg.SWEEP if v.compiled and not v.lag], ids=str)
def test_kernels_a_compiled_step(v):
    """The bcast step: 3 Triton kernels, the classes step 2 (as Inductor's Triton code read on
    the CPU says); the autotuned mm step: at most the eager step's 4 and a split-K reduction.
    Printed for the record either way."""
    data = make_ladder_data(tiny_images(n_train=256), LadderConfig(batch_size=128))
    s = to.EpochState(data, LadderConfig(batch_size=128), torch.device("cuda"),
                      transposed=v.transposed)
    step = compiled(STEP[v.step], v.mode)
    out = step_output(v.step, 256, "cuda")
    args = (s.shuffled[128:256], s.w, out[128:256], s.lr)
    with torch.no_grad(), tg.preferred_blas(v.blas):
        step(*args)  # compiled (and autotuned) here
        names = kernels(lambda: step(*args))
    print(v, len(names), names)
    if v.step in ("bcast", "classes"):
        assert len(names) == {"bcast": 3, "classes": 2}[v.step], names
    else:
        assert 1 <= len(names) <= 5, names


def test_graph_trees_replay_one_graph_a_call():
    """torch-optimized at k = 2 over 3 steps: 2 calls an epoch, each one cudaGraphLaunch."""
    from torch.profiler import ProfilerActivity, profile

    data = make_ladder_data(tiny_images(n_train=150), CFG)
    impl = train(row(to.TorchOptimized, to.Variant(k=2)), data)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        impl.train_epoch(0)
        torch.cuda.synchronize()
    launches = sum(e.name == "cudaGraphLaunch" for e in prof.events())
    assert launches == 2, launches

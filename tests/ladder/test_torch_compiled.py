"""The torch.compile variants of torch-graphs (a compiled step a batch, captured in the epoch's
graph) and torch-optimized (k compiled steps a call, under CUDA graph trees), on the CPU: every
variant's epochs against the float64 reference, the partial batch included, through Dynamo and
AOTAutograd's functionalized graph ("aot_eager": Inductor's C++ build would cost ~7 s a graph
here) with the graphs compiled counted; Inductor's own code (CPU, and its Triton code for a
GPU, read without one) in the slow tests. The GPU runs are in test_torch_compiled_cuda.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from fasttrain.ladder import torch_graphs as tg
from fasttrain.ladder import torch_optimized as to
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.torch_compiled import FORMS, STEP, compiled
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

# 150 samples at batch 64: steps of 64, 64 and a partial 22, over 2 epochs of different order.
CFG = LadderConfig(epochs=2, batch_size=64)
# SWEEP's compiled steps, once each: aot_eager has no autotuning (its mode is Inductor's)
# (the lagged blocks' are in test_torch_lagged.py)
COMPILED_GRAPHS = list({(v.step, v.transposed): v for v in tg.SWEEP
                        if v.compiled and not v.lag}.values())


@pytest.fixture(scope="module")
def data():
    return make_ladder_data(tiny_images(n_train=150), CFG)


@pytest.fixture(scope="module")
def eager(data):
    """The eager row's weights and loss sum after CFG's epochs, and the float64 reference's."""
    s = to.EpochState(data, CFG, torch.device("cpu"))
    for epoch in range(CFG.epochs):
        to.train_epoch_steps(s, torch.from_numpy(data.orders[epoch]))
    return s.loss_sum.item(), reference_sgd(data, CFG, CFG.epochs)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # no graph of another test counted or reused
    yield
    torch._dynamo.reset()


def assert_trained_like_the_reference(s, data, eager):
    loss, (w_ref, b_ref) = eager
    w, b = s.params()
    assert not np.allclose(w_ref, data.w0, atol=ATOL)
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)
    assert s.loss_sum.item() == pytest.approx(loss, rel=1e-5)


@pytest.mark.parametrize("v", COMPILED_GRAPHS, ids=str)
def test_a_compiled_step_trains_like_the_reference_in_two_graphs(v, data, eager):
    """torch-graphs' compiled step over the eager step's fixed views: W updated in its own
    storage (the epoch graph's), and only 2 graphs compiled for 6 steps over 2 epochs (the
    views differ in storage offset only; the partial batch is the second)."""
    s = to.EpochState(data, CFG, torch.device("cpu"), transposed=v.transposed)
    ptr, stride = s.w.data_ptr(), s.w.stride()
    count = CompileCounterWithBackend("aot_eager")
    epoch = tg.epoch_fn(s, v, CFG.batch_size, backend=count)
    for e in range(CFG.epochs):
        epoch(torch.from_numpy(data.orders[e]))
    assert count.frame_count == 2
    assert (s.w.data_ptr(), s.w.stride()) == (ptr, stride)
    assert_trained_like_the_reference(s, data, eager)


@pytest.mark.parametrize("v", [*(to.Variant(k=2, form=f) for f in FORMS),
                               *(v for v in to.SWEEP if v.compiled)],
                         ids=str)
def test_compiled_chunks_train_like_the_reference(v, data, eager):
    """torch-optimized's v5 epoch, its chunk compiled without graph trees (CUDA's): the steps
    gathered in the graph, W and the loss sum updated in place, 2 epochs of warm-up undone;
    k = 2 makes a chunk of 2 steps and one of the partial step (2 graphs), k = 7 one chunk."""
    s = to.EpochState(data, CFG, torch.device("cpu"))
    ptr = s.w.data_ptr()
    count = CompileCounterWithBackend("aot_eager")
    epoch = to.graph_tree_epochs(s, torch.from_numpy(data.orders), v, CFG, mode=None,
                                 backend=count)
    assert s.loss_sum.item() == 0 and np.array_equal(s.params()[0], data.w0)  # warm-up undone
    for e in range(CFG.epochs):
        epoch(e)
    assert count.frame_count == (2 if v.k == 2 else 1)
    assert s.w.data_ptr() == ptr
    assert_trained_like_the_reference(s, data, eager)


def test_misaligned_views_are_refused(data):
    """At batch 3 the log-prob slices start 12 bytes apart: Inductor would clone them."""
    cfg = LadderConfig(epochs=1, batch_size=3)
    s = to.EpochState(data, cfg, torch.device("cpu"))
    with pytest.raises(ValueError, match="16-byte aligned"):
        tg.epoch_fn(s, tg.Variant(step="bcast"), cfg.batch_size, backend="aot_eager")


@pytest.mark.parametrize("make", [
    lambda: tg.Variant(step="fast"), lambda: tg.Variant(blas="mkl"),
    lambda: tg.Variant(autotune=True), lambda: to.Variant(k=-1),
    lambda: tg.Variant(step="lagged"), lambda: tg.Variant(step="bcast", lag=4),
    lambda: to.Variant(k=7, form="einsum"), lambda: to.Variant(form="bcast"),
    lambda: tg.Variant(pdl=True), lambda: tg.Variant(step="lagged", lag=4, pdl=True),
    lambda: tg.Variant(step="bcast", autotune=True, pdl=True)])
def test_bad_variants_are_refused(make):
    with pytest.raises(ValueError):
        make()


def test_the_sweeps_keep_their_defaults_and_name_each_variant_once():
    for module in (tg, to):
        assert module.DEFAULT in module.SWEEP
        assert len({v.tag for v in module.SWEEP}) == len(module.SWEEP)
    # The H200's sweep of 2026-11-28: each row's fastest, a compiled step.
    assert tg.Variant(step="bcast") == tg.DEFAULT and to.Variant(k=7) == to.DEFAULT
    assert to.EAGER in to.SWEEP and not to.EAGER.compiled
    assert tg.Variant(step="bcast", autotune=True).mode == "max-autotune-no-cudagraphs"
    assert tg.Variant(step="bcast").mode is None


def test_a_compiled_torch_optimized_needs_cuda():
    row = type("Row", (to.TorchOptimized,), {"variant": to.Variant(k=7)})
    assert "CUDA graph trees" in row.unavailable({}, LadderConfig(device="cpu"))
    assert row.unavailable({}, LadderConfig(device="cuda")) is None
    assert to.TorchOptimized.unavailable({}, LadderConfig(device="cpu")) is None


def test_the_torch_optimized_row_runs_eager_v4_off_cuda(data):
    """The row's DEFAULT (k = 7, graph trees) is CUDA's; on the CPU the row runs eager v4, and
    a variant named on purpose (the sweep's) is never swapped."""
    assert to.row_variant(to.DEFAULT, "cpu") == to.EAGER
    assert to.row_variant(to.DEFAULT, "cuda") == to.DEFAULT == to.Variant(k=7)
    assert to.row_variant(to.Variant(k=7, form="bcast"), "cpu").compiled
    row = to.TorchOptimized("cpu")
    row.setup(data, CFG)
    assert row.variant == to.EAGER and row.details()["cuda_graph"] is False


def test_pdl_is_inductors_option_without_a_mode(monkeypatch):
    """A pdl variant compiles with Inductor's `triton.enable_pdl` (torch.compile takes options or
    a mode, not both); under the tests' aot_eager backend the same step, no option."""
    seen = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw) or fn)
    compiled.cache_clear()
    try:
        compiled(STEP["bcast"], None, "inductor", True)
        compiled(STEP["bcast"], None, "inductor", False)
        with pytest.raises(ValueError, match="without a mode"):
            compiled(STEP["bcast"], "max-autotune-no-cudagraphs", "inductor", True)
        s = to.EpochState(make_ladder_data(tiny_images(n_train=150), CFG), CFG,
                          torch.device("cpu"))
        tg.epoch_fn(s, tg.Variant(step="classes", pdl=True), CFG.batch_size, "aot_eager")
        tg.epoch_fn(s, tg.Variant(step="classes", pdl=True), CFG.batch_size)
    finally:
        compiled.cache_clear()
    assert [kw["options"] for kw in seen] == [{"triton.enable_pdl": True}, None, None,
                                              {"triton.enable_pdl": True}]
    assert seen[0]["mode"] is None and seen[2]["backend"] == "aot_eager"
    assert "pdl" in tg.Variant(step="classes", pdl=True).tag


def test_one_compiled_wrapper_a_function_mode_and_backend():
    """A second torch.compile of the same step would not match its graphs' backend guard and
    compile them again: the bench's check and each repeat share one."""
    assert compiled(STEP["mm"], "max-autotune-no-cudagraphs") is compiled(
        STEP["mm"], "max-autotune-no-cudagraphs")
    assert compiled(STEP["mm"]) is not compiled(STEP["bcast"])


@pytest.mark.slow
@pytest.mark.parametrize("step", ["bcast", "classes"])
def test_inductors_cpu_step_updates_w_in_place(step, data, eager):
    """Inductor's own lowering (its C++ backend here): the mutations of W and of the output
    slices (log-probs, or the rows' loss) are stores into those buffers, not into copies."""
    s = to.EpochState(data, CFG, torch.device("cpu"))
    epoch = tg.epoch_fn(s, tg.Variant(step=step), CFG.batch_size)
    for e in range(CFG.epochs):
        epoch(torch.from_numpy(data.orders[e]))
    assert_trained_like_the_reference(s, data, eager)


@pytest.mark.slow
def test_inductors_triton_kernels_a_step():
    """The kernels Inductor's Triton lowering launches (tests/ladder/inductor_triton_code.py,
    generated for CPU tensors, not compiled): the bcast step is 3 Triton kernels and W is
    stored by the last (no copy kernel); the default-mode mm step is 4 launches, a copy of W
    among them, more than the eager step's — why SWEEP's mm steps are autotuned only; a chunk
    of k steps is 3k + 1 (bcast) or 3k + 3 (mm: the gathers, one kernel, and W's copy once).
    The classes step is 2 (W or Wᵀ storage), no copy, and its chunk 2k + 1; bcast over Wᵀ 3."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": "src:."}
    specs = ["step:bcast", "step:mm", "chunk:bcast:3", "chunk:mm:2",
             "step:classes", "step:classes:t", "chunk:classes:3", "step:bcast:t"]
    out = subprocess.run([sys.executable, "-m", "tests.ladder.inductor_triton_code", *specs],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert all(len(graphs) == 1 for graphs in got.values())
    bcast, mm, chunk_bcast, chunk_mm, classes, classes_t, chunk_classes, bcast_t = (
        got[s][0] for s in specs)
    for kernels in (classes, classes_t):
        assert len(kernels) == 2 and not any(k.startswith("extern:") for k in kernels)
        assert not any("_poi_" in k for k in kernels)  # no copy or stack kernel: 2 reductions
    assert len(chunk_classes) == 2 * 3 + 1
    assert len(bcast) == len(bcast_t) == 3 and not any(k.startswith("extern:") for k in bcast)
    assert not any("_poi_fused_copy_" in k for k in bcast + chunk_bcast + bcast_t)
    assert [k for k in mm if k.startswith("extern:")] == ["extern:mm", "extern:addmm"]
    assert len(mm) == 4 and "_poi_fused_copy_" in mm[-1]
    assert len(chunk_bcast) == 3 * 3 + 1
    assert len(chunk_mm) == 3 * 2 + 3 and chunk_mm.count("extern:addmm") == 2

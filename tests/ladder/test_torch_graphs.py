"""torch-optimized's step code, which torch-graphs captures as CUDA graphs: run eagerly on the CPU
against the float64 reference, its loss sum checked, and its aten ops counted — every op is one
kernel (cuBLAS may add a split-K reduction to a GEMM), so a step that grows an op fails here. On
a GPU both rows run in test_ladder.py's and test_torch_rows_cuda.py's generic checks."""

from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fasttrain.ladder.common import LadderConfig, make_ladder_data, softmax_xent
from fasttrain.ladder.torch_optimized import (
    OPS_PER_STEP,
    EpochState,
    shuffle,
    sum_loss,
    train_epoch_steps,
    train_steps,
)
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd


class CountOps(TorchDispatchMode):
    """Counts the aten ops dispatched (views, which launch nothing, apart)."""

    def __init__(self):
        super().__init__()
        self.ops, self.views = Counter(), Counter()
        self.grad_modes = set()  # "inference", "grad" or "no_grad": what each op ran under

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.grad_modes.add("inference" if torch.is_inference_mode_enabled()
                            else "grad" if torch.is_grad_enabled() else "no_grad")
        out = func(*args, **(kwargs or {}))
        kind = self.views if func._schema.name in VIEWS else self.ops
        kind[func._schema.name.removeprefix("aten::")] += 1
        return out


VIEWS = {"aten::slice", "aten::t", "aten::transpose", "aten::view", "aten::select",
         "aten::alias", "aten::as_strided", "aten::numpy_T", "aten::permute"}


def run_eager(data, cfg):
    s = EpochState(data, cfg, torch.device("cpu"))
    for epoch in range(cfg.epochs):
        train_epoch_steps(s, torch.from_numpy(data.orders[epoch]))
    w, b = s.params()
    return w, b, s


def test_steps_with_partial_batch_match_float64_reference():
    # 150 samples at batch 64: steps of 64, 64 and a partial 22, over 2 epochs of different order.
    cfg = LadderConfig(epochs=2, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    w, b, _ = run_eager(data, cfg)
    w_ref, b_ref = reference_sgd(data, cfg, 2)
    assert not np.allclose(w_ref, data.w0, atol=ATOL)
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)


def test_loss_summed_is_the_batch_loss():
    cfg = LadderConfig(epochs=1, batch_size=128)
    data = make_ladder_data(tiny_images(n_train=128), cfg)  # one step, from the initial weights
    _, _, s = run_eager(data, cfg)
    loss, _ = softmax_xent(data.w0, data.b0, data.train_x / 255.0, data.train_y)
    assert s.loss_sum.item() == pytest.approx(128 * loss, rel=1e-5)


def test_a_step_is_four_ops_and_an_epoch_adds_four():
    cfg = LadderConfig(epochs=1, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)  # 3 steps, the last partial
    s = EpochState(data, cfg, torch.device("cpu"))
    order = torch.from_numpy(data.orders[0])
    with CountOps() as step:
        shuffle(s, order)
    assert sum(step.ops.values()) == 1  # the whole set gathered in epoch order, once
    with CountOps() as step:
        train_steps(s, s.steps[:1])
    assert step.ops == Counter({"mm": 1, "_log_softmax": 1, "_log_softmax_backward_data": 1,
                                "addmm_": 1})
    assert sum(step.ops.values()) == OPS_PER_STEP
    assert not step.views  # v4: g.T and Wᵀ made at setup; a view is a dispatch too (~1 µs)
    with CountOps() as epoch:
        train_steps(s, s.steps)
    assert sum(epoch.ops.values()) == OPS_PER_STEP * len(s.steps)
    with CountOps() as loss:
        sum_loss(s)
    assert sum(loss.ops.values()) == 3  # mul, sum, add_: once an epoch, no host sync
    assert "_local_scalar_dense" not in epoch.ops | loss.ops  # .item(): a host sync


def test_the_transposed_weight_layout_trains_the_same_in_place():
    """torch-graphs' `transposed` variants: the weight over [785, 10] storage, the same 4 ops a
    step, updated in place (the graph's buffers never move), and the float64 reference's
    weights."""
    cfg = LadderConfig(epochs=2, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    s = EpochState(data, cfg, torch.device("cpu"), transposed=True)
    assert s.w.shape == (10, 785) and s.w.stride() == (1, 10)
    ptr = s.w.data_ptr()
    for epoch in range(cfg.epochs):
        train_epoch_steps(s, torch.from_numpy(data.orders[epoch]))
    assert s.w.data_ptr() == ptr and s.w.stride() == (1, 10)
    w_ref, b_ref = reference_sgd(data, cfg, 2)
    w, b = s.params()
    np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0)
    with CountOps() as step:
        train_steps(s, s.steps[:1])
    assert sum(step.ops.values()) == OPS_PER_STEP


def test_the_blas_library_is_restored_after_the_capture(monkeypatch):
    """preferred_blas sets PyTorch's BLAS library for the capture only, and restores the one
    before also when the capture raises (a CPU build cannot switch to cuBLASLt: the library
    setting is stood in for)."""
    from fasttrain.ladder.torch_graphs import DEFAULT, SWEEP, preferred_blas

    state = {"now": "cublas"}

    def library(backend=None):
        if backend is not None:
            state["now"] = backend
        return state["now"]

    monkeypatch.setattr(torch.backends.cuda, "preferred_blas_library", library)
    with preferred_blas("cublaslt"):
        assert state["now"] == "cublaslt"
    assert state["now"] == "cublas"
    with pytest.raises(RuntimeError, match="capture failed"), preferred_blas("cublaslt"):
        raise RuntimeError("capture failed")
    assert state["now"] == "cublas"
    assert DEFAULT.blas == "cublas" and {v.blas for v in SWEEP} == {"cublas", "cublaslt"}


def test_the_steps_run_in_inference_mode_and_leave_no_inference_tensor():
    """v4: train_steps runs under torch.inference_mode (the autograd dispatch keys skipped), but
    creates no tensor, so every buffer stays a normal tensor: the epoch's loss sum, params(),
    evaluate() and a CUDA graph's next capture or replay use them as before, autograd included."""
    cfg = LadderConfig(epochs=1, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    s = EpochState(data, cfg, torch.device("cpu"))
    shuffle(s, torch.from_numpy(data.orders[0]))  # the steps read the shuffled rows
    with CountOps() as step:
        train_steps(s, s.steps)
    assert step.grad_modes == {"inference"}
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # restored
    buffers = [s.w, s.wt, s.z, s.g, s.logp, s.shuffled, s.loss_sum] + [
        t for st in s.steps for t in st if isinstance(t, torch.Tensor)]
    assert not any(t.is_inference() for t in buffers)
    sum_loss(s)  # outside inference mode, on the buffers the steps wrote
    w = s.w.clone().requires_grad_(True)
    (w ** 2).sum().backward()  # a normal tensor: autograd can still use what the steps wrote
    torch.testing.assert_close(w.grad, 2 * s.w)

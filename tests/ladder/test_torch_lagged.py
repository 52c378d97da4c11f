"""torch-graphs' lagged-Gram steps (ladder/torch_lagged.py) on the CPU: the epoch the graph
captures, run without the capture, against the float64 reference SGD for L = 1 … 16 (the partial
batch and a block the epoch's end cuts short included), eager and compiled (through aot_eager);
L = 1 is the plain step bit for bit; the Grams' precision; the kernels a block (aten ops counted,
Inductor's Triton code read in the slow test); planted bugs fail. The GPU runs are in
test_torch_compiled_cuda.py (lagged-fused) and test_torch_lagged_cuda.py."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from fasttrain.ladder import torch_graphs as tg
from fasttrain.ladder import torch_lagged as tl
from fasttrain.ladder import torch_optimized as to
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd
from tests.ladder.test_torch_graphs import CountOps

# 10 full batches of 64 and a partial 22: L = 4 makes blocks of 4, 4 and 3 steps (the last cut,
# the partial batch in it), L = 2 a last block of the partial batch alone, L = 16 one cut block.
CFG = LadderConfig(epochs=2, batch_size=64)
N = 10 * 64 + 22
LAGS = (1, 2, 4, 8, 16)


@pytest.fixture(scope="module")
def data():
    return make_ladder_data(tiny_images(n_train=N), CFG)


@pytest.fixture(scope="module")
def ref(data):
    return reference_sgd(data, CFG, CFG.epochs)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run(data, step, lag, backend="aot_eager"):
    s = to.EpochState(data, CFG, torch.device("cpu"))
    epoch = tg.epoch_fn(s, tg.Variant(step=step, lag=lag), CFG.batch_size, backend=backend)
    for e in range(CFG.epochs):
        epoch(torch.from_numpy(data.orders[e]))
    return s


def err(s, ref):
    w, b = s.params()
    return max(np.abs(w - ref[0]).max(), np.abs(b - ref[1]).max())


def plain_loss(data):
    s = to.EpochState(data, CFG, torch.device("cpu"))
    for e in range(CFG.epochs):
        to.train_epoch_steps(s, torch.from_numpy(data.orders[e]))
    return s


@pytest.mark.parametrize("lag", LAGS)
@pytest.mark.parametrize("step", tg.LAGGED)
def test_lagged_epochs_train_like_the_float64_reference(step, lag, data, ref):
    s = run(data, step, lag)
    assert not np.allclose(ref[0], data.w0, atol=ATOL)
    assert err(s, ref) <= ATOL
    assert s.loss_sum.item() == pytest.approx(plain_loss(data).loss_sum.item(), rel=1e-5)


def test_lag_one_is_the_plain_step_bit_for_bit(data):
    """L = 1: P is the plain step's mm, no correction, the same softmax ops and addmm_."""
    a, b = run(data, "lagged", 1), plain_loss(data)
    assert torch.equal(a.w, b.w) and torch.equal(a.loss_sum, b.loss_sum)


def test_the_compiled_block_is_two_graphs_and_updates_w_in_place(data, ref):
    """One graph for the full blocks, one for the cut last block (views differ in offset only)."""
    s = to.EpochState(data, CFG, torch.device("cpu"))
    ptr = s.w.data_ptr()
    count = CompileCounterWithBackend("aot_eager")
    epoch = tg.epoch_fn(s, tg.Variant(step="lagged-fused", lag=4), CFG.batch_size, backend=count)
    for e in range(CFG.epochs):
        epoch(torch.from_numpy(data.orders[e]))
    assert count.frame_count == 2 and s.w.data_ptr() == ptr
    assert err(s, ref) <= ATOL


def test_blocks_cover_the_epoch_and_the_last_is_cut():
    assert tl.block_spans(N, 64, 4) == [(0, 256), (256, 512), (512, N)]
    assert tl.block_spans(N, 64, 16) == [(0, N)]
    with pytest.raises(ValueError):
        tl.block_spans(N, 64, 0)


def test_the_grams_are_the_float64_grams_to_fp32_rounding(data):
    """Γ̃ = 255² x_t · x_i, the bias included, from the epoch's pixel rows; bf16 holds every pixel
    and 255 exactly (the CUDA path's operands), and the fp32 sums are within fp32 rounding of
    sums ≤ 785 · 255² of the float64 Gram (relative ~6e-8 a rounding)."""
    levels = torch.arange(256, dtype=torch.float32)
    assert torch.equal(levels.to(torch.bfloat16).float(), levels)
    s = to.EpochState(data, CFG, torch.device("cpu"))
    lg = tl.Lagged(s, CFG.batch_size, 4)
    order = torch.from_numpy(data.orders[0])
    to.shuffle(s, order)
    lg.make_grams(order)
    pix = np.concatenate([data.train_x[data.orders[0]].astype(np.float64),
                          np.full((N, 1), 255.0)], axis=1)
    for i, (a, b) in enumerate(lg.spans):
        want = pix[a:b] @ pix[a:b].T
        got = lg.grams[i, : b - a, : b - a].double().numpy()
        assert np.abs(got - want).max() / want.max() <= 1e-6
    x = lg.shuffled[:N, :785] / 255  # [x/255 | 1]: the rows' augmented x, exactly
    np.testing.assert_allclose(x.numpy(), s.shuffled[:, :785].numpy(), rtol=1e-6, atol=0)


def test_a_block_is_3l_plus_1_aten_ops(data):
    s = to.EpochState(data, CFG, torch.device("cpu"))
    lg = tl.Lagged(s, CFG.batch_size, 4)
    to.shuffle(s, torch.from_numpy(data.orders[0]))
    lg.make_grams(torch.from_numpy(data.orders[0]))
    lg.blocks = lg.blocks[:1]
    with CountOps() as ops:
        tl.train_blocks(s, lg)
    assert sum(ops.ops.values()) == 3 * 4 + 1 and ops.ops["addmm"] == 3, ops.ops
    assert "_local_scalar_dense" not in ops.ops  # no host sync


def drop_oldest(lg):
    """A step's window without its block's first step (its Gram term left out)."""
    b = lg.batch_size
    for i, blk in enumerate(lg.blocks):
        lg.blocks[i] = blk._replace(steps=[
            st._replace(gram=st.gram[:, b:], g_prev=st.g_prev[b:]) if st.gram is not None else st
            for st in blk.steps])


def no_bias_in_gram(lg):
    lg.pixels[:, 784] = 0  # the bias column's 1 left out of x_t · x_i


def updated_a_block_late(lg):
    """Each W update applied one call late (the last never): P read from a stale W."""
    w, pending = lg.s.w, []
    real = w.addmm_

    def late(gt, x, alpha):
        if pending:
            gt0, x0, alpha0 = pending.pop()
            real(gt0, x0, alpha=alpha0)
        pending.append((gt.clone(), x.clone(), alpha))

    w.addmm_ = late


PLANTED = {"a Gram term left out": drop_oldest, "the bias's Gram term left out": no_bias_in_gram,
           "W updated a block late": updated_a_block_late}


@pytest.mark.parametrize("bug", PLANTED)
def test_planted_bugs_fail(bug, data, ref, monkeypatch):
    made = []

    class Planted(tl.Lagged):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            PLANTED[bug](self)
            made.append(self)

    monkeypatch.setattr(tl, "Lagged", Planted)
    s = run(data, "lagged", 4)
    assert made and err(s, ref) > ATOL


def test_a_planted_gram_bug_fails_the_compiled_block_too(data, ref, monkeypatch):
    monkeypatch.setattr(tl, "PIXEL_MAX", 254)  # the correction's 1/255² scale wrong
    assert err(run(data, "lagged-fused", 4), ref) > ATOL


def test_the_sweep_names_each_lagged_variant_once():
    lagged = [v for v in tg.SWEEP if v.lag]
    assert {(v.step, v.lag) for v in lagged} == {(s, L) for s in tg.LAGGED for L in (4, 8, 16)}
    assert tg.Variant(step="bcast") == tg.DEFAULT  # a GPU decides
    assert all(v.compiled == (v.step == "lagged-fused") for v in lagged)


@pytest.mark.slow
def test_inductors_triton_kernels_a_lagged_block():
    """Inductor's Triton code for a fused block of L = 4 full batches (generated for CPU tensors,
    not compiled; tests/ladder/inductor_triton_code.py): L + 4 kernels — P, step 0's softmax,
    one reduction a later step with the softmax, g and the loss fused in it (the goal), two
    pointwise copies Inductor defers to the block's end, and W's update — no extern (BLAS)."""
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": "src:."}
    out = subprocess.run([sys.executable, "-m", "tests.ladder.inductor_triton_code", "lagged:4"],
                         env=env, capture_output=True, text=True, timeout=300, check=True)
    (kernels,) = json.loads(out.stdout.strip().splitlines()[-1])["lagged:4"]
    print(kernels)
    assert len(kernels) == tl.fused_kernels(4) and not any(k.startswith("extern:") for k in kernels)
    steps = [k for k in kernels if k.startswith("triton_red_fused_add_exp_log_maximum")]
    assert len(steps) == 4 - 1  # each step after the first: correction + softmax in one kernel

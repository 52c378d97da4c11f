"""triton-fused on the CPU: the kernel runs under Triton's interpreter in a child process
(TRITON_INTERPRET=1 must be set before triton is imported, and must not leak into other tests),
and its weights and statistics are checked here against the float64 reference. On a GPU the row
itself runs in test_ladder.py's generic checks."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from fasttrain.ladder.common import LadderConfig, make_ladder_data, softmax_xent
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

pytest.importorskip("triton", reason="triton is in the test extra: pip install -e .[test]")
ROOT = Path(__file__).resolve().parents[2]

# Each case: (samples, batch size, epochs, lr). Small: the interpreter runs ~0.2 s a step.
CASES = {
    "one-step": (64, 64, 1, 0.1),  # one full batch from the initial weights
    "partial": (40, 16, 2, 0.1),  # steps of 16, 16 and a partial 8, two epochs
    "memorize": (16, 16, 10, 0.5),  # one small batch, ten steps
}

CHILD = """
import json, sys
import numpy as np, torch
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from fasttrain.ladder.triton_fused import sgd_steps
from tests.conftest import tiny_images
out = {}
for name, (n, bs, epochs, lr) in json.loads(sys.argv[1]).items():
    cfg = LadderConfig(epochs=epochs, batch_size=bs, lr=lr)
    data = make_ladder_data(tiny_images(n_train=n), cfg)
    x, y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    w, b = torch.from_numpy(data.w0.copy()), torch.from_numpy(data.b0.copy())
    stats = torch.zeros(2)
    for e in range(epochs):
        sgd_steps(x, y, torch.from_numpy(data.orders[e]), w, b, stats, 0, -(-n // bs), bs, lr)
    out[name] = {"w": w.tolist(), "b": b.tolist(), "stats": stats.tolist()}
json.dump(out, sys.stdout)
"""


@pytest.fixture(scope="module")
def interpreted():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    r = subprocess.run([sys.executable, "-c", CHILD, json.dumps(CASES)], env=env, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {k: {f: np.array(v, dtype=np.float32) for f, v in d.items()}
            for k, d in json.loads(r.stdout).items()}


def case(name):
    n, bs, epochs, lr = CASES[name]
    cfg = LadderConfig(epochs=epochs, batch_size=bs, lr=lr)
    return make_ladder_data(tiny_images(n_train=n), cfg), cfg


@pytest.mark.parametrize("name", ["one-step", "partial"])
def test_steps_match_float64_reference(interpreted, name):
    data, cfg = case(name)
    w_ref, b_ref = reference_sgd(data, cfg, cfg.epochs)
    got = interpreted[name]
    assert not np.allclose(w_ref, data.w0, atol=ATOL), "the steps must change the weights"
    np.testing.assert_allclose(got["w"], w_ref, atol=ATOL, rtol=0)
    np.testing.assert_allclose(got["b"], b_ref, atol=ATOL, rtol=0)


def test_loss_and_accuracy_accumulated_on_device(interpreted):
    data, _ = case("one-step")
    loss, acc = softmax_xent(data.w0, data.b0, data.train_x / 255.0, data.train_y)
    loss_sum, correct = interpreted["one-step"]["stats"]
    assert loss_sum == pytest.approx(64 * loss, rel=1e-5)
    assert correct == round(64 * acc)


def test_memorizes_a_small_batch(interpreted):
    data, _ = case("memorize")
    got = interpreted["memorize"]
    loss, acc = softmax_xent(got["w"], got["b"], data.train_x / 255.0, data.train_y)
    assert acc == 1.0
    assert loss < 0.02, f"triton-fused did not memorize one batch: loss {loss:.4f}"


COMPILE = """
import json
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from fasttrain.ladder import triton_fused as tf
out = []
for n_steps in ("i32", 1):  # a whole epoch; one step (the JIT makes an argument == 1 a constexpr)
    sig = dict(x_ptr="*u8", y_ptr="*i64", order_ptr="*i64", w_ptr="*fp32", b_ptr="*fp32",
               stats_ptr="*fp32", n="i32", first="i32", n_steps=n_steps, batch="i32", lr="fp32")
    consts = dict(K=784, C=10, BLOCK_B=128, BLOCK_K=tf.BLOCK_K, BLOCK_C=tf.BLOCK_C)
    if n_steps == 1:
        sig["n_steps"], consts["n_steps"] = "constexpr", 1
    src = ASTSource(fn=tf.sgd_steps_kernel, constexprs=consts,
                    signature={**sig, **{k: "constexpr" for k in consts}})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options={"num_warps": tf.NUM_WARPS})
    out.append({"cubin": len(kernel.asm["cubin"]), "bar_sync": "bar.sync" in kernel.asm["ptx"]})
print(json.dumps(out))
"""


def test_kernel_compiles_for_hopper():
    """The interpreter does not lower the kernel; this does, ahead of time to an sm_90 cubin
    through Triton's own ptxas (no GPU needed), as the GPU will on first launch. In a child
    without TRITON_INTERPRET, so that it compiles even when the suite runs under the interpreter."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    r = subprocess.run([sys.executable, "-c", COMPILE], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for variant in json.loads(r.stdout.splitlines()[-1]):
        assert variant["cubin"] > 0
        assert variant["bar_sync"], "the barriers between a step's phases are emitted"

"""cpp-tiled beyond what every row's tests check (tests/ladder/test_ladder.py runs its one step,
partial batch and memorization against float64): every vector width the source can be built for
and every thread count give the same training, and the g++ build is cached like the CUDA one."""

import ctypes
import shutil

import numpy as np
import pytest

from fasttrain.ladder import build, cpp_tiled
from fasttrain.ladder.common import LadderConfig, make_ladder_data
from tests.conftest import tiny_images
from tests.ladder.test_ladder import ATOL, reference_sgd

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="g++ not found on PATH")

# What the machine can run of the widths (-march=native picks the widest), and the lane shuffles
# GCC before 12 is limited to (__builtin_shuffle instead of __builtin_shufflevector).
WIDTHS = {"native": (), "avx2": ("-mno-avx512f",), "sse": ("-mno-avx",),
          "gcc11-shuffles": ("-DFASTTRAIN_OLD_SHUFFLE",)}


def cpu_has(flag: str) -> bool:
    with open("/proc/cpuinfo") as f:
        return any(flag in line.split() for line in f if line.startswith("flags"))


def library(width, tmp_path_factory):
    if width == "avx2" and not cpu_has("avx2"):
        pytest.skip("this CPU has no AVX2")
    so = build.compile_cpu(cpp_tiled.SOURCE, extra=WIDTHS[width],
                           out_dir=tmp_path_factory.getbasetemp() / "cpp")
    return cpp_tiled.typed(ctypes.CDLL(str(so)))


def train(lib, data, cfg, threads):
    w, b = data.w0.copy(), data.b0.copy()
    losses = [cpp_tiled.run_epoch(lib, data.train_x, data.train_y, data.orders[e], w, b, cfg.lr,
                                  cfg.batch_size, threads) for e in range(cfg.epochs)]
    return w, b, losses


@pytest.mark.parametrize("width", WIDTHS)
def test_every_vector_width_trains_like_float64(width, tmp_path_factory):
    lib = library(width, tmp_path_factory)
    expected = {"sse": 4, "avx2": 8}.get(width)
    assert expected is None or lib.cpu_epoch_vector_width() == expected
    # 150 samples at batch 40: steps of 40, 40, 40 and a partial 30 (not a multiple of any width)
    cfg = LadderConfig(epochs=2, batch_size=40)
    data = make_ladder_data(tiny_images(n_train=150), cfg)
    w_ref, b_ref = reference_sgd(data, cfg, 2)
    for threads in (1, 2, 3):
        w, b, losses = train(lib, data, cfg, threads)
        np.testing.assert_allclose(w, w_ref, atol=ATOL, rtol=0, err_msg=f"{threads} threads")
        np.testing.assert_allclose(b, b_ref, atol=ATOL, rtol=0, err_msg=f"{threads} threads")
        assert all(np.isfinite(losses)) and losses[1] < losses[0]


def test_more_threads_than_it_uses_train_the_same(tmp_path_factory):
    lib = library("native", tmp_path_factory)
    cfg = LadderConfig(epochs=1, batch_size=64)
    data = make_ladder_data(tiny_images(n_train=64), cfg)
    most = lib.cpu_epoch_max_threads(784)
    assert 1 <= most <= 784 // lib.cpu_epoch_vector_width() // 4
    few, many = train(lib, data, cfg, 2), train(lib, data, cfg, most + 5)
    np.testing.assert_allclose(few[0], many[0], atol=ATOL, rtol=0)


def test_loss_is_the_epoch_mean_before_each_step(tmp_path_factory):
    from fasttrain.ladder.common import softmax_xent

    lib = library("native", tmp_path_factory)
    cfg = LadderConfig(epochs=1, batch_size=100)
    data = make_ladder_data(tiny_images(n_train=100), cfg)  # one step: the loss of w0
    *_, (loss,) = train(lib, data, cfg, 2)
    assert loss == pytest.approx(softmax_xent(data.w0, data.b0, data.train_x / 255.0,
                                              data.train_y)[0], rel=1e-5)


def test_bad_arguments_are_an_error_code_not_a_crash(tmp_path_factory):
    lib = library("native", tmp_path_factory)
    cfg = LadderConfig(epochs=1, batch_size=8)
    data = make_ladder_data(tiny_images(n_train=16), cfg)
    x = np.ascontiguousarray(data.train_x[:, :783])  # 783 features: not a whole vector
    with pytest.raises(RuntimeError, match="bad arguments"):
        cpp_tiled.run_epoch(lib, x, data.train_y, data.orders[0], data.w0.copy(),
                            data.b0.copy(), 0.1, 8, 2)


def test_cpu_build_is_cached_per_source_and_machine(tmp_path, monkeypatch):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "t.cpp").write_text('extern "C" int seven() { return 7; }\n')
    monkeypatch.setattr(build, "CSRC", csrc)
    first = build.compile_cpu("t.cpp", out_dir=tmp_path / "cache")
    assert build.compile_cpu("t.cpp", out_dir=tmp_path / "cache") == first
    assert ctypes.CDLL(str(first)).seven() == 7
    (csrc / "t.cpp").write_text('extern "C" int seven() { return 8; }\n')
    assert build.compile_cpu("t.cpp", out_dir=tmp_path / "cache") != first
    # -march=native's meaning on another machine is another key
    monkeypatch.setattr(build, "_gxx_target", lambda gxx: "g++ 99\n  -march=  \t\tother\n")
    assert build.compile_cpu("t.cpp", out_dir=tmp_path / "cache").name.startswith("t-other-")


def test_compile_error_carries_gxx_message(tmp_path, monkeypatch):
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "bad.cpp").write_text("int f( {\n")
    monkeypatch.setattr(build, "CSRC", csrc)
    with pytest.raises(RuntimeError, match=r"g\+\+ failed on bad.cpp"):
        build.compile_cpu("bad.cpp", out_dir=tmp_path / "cache")
    assert not list((tmp_path / "cache").glob("*.so")), "no half-written library is left"


def test_a_compiler_that_cannot_build_it_makes_the_row_unavailable(monkeypatch):
    def fails(source, **kw):
        raise RuntimeError("g++ failed on cpu_epoch.cpp (exit 1):\nerror: too old\nmore")

    monkeypatch.setattr(build, "compile_cpu", fails)
    reason = cpp_tiled.CppTiled.unavailable({}, LadderConfig())
    assert reason.startswith("g++ cannot build csrc/cpu_epoch.cpp here") and "\n" not in reason
    assert "error: too old" in reason


def test_missing_gxx_makes_the_row_unavailable(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    reason = cpp_tiled.CppTiled.unavailable({}, LadderConfig())
    assert reason and "g++" in reason
    with pytest.raises(build.Unavailable, match="g\\+\\+"):
        build.compile_cpu(cpp_tiled.SOURCE)


def test_the_row_records_how_it_was_built_and_run():
    cfg = LadderConfig(epochs=1, batch_size=32)
    impl = cpp_tiled.CppTiled()
    impl.setup(make_ladder_data(tiny_images(n_train=64), cfg), cfg)
    d = impl.details()
    assert d["vector_width"] in (4, 8, 16) and d["threads"] >= 1
    assert d["compiler"].startswith("g++") and "-march=native" in d["flags"] and d["march"]


def test_the_phase_benchmark_builds_against_the_rows_source_and_runs(tmp_path):
    import subprocess
    from pathlib import Path

    src = Path(__file__).resolve().parents[2] / "benchmarks" / "cpu_epoch_phases.cpp"
    exe = tmp_path / "phases"
    subprocess.run(["g++", *build.CPU_FLAGS[:3], "-pthread", "-o", str(exe), str(src)],
                   check=True, capture_output=True)
    out = subprocess.run([str(exe), "2", "1"], check=True, capture_output=True, text=True).stdout
    assert "epoch" in out and "[t1 labels" in out and "update" in out

"""The CUDA build on the CPU: every source compiles with nvcc (no GPU needed), the cache rebuilds
on a source or header change and not otherwise, and a missing toolchain is a reason, not a
traceback."""

import pytest

from fasttrain.ladder import build
from tests.ladder.conftest import libs_of

requires_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found on PATH")


def test_the_ladders_sources_are_there():
    sources = {p.name: libs_of(p.name) for p in build.CSRC.glob("*.cu")}
    assert sources["rungs_kernels.cu"] == ()
    assert sources["rungs_cublas.cu"] == ("cublasLt",)
    assert sources["rungs_cudnn.cu"] == ("cublasLt", "cudnn")
    # cuda-epoch v7's hand-off probes: compiled for Hopper with the rest, no library.
    assert sources["sync_probes.cu"] == ()


def test_every_source_compiles_for_hopper(hopper_builds):
    assert hopper_builds.keys() == {p.name for p in build.CSRC.glob("*.cu")}
    for so in hopper_builds.values():
        assert so.is_file() and so.stat().st_size > 0


@pytest.fixture
def tiny_csrc(tmp_path, monkeypatch):
    """A scratch csrc/ with one small kernel file and a header it includes."""
    csrc = tmp_path / "csrc"
    csrc.mkdir()
    (csrc / "tiny.cuh").write_text("#define SCALE 2.0f\n")
    (csrc / "tiny.cu").write_text(
        '#include "tiny.cuh"\n'
        "__global__ void k(float* x) { x[threadIdx.x] *= SCALE; }\n"
        'extern "C" int launch(float* x, cudaStream_t s) {\n'
        "  k<<<1, 32, 0, s>>>(x); return (int)cudaGetLastError(); }\n")
    monkeypatch.setattr(build, "CSRC", csrc)
    return csrc


@requires_nvcc
def test_cache_rebuilds_on_source_or_header_change_only(tiny_csrc, tmp_path):
    out = tmp_path / "cache"
    first = build.compile("tiny.cu", arch="sm_80", out_dir=out)
    mtime = first.stat().st_mtime_ns
    assert build.compile("tiny.cu", arch="sm_80", out_dir=out) == first
    assert first.stat().st_mtime_ns == mtime, "same key: no rebuild"
    (tiny_csrc / "tiny.cuh").write_text("#define SCALE 3.0f\n")
    second = build.compile("tiny.cu", arch="sm_80", out_dir=out)
    assert second != first and second.is_file(), "a header change is a new key"
    (tiny_csrc / "tiny.cu").write_text((tiny_csrc / "tiny.cu").read_text() + "// changed\n")
    third = build.compile("tiny.cu", arch="sm_80", out_dir=out)
    assert third not in (first, second)
    assert not list(out.glob("tmp*")), "no temporary file left behind"


@requires_nvcc
def test_compile_error_carries_nvccs_message(tiny_csrc, tmp_path):
    (tiny_csrc / "tiny.cu").write_text("__global__ void k() { undeclared_name = 1; }\n")
    with pytest.raises(RuntimeError, match="undeclared_name"):
        build.compile("tiny.cu", arch="sm_80", out_dir=tmp_path)
    assert not list(tmp_path.glob("*.so")), "a failed build leaves no library"


def test_missing_nvcc_is_a_reason(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on PATH
    monkeypatch.setattr(build, "TOOLKIT_DIRS", (str(tmp_path / "no-cuda"),))
    reason = build.toolchain_reason()
    assert reason and "nvcc not found" in reason
    with pytest.raises(build.Unavailable, match="nvcc not found"):
        build.compile("rungs_kernels.cu", arch="sm_90a", out_dir=tmp_path)


@requires_nvcc
def test_missing_library_headers_are_a_reason(monkeypatch, tmp_path):
    monkeypatch.setattr(build, "_search_dirs", lambda nvcc: ([tmp_path], [tmp_path]))
    assert "cudnn.h not found" in build.toolchain_reason(("cudnn",))
    assert build.toolchain_reason(()) is None, "the kernels-only source needs no library"


def test_wheel_headers_and_libraries_are_found(monkeypatch, tmp_path):
    # The layout of NVIDIA's pip wheels: <site-packages>/nvidia/<pkg>/{include,lib}.
    root = tmp_path / "nvidia" / "cudnn"
    (root / "include").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "include" / "cudnn.h").write_text("")
    (root / "lib" / "libcudnn.so.9").write_text("")
    monkeypatch.setattr(build, "_wheel_roots", lambda: [root])
    monkeypatch.setattr(build, "TOOLKIT_DIRS", ())
    monkeypatch.setattr(build, "_toolkit_root", lambda nvcc: tmp_path / "toolkit")
    found = build._find_lib("cudnn", "nvcc")
    assert found == (root / "include", root / "lib", "libcudnn.so.9")


def test_no_gpu_is_unavailable(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(build.Unavailable, match="no CUDA GPU"):
        build.current_arch()


def test_wrapper_script_nvcc_finds_the_toolkit(tmp_path, monkeypatch):
    # /usr/local/bin/nvcc may be a shell script that execs the real one: the toolkit is then
    # found through TOOLKIT_DIRS, by its cuda_runtime.h.
    toolkit = tmp_path / "cuda"
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime.h").write_text("")
    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text("#!/bin/sh\n")
    monkeypatch.setattr(build, "TOOLKIT_DIRS", (str(toolkit),))
    assert build._toolkit_root(str(wrapper)) == toolkit

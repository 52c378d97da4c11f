"""nvcc → cached shared library → ctypes: how the ladder's hand-written CUDA C++ is built and
loaded.

No torch C++ extension: a CPU-only torch cannot build one, and the library must build the same way
everywhere. A `.cu` under `csrc/` is compiled by `nvcc` on first use into a cache keyed by its
source, the local headers it includes, the flags, the GPU architecture and nvcc's version, under a
file lock (two processes compiling the same key wait for each other instead of racing). cuBLAS and
cuDNN come from the CUDA toolkit or from NVIDIA's pip wheels (`nvidia-cublas`, `nvidia-cudnn-cu13`,
which torch's CUDA builds install); the library links them by soname and carries an rpath to the
folders they were found in.

    build.toolchain_reason(libs=("cublas",))   # None, or why it cannot build here (one line)
    build.compile("rungs_kernels.cu", arch="sm_90a")  # → Path of the .so (no GPU needed)
    build.load("rungs_kernels.cu")             # → ctypes.CDLL, built for the current GPU

The CPU rows' C++ (`cpu_epoch.cpp`) is built the same way by g++ with -march=native
(`compile_cpu`), keyed by what -march=native means on the machine.
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
# -lineinfo costs nothing at run time and lets Nsight Compute map time to source lines.
# A shared cudart: the library then uses the same CUDA runtime (and the same streams) as torch.
FLAGS = ("-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", "-lineinfo", "-cudart", "shared")
# Where a CUDA toolkit lives when nvcc is not on PATH (checked after PATH).
TOOLKIT_DIRS = ("/usr/local/cuda",)
# What each library needs: a header to compile against, a library (by soname) to link.
LIBS = {
    "cublas": ("cublas_v2.h", "libcublas.so.*"),
    "cublasLt": ("cublasLt.h", "libcublasLt.so.*"),
    "cudnn": ("cudnn.h", "libcudnn.so.*"),
}


class Unavailable(Exception):
    """The library cannot be built or run here; str(e) is the one-line reason."""


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/fasttrain/cuda, or ~/.cache/fasttrain/cuda."""
    from fasttrain.data import default_cache_dir

    return default_cache_dir() / "cuda"


def find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    for d in TOOLKIT_DIRS:
        p = Path(d) / "bin" / "nvcc"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


@functools.cache
def nvcc_version(nvcc: str) -> str:
    """nvcc's release line, e.g. 'Cuda compilation tools, release 13.0, V13.0.88'."""
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return next((ln for ln in out.splitlines() if "release" in ln), out.strip())


def _toolkit_root(nvcc: str) -> Path:
    """The toolkit folder holding include/cuda_runtime.h: nvcc's own, or /usr/local/cuda when
    nvcc is a wrapper script elsewhere (as /usr/local/bin/nvcc is on some images)."""
    for root in (Path(os.path.realpath(nvcc)).parent.parent, *map(Path, TOOLKIT_DIRS)):
        if (root / "include" / "cuda_runtime.h").is_file():
            return root
    return Path(os.path.realpath(nvcc)).parent.parent


def _wheel_roots() -> list[Path]:
    """The folders of NVIDIA's pip wheels (nvidia/cu13, nvidia/cublas, nvidia/cudnn, ...), found
    through the `nvidia` namespace package's __path__ without importing anything CUDA."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for base in spec.submodule_search_locations for p in sorted(glob.glob(
        os.path.join(base, "*"))) if os.path.isdir(p)]


def _search_dirs(nvcc: str) -> tuple[list[Path], list[Path]]:
    """(include dirs, library dirs) to look for cuBLAS/cuDNN in: the toolkit first, then
    /usr/local/cuda, the wheels, and the system's."""
    roots = [_toolkit_root(nvcc), *map(Path, TOOLKIT_DIRS)]
    roots += [Path(p) for r in list(roots) for p in sorted(glob.glob(str(r / "targets" / "*")))]
    roots += _wheel_roots()
    inc = [r / "include" for r in roots] + [Path("/usr/include")]
    lib = [r / sub for r in roots for sub in ("lib64", "lib")]
    lib += [Path("/usr/lib/x86_64-linux-gnu"), Path("/usr/lib64"), Path("/usr/lib")]
    unique = lambda ps: list(dict.fromkeys(p for p in ps if p.is_dir()))  # noqa: E731
    return unique(inc), unique(lib)


def _find_lib(name: str, nvcc: str) -> tuple[Path, Path, str] | str:
    """(include dir, library dir, soname) for `name`, or the reason it is missing."""
    header, pattern = LIBS[name]
    inc, lib = _search_dirs(nvcc)
    inc_dir = next((d for d in inc if (d / header).is_file()), None)
    if inc_dir is None:
        return (f"{header} not found (install the CUDA toolkit's {name} or `pip install "
                f"{'nvidia-cublas' if name.startswith('cublas') else 'nvidia-cudnn-cu13'}`)")
    for d in lib:
        # The soname with its major version (libcublas.so.13), not a full version's file name.
        sonames = sorted(p.name for p in d.glob(pattern)
                         if re.fullmatch(r"lib\w+\.so\.\d+", p.name))
        if sonames:
            return inc_dir, d, sonames[-1]
    return f"lib{name}.so.N not found next to {header} or in the CUDA toolkit, wheels or system"


def toolchain_reason(libs=()) -> str | None:
    """None when nvcc and the headers/libraries of `libs` are found, else a one-line reason."""
    try:
        nvcc = find_nvcc()
        if nvcc is None:
            return "nvcc not found on PATH or in /usr/local/cuda (install the CUDA toolkit)"
        if shutil.which("g++") is None:
            return "g++ not found on PATH (nvcc needs it as its host compiler)"
        for name in libs:
            found = _find_lib(name, nvcc)
            if isinstance(found, str):
                return found
        return None
    except Exception as e:  # a broken toolchain is a reason, never a traceback
        return f"CUDA toolchain check failed: {type(e).__name__}: {e}".splitlines()[0]


def local_headers(path: Path, seen: set[Path] | None = None) -> list[Path]:
    """The csrc/ headers `path` includes with #include "...", transitively."""
    seen = set() if seen is None else seen
    for name in re.findall(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.M):
        h = (path.parent / name).resolve()
        if h.is_file() and h not in seen:
            seen.add(h)
            local_headers(h, seen)
    return sorted(seen)


def current_arch() -> str:
    """sm_XY of the current CUDA device (raises Unavailable without one)."""
    import torch

    if not torch.cuda.is_available():
        raise Unavailable(f"no CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is "
                          "False)")
    major, minor = torch.cuda.get_device_capability()
    # 9.0 → sm_90a: the architecture-specific target, which the compile test also builds.
    return f"sm_{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")


def compile(source: str, *, libs=(), arch: str | None = None, out_dir=None) -> Path:  # noqa: A001
    """Compile csrc/<source> for `arch` (None: the current GPU) into the cache; returns the .so."""
    reason = toolchain_reason(libs)
    if reason:
        raise Unavailable(reason)
    nvcc = find_nvcc()
    arch = arch or current_arch()
    src = CSRC / source
    if not src.is_file():
        raise FileNotFoundError(src)
    cmd = [nvcc, *FLAGS, f"-arch={arch}"]
    # nvcc's own headers first: a wheel folder added below for cuBLAS (nvidia/cu13/include) may
    # also hold the runtime wheel's cuda_runtime.h, of another version than this nvcc.
    cmd += [f"-I{_toolkit_root(nvcc) / 'include'}"]
    # The CUDA runtime is usually already loaded by torch (same soname); this finds it otherwise.
    for d in ("lib64", "lib"):
        if (_toolkit_root(nvcc) / d).is_dir():
            cmd += ["-Xlinker", f"-rpath,{_toolkit_root(nvcc) / d}"]
    for name in libs:
        inc_dir, lib_dir, soname = _find_lib(name, nvcc)
        cmd += [f"-I{inc_dir}", f"-L{lib_dir}", f"-l:{soname}", "-Xlinker", f"-rpath,{lib_dir}"]
    return _cached_build(src, f"{src.stem}-{arch}", cmd, nvcc_version(nvcc), out_dir)


def _cached_build(src: Path, stem: str, cmd: list[str], version: str, out_dir=None) -> Path:
    """Run `cmd -o OUT src` into the cache unless a library of the same key is there; the key
    hashes the source, the local headers it includes, the command and the compiler's version."""
    h = hashlib.sha256()
    for f in (src, *local_headers(src)):
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    h.update("\0".join([*cmd[1:], version]).encode())
    out = Path(out_dir) if out_dir is not None else cache_dir()
    out.mkdir(parents=True, exist_ok=True)
    so = out / f"{stem}-{h.hexdigest()[:16]}.so"
    with open(out / f"{so.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building the same key
        if so.is_file():
            return so
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out)
        os.close(fd)
        try:
            r = subprocess.run([*cmd, "-o", tmp, str(src)], capture_output=True, text=True)
            if r.returncode != 0:
                raise RuntimeError(f"{Path(cmd[0]).name} failed on {src.name} (exit "
                                   f"{r.returncode}):\n{r.stderr.strip()}")
            os.replace(tmp, so)  # atomic: a reader sees no .so or a whole one
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return so


# The CPU rows' C++: this machine's instruction set (-march=native); contraction into FMA allowed,
# no -ffast-math (the vectorized exp rounds with a magic constant that reassociation would undo).
CPU_FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-pthread",
             "-ffp-contract=fast", "-fno-math-errno")


def cpu_toolchain_reason() -> str | None:
    """None when g++ can build the CPU rows' C++ here, else a one-line reason."""
    return None if shutil.which("g++") else "g++ not found on PATH (install gcc's C++ compiler)"


@functools.cache
def _gxx_target(gxx: str) -> str:
    """g++'s version and what -march=native means on this machine (its enabled ISA options): the
    same source built on another CPU is another library."""
    version = subprocess.run([gxx, "--version"], capture_output=True, text=True, check=True)
    target = subprocess.run([gxx, "-march=native", "-Q", "--help=target"], capture_output=True,
                            text=True, check=True)
    return version.stdout.splitlines()[0] + "\0" + target.stdout


def _march(target: str) -> str:
    """What -march=native resolved to, from _gxx_target's listing (e.g. 'znver3')."""
    return next((ln.split()[-1] for ln in target.splitlines() if ln.strip().startswith("-march=")),
                "native")


def cpu_build_info() -> dict:
    """The compiler, its flags and what -march=native meant: kept with the CPU rows' figures."""
    gxx = shutil.which("g++")
    if gxx is None:
        return {}
    target = _gxx_target(gxx)
    isa = sorted(ln.split()[0] for ln in target.splitlines()
                 if ln.strip().startswith("-m") and ln.split()[-1] == "[enabled]"
                 and re.match(r"-m(avx|fma|sse)", ln.strip()))
    return {"compiler": target.split("\0")[0], "flags": list(CPU_FLAGS), "march": _march(target),
            "isa": isa}


def compile_cpu(source: str, *, extra=(), out_dir=None) -> Path:
    """Compile csrc/<source> (C++) with g++ for this CPU into the cache; returns the .so. `extra`
    flags come last (the tests build narrower vectors with e.g. -mno-avx512f)."""
    reason = cpu_toolchain_reason()
    if reason:
        raise Unavailable(reason)
    gxx = shutil.which("g++")
    src = CSRC / source
    if not src.is_file():
        raise FileNotFoundError(src)
    target = _gxx_target(gxx)
    return _cached_build(src, f"{src.stem}-{_march(target)}", [gxx, *CPU_FLAGS, *extra], target,
                         out_dir if out_dir is not None else cache_dir().parent / "cpp")


_loaded: dict[tuple[str, tuple[str, ...]], ctypes.CDLL] = {}


def load(source: str, *, libs=()) -> ctypes.CDLL:
    """compile() for the current GPU (compile_cpu() for a .cpp), then load it once per process."""
    key = (source, tuple(libs))
    if key not in _loaded:
        so = compile_cpu(source) if source.endswith(".cpp") else compile(source, libs=libs)
        _loaded[key] = ctypes.CDLL(str(so))
    return _loaded[key]

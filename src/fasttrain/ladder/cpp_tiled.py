"""`cpp-tiled`: the CPU row aimed at the roofline — C++ for the FMA units, one call an epoch.

`csrc/cpu_epoch.cpp`, built on first use by g++ for this machine (`-march=native`: AVX-512, AVX2
or plain SSE vectors, GCC's portable vector extensions) and called through ctypes, which releases
the GIL. What it does differently from `numba-tiled` (the design is in the source's header):

- Features split across cores, not samples or classes: each core owns a slice of the 784 inputs
  and that slice of every weight row for the whole epoch, so the weight gradient never crosses
  cores and a step needs ONE barrier (partial logits, double-buffered by step parity).
- Every inner loop is a register tile: forward 8 samples × 2 classes (16 accumulators with
  AVX-512, 6 × 2 with 16 registers; reduced across lanes by shuffle trees), update 5 classes × 4
  vectors of features accumulated over the whole batch in registers, then added to the weights
  once.
- Softmax and loss vectorized along the samples (polynomial exp and log), computed redundantly by
  every core instead of exchanged.

Run alone:  python -m fasttrain bench --impl cpp-tiled
"""

from __future__ import annotations

import ctypes

import numpy as np

from fasttrain.ladder.common import IN_FEATURES, Impl, LadderConfig, LadderData
from fasttrain.peaks import cpu_threads

SOURCE = "cpu_epoch.cpp"


def load_library() -> ctypes.CDLL:
    """Build (once, cached) and load the library with its entry points typed."""
    from fasttrain.ladder import build

    return typed(build.load(SOURCE))


def typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    """`lib` (a build of csrc/cpu_epoch.cpp) with its entry points' signatures declared."""
    ptr, i32 = ctypes.c_void_p, ctypes.c_int
    # x, y, order, n, k_in, batch, lr, w, b, threads, loss_sum
    lib.cpu_epoch_train.argtypes = [ptr, ptr, ptr, ctypes.c_int64, i32, i32, ctypes.c_float, ptr,
                                    ptr, i32, ctypes.POINTER(ctypes.c_double)]
    lib.cpu_epoch_train.restype = i32
    lib.cpu_epoch_vector_width.restype = i32
    lib.cpu_epoch_max_threads.argtypes = [i32]
    lib.cpu_epoch_max_threads.restype = i32
    return lib


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def run_epoch(lib, x, y, order, w, b, lr: float, batch_size: int, threads: int) -> float:
    """Train one epoch in place (w float32 [10, 784] and b [10], C-contiguous); the mean loss."""
    loss = ctypes.c_double()
    code = lib.cpu_epoch_train(_ptr(x), _ptr(y), _ptr(order), len(order), x.shape[1], batch_size,
                               lr, _ptr(w), _ptr(b), threads, ctypes.byref(loss))
    if code:
        raise RuntimeError("cpu_epoch_train: " + ("bad arguments" if code == 1 else
                                                  "out of memory"))
    return loss.value / len(order)


class CppTiled(Impl):
    name = "cpp-tiled"
    precision = "fp32, u8 input"
    sources = ("csrc/cpu_epoch.cpp",)

    @classmethod
    def unavailable(cls, env, cfg):
        """No g++, or a g++ that cannot build the source (too old, not x86/ARM...): the build is
        tried here (cached), so that a compiler's limits read as a reason, not a failed row."""
        from fasttrain.ladder import build

        reason = build.cpu_toolchain_reason()
        if reason:
            return reason
        try:
            build.compile_cpu(SOURCE)
        except RuntimeError as e:
            lines = str(e).splitlines()
            first_error = next((ln.strip() for ln in lines if "error" in ln),
                               lines[-1] if lines else "")
            return f"g++ cannot build csrc/{SOURCE} here: {first_error}"
        return None

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        self.data, self.cfg = data, cfg
        self.lib = load_library()  # the build (seconds, once per machine) is setup time
        assert data.train_x.shape[1] == IN_FEATURES
        # (the library reads raw pointers: C order and these dtypes, without copies when so already)
        self.x = np.ascontiguousarray(data.train_x, np.uint8)
        self.y = np.ascontiguousarray(data.train_y, np.int64)
        self.orders = np.ascontiguousarray(data.orders, np.int64)
        self.w, self.b = data.w0.copy(), data.b0.copy()
        self.threads = cpu_threads()
        # Threads started and the code paged in on a one-step epoch of throw-away weights.
        run_epoch(self.lib, self.x, self.y, self.orders[0][: cfg.batch_size], self.w.copy(),
                  self.b.copy(), cfg.lr, cfg.batch_size, self.threads)

    def train_epoch(self, epoch: int) -> float:
        return run_epoch(self.lib, self.x, self.y, self.orders[epoch], self.w, self.b,
                         self.cfg.lr, self.cfg.batch_size, self.threads)

    def params(self):
        return self.w, self.b

    def details(self) -> dict:
        from fasttrain.ladder import build

        return {"threads": min(self.threads, self.lib.cpu_epoch_max_threads(IN_FEATURES)),
                "vector_width": self.lib.cpu_epoch_vector_width(),
                **build.cpu_build_info()}

"""The report's CUDA C++ ladder: `cuda-baseline` → `+no-sync` → `+cublas` → `+report-10` →
`+fused-loss` → `+cudnn-softmax` → `+cuda-graphs`, each rung adding one change to the one before.

The CUDA C++ is in `csrc/` (one `.cu` per rung family, shared kernels and the epoch loop in
`common.cuh`), built by `fasttrain.ladder.build` on first use (the build is the row's setup time)
and called through ctypes. Torch only allocates: the uint8 training set, labels and every epoch's
shuffle order live on the device, a batch is gathered there, and the C++ runs an epoch's steps on
torch's current stream.

| row            | family   | what it adds                                                        |
|----------------|----------|---------------------------------------------------------------------|
| cuda-baseline  | kernels  | hand-written kernels for every op; loss and accuracy to the host    |
|                |          | after every step (a copy and a wait per step, as the report's)      |
| +no-sync       | kernels  | loss and accuracy summed on the device; one read per epoch          |
| +cublas        | cublas   | both GEMMs by cuBLAS (the update folded into the second: beta = 1;  |
|                |          | algorithms chosen once through cublasLt by timing: see csrc)        |
| +report-10     | cublas   | loss and accuracy computed only every 10 epochs (and the last)      |
| +fused-loss    | cublas   | one kernel for loss and accuracy (the report's §5.2; no table row)  |
| +cudnn-softmax | cudnn    | cuDNN's softmax                                                     |
| +cuda-graphs   | cudnn    | an epoch's steps captured once as a CUDA graph (at setup), replayed |

Host syncs inside an epoch: the baseline's, one per step, deliberately; from `+no-sync` on none,
the only read being the epoch's loss after its last step, on the epochs that report it.

Run alone:  python -m fasttrain bench --impl cuda-baseline,+no-sync,+cuda-graphs
Measured (H100 80GB HBM3, ms/epoch, for the rows above in order): 2026-11-26 22.7, 13.6, 20.3,
17.8, 17.4, 18.0, 12.5; 2026-11-27 22.2, 14.1, 22.9, 20.1, 19.9, 19.7, 16.5 (the cuBLAS rows
slower: the no-split-K rule gave the update GEMM an 18.2 µs kernel; now chosen by timing, not yet
run on a GPU); the report's 38, 27, 20.7, 19, -, 18, 17 (README, "The CUDA C++ ladder";
benchmarks/cuda_step_profile.py says where each step goes).
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from fasttrain.ladder import build
from fasttrain.ladder.common import CLASSES, IN_FEATURES, Impl, LadderConfig, LadderData

# Flags of ft_epoch (csrc/common.cuh).
STATS, SYNC_STEP, FUSED, GRAPH = 1, 2, 4, 8
WORKSPACE_BYTES = 32 << 20  # cuBLAS's recommended workspace on Hopper
_P = ctypes.c_void_p


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """ctypes signatures of the entry points every family exports (FT_EXPORT_ENTRY_POINTS)."""
    lib.ft_create.argtypes = [_P, _P, ctypes.c_int, ctypes.c_int, ctypes.c_float, _P, _P, _P, _P,
                              _P, _P, _P, _P, _P, _P, ctypes.c_size_t, ctypes.POINTER(_P)]
    lib.ft_capture.argtypes = [_P, ctypes.c_int]
    lib.ft_epoch.argtypes = [_P, _P, ctypes.c_int, _P]
    lib.ft_host_stats.argtypes = [_P, ctypes.POINTER(ctypes.c_double)]
    lib.ft_host_stats.restype = None
    lib.ft_destroy.argtypes = [_P]
    return lib


def gemm_choice(values) -> dict:
    """ft_gemm_choice's 16 floats (csrc/cublas_gemms.cuh) as the row's details: for each GEMM
    and batch (full, last), the algorithm setup timed fastest, its GPU µs a call there (timed in
    a CUDA graph) and k splits."""
    out = {}
    for g, gemm in enumerate(("forward", "update")):
        for i, batch in enumerate(("full_batch", "last_batch")):
            us, splits, algo, tile = values[8 * g + 4 * i: 8 * g + 4 * i + 4]
            out[f"{gemm}_{batch}"] = {"us": round(float(us), 2), "split_k": int(splits),
                                      "algo_id": int(algo), "tile_id": int(tile)}
    return out


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what} failed with status {status} (a cudaError_t, cublasStatus_t or "
                           "cudnnStatus_t)")


class CudaRung(Impl):
    """One rung; subclasses set the class attributes below and nothing else."""

    device = "cuda"
    source = "rungs_kernels.cu"
    libs: tuple[str, ...] = ()
    sources = ("csrc/rungs_kernels.cu", "csrc/common.cuh")  # the files its figures come from
    sync_every_step = False
    report_every = 1  # compute loss and accuracy every this many epochs (and after the last)
    fused_loss = False
    graphs = False

    @classmethod
    def unavailable(cls, env: dict, cfg: LadderConfig) -> str | None:
        import torch

        if not torch.cuda.is_available():
            return f"no CUDA GPU (torch {torch.__version__}: torch.cuda.is_available() is False)"
        return build.toolchain_reason(cls.libs)

    def setup(self, data: LadderData, cfg: LadderConfig) -> None:
        import torch

        self.data, self.cfg = data, cfg
        self.lib = _declare(build.load(self.source, libs=self.libs))
        dev = torch.device("cuda")
        n, bs = data.n_train, cfg.batch_size

        def put(array):
            return torch.from_numpy(np.ascontiguousarray(array)).to(dev)

        # Everything the C++ reads or writes, allocated by torch and kept alive by this object.
        self.x, self.y, self.orders = put(data.train_x), put(data.train_y), put(data.orders)
        self.w, self.b = put(data.w0), put(data.b0)
        f32 = dict(device=dev, dtype=torch.float32)
        self.xb = torch.empty(bs * IN_FEATURES, **f32)
        self.yb = torch.empty(bs, device=dev, dtype=torch.int32)
        self.z = torch.empty(bs * CLASSES, **f32)
        self.p = torch.empty(bs * CLASSES, **f32)
        self.gw = torch.empty(CLASSES * IN_FEATURES, **f32)
        self.stats = torch.zeros(2, device=dev, dtype=torch.float64)
        self.order_buf = torch.empty(n, device=dev, dtype=torch.int64)
        self.workspace = torch.empty(WORKSPACE_BYTES if self.libs else 1, device=dev,
                                     dtype=torch.uint8)
        ctx = _P()
        ptr = lambda t: t.data_ptr()  # noqa: E731
        status = self.lib.ft_create(
            ptr(self.x), ptr(self.y), n, bs, cfg.lr, ptr(self.w), ptr(self.b), ptr(self.xb),
            ptr(self.yb), ptr(self.z), ptr(self.p), ptr(self.gw), ptr(self.stats),
            ptr(self.order_buf), ptr(self.workspace), self.workspace.numel(), ctypes.byref(ctx))
        self.ctx = ctx
        # The context (handles, graphs) goes with this object, after a failed create too.
        weakref.finalize(self, self.lib.ft_destroy, ctx)
        _check(status, f"{self.name}: ft_create")
        self.base_flags = (SYNC_STEP * self.sync_every_step | FUSED * self.fused_loss
                           | GRAPH * self.graphs)
        # One untimed epoch of each kind this row runs, then the initial weights back: CUDA loads
        # kernels lazily on first launch (and cuBLAS picks its algorithms), which belongs to setup
        # and must not happen inside a graph capture.
        stream = _P(torch.cuda.current_stream().cuda_stream)
        warm = self.base_flags & ~GRAPH
        for stats in (0, STATS):
            _check(self.lib.ft_epoch(ctx, _P(self.orders[0].data_ptr()), warm | stats, stream),
                   f"{self.name}: warm-up")
        self.w.copy_(torch.from_numpy(data.w0))
        self.b.copy_(torch.from_numpy(data.b0))
        if self.graphs:  # capture both epoch graphs now (setup time): with and without stats
            for stats in (0, STATS):
                _check(self.lib.ft_capture(ctx, self.base_flags | stats), f"{self.name}: capture")
        self.host = (ctypes.c_double * 2)()
        self.train_accuracy: float | None = None

    def train_epoch(self, epoch: int) -> float | None:
        import torch

        report = (epoch + 1) % self.report_every == 0 or epoch + 1 == self.cfg.epochs
        stream = _P(torch.cuda.current_stream().cuda_stream)
        _check(self.lib.ft_epoch(self.ctx, _P(self.orders[epoch].data_ptr()),
                                 self.base_flags | STATS * report, stream), f"{self.name}: epoch")
        if not report:
            return None
        if self.sync_every_step:  # summed on the host, step by step, by the C++
            self.lib.ft_host_stats(self.ctx, self.host)
            loss_sum, correct = self.host[0], self.host[1]
        else:  # the epoch's one host read: after its last step
            loss_sum, correct = self.stats.tolist()
        self.train_accuracy = correct / self.data.n_train
        return loss_sum / self.data.n_train

    def params(self):
        return self.w.cpu().numpy().copy(), self.b.cpu().numpy().copy()

    def details(self) -> dict:
        """The cuBLAS families: each GEMM's algorithm, chosen at setup by timing."""
        if not self.libs:
            return {}
        choice = (ctypes.c_float * 16)()
        self.lib.ft_gemm_choice.argtypes = [_P, ctypes.POINTER(ctypes.c_float)]
        self.lib.ft_gemm_choice.restype = None
        self.lib.ft_gemm_choice(self.ctx, choice)
        return {"cublaslt": gemm_choice(list(choice))}


class CudaBaseline(CudaRung):
    name = "cuda-baseline"
    reproduces = "Baseline CUDA/C++"
    report_ms = 38.0
    sync_every_step = True


class NoSync(CudaRung):
    name = "+no-sync"
    reproduces = "+ Reducing synchronization and memcpy to host"
    report_ms = 27.0


class Cublas(NoSync):
    name = "+cublas"
    reproduces = "+ cuBLAS matrix multiplication"
    report_ms = 20.73
    source = "rungs_cublas.cu"
    libs = ("cublasLt",)
    sources = ("csrc/rungs_cublas.cu", "csrc/cublas_gemms.cuh", "csrc/common.cuh")


class Report10(Cublas):
    name = "+report-10"
    reproduces = "+ Only performing loss & accuracy calculation every 10 epochs"
    report_ms = 19.0
    report_every = 10


class FusedLoss(Report10):
    name = "+fused-loss"
    reproduces = None  # the report lists the fusion (§5.2) but gives it no row of its own
    report_ms = None
    fused_loss = True


class CudnnSoftmax(FusedLoss):
    name = "+cudnn-softmax"
    reproduces = "+ cuDNN implementation of softmax"
    report_ms = 18.0
    source = "rungs_cudnn.cu"
    libs = ("cublasLt", "cudnn")
    sources = ("csrc/rungs_cudnn.cu", "csrc/cublas_gemms.cuh", "csrc/common.cuh")


class CudaGraphs(CudnnSoftmax):
    name = "+cuda-graphs"
    reproduces = "+ CUDA Graphs to minimize kernel launch latencies"
    report_ms = 17.0
    graphs = True

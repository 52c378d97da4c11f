"""What limits a training step — compute, memory, overhead or input — and the switch to try next.

The model, per optimizer step (times in seconds per step, from `fasttrain.lab.profile`):

    wall = input + idle + busy

- input: waiting for the next batch (inside the data iterator while the device runs nothing);
- idle: the device runs nothing and no batch is awaited — Python, dispatch, launches, syncs;
- busy: the device is inside an op. Busy time is split over *op groups*: each aten op that one
  eager step calls (`count_step` sees every call once: input gather, forward, backward,
  optimizer) is matched by name to the trace's outermost events of that name; device time inside
  no counted op (wrappers such as aten::linear, autograd bookkeeping, compiled graphs whose fused
  kernels carry no aten name) forms one more group, "rest", which owns the counted calls that no
  trace event matched.

Every counted call has a roofline time, max(FLOPs / peak, bytes / bandwidth) — FLOPs from torch's
FLOP formulas, bytes the sizes of its input and output tensors — and is compute-limited when its
arithmetic intensity (FLOP/byte) is above the device's ops:byte ratio (the ridge), memory-limited
below. The one threshold: a call whose roofline time is shorter than `issue_s`, the measured time
to issue one trivial op, is *small* — issuing it costs more than its work, so whatever it takes is
overhead. A group's time goes first to its small calls (issue_s each, at most all of it) as
overhead, and the remainder to compute and memory in the ratio of its large calls' roofline times
(all overhead if it has none). Large ops slower than their roof stay in their class: an
elementwise op at a tenth of the bandwidth is still a memory-class op, and the switches that help
it (fewer bytes: bf16, fusion) are the memory ones.

The class is the largest of the shares input, overhead (idle + small calls), compute and memory:
the resource whose removal would shorten the step most (Amdahl). When the winner holds less than
`MIXED_BELOW` (half) of the step, the runner-up is named too: the step is mixed, and the next
switch may move the class.

Peaks: on a GPU in `fasttrain.env.GPU_PEAKS`, the data sheet's dense peak for the step's precision
and its memory bandwidth; elsewhere (the CPU, unknown GPUs) they are measured at start-up: the best
of a few large matmuls (FLOP/s) and of a few large copies (bytes read + written per second) — an
achievable rather than a data-sheet roof, which is the one a roofline of this machine needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

if TYPE_CHECKING:
    from fasttrain.engine.run import Run

MIXED_BELOW = 0.5  # a winner with less than half the step does not dominate it


@dataclass
class Peaks:
    """The roofline of a device for one precision."""

    flops: float  # FLOP/s, dense, for the step's compute dtype
    bandwidth: float  # bytes/s, device memory (read + written)
    source: str  # "datasheet: H100 SXM" | "measured"

    @property
    def ridge(self) -> float:
        """The ops:byte ratio (FLOP/byte) above which an op is compute-limited."""
        return self.flops / self.bandwidth


@dataclass
class OpWork:
    """One aten op's calls in a step: what they ask, and each call's roofline time."""

    flops: float = 0.0  # FLOP, all calls
    bytes: float = 0.0  # bytes read + written, all calls (tensor sizes; caches ignored)
    roofline: list[tuple[float, float]] = field(default_factory=list)  # per call: (compute s,
    # memory s), one of them 0: FLOPs/peak for a compute-limited call, bytes/bandwidth otherwise

    @property
    def calls(self) -> int:
        return len(self.roofline)

    @property
    def roofline_s(self) -> float:
        return sum(c + m for c, m in self.roofline)


@dataclass
class Work:
    """What one optimizer step asks of the device, by aten op name ('aten::addmm')."""

    by_op: dict[str, OpWork] = field(default_factory=dict)

    @property
    def flops(self) -> float:
        return sum(w.flops for w in self.by_op.values())

    @property
    def bytes(self) -> float:
        return sum(w.bytes for w in self.by_op.values())

    @property
    def roofline_s(self) -> float:
        """The step's busy time if every op ran at its roof."""
        return sum(w.roofline_s for w in self.by_op.values())

    @property
    def intensity(self) -> float:
        """Arithmetic intensity of the whole step, FLOP/byte."""
        return self.flops / self.bytes if self.bytes else 0.0


# -- peaks ---------------------------------------------------------------------------------------


def _best_seconds(fn, device: torch.device, repeats: int) -> float:
    from fasttrain.timing import synchronizer

    sync = synchronizer(str(device))  # the clock must not stop before the GPU does
    fn()  # warm-up: allocation, library dispatch, clocks ramping up
    sync()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def measure_peaks(device: torch.device, dtype: torch.dtype = torch.float32) -> Peaks:
    """Achievable FLOP/s (square matmul, n=1024 on the CPU, 4096 on a GPU) and bytes/s (copy of
    64 MiB on the CPU, 256 MiB on a GPU: well beyond the caches). About 0.2 s on a 2-core CPU."""
    n, mib = (1024, 64) if device.type == "cpu" else (4096, 256)
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    flops = 2 * n**3 / _best_seconds(lambda: torch.mm(a, b), device, 3)
    src = torch.empty(mib * 2**20 // 4, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.nbytes / _best_seconds(lambda: dst.copy_(src), device, 5)
    return Peaks(flops=flops, bandwidth=bandwidth, source="measured")


def device_peaks(device: torch.device, precision: str) -> Peaks:
    """The data sheet's figures for a known GPU, measured ones otherwise."""
    if device.type == "cuda":
        from fasttrain.env import gpu_peaks

        name = torch.cuda.get_device_name(device)
        known = gpu_peaks(name)
        key = precision if precision in ("tf32", "bf16", "fp16") else "fp32"
        if known and key in known:
            return Peaks(flops=known[key], bandwidth=known["bw"], source=f"datasheet: {name}")
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    return measure_peaks(device, dtype)


# -- counting one step ---------------------------------------------------------------------------


def flop_formulas() -> dict:
    """torch's FLOP formulas (op packet → formula), plus the CPU's fused attention and its
    backward, which torch counts on CUDA but not on the CPU: without them a transformer's
    attention (~15-60% of its FLOPs, with the context length) would count as free on a CPU."""
    from torch.utils.flop_counter import flop_registry, sdpa_backward_flop_count, sdpa_flop_count

    def forward(query, key, value, *args, out_val=None, **kwargs):
        return sdpa_flop_count(query.shape, key.shape, value.shape)

    def backward(grad_out, query, key, value, *args, out_val=None, **kwargs):
        return sdpa_backward_flop_count(grad_out.shape, query.shape, key.shape, value.shape)

    aten = torch.ops.aten
    cpu = {name: getattr(aten, name) for name in ("_scaled_dot_product_flash_attention_for_cpu",
           "_scaled_dot_product_flash_attention_for_cpu_backward") if hasattr(aten, name)}
    extra = {op: backward if name.endswith("_backward") else forward for name, op in cpu.items()}
    return {**extra, **flop_registry}  # torch's own formula wins where it has one


def moves_no_data(func) -> bool:
    """Views alias their input (no bytes move); empty* only allocate."""
    name = func._overloadpacket.__name__
    if name.startswith(("empty", "new_empty")) or name == "_local_scalar_dense":
        return True
    returns = func._schema.returns
    alias = returns[0].alias_info if returns else None
    return alias is not None and not alias.is_write


def _nbytes(t: torch.Tensor) -> int:
    size = t.numel() * t.element_size()
    try:  # an expanded tensor (stride 0) is smaller in memory than numel says
        return min(size, t.untyped_storage().nbytes())
    except (RuntimeError, NotImplementedError):  # no plain storage (sparse, nested)
        return size


# Ops that read only the rows they gather, not the whole source tensor.
_GATHERS = {"index", "_unsafe_index", "index_select", "gather", "take", "embedding"}


def bytes_moved(func, args, kwargs, out) -> int:
    """Bytes read and written: every input and output tensor once; a gather reads as many bytes
    of its source (the first argument) as it writes, plus its indices."""
    def size(tree) -> int:
        return sum(_nbytes(t) for t in tree_leaves(tree) if isinstance(t, torch.Tensor))

    if func._overloadpacket.__name__ in _GATHERS:
        return 2 * size(out) + size((args[1:], kwargs))
    return size((args, kwargs)) + size(out)


class _Counter(TorchDispatchMode):
    """Sees every aten op below autograd (backward and optimizer included), once each."""

    def __init__(self, peaks: Peaks):
        super().__init__()
        self.peaks, self.formulas, self.work = peaks, flop_formulas(), Work()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if moves_no_data(func):
            return out
        moved = bytes_moved(func, args, kwargs, out)
        formula = self.formulas.get(func._overloadpacket)
        flops = float(formula(*args, **kwargs, out_val=out)) if formula else 0.0
        name = f"aten::{func._overloadpacket.__name__}"  # as the profiler names it
        op = self.work.by_op.setdefault(name, OpWork())
        t_compute, t_memory = flops / self.peaks.flops, moved / self.peaks.bandwidth
        op.roofline.append((t_compute, 0.0) if t_compute >= t_memory else (0.0, t_memory))
        op.flops += flops
        op.bytes += moved
        return out


def count_step(run: Run, batches: Iterator[list], peaks: Peaks) -> Work:
    """Fetch one step's micro-batches from `batches` and run that optimizer step eagerly under a
    counting mode; return what it asked of the device.

    The fetch is counted too: with the data on the device, gathering a batch is device work like
    any other op (a DataLoader's worker processes are not seen: that is input time). The step
    runs the parameter-owning module, not a compiled one: FLOPs and bytes are those of the eager
    graph, an upper bound on bytes once `--compile` fuses ops (the gap is what fusion buys). The
    step is real (the weights move), like any other profiling step."""
    from fasttrain.engine.loop import step

    counter = _Counter(peaks)
    with counter:
        step(run, next(batches), forward=run.model)
    return counter.work


# -- the class ---------------------------------------------------------------------------------


def _split(seconds: float, calls: list[tuple[float, float]], issue_s: float) -> dict:
    """One group's time → {"compute", "memory", "overhead"} seconds (see the module docstring)."""
    large = [(c, m) for c, m in calls if c + m >= issue_s]
    small = min(seconds, (len(calls) - len(large)) * issue_s)
    rest = seconds - small
    ideal_c, ideal_m = sum(c for c, _ in large), sum(m for _, m in large)
    if not ideal_c + ideal_m:
        return {"compute": 0.0, "memory": 0.0, "overhead": seconds}
    return {"compute": rest * ideal_c / (ideal_c + ideal_m),
            "memory": rest * ideal_m / (ideal_c + ideal_m), "overhead": small}


def classify(wall: float, input_s: float, busy: float, measured: dict[str, float],
             issue_s: float, work: Work, peaks: Peaks) -> dict:
    """Shares of the step (they sum to 1), the class, and the figures behind them.

    wall, input_s, busy: seconds per step; measured: op name → seconds per step inside the
    trace's outermost events of each counted op (names not in `work` are ignored; the rest of
    busy is the "rest" group); issue_s: seconds to issue one trivial op."""
    wall = max(wall, 1e-12)
    input_s = min(input_s, wall)
    busy = min(busy, wall - input_s)
    named = {n: t for n, t in measured.items() if n in work.by_op}
    total = sum(named.values())
    scale = min(1.0, busy / total) if total else 1.0  # overlapping events never exceed busy
    groups = {n: (t * scale, work.by_op[n].roofline) for n, t in named.items()}
    unseen = [call for n, w in work.by_op.items() if n not in named for call in w.roofline]
    groups["rest"] = (max(0.0, busy - total * scale), unseen)
    parts = {"compute": 0.0, "memory": 0.0, "overhead": wall - input_s - busy}
    by_group = {}
    for name, (seconds, calls) in groups.items():
        split = _split(seconds, calls, issue_s)
        for k, v in split.items():
            parts[k] += v
        by_group[name] = {"ms": 1e3 * seconds, "calls": len(calls),
                          "roofline_ms": 1e3 * sum(c + m for c, m in calls),
                          "limited_by": max(split, key=split.get)}
    shares = {**{k: v / wall for k, v in parts.items()}, "input": input_s / wall}
    ranked = sorted(shares, key=shares.get, reverse=True)
    return {
        "class": ranked[0],
        "runner_up": ranked[1] if shares[ranked[0]] < MIXED_BELOW else None,
        "shares": shares,
        "step_ms": 1e3 * wall, "input_ms": 1e3 * input_s, "busy_ms": 1e3 * busy,
        "idle_ms": 1e3 * (wall - input_s - busy), "issue_us": 1e6 * issue_s,
        "flops_per_step": work.flops, "bytes_per_step": work.bytes,
        "intensity_flop_per_byte": work.intensity, "ridge_flop_per_byte": peaks.ridge,
        "roofline_ms": 1e3 * work.roofline_s,
        "achieved_flops": work.flops / max(wall - input_s, 1e-12),
        "groups": by_group,
        "peaks": {**asdict(peaks), "ridge": peaks.ridge},
    }


def input_source(batches) -> str:
    """Where a Run's batches come from, as `next_switches` needs it: "device" (in memory on the
    device), "host" (in memory on the host), "dataset" (a map-style Dataset, streamed), "stream"
    (an IterableDataset) or "loader" (the user's own DataLoader: its settings, not --workers)."""
    if getattr(batches, "path", None) != "streamed":
        return "device" if batches.on_device else "host"
    train = batches.splits["train"]
    if train.loader_kw or train.as_built is not None:
        return "loader"
    return "stream" if train.iterable else "dataset"


def next_switches(cls: str, cfg, device_type: str, fast_dtypes: list[str],
                  source: str) -> list[str]:
    """The switches worth trying for a class, leaving out those already on. `fast_dtypes`: the
    low-precision dtypes the device runs natively (`fasttrain.lab.doctor.fast_dtypes`);
    `source`: where the batches come from (`input_source`): only switches `train` accepts for
    that data are named."""
    low = "bf16" in fast_dtypes and cfg.precision in ("fp32", "tf32")
    tips: list[str] = []
    if cls == "overhead":
        if not cfg.compile and not cfg.cuda_graphs:
            tips.append("--compile (fewer, fused ops: less dispatch per step)")
        if device_type == "cuda" and not cfg.cuda_graphs and cfg.precision != "fp16":
            tips.append("--cuda-graphs (one launch replays the whole step)")
        tips.append(f"--batch-size {2 * cfg.batch_size} (the same fixed costs buy twice the work)")
    elif cls == "memory":
        if low:
            tips.append("--precision bf16 (half the bytes per element)")
        if not cfg.compile:
            tips.append("--compile (fuses elementwise ops: intermediates stay out of memory)")
        if cfg.model in ("cnn", "resnet") and not cfg.channels_last:
            tips.append("--channels-last (NHWC convolutions without layout copies)")
    elif cls == "compute":
        if low:
            tips.append("--precision bf16 (tensor cores / AMX: several times the FLOP/s)")
        if device_type == "cuda" and cfg.precision == "fp32" and "tf32" in fast_dtypes:
            tips.append("--precision tf32 (tensor cores for fp32 matmuls)")
    elif cls == "input" and source == "loader":
        tips.append("num_workers=N in your DataLoader, with pin_memory=True on a GPU (it is "
                    "used as built: --workers and --pin-memory do not apply to it)")
    elif cls == "input" and source != "device":
        workers = f"--workers {max(2, 2 * cfg.workers)} (load the next batches while the step runs)"
        if source == "host":  # --workers with --data-on-device on is refused
            tips.append("--data-on-device on (batches gathered in device memory: no loader)"
                        + (" without --workers" if cfg.workers else ""))
        elif source == "dataset":  # --data-on-device on alone is refused for streamed data
            tips.append("--data-in-memory (the Dataset read once into memory: no loader; its "
                        "random transforms are then drawn once)")
        tips.append(workers)
        if device_type == "cuda" and not cfg.pin_memory:
            tips.append("--pin-memory (asynchronous host-to-GPU copies)")
    if not tips:
        tips.append("no switch left for this class: look at the top operators and the trace")
    return tips

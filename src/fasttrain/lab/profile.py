"""Where a training step's time goes and what limits it: `profile_run(run)` runs steps of a Run
under torch.profiler and returns the result that `fasttrain profile` prints (fasttrain.commands).

    run = fasttrain.engine.build(cfg, model=my_module, data=task, verbose=False)
    result = profile_run(run, steps=10, warmup=3)

It runs `warmup` steps untraced (compilation, allocator, caches), counts one eager step's FLOPs
and bytes, then runs `steps` steps under torch.profiler (CPU and, with a GPU, CUDA activities;
shapes recorded, no stacks) and finds:

- the top operators by self time (device time on a GPU);
- each step's time split into input (waiting for the batch: inside the data iterator while the
  device runs nothing), busy (the device inside an op) and idle (neither);
- the host–device synchronizations of the step and the file:line they come from;
- the class — compute-, memory-, overhead- or input-bound (`fasttrain.lab.classify`) — and the
  switches to try next.

"The device" is the GPU when training on one: busy = the union of its kernel, memcpy and memset
intervals. On the CPU it is the CPU: busy = the union of the intervals of aten ops (and compiled
graphs), so that idle is the time outside any op — Python, autograd bookkeeping, the loop. Every
step ends with a device synchronization (so that a step's kernels fall inside its window); that
sync is the profiler's own and the audit does not count it.

Sync audit: during the traced steps, calls that force the host to wait for the device —
`Tensor.item / tolist / numpy / cpu`, `.to()` onto the CPU, `bool() / float() / int() /
index() / format() / repr()` of a tensor and `torch.cuda.synchronize` — are counted where user
code (anything outside torch) makes them, by file:line. On a GPU, torch's sync debug mode adds
the syncs torch makes itself (`nonzero`, boolean masks, GradScaler's inf check, ...) wherever
they reach Python as warnings, at the first caller outside torch. On the CPU nothing waits, but
the same calls are counted — each would be a sync on a GPU — and torch's own are not seen.

The class is computed on the faster half of the traced steps: a neighbour on a shared machine
can only slow a step down, so the fastest steps are the least disturbed. When the load average
says the CPU is shared, the report warns. Profiling adds a few µs to every op, so an
overhead-bound step looks slightly more so; the ms/step of up to 5 untraced steps after the
warm-up (their faster half, as the traced ones') is printed beside the traced one to show by how
much.
"""

from __future__ import annotations

import contextlib
import functools
import linecache
import os
import statistics
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING

import torch
from torch.profiler import ProfilerActivity, record_function

from fasttrain.engine.loop import endless_batches, endless_steps, warm_up
from fasttrain.lab.classify import classify, count_step, device_peaks, input_source, next_switches
from fasttrain.lab.trace import INPUT, STEP, op_times, steady_steps, step_rows, top_ops, windows
from fasttrain.timing import synchronizer

if TYPE_CHECKING:
    from fasttrain.engine.run import Run

SCHEMA = "fasttrain.profile/1"
UNTRACED = 5  # untraced steps timed after the warm-up, at most
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.abspath(__file__)


# -- the sync audit ------------------------------------------------------------------------------

_TENSOR_CALLS = ("item", "tolist", "numpy", "cpu", "to", "__bool__", "__float__", "__int__",
                 "__index__", "__format__", "__repr__")


class SyncAudit:
    """Counts host–device synchronizations by the file:line that makes them, while open.

    `sites` maps (call, file, line) → count. A call counts when its direct caller is outside
    torch (torch's own internal calls — e.g. the CPU optimizer reading its step counter — are
    not the user's doing; on a GPU the sync debug mode reports the ones that do sync) and the
    tensor lives on the audited device (`.to()`: only device → CPU copies)."""

    def __init__(self, device: torch.device):
        self.device = device
        self.sites: dict[tuple[str, str, int], int] = {}
        self._local = threading.local()  # `inside`: a patched call is running on this thread
        self._restore: list = []

    def __enter__(self) -> SyncAudit:
        for name in _TENSOR_CALLS:
            self._patch(torch.Tensor, name, self._wrap(name, getattr(torch.Tensor, name)))
        if self.device.type == "cuda":
            self._patch(torch.cuda, "synchronize", self._wrap_sync(torch.cuda.synchronize))
            # Syncs inside torch ops arrive as warnings; they are recorded at their caller.
            previous = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode("warn")
            self._restore.append(lambda: torch.cuda.set_sync_debug_mode(previous))
            caught = warnings.catch_warnings()
            caught.__enter__()
            self._restore.append(lambda: caught.__exit__(None, None, None))
            warnings.filterwarnings("always", message=".*synchroniz", category=UserWarning)
            shown = warnings.showwarning
            warnings.showwarning = functools.partial(self._warning, shown)
        return self

    def __exit__(self, *exc) -> None:
        while self._restore:
            self._restore.pop()()

    @contextlib.contextmanager
    def paused(self):
        """Nothing counts inside (a harness's own syncs)."""
        self._local.inside = True
        try:
            yield
        finally:
            self._local.inside = False

    def per_step(self, steps: int) -> list[dict]:
        rows = [{"call": call, "where": f"{_short(file)}:{line}", "file": file, "line": line,
                 "code": linecache.getline(file, line).strip(), "per_step": n / steps}
                for (call, file, line), n in self.sites.items()]
        return sorted(rows, key=lambda r: -r["per_step"])

    def _patch(self, owner, name: str, value) -> None:
        had, old = name in vars(owner), vars(owner).get(name)
        setattr(owner, name, value)
        self._restore.append(lambda: setattr(owner, name, old) if had else delattr(owner, name))

    def _record(self, call: str, frame) -> None:
        key = (call, frame.f_code.co_filename, frame.f_lineno)
        self.sites[key] = self.sites.get(key, 0) + 1

    def _counts(self, name: str, tensor, out) -> bool:
        if name == "to":  # a real sync only from the GPU to the host
            return (tensor.device.type == self.device.type != "cpu"
                    and isinstance(out, torch.Tensor) and out.device.type == "cpu")
        return tensor.device.type == self.device.type

    def _wrap(self, name: str, original):
        local = self._local

        @functools.wraps(original)
        def patched(tensor, *args, **kwargs):
            caller = sys._getframe(1)
            # Inside another patched call (count once), or called by torch itself: pass through
            # (on a GPU, the sync debug mode reports torch's own syncs at the user's line).
            if getattr(local, "inside", False) or not _is_user(caller.f_code.co_filename):
                return original(tensor, *args, **kwargs)
            local.inside = True
            try:
                out = original(tensor, *args, **kwargs)
            finally:
                local.inside = False
            if self._counts(name, tensor, out):
                self._record(f".{name.strip('_')}()" if name.startswith("__") else f".{name}()",
                             caller)
            return out

        return patched

    def _wrap_sync(self, original):
        @functools.wraps(original)
        def patched(*args, **kwargs):
            if not getattr(self._local, "inside", False):
                caller = sys._getframe(1)
                if _is_user(caller.f_code.co_filename):
                    self._record("torch.cuda.synchronize()", caller)
            return original(*args, **kwargs)

        return patched

    def _warning(self, shown, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message):
            return shown(message, category, filename, lineno, file, line)
        if getattr(self._local, "inside", False):
            return None  # already counted by a patched call
        frame = sys._getframe(1)
        while frame is not None and not _is_user(frame.f_code.co_filename):
            frame = frame.f_back
        if frame is not None:
            self._record("implicit sync in a torch op", frame)
        return None


def _is_user(filename: str) -> bool:
    """Outside torch, outside this module and the warnings machinery."""
    return not (filename.startswith(_TORCH_DIR) or os.path.abspath(filename) == _HERE
                or filename.endswith(("warnings.py", "contextlib.py")) or filename.startswith("<"))


def _short(file: str) -> str:
    try:
        return os.path.relpath(file)
    except ValueError:  # another drive (Windows)
        return file



# -- profiling -----------------------------------------------------------------------------------


def _issue_cost(device: torch.device, activities: list) -> float:
    """Seconds to issue one trivial op (a one-element add) from Python, traced like the steps:
    an op whose roofline time is shorter is overhead-bound — dispatch on the CPU, the launch on a
    GPU take longer than its work. Median of 5 runs of 100."""
    a, sync = torch.ones(1, device=device), synchronizer(str(device))
    runs = []
    with torch.profiler.profile(activities=activities, record_shapes=True):
        for _ in range(5):
            sync()
            t0 = time.perf_counter()
            for _ in range(100):
                torch.add(a, a)
            sync()
            runs.append((time.perf_counter() - t0) / 100)
    return statistics.median(runs)


def profile_run(run: Run, steps: int = 10, warmup: int = 3, trace: str | None = None,
                top: int = 12, sample_period_s: float = 0.05) -> dict:
    """Profile `steps` optimizer steps of `run` (after `warmup` untraced ones) and return the
    result: schema, env, config, rows (per step), ops, syncs, classification, device_sampler.
    `trace`: a path for the Chrome/Perfetto trace; `top`: operators listed."""
    from fasttrain.lab.memory import users_code

    with users_code(run):
        return _profile(run, steps, warmup, trace, top, sample_period_s)


def _profile(run: Run, steps: int, warmup: int, trace: str | None, top: int,
             sample_period_s: float) -> dict:
    from fasttrain.env import env_block
    from fasttrain.lab.doctor import fast_dtypes
    from fasttrain.lab.sampler import DeviceSampler

    device, cfg = run.device, run.cfg
    sync = synchronizer(str(device))  # the original function: the audit never sees these
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    inputs = endless_steps(run)  # what run.train_step takes: the whole-step graph's, if any
    warm_up(run, inputs, max(warmup - 1, 0))
    # Untraced steps to set beside the traced ones (the profiler's own cost is the difference):
    # as many as are traced, up to UNTRACED, their faster half kept as the traced steps' is (one
    # step alone was a single sample of a neighbour's load: 82.6 ms against 3.68 traced).
    untraced = []
    for _ in range(min(steps, UNTRACED) if warmup else 0):
        t0 = time.perf_counter()
        run.train_step(run, next(inputs))
        sync()
        untraced.append(time.perf_counter() - t0)
    peaks = device_peaks(device, cfg.precision)
    work = count_step(run, endless_batches(run), peaks)  # one eager step's micro-batches
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    issue_s = _issue_cost(device, activities)

    audit = SyncAudit(device)
    sampler = DeviceSampler(device, period_s=sample_period_s)
    with sampler, torch.profiler.profile(activities=activities, record_shapes=True) as prof, \
            audit:
        for _ in range(steps):
            with record_function(STEP):
                with record_function(INPUT):
                    step_input = next(inputs)
                run.train_step(run, step_input)
                sync()  # the step's kernels end inside its window
    if trace:
        prof.export_chrome_trace(str(trace))
    events = prof.events()
    rows = step_rows(events, device.type)
    steady = steady_steps(rows)
    mean = lambda key: statistics.fmean(rows[i][key] for i in steady)  # noqa: E731
    steady_windows = [w for i, w in enumerate(windows(events, STEP)) if i in steady]
    verdict = classify(wall=mean("wall_ms") / 1e3, input_s=mean("input_ms") / 1e3,
                       busy=mean("busy_ms") / 1e3, issue_s=issue_s, work=work, peaks=peaks,
                       measured=op_times(events, device.type, work.by_op, steady_windows))
    verdict["ops_per_step"] = mean("ops")
    verdict["steps_classified"] = steady
    fast = fast_dtypes(device)
    verdict["next"] = next_switches(verdict["class"], cfg, device.type, fast,
                                    input_source(run.batches))
    faster = sorted(untraced)[:(len(untraced) + 1) // 2]
    return {
        "schema": SCHEMA,
        "env": env_block(),
        "config": {**cfg.to_dict(), "steps": steps, "profile_warmup": warmup,
                   "model_class": type(run.model).__name__,
                   "data_on_device": run.batches.on_device,
                   "resolved_device": str(device), "trace": str(trace) if trace else None},
        "untraced_step_ms": 1e3 * statistics.fmean(faster) if faster else None,
        "untraced_steps": len(untraced),
        # On a shared CPU, a neighbour holding a core makes every parallel op wait a scheduler
        # slice (OpenMP's barrier): the times then measure the neighbour, not the step.
        "cpu_load_1min": load,
        "cpu_oversubscribed": bool(device.type == "cpu" and load is not None and
                                   load + torch.get_num_threads() > (os.cpu_count() or 1) + 1),
        "rows": rows,
        "ops": top_ops(events, device.type, steady_windows, mean("wall_ms"), top),
        "syncs": audit.per_step(steps),
        "syncs_are_real": device.type != "cpu",
        "classification": verdict,
        "device_sampler": sampler.summary(),
    }

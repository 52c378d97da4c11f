"""`fasttrain profile`: where a training step's time goes, what limits it, and the switch to try.

    fasttrain profile --model logreg --data synthetic --batch-size 128 --steps 20
    fasttrain profile --model cnn --data mnist --precision bf16 --compile --trace cnn.json \\
                      --json cnn-profile.json --plot cnn-util.png

Takes every `fasttrain train` switch (a user's --model pkg.module:factory too). Builds the Run
through `fasttrain.build`, runs --profile-warmup steps untraced
(compilation, allocator, caches), counts one eager step's FLOPs and bytes, then runs --steps steps
under torch.profiler (CPU and, with a GPU, CUDA activities; shapes recorded, no stacks) and prints:

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
overhead-bound step looks slightly more so; the untraced ms/step of the warm-up is printed beside
the traced one to show by how much.
Exit status: 0, or 2 for bad input.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import functools
import linecache
import os
import statistics
import sys
import threading
import time
import warnings
from pathlib import Path

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, record_function

from fasttrain.engine.loop import step
from fasttrain.errors import UserError
from fasttrain.lab.classify import classify, count_step, device_peaks, next_switches
from fasttrain.timing import synchronizer

SCHEMA = "fasttrain.profile/1"
STEP, INPUT = "fasttrain.step", "fasttrain.input"  # our ranges in the trace
_CPU_OPS = ("aten::", "## Call CompiledFxGraph")  # CPU events that are the device's work
_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep
_HERE = os.path.abspath(__file__)


# -- the command -------------------------------------------------------------------------------


def profile_parser(sub: argparse._SubParsersAction) -> None:
    from fasttrain.engine.config import add_arguments

    p = sub.add_parser("profile", help="profile training steps: top ops, idle time, syncs, and "
                       "what bounds the step", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    g = p.add_argument_group("profiling")
    g.add_argument("--steps", type=int, default=10, help="optimizer steps traced (default: 10)")
    g.add_argument("--profile-warmup", type=int, default=3, metavar="N",
                   help="untraced steps first: compilation, allocator, caches (default: 3)")
    g.add_argument("--trace", metavar="PATH", help="write a Chrome/Perfetto trace (JSON)")
    g.add_argument("--json", metavar="PATH", help="write the result as JSON")
    g.add_argument("--plot", metavar="PATH", help="GPU utilization and memory over time (PNG; "
                   "needs a GPU and nvidia-ml-py)")
    g.add_argument("--top", type=int, default=12, help="operators listed (default: 12)")
    p.set_defaults(func=profile)


def profile(args: argparse.Namespace) -> int:
    from fasttrain.engine.config import from_args
    from fasttrain.report import check_writable, write_json

    for flag, value, least in (("--steps", args.steps, 1), ("--profile-warmup",
                               args.profile_warmup, 0), ("--top", args.top, 1)):
        if value < least:
            raise UserError(f"{flag} must be ≥ {least}, got {value}")
    for flag in ("trace", "json", "plot"):
        if getattr(args, flag):
            check_writable(getattr(args, flag), f"--{flag}")
    trainer = build_trainer(from_args(args))
    result = profile_trainer(trainer, steps=args.steps, warmup=args.profile_warmup,
                             trace=args.trace, top=args.top)
    print_report(result)
    if args.json:
        write_json(args.json, result)
    if args.plot:
        from fasttrain.lab.sampler import plot_samples

        why_not = plot_samples(result["device_sampler"], args.plot)
        print(f"--plot {args.plot}: " + (f"not written, {why_not}" if why_not else "written"))
    return 0


# -- building what is profiled -------------------------------------------------------------------


def build_trainer(cfg, task=None, model: torch.nn.Module | None = None):
    """The engine's Run for `cfg`, with `task` and `model` injected where given: the public
    path (`build`), so a user's model is profiled exactly as it trains."""
    from fasttrain.engine.run import build

    return build(cfg, model=model, data=task, verbose=False)


def _batches_forever(run):
    """Optimizer steps' micro-batches, epoch after epoch: profiling ignores epochs/max_steps."""
    from fasttrain.engine.loop import endless_batches

    return endless_batches(run)


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


# -- the trace -----------------------------------------------------------------------------------


def _is_device_op(event, device_type: str) -> bool:
    if device_type == "cuda":
        # Kernels, memcpy, memset; not the GPU-timeline copies of our record_function ranges.
        return (event.device_type == DeviceType.CUDA
                and not getattr(event, "is_user_annotation", False)
                and "annotation" not in str(getattr(event, "activity_type", "")))
    return event.device_type == DeviceType.CPU and event.name.startswith(_CPU_OPS)


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(s, e) for s, e in merged]


def _covered(merged: list[tuple[float, float]], starts: list[float], lo: float, hi: float) -> float:
    """Length of [lo, hi] covered by the sorted, disjoint intervals `merged`."""
    total, i = 0.0, max(bisect.bisect_right(starts, lo) - 1, 0)
    while i < len(merged) and merged[i][0] < hi:
        total += max(0.0, min(hi, merged[i][1]) - max(lo, merged[i][0]))
        i += 1
    return total


def _windows(events, name: str) -> list[tuple[float, float]]:
    return sorted((e.time_range.start, e.time_range.end) for e in events if e.name == name)


def step_rows(events, device_type: str) -> list[dict]:
    """Per traced step: wall, input (waiting), busy and idle (ms), and device ops (count)."""
    ops = [(e.time_range.start, e.time_range.end) for e in events
           if _is_device_op(e, device_type)]
    busy = _union(ops)
    starts = [s for s, _ in busy]
    op_starts = sorted(s for s, _ in ops)
    rows = []
    for i, ((lo, hi), (in_lo, in_hi)) in enumerate(zip(_windows(events, STEP),
                                                       _windows(events, INPUT), strict=True)):
        in_busy = _covered(busy, starts, in_lo, in_hi)
        wall, on = hi - lo, _covered(busy, starts, lo, hi)
        waiting = (in_hi - in_lo) - in_busy
        rows.append({"step": i, "wall_ms": wall / 1e3, "input_ms": waiting / 1e3,
                     "busy_ms": on / 1e3, "idle_ms": (wall - on - waiting) / 1e3,
                     "ops": bisect.bisect_left(op_starts, hi) - bisect.bisect_left(op_starts, lo)})
    return rows


def steady_steps(rows: list[dict]) -> list[int]:
    """The faster half of the traced steps (indices). A neighbour on the machine can only slow a
    step down, never speed it up, so the fastest steps are the least disturbed (timeit's reason
    for taking the minimum); the class is computed on them."""
    ranked = sorted(range(len(rows)), key=lambda i: rows[i]["wall_ms"])
    return sorted(ranked[:max(1, (len(rows) + 1) // 2)])


def op_times(events, device_type: str, names, windows: list[tuple[float, float]]
             ) -> dict[str, float]:
    """name → seconds per step inside the outermost events named in `names` (an event inside
    another counted op is part of that op's time) that start in one of the step `windows` (µs):
    wall time on the CPU, the time of the kernels they and their children launched on a GPU."""
    names, found = set(names), {}
    windows = sorted(windows)
    lows = [lo for lo, _ in windows]
    for e in events:
        if e.device_type != DeviceType.CPU or e.name not in names:
            continue
        i = bisect.bisect_right(lows, e.time_range.start) - 1
        if i < 0 or e.time_range.start > windows[i][1]:
            continue
        parent = e.cpu_parent
        while parent is not None and parent.name not in names:
            parent = parent.cpu_parent
        if parent is None:
            us = e.device_time_total if device_type == "cuda" else e.time_range.elapsed_us()
            found[e.name] = found.get(e.name, 0.0) + us * 1e-6 / len(windows)
    return found


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


def _top_ops(prof, device_type: str, steps: int, step_ms: float, k: int) -> list[dict]:
    attr = "self_device_time_total" if device_type == "cuda" else "self_cpu_time_total"
    rows = [a for a in prof.key_averages() if a.device_type == DeviceType.CPU
            and not a.key.startswith("fasttrain.") and getattr(a, attr) > 0]
    rows.sort(key=lambda a: getattr(a, attr), reverse=True)
    return [{"op": a.key, "calls_per_step": a.count / steps,
             "self_ms_per_step": getattr(a, attr) / 1e3 / steps,
             "share_of_step": getattr(a, attr) / 1e3 / steps / step_ms if step_ms else None}
            for a in rows[:k]]


# -- profiling -----------------------------------------------------------------------------------


def profile_trainer(trainer, steps: int = 10, warmup: int = 3, trace: str | None = None,
                    top: int = 12, sample_period_s: float = 0.05) -> dict:
    """Profile `steps` optimizer steps of `trainer` (after `warmup` untraced ones) and return the
    result: schema, env, config, rows (per step), ops, syncs, classification, device_sampler."""
    from fasttrain.env import env_block
    from fasttrain.lab.doctor import fast_dtypes
    from fasttrain.lab.sampler import DeviceSampler

    device, cfg = trainer.device, trainer.cfg
    sync = synchronizer(str(device))  # the original function: the audit never sees these
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    batches = _batches_forever(trainer)
    untraced = []
    for _ in range(warmup):
        t0 = time.perf_counter()
        step(trainer, next(batches))
        sync()
        untraced.append(time.perf_counter() - t0)
    peaks = device_peaks(device, cfg.precision)
    work = count_step(trainer, batches, peaks)
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
                    micro_batches = next(batches)
                step(trainer, micro_batches)
                sync()  # the step's kernels end inside its window
    if trace:
        prof.export_chrome_trace(str(trace))
    events = prof.events()
    rows = step_rows(events, device.type)
    steady = steady_steps(rows)
    mean = lambda key: statistics.fmean(rows[i][key] for i in steady)  # noqa: E731
    windows = [w for i, w in enumerate(_windows(events, STEP)) if i in steady]
    verdict = classify(wall=mean("wall_ms") / 1e3, input_s=mean("input_ms") / 1e3,
                       busy=mean("busy_ms") / 1e3, issue_s=issue_s, work=work, peaks=peaks,
                       measured=op_times(events, device.type, work.by_op, windows))
    verdict["ops_per_step"] = mean("ops")
    verdict["steps_classified"] = steady
    fast = fast_dtypes(device)
    verdict["next"] = next_switches(verdict["class"], cfg, device.type, fast,
                                    trainer.batches.on_device)
    half = untraced[len(untraced) // 2:]
    return {
        "schema": SCHEMA,
        "env": env_block(),
        "config": {**cfg.to_dict(), "steps": steps, "profile_warmup": warmup,
                   "model_class": type(trainer.model).__name__,
                   "data_on_device": trainer.batches.on_device,
                   "resolved_device": str(device), "trace": str(trace) if trace else None},
        "untraced_step_ms": 1e3 * statistics.fmean(half) if half else None,
        # On a shared CPU, a neighbour holding a core makes every parallel op wait a scheduler
        # slice (OpenMP's barrier): the times then measure the neighbour, not the step.
        "cpu_load_1min": load,
        "cpu_oversubscribed": bool(device.type == "cpu" and load is not None and
                                   load + torch.get_num_threads() > (os.cpu_count() or 1) + 1),
        "rows": rows,
        "ops": _top_ops(prof, device.type, steps,
                       statistics.fmean(r["wall_ms"] for r in rows), top),
        "syncs": audit.per_step(steps),
        "syncs_are_real": device.type != "cpu",
        "classification": verdict,
        "device_sampler": sampler.summary(),
    }


# -- the report ----------------------------------------------------------------------------------


def print_report(result: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console, cfg, v = Console(), result["config"], result["classification"]
    sh = v["shares"]
    untraced = result["untraced_step_ms"]
    console.print(f"[bold]fasttrain profile[/bold] — {cfg['model_class']} on {cfg['data']}, "
                  f"{cfg['resolved_device']}, {cfg['precision']}, batch {cfg['batch_size']}"
                  f"{' (compiled)' if cfg['compile'] else ''}; {cfg['steps']} steps traced, "
                  f"the faster {len(v['steps_classified'])} classified: "
                  f"{v['step_ms']:.3g} ms/step traced"
                  + (f", {untraced:.3g} untraced" if untraced else ""))
    if result["cpu_oversubscribed"]:
        threads = result["env"]["torch_threads"]
        console.print(f"[yellow]warning: load average {result['cpu_load_1min']:.1f} on "
                      f"{result['env']['cores']} cores with {threads} torch thread(s): other "
                      f"processes share the CPU and the times below include their share; "
                      f"profile on an idle machine"
                      + (", or with OMP_NUM_THREADS=1" if threads > 1 else "") + "[/yellow]")
    ops = Table(title="top operators by self time (per step)")
    for col in ("operator", "calls", "self ms", "of step"):
        ops.add_column(col, justify="left" if col == "operator" else "right")
    for r in result["ops"]:
        share = r["share_of_step"]
        ops.add_row(r["op"], f"{r['calls_per_step']:.3g}", f"{r['self_ms_per_step']:.3g}",
                    f"{share:.1%}" if share is not None else "-")
    console.print(ops)
    device = "GPU" if result["syncs_are_real"] else "CPU (in aten ops)"
    console.print(f"step {v['step_ms']:.3g} ms = input {v['input_ms']:.3g} + {device} busy "
                  f"{v['busy_ms']:.3g} + idle {v['idle_ms']:.3g}; {v['ops_per_step']:.0f} ops; "
                  f"issuing one costs {v['issue_us']:.2g} µs")
    p = v["peaks"]
    console.print(f"roofline: {v['flops_per_step'] / 1e9:.3g} GFLOP and "
                  f"{v['bytes_per_step'] / 1e6:.3g} MB per step → "
                  f"{v['intensity_flop_per_byte']:.3g} FLOP/B against a ridge of "
                  f"{p['ridge']:.3g} FLOP/B ({p['flops'] / 1e9:,.0f} GFLOP/s, "
                  f"{p['bandwidth'] / 1e9:,.1f} GB/s, {p['source']}); the roofline's time "
                  f"is {v['roofline_ms']:.3g} ms of {v['step_ms']:.3g}")
    syncs = result["syncs"]
    if syncs:
        t = Table(title="host–device syncs per step" + ("" if result["syncs_are_real"] else
                  " (CPU run: each would be a sync on a GPU)"))
        for col in ("per step", "call", "where", "code"):
            t.add_column(col, justify="right" if col == "per step" else "left")
        for s in syncs:
            t.add_row(f"{s['per_step']:.3g}", s["call"], s["where"], s["code"])
        console.print(t)
    else:
        console.print("host–device syncs per step: none")
    shares = ", ".join(f"{k} {sh[k]:.0%}" for k in sorted(sh, key=sh.get, reverse=True))
    console.print(f"[bold]{v['class']}-bound[/bold]"
                  + (f" (then {v['runner_up']})" if v["runner_up"] else "") + f": {shares}")
    for tip in v["next"]:
        console.print(f"  try {tip}")
    sampler = result["device_sampler"]
    if sampler["available"]:
        console.print(f"NVML: GPU busy {sampler['gpu_util_mean_pct'] or 0:.0f}% on average, "
                      f"{sampler['mem_used_max_gb'] or 0:.1f} GiB used at most")
    else:
        console.print(f"NVML sampler: {sampler['reason']}")
    if cfg["trace"]:
        console.print(f"trace: {Path(cfg['trace'])} (open in ui.perfetto.dev or chrome://tracing)")

"""What a run costs on each GPU of a catalogue: the catalogue itself (lab/gpus.toml, or a user's
file), and the arithmetic of time and money — on-demand, spot with its restarts, a deadline, the
marks (cheapest, fastest, cheapest by the deadline) and the Pareto front of cost against time.

Spot: preemptions arrive at `rate` per hour of wall time (a Poisson process). Each one loses, on
average, half the checkpoint interval of work (the preemption falls uniformly between two
checkpoints) plus the restart time (a new instance, the job starting, the checkpoint loading).
Work lost is itself exposed to preemption, so the wall time T of a run whose work takes T0 hours
solves T = T0 + rate · T · (interval/2 + restart):

    T = T0 / (1 − rate · (interval/2 + restart))     (never finishes when rate · (…) ≥ 1)

and the expected number of preemptions is rate · T. Writing a checkpoint is taken as free (an
asynchronous save), and a preempted instance as unbilled from the moment it is taken away.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from fasttrain.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

PRECISION_KEYS = ("fp32", "tf32", "bf16", "fp16", "fp8")
REQUIRED = ("memory_gb", "fp32", "bandwidth_gbs", "interconnect", "link_gbs")
OPTIONAL = ("launch_us", "launch_source")  # both or neither
TIERS = ("on_demand", "spot")
PRICE_FIELDS = ("usd_per_hour", "read", "source")


@dataclass(frozen=True)
class Price:
    usd_per_hour: float  # one GPU
    read: str  # the date it was read
    source: str


@dataclass(frozen=True)
class GPU:
    name: str
    memory_gb: float
    peaks: dict[str, float]  # precision → dense FLOP/s (absent: no such unit)
    bandwidth: float  # B/s
    interconnect: str
    link_bandwidth: float  # B/s per GPU per direction
    prices: dict[str, Price] = field(default_factory=dict)  # tier → price
    launch_s: float | None = None  # seconds to issue one eager op (None: steptime's default)
    launch_source: str = ""

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 2**30)


def _number(where: str, key: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            math.isfinite(value) and value > 0):
        raise UserError(f"{where}: field {key!r} must be a positive number, got {value!r}")
    return float(value)


def parse(raw: dict, origin: str) -> dict[str, GPU]:
    """GPUs by name from a catalogue's TOML tables, every field checked (a UserError names the
    GPU and the field)."""
    gpus = raw.get("gpus")
    if not isinstance(gpus, dict) or not gpus:
        raise UserError(f"{origin}: no [gpus.\"NAME\"] tables; see fasttrain/lab/gpus.toml for "
                        f"the form")
    out = {}
    for name, g in gpus.items():
        where = f"{origin}: GPU {name!r}"
        if not isinstance(g, dict):
            raise UserError(f"{where}: must be a table of fields")
        for key in REQUIRED:
            if key not in g:
                raise UserError(f"{where} lacks the field {key!r} (required: "
                                f"{', '.join(REQUIRED)})")
        unknown = set(g) - set(REQUIRED) - set(PRECISION_KEYS) - set(OPTIONAL) - {"prices"}
        if unknown:
            raise UserError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        for key, other in (OPTIONAL, OPTIONAL[::-1]):
            if key in g and other not in g:
                raise UserError(f"{where} has {key!r} but lacks the field {other!r}")
        prices = {}
        for tier, p in (g.get("prices") or {}).items():
            if tier not in TIERS:
                raise UserError(f"{where}: unknown price tier {tier!r} (tiers: {', '.join(TIERS)})")
            for key in PRICE_FIELDS:
                if not isinstance(p, dict) or key not in p:
                    raise UserError(f"{where} lacks the field 'prices.{tier}.{key}'")
            prices[tier] = Price(_number(where, f"prices.{tier}.usd_per_hour", p["usd_per_hour"]),
                                 str(p["read"]), str(p["source"]))
        out[name] = GPU(
            name=name, memory_gb=_number(where, "memory_gb", g["memory_gb"]),
            peaks={k: 1e12 * _number(where, k, g[k]) for k in PRECISION_KEYS if k in g},
            bandwidth=1e9 * _number(where, "bandwidth_gbs", g["bandwidth_gbs"]),
            interconnect=str(g["interconnect"]),
            link_bandwidth=1e9 * _number(where, "link_gbs", g["link_gbs"]), prices=prices,
            launch_s=(1e-6 * _number(where, "launch_us", g["launch_us"]) if "launch_us" in g
                      else None), launch_source=str(g.get("launch_source", "")))
    return out


def load(path: str | Path | None = None) -> dict[str, GPU]:
    """The shipped catalogue, or a user's file."""
    if path is None:
        text = resources.files("fasttrain.lab").joinpath("gpus.toml").read_text()
        origin = "gpus.toml"
    else:
        p = Path(path)
        if not p.is_file():
            raise UserError(f"--catalog {path}: no such file")
        text, origin = p.read_text(), str(path)
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise UserError(f"{origin}: not valid TOML ({e})") from None
    return parse(raw, origin)


def datasheet_peaks() -> dict[str, dict[str, float]]:
    """The shipped catalogue in the form fasttrain.env.GPU_PEAKS has (FLOP/s per precision, "bw"
    in B/s): one source of data-sheet figures."""
    return {g.name: {**g.peaks, "bw": g.bandwidth} for g in load().values()}


# -- time and money ------------------------------------------------------------------------------


def spot_hours(work_hours: float, rate: float, interval_h: float, restart_h: float) -> float:
    """Expected wall hours on spot for `work_hours` of work (module docstring); inf when the
    preemptions would undo work faster than it is done."""
    loss = rate * (interval_h / 2 + restart_h)
    return work_hours / (1 - loss) if loss < 1 else math.inf


@dataclass
class Option:
    """One way to run: a GPU (× n) at a price tier."""

    gpu: str
    tier: str
    n: int
    hours: float  # expected wall time
    usd: float
    preemptions: float = 0.0  # expected
    marks: list[str] = field(default_factory=list)


def options(gpu: GPU, n: int, work_hours: float, rate: float, interval_h: float,
            restart_h: float) -> list[Option]:
    """The GPU's tiers priced: on-demand for the work's hours; spot for its expected hours with
    restarts (billed while running, n GPUs each)."""
    out = []
    for tier, price in gpu.prices.items():
        hours = work_hours if tier == "on_demand" else spot_hours(work_hours, rate, interval_h,
                                                                  restart_h)
        pre = rate * hours if tier == "spot" else 0.0
        out.append(Option(gpu.name, tier, n, hours, hours * n * price.usd_per_hour, pre))
    return out


def mark(opts: list[Option], deadline_h: float | None) -> None:
    """Adds "cheapest", "fastest" and (with a deadline) "cheapest by deadline" to the options
    that earn them (ties: the first)."""
    finite = [o for o in opts if math.isfinite(o.hours)]
    if not finite:
        return
    min(finite, key=lambda o: (o.usd, o.hours)).marks.append("cheapest")
    min(finite, key=lambda o: (o.hours, o.usd)).marks.append("fastest")
    if deadline_h is not None:
        meeting = [o for o in finite if o.hours <= deadline_h]
        if meeting:
            min(meeting, key=lambda o: (o.usd, o.hours)).marks.append("cheapest by deadline")


def pareto(opts: list[Option]) -> list[Option]:
    """The options no other beats on both time and cost, fastest first."""
    front, best_usd = [], math.inf
    for o in sorted((o for o in opts if math.isfinite(o.hours)), key=lambda o: (o.hours, o.usd)):
        if o.usd < best_usd:
            front.append(o)
            best_usd = o.usd
    return front

"""`fasttrain doctor`: which devices this machine has, what they run fast, and whether tensors land
where they should.

    fasttrain doctor            # tables
    fasttrain doctor --json     # the same as JSON (schema fasttrain.doctor/1)
"""

from __future__ import annotations

import argparse
import json

from fasttrain.lab import doctor as doctor_model


def doctor_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("doctor", help="devices, fast dtypes, versions, placement checks "
                       "(exit 0: a GPU was found; 1: none, or a check failed)",
                       description=f"{__doc__}\n{doctor_model.__doc__}",
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=doctor)


def doctor(args: argparse.Namespace) -> int:
    report = doctor_model.diagnose()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return report["exit_status"]
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title="devices")
    for col in ("device", "name", "memory GiB", "capability", "fast dtypes", "notes"):
        table.add_column(col)
    for d in report["devices"]:
        notes = (f"{d['multiprocessors']} SMs" if d["kind"] == "cuda" else
                 f"{d['cores']} cores; flags: {', '.join(d['cpu_flags']) or 'none found'}"
                 if d["kind"] == "cpu" else "")
        if d["kind"] == "cpu" and not d["fast_dtypes"]:
            notes += " (bf16/fp16 run by conversion, no faster than fp32)"
        table.add_row(d["device"], d["name"], str(d["memory_gb"] or "-"),
                      d.get("compute_capability", "-"), ", ".join(d["fast_dtypes"]) or "-",
                      notes)
    console.print(table)
    console.print("versions: " + ", ".join(f"{k} {v}" for k, v in report["versions"].items()
                                           if v is not None))
    checks = Table(title="checks")
    for col in ("check", "device", "status", "detail"):
        checks.add_column(col)
    for c in report["checks"]:
        colour = {"ok": "green", "failed": "red"}.get(c["status"], "yellow")
        detail = (f"{c['error']}\n→ {c['detail']}" if c.get("error") else c["detail"])
        checks.add_row(c["check"], c["device"], f"[{colour}]{c['status']}[/{colour}]", detail)
    console.print(checks)
    if not report["gpu_found"]:
        console.print("no GPU found: exit status 1")
    return report["exit_status"]

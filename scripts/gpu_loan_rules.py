"""scripts/gpu-loan's rules, written before the loan: which variant each measurement makes the
row's, read from the files gpu-check's steps write, and the careful source edit that applies it.
Pure functions of those files' contents (no torch, no GPU): tests/test_gpu_loan.py runs them on
the real shapes of the H200's run 10 (benchmarks/results/gpu-calls-2026-11-28-h200-run10/).

A rule that has no data (its step cut, failed or missing) changes nothing and says why.
"""

from __future__ import annotations

import ast
import difflib
import json
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

SWEEP_MARGIN = 0.02  # a sweep's winner must beat the row's DEFAULT by this fraction
# v7-tests' ids name the variant: [128-v7g-one-launch], [v7g], [v7g-one-launch]. The phase
# clocks' ids ([k-launch]) name none: a measurement, not the variant's correctness.
V7_ID = re.compile(r"\[(?:[^\]]*-)?v7([a-z])(?:-[^\]]*)?\]$")
V7_TIME = re.compile(r"^v7([a-z]) in one launch\b")


@dataclass
class Choice:
    """One rule's verdict: `chosen` is the row's new value, or None (the row stays)."""

    rule: str  # "v7", "torch-graphs" or "torch-optimized"
    current: str | None
    chosen: str | None
    why: str  # the loan.log line: what the rule saw and chose, with the figures
    figures: dict = field(default_factory=dict)
    args: dict | None = None  # a sweep winner's Variant arguments (the non-default fields)


# -- v7: cuda_epoch.V7_VARIANT from the v7-tests and v7-candidates steps -----------------------


def step_outcome(summary_json: Path, name: str) -> dict | None:
    """The step `name` of gpu-check's summary.json, or None (no summary: gpu-check was cut)."""
    try:
        steps = json.loads(Path(summary_json).read_text())["steps"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return next((s for s in steps if s.get("name") == name), None)


def tests_complete(outcome: dict | None) -> bool:
    """Whether pytest ran every selected test: exit 0 (all passed) or 1 (some failed). A step
    cut at its time limit wrote the XML of the tests done so far, which may lack a variant's
    last tests: its passes prove nothing."""
    return bool(outcome) and outcome.get("exit_code") in (0, 1)


def v7_verdicts(xml_text: str) -> dict[str, str]:
    """{variant letter: "passed" | "failed"} from v7-tests' JUnit XML: failed if any of its
    tests failed or errored, passed if at least one passed and none failed (skips count for
    neither)."""
    passed, failed = set(), set()
    for case in ET.fromstring(xml_text).iter("testcase"):
        m = V7_ID.search(case.get("name", ""))
        if not m:
            continue
        tags = {child.tag for child in case}
        if tags & {"failure", "error"}:
            failed.add(m.group(1))
        elif "skipped" not in tags:
            passed.add(m.group(1))
    return {v: "failed" if v in failed else "passed" for v in passed | failed}


def v7_times(candidates: dict) -> dict[str, float | str]:
    """{variant letter: ms/epoch in one launch, or the error sync_cost.py recorded instead}
    from the v7-candidates step's JSON (benchmarks/sync_cost.py's schema)."""
    return {m.group(1): ms for key, ms in candidates["cuda_epoch_ms"].items()
            if (m := V7_TIME.match(key))}


def pick_v7(row: str, candidates: tuple[str, ...], verdicts: dict[str, str] | None,
            times: dict[str, float | str] | None) -> Choice:
    """The fastest candidate in one launch whose own GPU tests all passed, if it is faster than
    the row's variant in the same launch (a tie keeps the row; between tied candidates, the
    first letter). `verdicts` None: the tests did not all run; `times` None: no timing."""
    def no(why: str, **figs) -> Choice:
        return Choice("v7", row, None, f"v7: V7_VARIANT stays {row!r}: {why}", figs)

    if times is None:
        return no("no v7-candidates JSON (the step was cut, failed or skipped)")
    if verdicts is None:
        return no("the v7-tests step did not run to its end (cut, or pytest did not finish)",
                  ms_per_epoch=times)
    row_ms = times.get(row)
    if not isinstance(row_ms, float):
        return no(f"the row's own time is missing ({row_ms!r})", ms_per_epoch=times)
    ok = {v: times[v] for v in candidates
          if verdicts.get(v) == "passed" and isinstance(times.get(v), float)}
    figs = {"row_ms": row_ms, "ms_per_epoch": times, "tests": verdicts,
            "eligible": sorted(ok)}
    seen = (f"candidates that passed and ran: {_ms(ok) or 'none'}; failed tests: "
            f"{sorted(v for v in candidates if verdicts.get(v) == 'failed') or 'none'}; "
            f"no tests: {sorted(v for v in candidates if v not in verdicts) or 'none'}")
    if not ok:
        return no(f"{row} {row_ms:.3f} ms/epoch; {seen}", **figs)
    best = min(ok, key=lambda v: (ok[v], v))
    if ok[best] < row_ms:
        return Choice("v7", row, best, f"v7: V7_VARIANT {row!r} -> {best!r}: {best} "
                      f"{ok[best]:.3f} ms/epoch < {row} {row_ms:.3f}; {seen}", figs)
    return no(f"the fastest that passed, {best} {ok[best]:.3f} ms/epoch, does not beat "
              f"{row} {row_ms:.3f}; {seen}", **figs)


def _ms(times: dict) -> str:
    return ", ".join(f"{v} {ms:.3f}" for v, ms in sorted(times.items(), key=lambda kv: kv[1]))


# -- the compiled sweep: each row's DEFAULT --------------------------------------------------


def pick_default(row: str, sweep: dict, margin: float = SWEEP_MARGIN) -> Choice:
    """The fastest of `row`'s variants in variant_sweep.py's JSON that passed its float64 check
    and ran, if it beats the row's DEFAULT in the same sweep by ≥ `margin` (a fraction)."""
    config = sweep.get("config", {})
    current = config.get("defaults", {}).get(row)

    def no(why: str, **figs) -> Choice:
        now = f" [{_tag(current)}]" if current else ""
        return Choice(row, current, None, f"{row}: DEFAULT stays{now}: {why}", figs)

    mine = [r for r in sweep.get("rows", []) if r.get("impl", "").startswith(f"{row} [")]
    if current is None or not mine:
        return no("no variant of the row in the sweep (the step was cut, failed or skipped)")
    ok = {r["impl"]: r["epoch_ms"] for r in mine
          if r.get("status") == "ok" and (r.get("check") or {}).get("ok") is True
          and isinstance(r.get("epoch_ms"), (int, float))}
    bad = sorted(_tag(r["impl"]) for r in mine if r["impl"] not in ok)
    figs = {"ms_per_epoch": {_tag(k): v for k, v in ok.items()}, "not_ok": bad,
            "default": _tag(current), "margin": margin}
    seen = (f"swept {len(mine)}, passed and timed: "
            + ", ".join(f"[{_tag(k)}] {v:.2f}" for k, v in sorted(ok.items(), key=lambda kv: kv[1]))
            + (f"; failed or not timed: {bad}" if bad else ""))
    if current not in ok:
        return no(f"the DEFAULT has no time in this sweep to compare with; {seen}", **figs)
    best = min(ok, key=lambda k: (ok[k], k != current, k))  # a tie: the DEFAULT
    if best == current:
        return no(f"it is the fastest, {ok[current]:.2f} ms/epoch; {seen}", **figs)
    gain = 1 - ok[best] / ok[current]
    figs.update(best=_tag(best), gain=gain)
    if gain < margin:
        return no(f"[{_tag(best)}] {ok[best]:.2f} ms/epoch is within {margin:.0%} of its "
                  f"{ok[current]:.2f} ({gain:.1%} faster); {seen}", **figs)
    args = (config.get("variants") or {}).get(best, {}).get("args")
    if args is None:
        return no(f"[{_tag(best)}] wins ({gain:.1%} faster) but the sweep's JSON lacks its "
                  f"Variant's arguments (config.variants): no edit; {seen}", **figs)
    return Choice(row, current, best, f"{row}: DEFAULT [{_tag(current)}] -> [{_tag(best)}] "
                  f"= {variant_expr(args)}: {ok[best]:.2f} ms/epoch against {ok[current]:.2f} "
                  f"({gain:.1%} faster, ≥ {margin:.0%}); {seen}", figs, args)


def _tag(label: str | None) -> str | None:
    """"torch-graphs [cublas, W storage]" -> "cublas, W storage"."""
    return label.split(" [", 1)[1].rstrip("]") if label and " [" in label else label


def variant_expr(args: dict) -> str:
    """The source of a Variant from its non-default fields: Variant(step="bcast", autotune=True)."""
    def lit(x) -> str:
        if isinstance(x, str):
            return json.dumps(x, ensure_ascii=False)
        if isinstance(x, (bool, int, float)):
            return repr(x)
        raise ValueError(f"Variant argument {x!r}: not a str, bool, int or float")

    return "Variant(" + ", ".join(f"{k}={lit(v)}" for k, v in args.items()) + ")"


# -- the source edit -----------------------------------------------------------------------


class EditError(ValueError):
    """The source does not hold the assignment exactly as the edit expects."""


def edit_assignment(text: str, name: str, value_src: str, where: str = "source",
                    comment: str | None = None) -> str:
    """`text` with the value of the one module-level `name = ...` (on one line) replaced by
    `value_src`; its trailing comment kept, or replaced by `# comment`. Refuses (EditError)
    when the assignment is not there exactly once or spans lines, or when the result does not
    parse to that assignment."""
    tree = ast.parse(text)
    found = [node for node in tree.body
             if isinstance(node, ast.Assign) and len(node.targets) == 1
             and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name]
    if len(found) != 1:
        raise EditError(f"{where}: found {len(found)} module-level assignments `{name} = ...`, "
                        f"expected exactly 1: edit it by hand")
    node = found[0]
    if node.lineno != node.value.end_lineno:
        raise EditError(f"{where}:{node.lineno}: `{name} = ...` spans lines: edit it by hand")
    lines = text.splitlines(keepends=True)
    line = lines[node.lineno - 1].encode()  # ast's columns count UTF-8 bytes
    head = line[:node.value.col_offset].decode()
    tail = line[node.value.end_col_offset:].decode()
    if comment is not None:
        tail = f"  # {comment}\n" if tail.endswith("\n") else f"  # {comment}"
    lines[node.lineno - 1] = head + value_src + tail
    new = "".join(lines)
    try:
        check = [n for n in ast.parse(new).body if isinstance(n, ast.Assign)
                 and isinstance(n.targets[0], ast.Name) and n.targets[0].id == name]
    except SyntaxError as e:
        raise EditError(f"{where}:{node.lineno}: `{name} = {value_src}` is not valid "
                        f"Python: {e.msg}") from None
    if len(check) != 1 or ast.dump(check[0].value) != ast.dump(ast.parse(value_src,
                                                                         mode="eval").body):
        raise EditError(f"{where}:{node.lineno}: the edit of `{name}` did not parse back to "
                        f"{value_src}")
    return new


def unified_diff(before: str, after: str, path: str) -> str:
    """A diff that `git apply` takes, from the repository's root."""
    return "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                        after.splitlines(keepends=True),
                                        fromfile=f"a/{path}", tofile=f"b/{path}"))

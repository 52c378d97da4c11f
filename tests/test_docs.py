"""The docs as a user reads them: every relative link and `#anchor` resolves, every `fasttrain
<command> --flag` in the code blocks of the README and docs/ (and in the README's Switches table)
is one the CLI accepts, and every `scripts/gpu-check --only STEP` names a step of the script.

Anchors follow GitHub's rules (github-slugger): the heading as rendered (code spans, links and
emphasis reduced to their text), lower-cased, every character that is not a letter, mark,
number, connector ('_'), space or '-' dropped, each space made '-'; a repeated slug gets -1, -2, ...
"""

from __future__ import annotations

import argparse
import importlib.machinery
import importlib.util
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def doc_files() -> list[Path]:
    """README.md, docs/**/*.md, and the README.md / summary*.md of each results folder."""
    results = ROOT / "benchmarks" / "results"
    return [README, *sorted((ROOT / "docs").rglob("*.md")),
            *sorted(results.rglob("README.md")), *sorted(results.rglob("summary*.md"))]


def split_fences(text: str) -> tuple[list[str], list[str]]:
    """(the file's lines with those of fenced code blocks and their fences blanked, so that line
    numbers hold; the blocks' contents, in order)."""
    lines, blocks, current, fence = [], [], [], None
    for line in text.split("\n"):
        opening = re.match(r" {0,3}(`{3,}|~{3,})", line)
        if fence is None and opening:
            fence, current = opening.group(1), []
        elif fence is not None and re.fullmatch(rf" {{0,3}}{fence[0]}{{{len(fence)},}}\s*", line):
            blocks.append("\n".join(current))
            fence = None
        elif fence is not None:
            current.append(line)
        else:
            lines.append(line)
            continue
        lines.append("")
    return lines, blocks


def rendered(heading: str) -> str:
    """A heading's text as GitHub renders it: code spans, links, images and emphasis as text."""
    parts = re.split(r"(`+[^`]*`+)", heading)
    out = []
    for part in parts:
        if part.startswith("`"):
            out.append(part.strip("`").strip())
        else:
            part = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", part)
            out.append(part.replace("*", ""))
    return "".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor of one heading (without the -N of a repeated one)."""
    kept = [c for c in rendered(heading).strip().lower()
            if c in " -_" or unicodedata.category(c)[0] in "LMN" or unicodedata.category(c) == "Pc"]
    return "".join(kept).replace(" ", "-")


def anchors(headings: list[str]) -> list[str]:
    """The anchors of a file's headings in order; a repeated slug gets -1, -2, ... as on GitHub."""
    seen: dict[str, int] = {}
    result = []
    for h in headings:
        original = s = slug(h)
        while s in seen:
            seen[original] += 1
            s = f"{original}-{seen[original]}"
        seen[s] = 0
        result.append(s)
    return result


def headings(path: Path) -> list[str]:
    lines = split_fences(path.read_text(encoding="utf-8"))[0]
    return [re.sub(r"\s+#+\s*$", "", m.group(1)) for line in lines
            if (m := re.match(r" {0,3}#{1,6}\s+(.*?)\s*$", line))]


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every inline link; fenced blocks and code spans hold none."""
    text = "\n".join(split_fences(path.read_text(encoding="utf-8"))[0])
    text = re.sub(r"`+[^`]*?`+", lambda m: re.sub(r"[^\n]", "x", m.group(0)), text)
    return [(text.count("\n", 0, m.start()) + 1, m.group(1)) for m in LINK.finditer(text)]


def ignored_by_git(paths: list[Path]) -> set[Path]:
    """Those of `paths` git ignores: they exist here but not in a clone (none without git)."""
    if not paths or not (ROOT / ".git").exists() or shutil.which("git") is None:
        return set()
    out = subprocess.run(["git", "check-ignore", "--stdin"], cwd=ROOT, capture_output=True,
                         text=True, input="\n".join(str(p.relative_to(ROOT)) for p in paths))
    return {ROOT / line for line in out.stdout.split("\n") if line}


def link_problems(path: Path, anchor_cache: dict[Path, set[str]]) -> list[str]:
    problems, targets = [], {}
    for line, target in links(path):
        if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        where = f"{path.relative_to(ROOT)}:{line}: ({target})"
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if ROOT not in dest.parents and dest != ROOT:
            problems.append(f"{where} leaves the repository")
            continue
        if file_part and not dest.exists():
            problems.append(f"{where} no such file or folder")
            continue
        if file_part:
            targets.setdefault(dest, where)
        if anchor and dest.suffix == ".md":
            if dest not in anchor_cache:
                anchor_cache[dest] = set(anchors(headings(dest)))
            if unquote(anchor) not in anchor_cache[dest]:
                problems.append(f"{where} no heading of {dest.relative_to(ROOT)} has this anchor")
    problems += [f"{targets[dest]} ignored by git: not in a clone"
                 for dest in sorted(ignored_by_git(list(targets)))]
    return problems


# --- the slug function -------------------------------------------------------------------------


@pytest.mark.parametrize("heading, expected", [
    ("On a GPU: the GPU tests and `scripts/gpu-check`",
     "on-a-gpu-the-gpu-tests-and-scriptsgpu-check"),
    ("Diagnostics: why is it slow, why does it not fit, what does AMP buy",
     "diagnostics-why-is-it-slow-why-does-it-not-fit-what-does-amp-buy"),
    ("The CUDA C++ ladder", "the-cuda-c-ladder"),
    ("The ladder, measured here", "the-ladder-measured-here"),
    ("Pipeline parallel (`--pp`)", "pipeline-parallel---pp"),
    ("The probes on an H200 (2026-11-28, measured): the estimates were 3–6× low",
     "the-probes-on-an-h200-2026-11-28-measured-the-estimates-were-36-low"),
    ("Register and shared-memory budgets (estimates, 1 CTA a SM, ≤ 227 KB shared)",
     "register-and-shared-memory-budgets-estimates-1-cta-a-sm--227-kb-shared"),
    ("cuda-epoch v7: the lagged-Gram step — a design budgeted from measurements",
     "cuda-epoch-v7-the-lagged-gram-step--a-design-budgeted-from-measurements"),
    ("Off the critical path, per step (**estimates**)", "off-the-critical-path-per-step-estimates"),
    ("v3: the Γ̃ copy by bulk copies (compiled, not yet run)",
     "v3-the-γ̃-copy-by-bulk-copies-compiled-not-yet-run"),
    ("See [the plan](plan.md) and v7_grams", "see-the-plan-and-v7_grams"),
])
def test_slug_follows_githubs_rules(heading, expected):
    assert slug(heading) == expected


def test_repeated_headings_get_numbered_anchors():
    assert anchors(["What the GPU must measure", "Estimate", "What the GPU must measure",
                    "What the GPU must measure", "What the GPU must measure-1"]) == [
        "what-the-gpu-must-measure", "estimate", "what-the-gpu-must-measure-1",
        "what-the-gpu-must-measure-2", "what-the-gpu-must-measure-1-1"]


def test_headings_and_links_skip_code(monkeypatch):
    doc = ROOT / "docs" / "_probe.md"  # never written: read through a patched read_text
    text = ("# Title\n\n```bash\n# not a heading [x](missing.md)\n```\n\n"
            "`[y](missing.md)` and [`z`](README.md#title) [w](#title)\n")
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: text if self == doc else original(self, *a, **k))
    assert headings(doc) == ["Title"]
    assert links(doc) == [(7, "README.md#title"), (7, "#title")]


def test_a_broken_link_or_anchor_is_found(tmp_path, monkeypatch):
    doc = ROOT / "docs" / "_probe.md"
    text = ("# Probe\n[ok](../README.md#quick-start) [gone](../no-such-file.md) "
            "[bad](../README.md#no-such-heading) [self](#probe) [self-bad](#nope)\n")
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: text if self == doc else original(self, *a, **k))
    problems = link_problems(doc, {})
    assert len(problems) == 3, problems
    assert "no-such-file.md" in problems[0] and "no such file" in problems[0]
    assert "#no-such-heading" in problems[1] and "#nope" in problems[2]


def test_a_link_to_a_file_git_ignores_is_found(monkeypatch):
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing is ignored")
    doc = ROOT / "docs" / "_probe.md"
    cache = ROOT / "src" / "fasttrain" / "__pycache__"  # exists once anything is imported
    text = "[cache](../src/fasttrain/__pycache__) [ok](../src/fasttrain/cli.py)\n"
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text",
                        lambda self, *a, **k: text if self == doc else original(self, *a, **k))
    if not cache.is_dir():
        pytest.skip("no __pycache__ here (PYTHONDONTWRITEBYTECODE): no ignored folder to link")
    assert link_problems(doc, {}) == [
        "docs/_probe.md:1: (../src/fasttrain/__pycache__) ignored by git: not in a clone"]


# --- the docs themselves -----------------------------------------------------------------------


def test_every_relative_link_and_anchor_resolves():
    cache: dict[Path, set[str]] = {}
    problems = [p for path in doc_files() for p in link_problems(path, cache)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def commands(block: str) -> list[str]:
    """The block's command lines: `\\` continuations and a usage synopsis's indented `[--flag]`
    lines joined, comments dropped."""
    block = re.sub(r"\\\n|\n(?=\s+\[-)", " ", block)
    return [re.sub(r"(^|\s)#.*$", "", line) for line in block.split("\n")]


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    actions = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(actions[0].choices) if actions else {}


def accepted(parser: argparse.ArgumentParser, rest: list[str]) -> tuple[str, set[str], list[str]]:
    """(the sub-command named by `rest`'s first words, the flags it accepts, the words after it).
    A sub-parser (argparse's) or a positional with choices (`experiment NAME`, whose flags of
    one experiment the others refuse: `_flags_of`) narrows the flags."""
    label, flags = "", set(parser._option_string_actions)
    while rest and subparsers(parser).get(rest[0]) is not None:
        parser, label, rest = subparsers(parser)[rest[0]], f"{label} {rest[0]}", rest[1:]
        flags = set(parser._option_string_actions)
    chosen = [a for a in parser._actions if not a.option_strings and a.choices
              and not isinstance(a, argparse._SubParsersAction)]
    if chosen and rest and not rest[0].startswith("-"):
        if rest[0] not in chosen[0].choices:
            return f"{label} {rest[0]}", set(), []
        label, rest = f"{label} {rest[0]}", rest[1:]
        flags_of = parser.get_default("_flags_of") or {}
        mine = flags_of.get(label.split()[-1], flags_of.get("other", {}))
        others = {flag for group in flags_of.values() for flag, _ in group.values()}
        flags -= others - {flag for flag, _ in mine.values()}
    return label, flags, rest


def cli_problems(text: str, root: argparse.ArgumentParser) -> list[str]:
    """Every `fasttrain <command> [<subcommand>] --flag` in `text`'s code blocks not accepted."""
    problems = []
    top = subparsers(root)
    for block in split_fences(text)[1]:
        for line in commands(block):
            for m in re.finditer(r"(?:^|[\s/])fasttrain[ \t]+([a-z][\w-]*)(.*)", line):
                tokens = m.group(2).split()
                names = [m.group(1)]
                while len(tokens) >= 2 and tokens[0] == "|" and tokens[1] in top:
                    names.append(tokens[1])  # `fasttrain doctor | memory | ...`: alternatives
                    tokens = tokens[2:]
                for name in names:
                    if name not in top:
                        problems.append(f"fasttrain {name}: no such command ({line.strip()})")
                        continue
                    sub, flags, rest = accepted(top[name], tokens)
                    label = f"fasttrain {name}{sub}"
                    if not flags:
                        problems.append(f"{label}: no such command ({line.strip()})")
                    for token in rest:
                        if token in {"|", "||", "&&", ";"} or token.startswith(">"):
                            break
                        for flag in re.findall(r"(?:^|[\[(])(--[A-Za-z0-9][\w-]*)", token):
                            if flag not in flags:
                                problems.append(f"{label} {flag}: not an option of {label} "
                                                f"({line.strip()})")
    return problems


@pytest.fixture(scope="module")
def cli() -> argparse.ArgumentParser:
    from fasttrain.cli import build_parser

    return build_parser(None)


def test_every_documented_command_and_flag_is_one_the_cli_accepts(cli):
    problems = [f"{path.relative_to(ROOT)}: {p}"
                for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]
                for p in cli_problems(path.read_text(encoding="utf-8"), cli)]
    assert not problems, "\n".join(problems)


def test_a_wrong_command_or_flag_in_a_code_block_is_found(cli):
    text = ("```bash\nfasttrain bench --impl a,b --no-such-flag \\\n   --json out.json\n"
            "fasttrain trian --epochs 2\nfasttrain experiment scaling --predict-only --nope\n"
            "fasttrain experiment precision --steps 3 --procs 2\nfasttrain experiment speed\n"
            "torchrun --nproc-per-node 2 -m fasttrain train --model cnn   # --not-checked\n"
            "fasttrain doctor | memory | experiment\nfasttrain env --json | head --lines 3\n"
            "fasttrain bench [--epochs 20] [--data mnist|synthetic]\n"
            "          [--seed 0] [--bad]\n```\n")
    problems = cli_problems(text, cli)
    assert [p.split(":")[0] for p in problems] == [
        "fasttrain bench --no-such-flag", "fasttrain trian",
        "fasttrain experiment scaling --nope", "fasttrain experiment precision --procs",
        "fasttrain experiment speed", "fasttrain bench --bad"], problems


def switches_table_problems(text: str, train: argparse.ArgumentParser) -> list[str]:
    """Every `--flag` in the first column of the README's "Switches" table not one of train's."""
    section = text.split("\n### Switches\n", 1)[1].split("\n#", 1)[0]
    rows = [line.split("|")[1] for line in section.split("\n") if line.startswith("| `--")]
    assert rows, "the Switches table has no rows"
    return [f"fasttrain train {flag}: in the Switches table, not an option of train"
            for row in rows for flag in re.findall(r"(?<![\w-])--[a-z0-9][\w-]*", row)
            if flag not in train._option_string_actions]


def test_every_switch_in_the_table_is_a_train_option(cli):
    train = subparsers(cli)["train"]
    text = README.read_text(encoding="utf-8")
    assert switches_table_problems(text, train) == []
    planted = text.replace("| `--accum-steps N` |", "| `--accum-step N` |")
    assert switches_table_problems(planted, train) == [
        "fasttrain train --accum-step: in the Switches table, not an option of train"]


def gpu_check_steps() -> list[str]:
    loader = importlib.machinery.SourceFileLoader("gpu_check", str(ROOT / "scripts" / "gpu-check"))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader("gpu_check", loader))
    sys.modules["gpu_check"] = module  # dataclasses look their module up while it loads
    loader.exec_module(module)
    return [step.name for step in module.plan(Path("/nonexistent"), "DATE-GPU")]


def only_problems(label: str, text: str, steps: list[str]) -> list[str]:
    """Every `--only A,B` (the option is gpu-check's alone) naming a step the script lacks."""
    return [f"{label}:{text.count(chr(10), 0, m.start()) + 1}: --only {name}: "
            f"not a step of scripts/gpu-check"
            for m in re.finditer(r"--only[ =]([a-z0-9][\w,-]*)", text)
            for name in m.group(1).split(",") if name not in steps]


def test_every_gpu_check_only_step_exists():
    steps = gpu_check_steps()
    assert {"env", "bench", "compiled-tests", "stream-vs-memory"} <= set(steps)
    problems = [p for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]
                for p in only_problems(str(path.relative_to(ROOT)),
                                       path.read_text(encoding="utf-8"), steps)]
    assert not problems, "\n".join(problems)
    planted = only_problems("x.md", "run\n`scripts/gpu-check --only env,bnech` next", steps)
    assert planted == ["x.md:2: --only bnech: not a step of scripts/gpu-check"]

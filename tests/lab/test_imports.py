"""The lab's models and measurements stand apart from the commands that print them: importable
without argparse or rich (fasttrain.commands holds the parsers, tables and plots)."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import fasttrain.lab

LAB = Path(fasttrain.lab.__file__).parent
MODELS = sorted(p.stem for p in LAB.glob("*.py") if p.stem != "__init__")
BANNED = ("argparse", "rich", "fasttrain.commands", "fasttrain.report", "fasttrain.cli")


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at its top or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("name", MODELS)
def test_a_lab_module_imports_no_command_code(name):
    bad = sorted(m for m in imported(LAB / f"{name}.py")
                 if any(m == b or m.startswith(b + ".") for b in BANNED))
    assert not bad, f"fasttrain.lab.{name} imports {bad}"


def test_the_lab_imports_with_rich_blocked():
    # torch itself imports argparse, so only rich can be blocked in a real interpreter; the
    # test above covers argparse by reading the sources.
    code = ("import sys; sys.modules['rich'] = None; "
            + "; ".join(f"import fasttrain.lab.{m}" for m in MODELS)
            + "; assert 'fasttrain.commands' not in sys.modules")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr

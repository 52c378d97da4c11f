"""pyproject.toml's dependencies: every third-party module the package imports without a fallback
is declared, with a marker that holds on every Python the package supports (requires-python) where
the import runs: `pip install .` on a fresh machine must give a package that starts."""

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = pytest.importorskip("tomli")

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "fasttrain"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# Import name -> distribution name, where the two differ.
DISTRIBUTION = {"yaml": "pyyaml", "PIL": "pillow", "pynvml": "nvidia-ml-py"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _python_versions() -> list[str]:
    """Every minor version from requires-python's lower bound up to the running one (and 3.13)."""
    low = re.search(r">=\s*3\.(\d+)", PYPROJECT["project"]["requires-python"])
    assert low, "requires-python names no lower bound"
    top = max(13, sys.version_info.minor)
    return [f"3.{m}" for m in range(int(low.group(1)), top + 1)]


def _version_guard(test: ast.expr) -> tuple[int, int] | None:
    """(3, N) for `sys.version_info >= (3, N)`, else None."""
    if (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.GtE)
            and ast.unparse(test.left) == "sys.version_info"
            and isinstance(test.comparators[0], ast.Tuple)):
        return tuple(ast.literal_eval(test.comparators[0]))
    return None


def _catches_import_error(node: ast.Try) -> bool:
    for handler in node.handlers:
        names = ast.unparse(handler.type) if handler.type else "BaseException"
        if re.search(r"\b(ImportError|ModuleNotFoundError|Exception|BaseException)\b", names):
            return True
    return False


def required_imports() -> dict[str, set[str]]:
    """{top-level module: the Python versions it is imported on without a fallback}."""
    versions = _python_versions()
    found: dict[str, set[str]] = {}

    def visit(node: ast.AST, pythons: list[str]) -> None:
        if isinstance(node, ast.Try) and _catches_import_error(node):
            for child in node.handlers + node.orelse + node.finalbody:
                visit(child, pythons)
            return  # the body's imports are optional: the module copes without them
        if isinstance(node, ast.If) and (guard := _version_guard(node.test)):
            newer = [v for v in pythons if tuple(map(int, v.split("."))) >= guard]
            older = [v for v in pythons if v not in newer]
            for child in node.body:
                visit(child, newer)
            for child in node.orelse:
                visit(child, older)
            return
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            names = []
        for name in names:
            top = name.split(".")[0]
            if top != "fasttrain" and top not in sys.stdlib_module_names:
                found.setdefault(top, set()).update(pythons)
        # Imports are statements: only the statement lists (a body, its else, a handler's or a
        # case's body) can hold one, never an expression, so those alone are walked (the whole
        # tree took 0.83 s of CPU a call; this scan runs at every collection of tests/).
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            for child in getattr(node, field, None) or ():
                visit(child, pythons)

    for path in sorted(SRC.rglob("*.py")):
        visit(ast.parse(path.read_text(), str(path)), versions)
    return found


def test_the_scan_sees_a_version_guarded_import():
    """The scan itself: `tomli` is imported only where `tomllib` is missing (Python < 3.11)."""
    assert required_imports().get("tomli") == {
        v for v in _python_versions() if tuple(map(int, v.split("."))) < (3, 11)}


@pytest.mark.parametrize("module, pythons", sorted(required_imports().items()))
def test_every_required_import_is_a_declared_dependency(module, pythons):
    distribution = _norm(DISTRIBUTION.get(module, module))
    declared = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    matching = [r for r in declared if _norm(r.name) == distribution]
    assert matching, (f"src imports {module!r} (on Python {', '.join(sorted(pythons))}) but "
                      f"pyproject.toml's dependencies do not declare {distribution!r}")
    for python in sorted(pythons):
        assert any(r.marker is None or r.marker.evaluate({"python_version": python})
                   for r in matching), (
            f"{distribution!r} is imported on Python {python}, but its dependency's marker "
            f"leaves it out there")


# The CUDA stack of the GPU image (torch 2.11.0+cu130, triton 3.6.0; benchmarks/results/gpu-check-*)
# as torch 2.11.0's wheel pins it on PyPI: the newest torch whose triton is on the 3.6 line.
GPU_IMAGE_STACK = {"triton": "3.6.0", "nvidia-cublas": "13.1.0.3", "nvidia-cudnn-cu13": "9.19.0.56"}


@pytest.mark.parametrize("name, version", sorted(GPU_IMAGE_STACK.items()))
def test_the_test_extra_admits_the_gpu_images_cuda_stack(name, version):
    """The test extra pins triton to the GPU image's line; its other CUDA wheels must admit the
    versions that image's torch pins, or pip walks back past it (downloading every newer torch
    to read its pins) to a torch that pins none of them: 2.10's CUDA 12 build, two CUDA stacks."""
    extra = [Requirement(r) for r in PYPROJECT["project"]["optional-dependencies"]["test"]]
    matching = [r for r in extra if _norm(r.name) == _norm(name)]
    assert matching, f"the test extra does not name {name}"
    for r in matching:
        assert r.specifier.contains(version, prereleases=True), (
            f"the test extra's {r} excludes {name} {version}, which the GPU image's torch "
            f"(2.11.0+cu130) pins")

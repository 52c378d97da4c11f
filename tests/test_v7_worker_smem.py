"""scripts/v7_worker_smem.py, the CPU check behind v7j's design (docs/measurements/
cuda-epoch-v7-design.md, "v7j"): its bank-pass counts, and the proposed ldmatrix loads giving the
fragments the workers' current loads give — which a transposed load must break."""

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "v7_worker_smem.py"
spec = importlib.util.spec_from_file_location("v7_worker_smem", SCRIPT)
smem = importlib.util.module_from_spec(spec)
spec.loader.exec_module(smem)


def test_the_design_docs_wavefront_counts():
    assert smem.wavefront_counts() == {
        "update now": 512, "update ldmatrix": 256, "update ldmatrix swizzled": 128,
        "partials now": 384, "partials ldmatrix": 256, "partials ldmatrix swizzled": 128}


def test_ldmatrix_gives_the_current_fragments_and_a_flipped_transpose_does_not(monkeypatch):
    assert smem.check_fragments() == 64
    right = smem.ldmatrix
    monkeypatch.setattr(smem, "ldmatrix", lambda mem, rows, trans: right(mem, rows, not trans))
    with pytest.raises(AssertionError):
        smem.check_fragments()


def test_a_byte_becomes_fp16_exactly_by_the_magic_number():
    smem.check_byte_to_half()

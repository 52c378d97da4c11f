"""benchmarks/triton_sweep.py on the CPU: its rows are the triton-fused row with each Variant of
the sweep (named by it, hashed by the row's own source, refused without a GPU as the row is),
the bench's harness checks them, and the script refuses to run without CUDA. The sweep itself
runs on a GPU (scripts/gpu-check's triton-sweep step)."""

import pytest

from tests.conftest import import_benchmark, tiny_images
from tests.test_gpu_check import load_script

pytest.importorskip("triton", reason="triton is in the test extra: pip install -e .[test]")


@pytest.fixture(scope="module")
def sweep():
    return import_benchmark("triton_sweep")


def test_each_entry_is_the_row_with_its_variant(sweep):
    from fasttrain import ladder
    from fasttrain.ladder import triton_fused as tf

    entries = sweep.entries()
    assert [e.variant for e in entries] == list(tf.SWEEP)
    assert len({e.name for e in entries}) == len(entries)
    row = ladder.entry("triton-fused")
    for e in entries:
        cls = e.load()
        assert issubclass(cls, tf.TritonFused) and cls.variant == e.variant
        assert cls.name == e.name and cls().variant == e.variant
        assert e.source_hash() == row.source_hash()  # the same code as the row's
    assert tf.TritonFused.variant == tf.DEFAULT  # the row itself is untouched


def test_without_a_gpu_the_bench_reports_every_variant_unavailable(sweep):
    import torch

    from fasttrain import bench, ladder

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the variants run")
    cfg = ladder.LadderConfig(epochs=1, batch_size=16)
    data = ladder.make_ladder_data(tiny_images(n_train=32), cfg)
    rows = bench.run_rows(sweep.entries()[:2], data, cfg, {}, repeats=1)
    assert [r["status"] for r in rows] == ["unavailable"] * 2
    assert all("CUDA" in r["reason"] for r in rows)
    assert sweep.main(["--data", "synthetic"]) == 2


def test_the_gpu_check_step_runs_the_sweep(tmp_path, sweep):
    step = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}["triton-sweep"]
    assert step.argv[1] == "benchmarks/triton_sweep.py" and step.needs_gpu
    assert step.outputs == ["results/2026-01-01-some-gpu-triton-sweep.json"]

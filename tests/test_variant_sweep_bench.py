"""benchmarks/variant_sweep.py on the CPU: its rows are each swept row with each Variant of its
module's SWEEP (named by it, hashed by the row's own source, refused without a GPU as the row
is), the bench's harness checks them, and the script refuses to run without CUDA or with a row
it cannot sweep. The sweep itself runs on a GPU (scripts/gpu-check's variant-sweep step)."""

import pytest

from tests.conftest import import_benchmark, tiny_images
from tests.test_gpu_check import load_script

pytest.importorskip("triton", reason="triton is in the test extra: pip install -e .[test]")


@pytest.fixture(scope="module")
def sweep():
    return import_benchmark("variant_sweep")


@pytest.mark.parametrize("row", ["triton-fused", "torch-graphs"])
def test_each_entry_is_the_row_with_its_variant(sweep, row):
    from fasttrain import ladder

    module = sweep.module(row)
    entries = sweep.entries([row])
    assert [e.variant for e in entries] == list(module.SWEEP)
    assert module.DEFAULT in module.SWEEP
    assert len({e.name for e in entries}) == len(entries)
    base = ladder.entry(row)
    for e in entries:
        cls = e.load()
        assert issubclass(cls, base.load()) and cls.variant == e.variant
        assert cls.name == e.name == f"{row} [{e.variant.tag}]"
        assert cls().variant == e.variant
        assert e.source_hash() == base.source_hash()  # the same code as the row's
    assert base.load().variant == module.DEFAULT  # the row itself is untouched


def test_without_a_gpu_the_bench_reports_every_variant_unavailable(sweep):
    import torch

    from fasttrain import bench, ladder

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the variants run")
    cfg = ladder.LadderConfig(epochs=1, batch_size=16)
    data = ladder.make_ladder_data(tiny_images(n_train=32), cfg)
    picked = [sweep.entries(["triton-fused"])[0], sweep.entries(["torch-graphs"])[-1]]
    rows = bench.run_rows(picked, data, cfg, {}, repeats=1)
    assert [r["status"] for r in rows] == ["unavailable"] * 2
    assert all("CUDA" in r["reason"] for r in rows)
    assert sweep.main(["--data", "synthetic"]) == 2


@pytest.mark.parametrize("argv", [["--rows", "cuda-epoch"], ["--rows", ","],
                                  ["--epochs", "0"]])
def test_bad_arguments_exit_2_naming_them(sweep, argv, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_the_gpu_check_step_runs_the_sweep(tmp_path, sweep):
    steps = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}
    step = steps["variant-sweep"]
    assert step.argv[1] == "benchmarks/variant_sweep.py" and step.needs_gpu
    assert step.outputs == ["results/2026-01-01-some-gpu-variant-sweep.json"]


def test_an_unwritable_json_is_refused_before_any_gpu_time(sweep, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        sweep.main(["--json", str(tmp_path / "no-such-folder" / "r.json")])
    assert e.value.code == 2 and "does not exist" in capsys.readouterr().err

"""benchmarks/dispatch_cost.py on the CPU: every way it issues torch-optimized's step computes what
v3's step computes, bit for bit, in every autograd mode (what it times is the same work), each
variant runs at both shapes, and --device cuda is refused in one line without a GPU."""

import sys

import pytest
import torch

from tests.conftest import import_benchmark


@pytest.fixture(scope="module")
def bench():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the script runs; 2 threads of tiny ops crawl on a busy host
    yield import_benchmark("dispatch_cost")
    torch.set_num_threads(threads)


def test_every_variant_and_mode_computes_v3s_weights_bit_for_bit(bench):
    same = bench.check_identical("cpu")
    assert len(same) == len(bench.VARIANTS) * len(bench.MODES)
    assert all(same.values()), [k for k, ok in same.items() if not ok]


def test_the_check_catches_a_step_that_differs(bench, monkeypatch):
    """A variant whose update is off by one rounding step fails the check."""

    def off(s):
        run = bench.out_variant(s)

        def wrong():
            run()
            s.w.mul_(1 + 2**-20)
        return wrong
    monkeypatch.setitem(bench.VARIANTS, "off", off)
    same = bench.check_identical("cpu")
    assert not any(ok for k, ok in same.items() if k.startswith("off,"))


@pytest.mark.parametrize("shape", ["smallest", "row"])
def test_each_variant_times_its_steps(bench, shape):
    for name, make in bench.VARIANTS.items():
        s = bench.make_state(bench.SHAPES[shape])
        w0 = s.w.clone()
        assert bench.best_us(make(s), reps=1) > 0
        # At the smallest shapes (1 class) the gradient is 0: the same ops, nothing learnt.
        assert torch.equal(s.w, w0) == (shape == "smallest"), name


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_without_a_gpu_is_refused_in_one_line(bench, monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["dispatch_cost.py", "--device", "cuda"])
    assert bench.main() == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--device cuda needs a CUDA GPU" in err


def test_the_gpu_check_step_measures_cuda_and_its_summary_reads_the_result(bench, tmp_path):
    from tests.test_gpu_check import ROOT, load_script

    step = {s.name: s for s in load_script().plan(tmp_path, "2026-01-01-some-gpu")}[
        "dispatch-cost"]
    args = bench.parse(step.argv[2:])  # a SystemExit here: a flag that is gone
    assert args.device == "cuda" and args.json == str(tmp_path / step.outputs[0])
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check_figures
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    cpu = ROOT / "benchmarks/results/2026-11-27-cpu-amd-epyc-2core-dispatch-cost.json"
    assert gpu_check_figures.FIGURES["dispatch-cost"](cpu) == [
        "cpu: v3's step 5.03 µs, train_steps 3.19 µs, torch.jit.script 2.40 µs "
        "(host path, smallest shapes)"]

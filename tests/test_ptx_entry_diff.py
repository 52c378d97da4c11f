"""scripts/ptx_entry_diff.py: the PTX of two builds compared kernel by kernel, register numbering
and labels ignored: how a refactor of the CUDA C++ is shown not to change a kernel, GPU-less."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "ptx_entry_diff.py"
spec = importlib.util.spec_from_file_location("ptx_entry_diff", SCRIPT)
ptx_entry_diff = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ptx_entry_diff)

KERNEL = """.visible .entry _ZN46_GLOBAL__N__a304d9b5_13_cuda_epoch_cu_2dc4956711kernel{k}(
\t.reg .f32 \t%f<{nf}>;
$L__BB{lab}_1:
\tadd.f32 \t%f{a}, %f{b}, 0f3F800000;
\t{op}.f32 \t%f{c}, %f{a};
\tbra.uni \t$L__BB{lab}_1;
}}
"""


def ptx(tmp_path, name, *kernels):
    path = tmp_path / name
    path.write_text("".join(KERNEL.format(**k) for k in kernels))
    return str(path)


def test_renumbered_registers_and_labels_are_the_same_kernel(tmp_path, capsys):
    a = ptx(tmp_path, "a.ptx", dict(k="A", nf=9, lab=3, a=1, b=2, c=3, op="neg"))
    b = ptx(tmp_path, "b.ptx", dict(k="A", nf=12, lab=7, a=5, b=8, c=9, op="neg"))
    assert ptx_entry_diff.main([a, b]) == 0
    assert "1 entries identical after renaming registers, 0 differ" in capsys.readouterr().out


def test_another_instruction_or_a_missing_kernel_is_a_difference(tmp_path, capsys):
    a = ptx(tmp_path, "a.ptx", dict(k="A", nf=9, lab=3, a=1, b=2, c=3, op="neg"),
            dict(k="B", nf=9, lab=4, a=1, b=2, c=3, op="abs"))
    b = ptx(tmp_path, "b.ptx", dict(k="A", nf=9, lab=3, a=1, b=2, c=3, op="abs"))
    assert ptx_entry_diff.main([a, b]) == 1
    out = capsys.readouterr().out
    assert "kernelA differs" in out and "kernelB differs" in out
    assert "0 entries identical after renaming registers, 2 differ" in out


def test_another_translation_units_hashes_and_call_numbers_are_the_same_kernel(tmp_path, capsys):
    """Two nvcc runs of another .cu: its hash after `_cu_` and ptxas's call-sequence numbers
    (counted over the whole file) differ; the kernel does not."""
    k = dict(k="A", nf=9, lab=3, a=1, b=2, c=3, op="neg")
    a, b = (tmp_path / "a.ptx", tmp_path / "b.ptx")
    for path, unit, call in ((a, "2dc49567", 0), (b, "9f00e1aa", 7)):
        path.write_text(KERNEL.format(**k).replace("2dc49567", unit).replace(
            "bra.uni", f"{{ // callseq {call}, 0\n\tbra.uni\n\t}} // callseq {call}"))
    assert ptx_entry_diff.main([str(a), str(b)]) == 0
    assert "1 entries identical" in capsys.readouterr().out
    b.write_text(b.read_text().replace("neg", "abs"))
    assert ptx_entry_diff.main([str(a), str(b)]) == 1

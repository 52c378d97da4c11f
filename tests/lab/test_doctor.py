"""`fasttrain doctor`: devices, fast dtypes, versions, and the placement and mismatch checks.

Runs anywhere: without a GPU the command exits 1 (documented) and skips the mismatch check with
its reason; the mismatch code path itself is exercised on the `meta` device, which is "not the
CPU" as far as torch's device checks go.
"""

import json

import pytest
import torch

from fasttrain.cli import main
from fasttrain.lab import doctor


def test_json_report(capsys):
    code = main(["doctor", "--json"])
    report = json.loads(capsys.readouterr().out)
    gpu = torch.cuda.is_available()
    assert code == (0 if gpu else 1) == report["exit_status"]
    assert report["schema"] == "fasttrain.doctor/1" and report["gpu_found"] == gpu
    assert {"cpu", "cores", "torch", "git_commit"} <= report["env"].keys()
    cpu = report["devices"][-1]
    assert cpu["kind"] == "cpu" and cpu["cores"] >= 1 and cpu["name"]
    assert set(cpu["fast_dtypes"]) <= {"bf16", "fp16"}
    assert report["versions"]["torch"] == torch.__version__
    checks = {c["check"]: c for c in report["checks"]}
    assert checks["placement"]["status"] == "ok"
    if not gpu:
        assert checks["mismatch"]["status"] == "skipped"
        assert "cannot happen" in checks["mismatch"]["detail"]


def test_table_report(capsys):
    code = main(["doctor"])
    out = capsys.readouterr().out
    assert code in (0, 1)  # 1 on a machine without a GPU, like this one
    assert "placement" in out and "mismatch" in out and "torch" in out
    if code == 1:
        assert "no GPU found" in out


@pytest.mark.parametrize("cc, fast", [
    ((6, 1), []),
    ((7, 0), ["fp16"]),
    ((7, 5), ["fp16"]),
    ((8, 0), ["tf32", "bf16", "fp16"]),
    ((8, 6), ["tf32", "bf16", "fp16"]),
    ((8, 9), ["tf32", "bf16", "fp16", "fp8"]),
    ((9, 0), ["tf32", "bf16", "fp16", "fp8"]),
])
def test_tensor_core_dtypes(cc, fast):
    assert doctor.tensor_core_dtypes(*cc) == fast


def test_cpu_flags_are_read_honestly():
    cpuinfo = ("processor\t: 0\nmodel name\t: Some CPU\n"
               "flags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile amx_bf16\n")
    flags = doctor.cpu_flags(cpuinfo)
    assert flags == ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
    assert doctor.cpu_dtypes(flags) == ["bf16"]
    assert doctor.cpu_dtypes(doctor.cpu_flags("flags\t: fpu sse avx2\n")) == []
    assert doctor.cpu_flags("no flags line here") == ()


def test_mismatch_is_provoked_and_explained_off_the_cpu():
    # `meta` stands in for an accelerator: a CPU batch into a model there must fail, explained.
    check = doctor.provoke_mismatch(torch.device("meta"))
    assert check["status"] == "ok", check
    assert "meta" in check["error"] and "cpu" in check["error"]
    assert "x.to(device)" in check["detail"]


def test_placement_checks_parameters_and_buffers():
    check = doctor.check_placement(torch.device("meta"))
    assert check["status"] == "ok", check
    assert "buffers are on meta" in check["detail"]


def test_exit_status_is_zero_with_a_gpu(monkeypatch):
    fake = {"kind": "cuda", "device": "cuda:0", "name": "Fake GPU", "memory_gb": 80.0,
            "compute_capability": "9.0", "multiprocessors": 132, "fast_dtypes": []}
    real = doctor.devices
    monkeypatch.setattr(doctor, "devices", lambda: [fake, *real()])
    assert doctor.diagnose()["exit_status"] == 0

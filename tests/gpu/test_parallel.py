"""Tensor and pipeline parallelism on CUDA (NCCL): --tp 2, --pp 2 and, with 4 GPUs, --pp 2 --tp 2
train gpt as one GPU does.

NCCL refuses two ranks on one device, so on a one-GPU machine these tests skip with that reason
(scripts/gpu-check reports it); the layouts' correctness is tested on CPU processes with gloo
(tests/engine/test_tensor_parallel.py, test_sequence_parallel.py, test_pipeline*.py). What a GPU
adds is NCCL's collectives and point-to-point sends, DTensor's CUDA kernels and the CUDA RNG
tracker (distinct dropout masks per sequence shard), which no CPU run exercises.

Tolerance: fp32 with --deterministic, TF32 off; the layouts add partial sums in other orders
than one GPU, so results differ in the last bits, as on the CPU (1e-5 there). Allowed: 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.engine.test_tensor_parallel import losses, train, weights
from tests.gpu.common import GPU

pytestmark = GPU

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
LAYOUTS = {  # name: (GPUs, flags)
    "tp2": (2, ["--tp", "2"]),
    "pp2": (2, ["--pp", "2"]),
    "pp2-tp2": (4, ["--pp", "2", "--tp", "2"]),
}


@pytest.mark.parametrize("name", LAYOUTS)
def test_a_layout_on_cuda_trains_as_one_gpu(tmp_path: Path, name: str):
    procs, flags = LAYOUTS[name]
    if procs > GPUS:
        pytest.skip(f"{' '.join(flags)} needs {procs} GPUs, this machine has {GPUS} (NCCL "
                    f"refuses two ranks on one device); the gloo CPU tests cover its correctness")
    extra = ["--device", "cuda", "--max-steps", "10"]
    one = train(tmp_path / "one", *extra)
    assert one.returncode == 0, one.stderr[-3000:]
    many = train(tmp_path / name, *extra, *flags, procs=procs)
    assert many.returncode == 0, many.stderr[-3000:]
    a, b = losses(tmp_path / "one"), losses(tmp_path / name)
    assert len(a) == len(b) == 10 and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-4
    wa, wb = weights(tmp_path / "one"), weights(tmp_path / name)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-4, msg=k)

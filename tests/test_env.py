"""env.gpu_peaks: a GPU's name as torch reports it, matched to the data sheet by whole words."""

import pytest

from fasttrain.env import GPU_PEAKS, gpu_peaks


@pytest.mark.parametrize("name, key", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # SXM parts do not say so
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A10G", "A10G"),
    ("Tesla T4", "T4"),
    ("NVIDIA GeForce RTX 4090", "RTX 4090"),
    ("NVIDIA RTX A6000", "A6000"),
])
def test_known_gpus_get_their_data_sheet(name, key):
    assert gpu_peaks(name) is GPU_PEAKS[key]


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA L40", "NVIDIA GH200 480GB",
                                  "NVIDIA B200", "", None])
def test_a_name_that_only_contains_a_known_one_is_unknown(name):
    assert gpu_peaks(name) is None  # an L40S is not an L4 (3× its bf16 peak)


def test_the_env_block_keeps_the_callers_torch_thread_count():
    """Asking numba its thread count starts its pool, whose OpenMP start reset torch's count: a
    profile at one thread (tests/lab/test_profile.py) ran at two after its first env block. A
    fresh process: the pool starts once per process."""
    import subprocess
    import sys

    code = ("import torch; torch.set_num_threads(1); from fasttrain.env import env_block; "
            "env_block(); print(torch.get_num_threads())")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"

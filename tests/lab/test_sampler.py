"""The NVML sampler: absent cleanly without a GPU or the module, and, against a stand-in NVML
module, sampling on its own thread at its period and stopping when the context closes."""

import sys
import threading
import types

import pytest
import torch

from fasttrain.lab.sampler import DeviceSampler, nvml_index, plot_samples


def test_absent_on_the_cpu(tmp_path):
    with DeviceSampler(torch.device("cpu")) as s:
        pass
    assert not s.available and "cpu" in s.reason
    summary = s.summary()
    assert summary == {"available": False, "reason": s.reason, "samples": []}
    assert "unavailable" in plot_samples(summary, tmp_path / "u.png")
    assert not (tmp_path / "u.png").exists()


def test_absent_without_the_module(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    with DeviceSampler(0) as s:
        pass
    assert not s.available and "nvidia-ml-py" in s.reason


class FakeNVML(types.ModuleType):
    """What the sampler uses of pynvml, recording the threads it is called from."""

    class NVMLError(Exception):
        pass

    def __init__(self, fail_init=False):
        super().__init__("pynvml")
        self.fail_init, self.threads, self.shut = fail_init, set(), False
        self.handles, self.reads, self.third_read = [], 0, threading.Event()

    def nvmlInit(self):
        if self.fail_init:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlDeviceGetHandleByIndex(self, i):
        self.handles.append(i)
        return f"gpu{i}"

    def nvmlDeviceGetUtilizationRates(self, handle):
        self.threads.add(threading.current_thread().name)
        self.reads += 1
        if self.reads >= 3:
            self.third_read.set()
        return types.SimpleNamespace(gpu=75, memory=30)

    def nvmlDeviceGetMemoryInfo(self, handle):
        return types.SimpleNamespace(used=3 * 2**30, total=80 * 2**30)

    def nvmlShutdown(self):
        self.shut = True


def test_samples_in_a_thread_at_its_period(monkeypatch, tmp_path):
    nvml = FakeNVML()
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with DeviceSampler(torch.device("cuda", 0), period_s=0.01) as s:
        assert nvml.third_read.wait(30)  # samples arrive while the context is open
    assert s.available and nvml.handles == [0] and nvml.shut
    assert "fasttrain-nvml" in nvml.threads  # sampled off the main thread
    n = len(s.samples)
    assert n >= 3
    # the thread stopped with the context: none left running
    assert not [t for t in threading.enumerate() if t.name == "fasttrain-nvml"]
    times = [x.t_s for x in s.samples]
    assert times == sorted(times)
    summary = s.summary()
    assert summary["gpu_util_mean_pct"] == 75 and summary["mem_used_max_gb"] == 3
    assert summary["mem_total_gb"] == 80 and summary["count"] == n
    assert plot_samples(summary, tmp_path / "u.png") is None
    assert (tmp_path / "u.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_nvml_that_cannot_start_is_a_reason(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNVML(fail_init=True))
    with DeviceSampler(0) as s:
        pass
    assert not s.available and "Driver Not Loaded" in s.reason


@pytest.mark.parametrize("visible, index, expected", [
    (None, 1, 1),
    ("2,3", 1, 3),
    ("GPU-1234abcd,GPU-9", 0, "GPU-1234abcd"),
    ("5", 2, 2),  # out of range of the list: leave it to NVML
])
def test_nvml_index_follows_cuda_visible_devices(monkeypatch, visible, index, expected):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert nvml_index(index) == expected

"""`fasttrain memory` on the real CUDA allocator: the predicted peak within 10% of
`torch.cuda.max_memory_allocated`, and `--find-batch-size` surviving a real out-of-memory.

The dataset stays on the host (`--data-on-device off`): resident on the GPU it would be a large,
exactly known part of the peak and would make the 10% easy to meet."""

from __future__ import annotations

import pytest
import torch

from tests.gpu.common import GPU, cli, read_json

pytestmark = GPU

DATA = {"cnn": "synthetic", "resnet": "synthetic-cifar", "gpt": "synthetic-text"}
CASES = [(m, b, p) for m in DATA for b in (32, 128) for p in ("fp32", "bf16")]


@pytest.mark.parametrize(("model", "batch", "precision"), CASES,
                         ids=[f"{m}-b{b}-{p}" for m, b, p in CASES])
def test_predicted_peak_within_10_percent_of_the_allocator(model, batch, precision, tmp_path):
    path = tmp_path / "m.json"
    assert cli("memory", "--model", model, "--data", DATA[model], "--device", "cuda",
               "--batch-size", batch, "--precision", precision, "--data-on-device", "off",
               "--json", path) == 0
    row = read_json(path)["rows"][0]
    assert row["device"].startswith("cuda")
    assert row["measured_by"].startswith("torch.cuda.max_memory_allocated")
    assert row["measured_peak"] > row["weights"] > 0
    assert row["first_step_peak"] > 0  # the warm-up's peak, reported apart
    assert (row["conv_workspace"] == 0) == (model == "gpt")  # probed only where convolutions are
    assert abs(row["error"]) <= 0.10, (
        f"predicted {row['predicted_peak']:,} B, measured {row['measured_peak']:,} B "
        f"({row['error']:+.1%}); parts: " + ", ".join(
            f"{k} {row[k]:,}" for k in ("weights", "gradients", "optimizer", "activations",
                                        "weight_copies", "inputs", "data", "workspace",
                                        "conv_workspace", "step_temp")))


@pytest.fixture
def small_gpu():
    """The caching allocator limited to 0.75 GiB, so that a batch search meets a real
    out-of-memory error early; the limit is lifted afterwards."""
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.75 * 2**30 / total, 0)
    yield
    torch.cuda.set_per_process_memory_fraction(1.0, 0)
    torch.cuda.empty_cache()


def _warm_cublas():
    """cuBLAS and cuBLASLt keep a workspace per stream once first used, allocated through the
    caching allocator: take it before counting what the search leaves behind."""
    a = torch.randn(256, 256, device="cuda", requires_grad=True)
    for dtype in (torch.float32, torch.bfloat16):
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            torch.nn.functional.linear(a, a, a[0]).float().sum().backward()


def _survivors(snapshot: dict, most: int = 5) -> str:
    """The largest blocks still allocated that were allocated while history was recorded, each
    with the fasttrain/tests frames that allocated it: what the search failed to give back."""
    blocks = [b for seg in snapshot["segments"] for b in seg["blocks"]
              if b["state"] == "active_allocated" and b.get("frames")]
    blocks.sort(key=lambda b: -b["size"])
    lines = []
    for b in blocks[:most]:
        ours = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in b["frames"]
                if "fasttrain" in f["filename"] or "tests" in f["filename"]][:4]
        lines.append(f"{b['size']:,} B from {' < '.join(ours) or '(no fasttrain frame)'}")
    return f"{len(blocks)} blocks; largest: " + "; ".join(lines)


def test_find_batch_size_catches_a_real_oom_and_frees_memory(small_gpu, tmp_path):
    _warm_cublas()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    path = tmp_path / "search.json"
    # Allocation stacks of what is left, should anything be: the failure then names its source.
    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        assert cli("memory", "--model", "gpt", "--data", "synthetic-text", "--device", "cuda",
                   "--find-batch-size", "--floor", "8", "--try-steps", "1", "--json", path) == 0
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    result = read_json(path)
    tries = result["rows"]
    # Each try gave back what it allocated: a leak would shrink the memory of every later try.
    leaky = [(t["batch"], t["reason"], t["held_after"]) for t in tries if t["held_after"] > 2**20]
    assert not leaky, f"tries (batch, reason, bytes) left memory allocated: {leaky}; " \
        + _survivors(snapshot)
    oom = [t for t in tries if not t["fits"] and t["reason"] == "out of memory"]
    assert oom, f"no try ran out of memory under 0.75 GiB: {tries}"
    best = result["best_batch_size"]
    assert best is not None and best < min(t["batch"] for t in oom)
    fitting = [t for t in tries if t["fits"]]
    assert all(t["peak"] <= 0.75 * 2**30 for t in fitting)
    # Everything the tries held is returned: what is allocated is what was before the search.
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated(0) - before <= 1 * 2**20, \
        f"{torch.cuda.memory_allocated(0) - before:,} bytes still held after the search; " \
        + _survivors(snapshot)

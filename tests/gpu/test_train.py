"""`fasttrain train` on CUDA with every speed switch: each run tracks the CPU fp32 reference
(same seed, same weights, same sample order) within a stated tolerance, and the step loop makes
no host–device sync between two logs.

The sync check is a difference, so that nothing but the loop is counted: after a warm-up run of
the same configuration (compilation, CUDA graph recording and cuDNN's algorithm choice are then
cached alike for what follows), a run of 2·LOG steps logging once must make exactly as many syncs
as a run of LOG steps logging once. Both have one log, one evaluation and one final checkpoint;
only the number of steps between logs differs.

Under --cuda-graphs the whole step is one CUDA graph (engine/graphed.py): the start line must say
so, and from the capture on every step must be exactly one replay (the train records'
graph_replays: none in the WARMUP_STEPS eager steps, one in each later step).
"""

from __future__ import annotations

import math

import pytest

from fasttrain.engine.graphed import WARMUP_STEPS
from tests.gpu.common import GPU, counting_syncs, train

pytestmark = GPU

LOG = 8  # steps between logs
STEPS = 2 * LOG
DATA = {"logreg": "synthetic", "mlp": "synthetic", "cnn": "synthetic",
        "resnet": "synthetic-cifar", "gpt": "synthetic-text"}
COMMON = ("--batch-size", "64", "--lr", "1e-3", "--seed", "0", "--epochs", "1")

# switch set → (flags, relative tolerance of each logged loss against the CPU fp32 run).
# fp32 on the GPU differs from the CPU only by summation order (1e-6 per op, grown by 16 AdamW
# steps); TF32 keeps a 10-bit mantissa in matmuls and convolutions; bf16/fp16 autocast 7/10
# bits, which moves the loss by about a percent within 16 steps; fp16 also skips the first
# steps whose scaled gradients overflow, which puts it a step or two behind.
SWITCHES = {
    "bf16-compile": (("--precision", "bf16", "--compile"), 0.05),
    "bf16-compile-cuda-graphs": (("--precision", "bf16", "--compile", "--cuda-graphs"), 0.05),
    # The eager step captured whole (no compile); accumulation, clipping and a schedule inside.
    "bf16-cuda-graphs-accum-clip": (("--precision", "bf16", "--cuda-graphs", "--accum-steps",
                                     "2", "--grad-clip", "1.0", "--schedule", "cosine",
                                     "--warmup-steps", "4"), 0.05),
    # fp16 takes the fused optimizer on CUDA by itself (see test_fp16_does_not_sync_... below).
    "fp16": (("--precision", "fp16"), 0.10),
    "tf32": (("--precision", "tf32"), 0.02),
    "dataloader-pinned": (("--data-on-device", "off", "--workers", "2", "--pin-memory"), 2e-3),
}
GRAPHED = ("bf16-compile-cuda-graphs", "bf16-cuda-graphs-accum-clip")
CASES = ([(m, s) for m in DATA for s in ("bf16-compile", *GRAPHED)]
         + [(m, s) for m in ("cnn", "resnet", "gpt")
            for s in ("fp16", "tf32", "dataloader-pinned")])


def _flags(model: str, device: str, steps: int, log_every: int, *switches) -> tuple:
    return (*COMMON, "--model", model, "--data", DATA[model], "--device", device,
            "--max-steps", steps, "--log-every", log_every, *switches)


def _losses(records: list[dict]) -> dict:
    """{step: train loss} of the logs and the final test loss."""
    out = {("train", r["step"]): r["loss"] for r in records if r["kind"] == "train"}
    out.update({("eval", r["step"]): r["test_loss"] for r in records if r["kind"] == "eval"})
    return out


@pytest.fixture(scope="module")
def cpu_reference(tmp_path_factory):
    """(model, flags) → the losses of the CPU fp32 run (computed once per pair)."""
    cache: dict[tuple, dict] = {}

    def get(model: str, flags: tuple = ()) -> dict:
        key = (model, _flags(model, "cpu", STEPS, LOG, *flags))
        if key not in cache:
            out = tmp_path_factory.mktemp(f"cpu-{model}")
            cache[key] = _losses(train(out, *key[1]))
        return cache[key]

    return get


@pytest.mark.parametrize(("model", "switch"), CASES, ids=[f"{m}-{s}" for m, s in CASES])
def test_train_on_cuda_tracks_cpu_and_never_syncs_between_logs(model, switch, tmp_path,
                                                              cpu_reference, capsys):
    flags, tol = SWITCHES[switch]
    records = train(tmp_path / "run", *_flags(model, "cuda", STEPS, LOG, *flags))
    start = capsys.readouterr().err
    # The CPU reference takes the same accumulation, clipping and schedule (the flags from
    # --accum-steps on), in fp32 eager.
    cpu_flags = flags[flags.index("--accum-steps"):] if "--accum-steps" in flags else ()

    # 1. Tracks the CPU fp32 reference, log by log, and the final test loss.
    got, ref = _losses(records), cpu_reference(model, cpu_flags)
    assert got.keys() == ref.keys() == {("train", LOG), ("train", STEPS), ("eval", STEPS)}
    for key, want in ref.items():
        assert math.isfinite(got[key]), (key, got)
        assert abs(got[key] - want) <= tol * abs(want), \
            f"{key}: cuda {got[key]:.5f} vs cpu fp32 {want:.5f} (tolerance {tol:.0%})"

    # 2. What a CUDA run logs: the allocator's peak, and an MFU where the GPU's peak is known.
    for r in (r for r in records if r["kind"] == "train"):
        assert r["peak_memory_gb"] > 0
        assert r["mfu"] is None or 0 < r["mfu"] < 1, r["mfu"]
        assert ("loss_scale" in r) == (switch == "fp16")
        if switch == "fp16":  # GradScaler telemetry: a power-of-two scale, few skipped steps
            assert 1 <= r["loss_scale"] <= 2**16 and math.log2(r["loss_scale"]).is_integer()
            assert 0 <= r["skipped_steps"] < STEPS // 2, r

    # 3. --cuda-graphs: the whole step captured, then exactly one replay a step.
    replays = [r.get("graph_replays") for r in records if r["kind"] == "train"]
    if switch in GRAPHED:
        assert "step: one CUDA graph of the whole step" in start, start
        assert replays == [LOG - WARMUP_STEPS, LOG], replays
    else:
        assert replays == [None, None] and "CUDA graph" not in start

    # 4. No host sync inside the step loop: 2·LOG steps sync as often as LOG steps.
    with counting_syncs() as short:
        train(tmp_path / "short", *_flags(model, "cuda", LOG, LOG, *flags))
    with counting_syncs() as long:
        train(tmp_path / "long", *_flags(model, "cuda", 2 * LOG, 2 * LOG, *flags))
    assert long.count == short.count, (
        f"{long.count - short.count} more syncs in {LOG} more steps: the step loop syncs. "
        f"{LOG} steps: {short}; {2 * LOG} steps: {long}")


def test_fp16_does_not_sync_every_step_without_the_fused_flag(tmp_path):
    # GradScaler with a foreach optimizer would read found_inf with .item() every step; the
    # engine takes the fused optimizer under fp16 on CUDA so that it does not.
    flags = ("--precision", "fp16")
    train(tmp_path / "warm", *_flags("cnn", "cuda", LOG, LOG, *flags))
    with counting_syncs() as short:
        train(tmp_path / "short", *_flags("cnn", "cuda", LOG, LOG, *flags))
    with counting_syncs() as long:
        train(tmp_path / "long", *_flags("cnn", "cuda", 2 * LOG, 2 * LOG, *flags))
    assert long.count == short.count, f"{LOG} steps: {short}; {2 * LOG} steps: {long}"

"""run.describe's start line names how the processes hold the model (engine/run.py)."""

from types import SimpleNamespace

import pytest

from fasttrain.engine.distributed import World
from fasttrain.engine.run import _layout


def run_of(parallel: str, size: int, tp: int = 1, pp: int = 1, schedule: str = "1f1b",
           microbatches: int = 0):
    world = World(parallel=parallel, size=size, tp=tp, pp=pp, dp_size=size // (tp * pp))
    cfg = SimpleNamespace(parallel=parallel, pp=pp, pp_schedule=schedule,
                          pp_microbatches=microbatches)
    return SimpleNamespace(world=world, cfg=cfg, batches=SimpleNamespace(micro=8, accum=1))


@pytest.mark.parametrize(("run", "says"), [
    (run_of("none", 1), ""),
    (run_of("ddp", 2), " (ddp)"),
    (run_of("zero1", 2), " (zero1)"),
    (run_of("fsdp", 2), " (fsdp)"),
    (run_of("none", 2, tp=2), " (dp 1 × tp 2 × pp 1: the micro-batch is per data-parallel rank)"),
    (run_of("fsdp", 8, tp=2, pp=2, schedule="interleaved-1f1b"),
     " (dp 2 fsdp × tp 2 × pp 2 interleaved-1f1b, m 4: the micro-batch is per data-parallel "
     "rank)"),
    (run_of("ddp", 4, pp=2, schedule="gpipe", microbatches=8),
     " (dp 2 ddp × tp 1 × pp 2 gpipe, m 8: the micro-batch is per data-parallel rank)"),
])
def test_the_start_line_names_the_data_parallel_mode_and_the_pipeline_schedule(run, says):
    assert _layout(run) == says

"""The configured model — yours (`--model pkg.module:factory`) or a bundled one with your flags —
described for the scaling and layout models (lab/scaling.py, lab/layout_choice.py) from one real
step counted here, as `fasttrain plan` counts it (lab/fitting.py):

    label, batch, m = describe(cfg, task)     # m: a layout_choice.Model
    *_, ranks = describe_ranks(cfg, task, {("fsdp", 2): layouts.layout(2, parallel="fsdp")})
    row = scaling.predict_counted(label, batch, m.params, m.flops_per_sample * batch, ...)

  params            distinct parameters of the built module (a tied weight once)
  flops_per_sample  FLOPs of the step's op calls (torch's FLOP formulas, forward, backward and
                    optimizer: lab/steptime.count_run, the optimizer on CUDA's foreach path)
                    ÷ --batch-size
  saved_per_sample  bytes saved for backward by one micro-batch counted in fp32 as CUDA holds
                    them (lab/memory.measure's activations_fp32) ÷ the micro-batch
  gpt fields        read from the module when it is the bundled gpt, else none: tensor and
                    pipeline parallelism are then left out, with why (layout_choice.left_out_of)

--batch-size is the batch per GPU, as it is per process in the measured sweep. The step runs on
this machine's CPU with the configured data and loss: a model of yours whose step fails on them
is one line naming --data and --loss (the data it trains on is the fix), not a traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fasttrain.errors import UserCodeError, UserError, first_line
from fasttrain.lab import fitting, layout_choice, memory, steptime

if TYPE_CHECKING:
    from fasttrain.engine.config import TrainConfig
    from fasttrain.lab.layout_choice import Model


def yours(cfg: TrainConfig) -> bool:
    """Whether the model or data is a user's import path, not a bundled name."""
    from fasttrain.models import MODELS

    return cfg.model not in MODELS or ":" in (cfg.data or "")


def describe(cfg: TrainConfig, task, command: str = "experiment scaling",
             ) -> tuple[str, int, Model]:
    """(label, batch per GPU, layout_choice.Model) of `cfg` on `task`: one Run built here, one
    step measured for its memory (`memory.measure`, as CUDA holds it) and one counted
    (`steptime.count_run`), then let go."""
    label, batch, m, _ = describe_ranks(cfg, task, {}, command)
    return label, batch, m


def describe_ranks(cfg: TrainConfig, task, lays: dict, command: str = "experiment scaling",
                   ) -> tuple[str, int, Model, dict]:
    """`describe`, and for each `lays` key → layouts.Layout the training state one rank of it
    holds (a layouts.RankMemory: parameters, gradients and optimizer state, exact; activations
    not counted), from the same Run after its step (`experiment scaling` puts it beside each
    measured row: key (mode, processes))."""
    from fasttrain.lab import layouts

    cfg = fitting.counted_here(cfg)

    def both(run):
        b = memory.measure(run, device_type="cuda")
        work = steptime.count_run(run, foreach=True)
        shape = layout_choice.gpt_shape(run.model, cfg.block_size)
        ranks = {key: layouts.per_rank(run.model, run.opt, [0], lay)[0]
                 for key, lay in lays.items()}
        return b, work, shape, layout_choice.left_out_of(run.model), ranks

    def step():
        try:
            return memory.on_run(cfg, None, task, None, both)
        # UserCodeError: the same failures, met in the user's own forward (memory.users_code)
        except (RuntimeError, ValueError, TypeError, IndexError, UserCodeError) as e:
            if not yours(cfg) or "allocate memory" in str(e):
                raise  # a bundled model on bundled data: an internal error keeps its traceback
            raise UserError(f"one step of --model {cfg.model} on {task.name} failed here "
                            f"({first_line(e)}); {command} counts one real step of your model: "
                            f"give the --data (and --loss) it trains on, as for `fasttrain "
                            f"train`") from None

    b, work, shape, out, ranks = fitting.on_this_host(cfg, step, command)
    return cfg.model, cfg.batch_size, layout_choice.Model(
        params=b.params, flops_per_sample=work.flops / cfg.batch_size,
        saved_per_sample=b.activations_fp32 // b.micro_batch, **shape, left_out=out), ranks

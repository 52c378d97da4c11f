"""The training configuration: one typed dataclass, every field documented with its unit, and
`validate()`, which rejects incompatible combinations at start with a message that names the fix.

Flags map 1:1 to fields (`--accum-steps` ↔ `accum_steps`); reading flags and TOML files into a
TrainConfig, and writing the resolved one back (`config.toml` in every run), is configfile.py.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field, fields
from typing import Any

from fasttrain.errors import UserError

DEVICES = ("auto", "cpu", "cuda", "mps", "xpu")
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
ON_OFF_AUTO = ("auto", "on", "off")
OPTIMIZERS = ("sgd", "adamw")
# What only the built-in optimizers read and changes the result (a factory sets its own).
_FACTORY_OWNS = ("lr", "momentum", "weight_decay")
SCHEDULES = ("constant", "cosine", "onecycle")
CONV_MODELS = ("cnn", "resnet")
PARALLEL = ("none", "ddp", "fsdp", "zero1", "dp")
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")
SEED_MAX = 2**32 - 1
INT_MAX = 2**31 - 1  # counts (steps, samples, tokens) beyond this overflow torch's int32 indices
FLOAT32_MAX = 3.4028234663852886e38


def _f(default, help: str, choices: tuple | None = None, group: str = "training"):
    return field(default=default, metadata={"help": help, "choices": choices, "group": group})


@dataclass
class TrainConfig:
    # -- what to train ------------------------------------------------------------------------
    model: str = _f("cnn", "model: logreg | mlp | cnn | resnet | gpt, or your own as an import "
                    "path pkg.module:factory (a callable with no arguments returning an "
                    "nn.Module)", group="model and data")
    data: str = _f("mnist", "dataset: mnist | fashion-mnist | cifar10 | tinyshakespeare | "
                   "synthetic | synthetic-cifar | synthetic-text, or pkg.module:factory returning "
                   "(x, y) tensors (held in memory), a Dataset, an IterableDataset or a "
                   "DataLoader (streamed: read afresh every epoch) or a dict of "
                   "'train'/'val'/'test' splits", group="model and data")
    loss: str = _f("auto", "loss: auto (cross-entropy for integer targets) | cross_entropy | mse "
                   "| l1 | pkg.module:fn taking (output, target)", group="model and data")
    step: str | None = _f(None, "your step instead of --loss: pkg.module:fn taking (model, "
                          "micro_batch) and returning the scalar loss, or a dict holding 'loss' "
                          "and extra scalar metrics (logged like the loss)",
                          group="model and data")
    val_fraction: float = _f(0.0, "hold out this fraction of the training set as a validation "
                             "set (metrics val_*), unless the data brings one",
                             group="model and data")
    data_dir: str | None = _f(None, "folder holding <dataset>/ (default: $FASTTRAIN_DATA, then "
                              "~/.cache/fasttrain)", group="model and data")
    block_size: int = _f(128, "tokens per training sequence (language models)",
                         group="model and data")
    data_in_memory: bool = _f(False, "read a map-style Dataset once into tensors (the in-memory "
                              "path: fast, but transforms are drawn once) instead of streaming "
                              "it each epoch; refused when it cannot fit in host memory",
                              group="model and data")
    prefetch_factor: int = _f(2, "batches each DataLoader worker loads ahead (streamed data "
                              "with --workers > 0)", group="model and data")
    augment: str | None = _f(None, "on-device image augmentation of in-memory data, drawn per "
                             "batch from the seed: flip (random horizontal flip), crop:P "
                             "(random translation by up to P pixels, zero padding); e.g. "
                             "flip,crop:4", group="model and data")
    # -- how long and how much ----------------------------------------------------------------
    epochs: int | None = _f(None, "passes over the training set (default: 1; for a stream "
                            "without length, as many as --max-steps takes, and if given, in "
                            "one process, whichever ends first)")
    max_steps: int = _f(0, "stop after this many optimizer steps (0: no limit); for a stream "
                        "without length, the run's length (it restarts as often as it takes)")
    batch_size: int = _f(64, "samples per optimizer step, across all accumulation micro-steps "
                         "and all processes (the GLOBAL batch)")
    accum_steps: int = _f(1, "micro-batches per optimizer step (each batch_size/accum_steps "
                          "samples, split over the processes; the loss is divided so the update "
                          "equals the big batch)")
    # -- optimization -------------------------------------------------------------------------
    optimizer: str = _f("adamw", "optimizer: sgd | adamw, or pkg.module:fn taking the parameter "
                        "groups (weights; biases and norms with weight_decay 0) and returning a "
                        "torch.optim.Optimizer", group="optimization")
    lr: float = _f(1e-3, "peak learning rate", group="optimization")
    momentum: float = _f(0.9, "SGD momentum (sgd only)", group="optimization")
    weight_decay: float = _f(0.0, "decoupled weight decay (adamw) or L2 (sgd)",
                             group="optimization")
    decay_norm_and_bias: bool = _f(False, "decay biases, normalization weights and every other "
                                   "parameter with fewer than 2 dimensions too (default: they "
                                   "are in a group with weight_decay 0)", group="optimization")
    schedule: str = _f("constant", "learning-rate schedule after warm-up", SCHEDULES,
                       group="optimization")
    scheduler: str | None = _f(None, "your scheduler instead of --schedule: pkg.module:fn taking "
                               "the optimizer and returning a torch LRScheduler, stepped once "
                               "per optimizer step", group="optimization")
    warmup_steps: int = _f(0, "optimizer steps of linear warm-up from 0 to lr",
                           group="optimization")
    grad_clip: float = _f(0.0, "clip the global gradient norm to this (0: off); fp16 gradients "
                          "are unscaled first", group="optimization")
    fused_optimizer: bool = _f(False, "use the optimizer's fused kernel (one launch for all "
                               "parameters; always on for fp16, --compile and --cuda-graphs on "
                               "CUDA)", group="optimization")
    # -- speed switches -----------------------------------------------------------------------
    device: str = _f("auto", "device (auto: cuda, then mps, then xpu, else cpu)", DEVICES,
                     group="speed")
    precision: str = _f("fp32", "fp32 | tf32 (CUDA matmuls in TF32) | fp16 (autocast + "
                        "GradScaler) | bf16 (autocast)", PRECISIONS, group="speed")
    compile: bool = _f(False, "torch.compile the model (default mode; with --cuda-graphs the "
                       "compiled model runs inside the captured step)", group="speed")
    cuda_graphs: bool = _f(False, "capture the whole optimizer step in one CUDA graph (the "
                           "batch gathered from the data on the device, forward, loss, "
                           "backward, clipping, the fused optimizer's update) after 3 eager "
                           "warm-up steps, then replay it once a step (CUDA, one process, not "
                           "fp16). Streamed or host-held data, --augment, "
                           "--activation-checkpointing or your own step, optimizer or "
                           "scheduler take CUDA graphs of the model only instead "
                           "(torch.compile reduce-overhead): the start line says which and why",
                           group="speed")
    data_on_device: str = _f("auto", "keep the dataset on the device (auto: when it fits in a "
                             "quarter of free memory)", ON_OFF_AUTO, group="speed")
    workers: int = _f(0, "DataLoader worker processes (streamed data, or in-memory data kept on "
                      "the host)", group="speed")
    pin_memory: bool = _f(False, "page-locked host batches for async copies (CUDA, DataLoader "
                          "path)", group="speed")
    activation_checkpointing: bool = _f(False, "recompute block activations in backward instead "
                                        "of storing them", group="speed")
    channels_last: bool = _f(False, "NHWC memory format for convolutional models", group="speed")
    # -- scale-out (see engine/distributed.py and docs/distributed.md) ------------------------
    parallel: str = _f("none", "data parallelism: none | ddp (DistributedDataParallel) | fsdp "
                       "(fully_shard, ZeRO-3) | zero1 (DDP + ZeroRedundancyOptimizer) — these "
                       "three under torchrun, one process per device | dp (DataParallel: one "
                       "process, ≥ 2 CUDA GPUs). Each process trains batch_size / processes / "
                       "accum_steps samples per micro-step", PARALLEL, group="scale-out")
    tp: int = _f(1, "tensor-parallel size: each layer's weights split over this many processes "
                 "(under torchrun; the heads of --model gpt must divide by it, a model of yours "
                 "brings a plan); the processes left over by tp × pp form the data-parallel "
                 "dimension (--parallel ddp/fsdp/none)", group="scale-out")
    pp: int = _f(1, "pipeline-parallel size: the model cut into this many stages at block "
                 "boundaries, one per group of processes (under torchrun)", group="scale-out")
    pp_schedule: str = _f("1f1b", "pipeline schedule (--pp > 1)", PP_SCHEDULES,
                          group="scale-out")
    pp_microbatches: int = _f(0, "micro-batches each pipeline step is cut into (0: 2 × pp)",
                              group="scale-out")
    # -- reproducibility ----------------------------------------------------------------------
    seed: int = _f(0, "seeds weights, data order and dropout", group="reproducibility")
    deterministic: bool = _f(False, "deterministic algorithms only (slower on GPU)",
                             group="reproducibility")
    # -- output, checkpoints, faults ----------------------------------------------------------
    out: str | None = _f(None, "run directory: config, metrics, plots, weights, checkpoints",
                         group="output")
    log_every: int = _f(50, "optimizer steps between loss reads (the only host syncs; across "
                        "processes also where a SIGTERM/SIGUSR1 stop is agreed)", group="output")
    checkpoint_every: int = _f(0, "optimizer steps between checkpoints (0: only at the end and "
                               "on preemption)", group="output")
    keep_checkpoints: int = _f(3, "checkpoints kept (the newest)", group="output")
    resume: str | None = _f(None, "'auto' (newest complete checkpoint in OUT/checkpoints) or a "
                            "checkpoint path; under torchrun, a restarted worker group "
                            "(TORCHELASTIC_RESTART_COUNT > 0) resumes 'auto' by itself",
                            group="output")
    progress: bool = _f(True, "progress bar (adds no host syncs)", group="output")
    early_stop: str | None = _f(None, "stop when this evaluation metric (e.g. val_loss, "
                                "val_accuracy) has not improved for --patience evaluations "
                                "(losses, perplexities and errors such as mae must fall, "
                                "other metrics rise)", group="output")
    patience: int = _f(3, "evaluations without improvement before --early-stop stops",
                       group="output")

    @property
    def micro_batch(self) -> int:
        """Samples per micro-step, summed over all processes (each has micro_batch / world)."""
        return self.batch_size // self.accum_steps

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def epoch_limit(self, sized: bool = True) -> float:
        """The passes the run may make: --epochs; not given, 1, or for a stream without length
        (`sized` False) none — its run is --max-steps long, the stream restarting as often as
        it takes, as Lightning's max_steps with max_epochs unset and Hugging Face's max_steps do
        (given, --epochs also bounds it, whichever ends first, as in Lightning)."""
        if self.epochs is not None:
            return self.epochs
        return 1 if sized else math.inf

    def unread(self) -> list[str]:
        """Settings given that this run never reads, each a line naming the fix: warned of, not
        refused, since a run saved with one resumes with it (its config.toml holds it, and
        resume.MUST_MATCH momentum)."""
        lines = []
        if self.optimizer == "adamw" and self.momentum != TrainConfig.momentum:
            lines.append(f"--momentum {self.momentum:g} is SGD's; --optimizer adamw does not "
                         f"read it (its betas stay (0.9, 0.999)): use --optimizer sgd, or drop "
                         f"--momentum")
        if not self.early_stop and self.patience != TrainConfig.patience:
            lines.append(f"--patience {self.patience} counts evaluations for --early-stop, "
                         f"which is not given: nothing stops early; add --early-stop METRIC "
                         f"(e.g. val_loss)")
        return lines

    def validate(self, kinds: dict[str, str] | None = None) -> TrainConfig:
        """Reject bad values and incompatible switches. `kinds` maps model → "classification" |
        "language" (default: the bundled models' registry)."""
        kinds = kinds if kinds is not None else kinds_of()
        for f in fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise UserError(f"--{flag(f.name)} {getattr(self, f.name)!r}: choose one of "
                                f"{', '.join(choices)}")
        for name in ("epochs", "batch_size", "accum_steps", "log_every", "keep_checkpoints",
                     "block_size", "patience"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserError(f"--{flag(name)} must be ≥ 1, got {getattr(self, name)}")
        for name in ("max_steps", "warmup_steps", "checkpoint_every", "workers"):
            if getattr(self, name) < 0:
                raise UserError(f"--{flag(name)} must be ≥ 0, got {getattr(self, name)}")
        for name in ("lr", "momentum", "weight_decay", "grad_clip"):
            v = getattr(self, name)
            # Training runs in float32 (or less): a value it cannot hold would overflow to inf.
            if not math.isfinite(v) or v < 0 or (name == "lr" and v == 0) or v > FLOAT32_MAX:
                raise UserError(f"--{flag(name)} must be a finite number "
                                f"{'> 0' if name == 'lr' else '≥ 0'} that float32 can hold "
                                f"(≤ 3.4e38), got {v}")
        if not 0 <= self.val_fraction < 1:
            raise UserError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        for name, given in (("model", self.model), ("data", self.data)):
            if ":" not in given and given not in _bundled(name):
                raise UserError(f"--{name} {given!r}: choose one of "
                                f"{', '.join(_bundled(name))}, or give an import path "
                                f"pkg.module:factory")
        if not 0 <= self.seed <= SEED_MAX:  # NumPy and torch seeds are unsigned 32-bit
            raise UserError(f"--seed must be in 0…{SEED_MAX} (2³²−1), got {self.seed}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name != "seed" and field_type(f) is int and v is not None and v > INT_MAX:
                raise UserError(f"--{flag(f.name)} {v} is out of range; give at most {INT_MAX}")
        if self.batch_size % self.accum_steps:
            raise UserError(f"--batch-size {self.batch_size} is not divisible by --accum-steps "
                            f"{self.accum_steps}; choose a batch size that is a multiple of it")
        language = self.data in ("tinyshakespeare", "synthetic-text")
        if (self.model in kinds and ":" not in self.data
                and (kinds[self.model] == "language") != language):
            fix = ("--data tinyshakespeare or synthetic-text" if kinds[self.model] == "language"
                   else "--model gpt")
            raise UserError(f"--model {self.model} cannot train on --data {self.data}: use {fix}")
        if self.channels_last and self.model in kinds and self.model not in CONV_MODELS:
            raise UserError(f"--channels-last only helps convolutions; --model {self.model} has "
                            f"none: drop the flag or use --model cnn/resnet")
        if self.workers and self.data_on_device == "on":
            raise UserError("--workers feeds the DataLoader path, but --data-on-device on keeps "
                            "the data on the device: use --data-on-device off, or drop --workers")
        if self.cuda_graphs and self.data_on_device == "off":
            raise UserError("--cuda-graphs needs the batches already on the device: use "
                            "--data-on-device on (or auto)")
        if self.cuda_graphs and self.precision == "fp16":
            raise UserError("--cuda-graphs with fp16: GradScaler's skipped steps cannot be "
                            "captured; use --precision bf16")
        if self.resume and not self.out:
            raise UserError("--resume needs --out DIR (the run directory holding checkpoints/)")
        self._validate_step()
        self._validate_layout()
        self._validate_parallel()
        self._validate_data()
        return self

    def _validate_data(self) -> None:
        """The data path's switches (streamed or in memory; see engine/stream.py)."""
        if self.prefetch_factor < 1:
            raise UserError(f"--prefetch-factor must be ≥ 1, got {self.prefetch_factor}")
        if self.augment is not None:
            from fasttrain.engine.augment import parse

            parse(self.augment)
            if self.data in ("tinyshakespeare", "synthetic-text"):
                raise UserError(f"--augment flips and shifts images; --data {self.data} is "
                                f"text: drop --augment")

    def _validate_step(self) -> None:
        """The user's step, optimizer and scheduler: import paths (imported at build) and the
        switches they replace."""
        for name in ("step", "scheduler", "optimizer"):
            given = getattr(self, name)
            if given is None or (name == "optimizer" and given in OPTIMIZERS):
                continue
            if ":" not in given:
                choices = "sgd, adamw, or " if name == "optimizer" else ""
                raise UserError(f"--{name} {given!r}: give {choices}an import path "
                                f"pkg.module:fn")
        if self.scheduler and (self.schedule != "constant" or self.warmup_steps):
            raise UserError(f"--scheduler {self.scheduler} replaces --schedule and "
                            f"--warmup-steps; drop them (warm up in your scheduler)")
        if self.optimizer not in OPTIMIZERS:
            # A factory builds its optimizer with its own settings: these flags would be
            # recorded (config.toml) yet never reach it.
            ignored = [f"--{f.name.replace('_', '-')}" for f in fields(self)
                       if f.name in _FACTORY_OWNS and getattr(self, f.name) != f.default]
            if ignored:
                raise UserError(f"{', '.join(ignored)} with --optimizer {self.optimizer}: your "
                                f"optimizer factory sets its own learning rate, momentum and "
                                f"weight decay, so {' and '.join(ignored)} would be ignored; set "
                                f"them in the factory and drop the flags")
        if self.optimizer not in OPTIMIZERS and self.parallel == "zero1":
            raise UserError(f"--optimizer {self.optimizer} with --parallel zero1: "
                            f"ZeroRedundancyOptimizer builds its optimizer from a class, not "
                            f"a factory; use --parallel ddp or fsdp, or --optimizer adamw/sgd")

    def _validate_parallel(self) -> None:
        """--parallel against the other switches, then against how the processes were launched
        (torchrun's environment, the GPUs present): the one check that reads the environment."""
        if self.parallel != "none" and self.cuda_graphs:
            raise UserError(f"--cuda-graphs is not supported with --parallel {self.parallel} "
                            f"(collectives inside a captured graph); drop --cuda-graphs")
        if self.parallel == "dp" and self.compile:
            raise UserError("--parallel dp re-replicates the model every step, which "
                            "torch.compile cannot trace; use --parallel ddp with --compile")
        from fasttrain.engine.distributed import check_launch

        # Only the data-parallel ranks take different samples (tp and pp ranks share theirs).
        world = check_launch(self.parallel, self.device, self.tp, self.pp) // (self.tp * self.pp)
        if self.batch_size % (world * self.accum_steps):
            raise UserError(f"--batch-size {self.batch_size} (global) is not divisible by "
                            f"{world} data-parallel processes × --accum-steps "
                            f"{self.accum_steps}; choose a multiple of {world * self.accum_steps}")
        if self.pp > 1:  # the schedule's micro-batches must cut each pipeline's batch evenly
            from fasttrain.engine.pipeline import microbatches

            microbatches(self, self.batch_size // world)

    def _validate_layout(self) -> None:
        """--tp/--pp against the other switches; against the launch (torchrun, sizes dividing
        the world) in check_launch, against the model (heads, blocks, a plan) at build."""
        for name in ("tp", "pp"):
            if getattr(self, name) < 1:
                raise UserError(f"--{name} must be ≥ 1, got {getattr(self, name)}")
        if self.pp_microbatches < 0:
            raise UserError(f"--pp-microbatches must be ≥ 0 (0: 2 × pp), got "
                            f"{self.pp_microbatches}")
        if self.tp * self.pp > 1 and self.cuda_graphs:
            raise UserError("--cuda-graphs is not supported with --tp/--pp (collectives inside "
                            "a captured graph); drop --cuda-graphs")
        if self.pp > 1 and self.compile:
            raise UserError("--pp runs each stage eagerly (the schedule calls the stages, not a "
                            "compiled model); drop --compile")


def kinds_of() -> dict[str, str]:
    from fasttrain.models import MODEL_KINDS

    return MODEL_KINDS


def _bundled(what: str) -> tuple[str, ...]:
    if what == "model":
        return tuple(kinds_of())
    from fasttrain.data.tasks import TASKS

    return TASKS


def flag(name: str) -> str:
    """The command-line flag of a field, without its dashes: accum_steps → accum-steps."""
    return name.replace("_", "-")


def field_type(f: dataclasses.Field) -> type:
    """The value type of a field (annotations are strings under `from __future__`; `int | None`
    is an int that may be left unset)."""
    return {"int": int, "float": float, "bool": bool}.get(str(f.type).removesuffix(" | None"),
                                                          str)

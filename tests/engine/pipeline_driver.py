"""Trains a tiny gpt with engine/pipeline.py directly (no config, mesh or build of the engine),
for tests/engine/test_pipeline.py: under torchrun with --pp 2 each rank holds its stages (with
--tp 2 as well, on a pp × tp mesh: each stage's blocks split by the model's own plan); with
--pp 1 (plain python) the whole model trains through loop.accumulate, the engine's own step.

    torchrun --standalone --nproc-per-node 2 tests/engine/pipeline_driver.py --pp 2 \\
        --schedule 1f1b --steps 20 --out DIR
    torchrun --standalone --nproc-per-node 2 tests/engine/pipeline_driver.py --pp 2 \\
        --schedule gpipe,1f1b,interleaved-1f1b --steps 20 --out DIR
    python tests/engine/pipeline_driver.py --pp 1 --steps 20 --out DIR

`case(["DIR", *FLAGS])` trains FLAGS' runs into DIR as a command of the session's shared
launch (tests/engine/launch.py, runs_driver.py's "call"): test_pipeline_layouts' pp × tp bytes.

Several schedules (comma-separated) train one after the other in one launch, each from the
same seed with its own model, stages and optimizer, into DIR/<schedule>/: only the process
group is shared (a torchrun launch costs its processes' start-up and torch import, seconds on
a busy 2-core machine; CI runs close to its 20 minutes).

Writes DIR/rank<r>.pt: the loss of every step (as the logger reads it: summed over the ranks
÷ their number), an evaluation of a batch of another size, this rank's state_dict (the
whole model's names, tensor-parallel shards gathered whole), its parameter and optimizer-state
bytes (local shards), and the mean wall time of the steps after the first (printed in
docs/distributed.md; no test reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist

from fasttrain.engine import pipeline, steps, tensor_parallel
from fasttrain.engine.config import PP_SCHEDULES
from fasttrain.engine.inputs import cross_entropy
from fasttrain.engine.loop import accumulate
from fasttrain.engine.memory import rank_memory
from fasttrain.engine.run import accuracy, seed_everything
from fasttrain.models.gpt import GPT

VOCAB, T, MICRO, ACCUM, EVAL = 65, 16, 8, 2, 12


def step_batches(n_steps: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """n_steps optimizer steps of ACCUM micro-batches of next-token pairs, the same everywhere."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n_steps):
        group = []
        for _ in range(ACCUM):
            # Learnable: each token follows from the one before (t -> 3t + 1 mod VOCAB).
            start = torch.randint(VOCAB, (MICRO, 1), generator=g)
            tokens = (start * 3 ** torch.arange(T + 1) + (3 ** torch.arange(T + 1) - 1) // 2) \
                % VOCAB
            group.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        out.append(group)
    return out


def whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor-parallel shard gathered whole (a collective over its tp group)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def logged(loss_sum: torch.Tensor) -> float:
    """The loss as callbacks.log reads it: summed over all ranks ÷ the number of ranks."""
    if dist.is_initialized():
        loss_sum = loss_sum.clone()
        dist.all_reduce(loss_sum)
        return loss_sum.item() / dist.get_world_size()
    return loss_sum.item()


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--schedule", default="1f1b", type=schedules,
                    help=f"one of {', '.join(PP_SCHEDULES)}, or several, comma-separated")
    ap.add_argument("--microbatches", type=int, default=0)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--n-embd", type=int, default=32)
    ap.add_argument("--out", type=Path, required=True)
    return ap


def main() -> None:
    args = parser().parse_args()
    torch.set_num_threads(1)  # two processes on a shared 2-core machine
    torch.use_deterministic_algorithms(True)  # --deterministic
    if args.pp > 1:
        dist.init_process_group("gloo")
    train_all(args)
    if args.pp > 1:
        dist.barrier()
        dist.destroy_process_group()


def case(argv: list[str]) -> int:
    """[DIR, *FLAGS]: main's runs of FLAGS into DIR, as a command of the session's shared launch
    (tests/engine/launch.py, runs_driver.py's "call"), whose driver holds the process group and
    puts the deterministic flag back after the command."""
    out, *flags = argv
    torch.use_deterministic_algorithms(True)
    train_all(parser().parse_args([*flags, "--out", out]))
    return 0


def train_all(args: argparse.Namespace) -> None:
    for schedule in args.schedule:
        out = args.out / schedule if len(args.schedule) > 1 else args.out
        train(args, schedule, out)


def schedules(text: str) -> list[str]:
    names = text.split(",")
    for name in names:
        if name not in PP_SCHEDULES:
            raise argparse.ArgumentTypeError(f"{name!r} is not one of {PP_SCHEDULES}")
    return names


def train(args: argparse.Namespace, schedule: str, out: Path) -> None:
    """One run of args.steps steps under `schedule` (with --pp 1: the whole model), from the
    seed: what it saved in out/rank<r>.pt."""
    seed_everything(0)  # the same initial weights on every rank, as build draws them
    model = GPT((T,), VOCAB, n_layer=4, n_head=2, n_embd=args.n_embd)
    run = SimpleNamespace(
        device=torch.device("cpu"), autocast=contextlib.nullcontext(), loss_fn=cross_entropy,
        metrics={"token_accuracy": accuracy}, loss_sum=torch.zeros(()), extra_sums={},
        batches=SimpleNamespace(micro=MICRO, accum=ACCUM), cfg=SimpleNamespace(accum_steps=ACCUM),
        no_sync=contextlib.nullcontext, scaler=torch.amp.GradScaler("cpu", enabled=False),
        forward=model)
    run.compute_loss = steps.compute_loss(run, None, "")
    rank = 0
    if args.pp > 1:
        rank = dist.get_rank()
        cfg = SimpleNamespace(pp=args.pp, pp_schedule=schedule, precision="fp32",
                              pp_microbatches=args.microbatches)
        group, wrap = dist.group.WORLD, None
        if args.tp > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (args.pp, args.tp), mesh_dim_names=("pp", "tp"))
            group = mesh["pp"]

            def wrap(stage):
                tensor_parallel.apply(stage, mesh["tp"])
                return stage
        pipe = pipeline.build(run, model, group, cfg, wrap)
        del model
        model, forward_backward = pipe.model, pipe.forward_backward
        evaluate_loss = pipe.evaluate_loss
    else:
        forward_backward = accumulate
        evaluate_loss = steps.evaluate_loss(run)
    # SGD: Adam would turn the rounding noise of exactly-zero gradients (the attention's key
    # bias) into whole steps of ±lr, in either layout.
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses, start = [], 0.0
    for i, group in enumerate(step_batches(args.steps)):
        if i == 1:  # the first step also learns the activations' shapes: not timed
            start = time.perf_counter()
        forward_backward(run, group)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(logged(run.loss_sum))
        run.loss_sum.zero_()
    seconds = time.perf_counter() - start
    x, y = step_batches(1)[0][0]
    model.eval()
    with torch.no_grad():
        loss, metrics = evaluate_loss(model, (x[:EVAL], y[:EVAL]))
    held = rank_memory(model, opt)
    state = {k: whole(v) for k, v in model.state_dict().items()}
    out.mkdir(parents=True, exist_ok=True)
    torch.save({"losses": losses, "eval": [loss.item(), metrics["token_accuracy"].item()],
                "state": state, "param_bytes": held.params, "optimizer_bytes": held.optimizer,
                "step_s": seconds / max(args.steps - 1, 1)},
               out / f"rank{rank}.pt")


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    main()

"""Runs one forward and backward of a tiny gpt split by its tensor-parallel plan (sequence
parallel + loss parallel, and with loss parallel off), beside the same model whole in the same
process, for tests/engine/test_sequence_parallel.py:

    torchrun --standalone --nproc-per-node 2 tests/engine/tp_driver.py --out DIR [--vocab 65]

or, as a command of the session's shared 2-process launch, `case(["DIR", *FLAGS])`.

Rank 0 writes DIR/result.json: for each mode, the loss and the largest gradient difference
from the whole model; the layouts seen (the residual stream entering block 0, the logits); and
the activation bytes this rank saves for backward — every tensor autograd keeps, counted by
storage once (a saved_tensors_hooks pack hook), parameters excluded — with the largest one.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from fasttrain.engine.inputs import cross_entropy
from fasttrain.models.gpt import GPT


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


@contextlib.contextmanager
def saved_activations(model: torch.nn.Module, found: dict):
    """Count what autograd saves for backward: bytes per storage, parameters left out."""
    params = {local(p).untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        storage = local(t).untyped_storage()
        if storage.data_ptr() not in params:
            found[storage.data_ptr()] = max(found.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield


def run(whole: GPT, mesh, x, y, sharded_loss: bool) -> dict:
    model = copy.deepcopy(whole)
    model.parallelize(mesh, loss_parallel=sharded_loss)
    seen = {}

    def stream(module, args) -> None:
        seen["stream"] = [type(args[0]).__name__, list(local(args[0]).shape)]

    model.blocks[0].register_forward_pre_hook(stream)
    found: dict[int, int] = {}
    with loss_parallel() if sharded_loss else contextlib.nullcontext():
        with saved_activations(model, found):
            logits = model(x)
            loss = cross_entropy(logits, y)
        loss.backward()
    seen["logits"] = [type(logits).__name__, list(local(logits).shape),
                      [str(p) for p in getattr(logits, "placements", ())]]
    grads = {n: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
             for n, p in model.named_parameters()}
    ref = dict(whole.named_parameters())
    return {"loss": local(loss).item(), "layouts": seen,
            "grad_diff": max((grads[n] - ref[n].grad).abs().max().item() for n in ref),
            "saved_bytes": sum(found.values()), "largest_saved": max(found.values())}


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--vocab", type=int, default=65)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=32)
    return ap


def main() -> None:
    args = parser().parse_args()
    dist.init_process_group("gloo")
    torch.use_deterministic_algorithms(True)
    measure(args)
    dist.destroy_process_group()


def case(argv: list[str]) -> int:
    """[DIR, *FLAGS]: main's measurement into DIR, as a command of the session's shared launch
    (tests/engine/launch.py, runs_driver.py's "call"), whose driver holds the process group and
    puts the deterministic flag back after the command."""
    out, *flags = argv
    torch.use_deterministic_algorithms(True)
    measure(parser().parse_args([*flags, "--out", out]))
    return 0


def measure(args: argparse.Namespace) -> None:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    whole = GPT((args.seq,), args.vocab, n_layer=2, n_head=4, n_embd=32)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(args.vocab, (args.batch, args.seq), generator=g)
    y = torch.roll(x, -1, 1)
    found: dict[int, int] = {}
    with saved_activations(whole, found):
        loss = cross_entropy(whole(x), y)
    loss.backward()
    result = {"one_process": {"loss": loss.item(), "saved_bytes": sum(found.values()),
                              "largest_saved": max(found.values())},
              "loss_parallel": run(whole, mesh, x, y, True),
              "gathered_logits": run(whole, mesh, x, y, False),
              "config": {"tp": dist.get_world_size(), **vars(args), "out": None}}
    if dist.get_rank() == 0:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "result.json").write_text(json.dumps(result, indent=1))
    dist.barrier()


if __name__ == "__main__":
    main()

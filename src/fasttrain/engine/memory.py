"""What to say when a run does not fit: a breakdown of what the memory holds and what to change."""

from __future__ import annotations

import torch


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def explain_oom(trainer) -> str:
    """One line for the error, after printing the breakdown of the run that ran out."""
    import sys

    cfg, model, opt = trainer.cfg, trainer.model, trainer.opt
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = params  # one gradient per parameter, same dtype (fp32 master weights)
    state = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values()
                if torch.is_tensor(t))
    lines = [f"out of memory on {trainer.device} at step {trainer.step}:",
             f"  weights {_gib(params)}, gradients {_gib(grads)}, optimizer state {_gib(state)};",
             "  the rest of the peak is activations, which grow with the micro-batch "
             f"({cfg.micro_batch} samples)."]
    if trainer.device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(trainer.device)
        total = torch.cuda.get_device_properties(trainer.device).total_memory
        lines.append(f"  peak allocated {_gib(peak)} of {_gib(total)}.")
    print("\n".join(lines), file=sys.stderr)
    fixes = [f"--batch-size {cfg.batch_size} --accum-steps {cfg.accum_steps * 2} (same update, "
             f"half the activations)"]
    if not cfg.activation_checkpointing:
        fixes.append("--activation-checkpointing")
    if cfg.precision in ("fp32", "tf32"):
        fixes.append("--precision bf16")
    return "the run does not fit in memory; try " + ", or ".join(fixes)

"""What the engine's speed switches buy on a GPU: fp32 eager with a DataLoader against
bf16 + torch.compile + device-resident data (and + CUDA graphs: the whole step captured,
engine/graphed.py; and the same graph around the uncompiled model), on `cnn` and `gpt`.

The course lab expects 1.5–3× faster and ~1.7× less memory from mixed precision; this measures it.
Each configuration trains STEPS steps in one process; the figure is the median ms/step of the
logs after the first (compilation and warm-up land in the first), peak memory the allocator's.

    PYTHONPATH=src python benchmarks/engine_speedup.py --json results/DATE-GPU-engine-speedup.json
    PYTHONPATH=src python benchmarks/engine_speedup.py --device cpu --steps 20   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from fasttrain.engine import TrainConfig, build, fit
from fasttrain.env import env_block, hardware_line

WORKLOADS = {  # model → (data, batch size, learning rate)
    "cnn": ("mnist", 256, 1e-3),
    "gpt": ("tinyshakespeare", 64, 1e-3),
}
CONFIGS = {
    "fp32 eager, DataLoader": dict(precision="fp32", data_on_device="off", workers=4,
                                   pin_memory=True),
    "bf16 + compile + data on device": dict(precision="bf16", compile=True, data_on_device="on"),
    "+ CUDA graphs": dict(precision="bf16", compile=True, cuda_graphs=True, data_on_device="on"),
    # The whole step captured around the eager model: what compile's fusion adds inside a graph.
    "bf16 + CUDA graphs, no compile": dict(precision="bf16", cuda_graphs=True,
                                           data_on_device="on"),
}


def measure(model: str, switches: dict, steps: int, device: str) -> dict:
    data, batch, lr = WORKLOADS[model]
    if device != "cuda":  # pinned memory and graphs are CUDA-only switches
        switches = {k: v for k, v in switches.items() if k not in ("pin_memory",)}
        if switches.get("cuda_graphs"):
            return {"status": "unavailable", "reason": "CUDA graphs need a CUDA GPU"}
    cfg = TrainConfig(model=model, data=data, batch_size=batch, lr=lr, max_steps=steps,
                      epochs=10**6, log_every=max(1, steps // 10), device=device,
                      progress=False, **switches)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    trainer = build(cfg)
    fit(trainer)
    logs = [r for r in trainer.history if r["kind"] == "train"][1:]
    row = {"status": "ok", "ms_per_step": statistics.median(r["step_ms"] for r in logs),
           "samples_per_s": statistics.median(r["samples_per_s"] for r in logs)}
    if cfg.cuda_graphs:  # which path --cuda-graphs took (engine/graphed.py), and why not whole
        row["whole_step_graph"] = trainer.graph is not None
        row["graph_replays"] = sum(r.get("graph_replays", 0) for r in logs)
        if trainer.graph_why:
            row["why_not_whole_step"] = trainer.graph_why
    if device == "cuda":
        row["peak_memory_gb"] = torch.cuda.max_memory_allocated() / 2**30
        row["mfu"] = logs[-1].get("mfu")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default="cnn,gpt")
    ap.add_argument("--json")
    args = ap.parse_args()
    env = env_block()
    print(hardware_line(env))
    rows = []
    for model in args.models.split(","):
        base = None
        for name, switches in CONFIGS.items():
            row = {"model": model, "config": name, **measure(model, switches, args.steps,
                                                              args.device)}
            if row["status"] == "ok":
                base = base or row
                row["speedup"] = base["ms_per_step"] / row["ms_per_step"]
                if "peak_memory_gb" in row:
                    row["memory_ratio"] = base["peak_memory_gb"] / row["peak_memory_gb"]
            rows.append(row)
            print(json.dumps(row))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"schema": "fasttrain.engine-speedup/1", "env": env,
                       "config": {"steps": args.steps, "workloads": WORKLOADS,
                                  "configs": CONFIGS}, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

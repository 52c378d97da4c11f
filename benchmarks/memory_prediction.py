"""How close `fasttrain memory`'s predicted peak comes to the CUDA allocator's measured peak:
cnn, resnet and gpt, at two batch sizes and two precisions, one JSON.

Each case is `fasttrain memory ... --data-on-device off --json` (the dataset stays on the host, so
the peak is the step's own); the error is (predicted − measured) / measured, the goal ±10%.
The data are the synthetic stand-ins: memory depends on shapes only, and these need no files.

    PYTHONPATH=src python benchmarks/memory_prediction.py --json DATE-GPU-memory-prediction.json
    PYTHONPATH=src python benchmarks/memory_prediction.py --device cpu --models cnn   # a smoke run
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from fasttrain.cli import main as fasttrain
from fasttrain.env import env_block, hardware_line

DATA = {"cnn": "synthetic", "resnet": "synthetic-cifar", "gpt": "synthetic-text"}
BATCHES = (32, 128)
PRECISIONS = ("fp32", "bf16")
KEEP = ("predicted_peak", "measured_peak", "error", "measured_by", "weights", "gradients",
        "optimizer", "activations", "weight_copies", "inputs", "data", "workspace",
        "conv_workspace", "step_temp", "first_step_peak")


def measure(model: str, batch: int, precision: str, device: str) -> dict:
    row = {"model": model, "batch_size": batch, "precision": precision}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.json"
        code = fasttrain(["memory", "--model", model, "--data", DATA[model], "--device", device,
                          "--batch-size", str(batch), "--precision", precision,
                          "--data-on-device", "off", "--json", str(path)])
        if code != 0:
            return {**row, "status": "failed", "reason": f"fasttrain memory exited {code}"}
        found = json.loads(path.read_text())["rows"][0]
    return {**row, "status": "ok", **{k: found[k] for k in KEEP}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--models", default=",".join(DATA))
    ap.add_argument("--json")
    args = ap.parse_args()
    env = env_block()
    print(hardware_line(env))
    rows = []
    for model in args.models.split(","):
        for batch in BATCHES:
            for precision in PRECISIONS:
                row = measure(model, batch, precision, args.device)
                rows.append(row)
                print(json.dumps({k: row.get(k) for k in ("model", "batch_size", "precision",
                                                          "status", "predicted_peak",
                                                          "measured_peak", "error")}))
    errors = [abs(r["error"]) for r in rows if r["status"] == "ok"]
    result = {"schema": "fasttrain.memory-prediction/1", "env": env,
              "config": {"device": args.device, "data": DATA, "batches": BATCHES,
                         "precisions": PRECISIONS, "data_on_device": "off"},
              "max_abs_error": max(errors) if errors else None, "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    print(f"max |error| {result['max_abs_error']}")


if __name__ == "__main__":
    main()

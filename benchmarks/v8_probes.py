"""cuda-epoch v8's pieces alone, each timed on the GPU before anything is integrated
(docs/measurements/cuda-epoch-v8-design.md, "Build first"): whichever is slower than ~1 µs a step
falsifies the design's 0.5 ms/epoch before the integration costs anything.

- the workers alone (`ladder/v8_workers.py`, step 3): the 56 worker CTAs for a whole epoch with
  every G given up front, so µs a step is their throughput; variants `simt` (v7's worker bodies:
  the baseline, which should land near v7's measured ~3.1 µs), `mma` (update and partials on the
  tensor cores) and `mma-scatter` (and the reduce a st.async reduce-scatter, no cluster barrier);
  each run's partials and weights checked against float64;
- the chain alone (`ladder/v8_chain.py`, step 2): one CTA runs the epoch's 469 dependent steps
  with real Grams and the other terms precomputed, so µs a step is T_chain, the design's central
  claim; and the chain with its six helpers in one cluster (step 4): whether they keep up; G
  checked against float64 SGD;
- the v8 Grams on the GPU (`ladder/v8_grams.py`: Gram v2 with 6 lags and the bias pixel): µs an
  epoch, and whether they equal NumPy's bit for bit.

Each probe's figures are printed as they are measured; a probe that cannot build or run is one
line in its place, and the other still runs.

    PYTHONPATH=src python benchmarks/v8_probes.py [--data mnist|random] [--repeats 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch

from fasttrain.env import env_block, hardware_line


def workers(repeats: int, data: str) -> dict:
    from fasttrain.ladder import v8_workers

    x = None
    if data == "mnist":
        from fasttrain.data import load_dataset

        train_x = load_dataset("mnist", None, seed=0).train_x
        x = train_x.reshape(len(train_x), -1)  # [N, 784]
    return v8_workers.measure(repeats=repeats, ep=v8_workers.epoch_inputs(x=x))


_INPUTS: dict = {}


def mnist_inputs() -> dict:
    """The chain's and the Grams' inputs (MNIST's first epoch, the cluster's Γ̃ too: ~155 MB),
    made once for both probes."""
    from fasttrain.ladder import v8_chain

    if not _INPUTS:
        _INPUTS.update(v8_chain.mnist_epoch())
    return _INPUTS


def chain(repeats: int, data: str) -> dict:
    from fasttrain.ladder import v8_chain

    if data != "mnist":
        raise ValueError("the chain's logits are real MNIST's: run it with --data mnist")
    return v8_chain.measure(repeats=repeats, inp=mnist_inputs())


def grams(repeats: int, data: str) -> dict:
    from fasttrain.ladder import v8_chain, v8_grams

    if data != "mnist":
        raise ValueError("the Grams are checked against MNIST's: run them with --data mnist")
    return v8_grams.time_grams(v8_chain.load_library(), mnist_inputs(), repeats=max(repeats, 5))


def guarded(name: str, probe, describe) -> dict:
    """The probe's result, printed; a failure is one line in its place."""
    from fasttrain.ladder import build

    try:
        result = probe()
    except (build.Unavailable, RuntimeError, OSError, ValueError) as e:
        result = {"error": f"{type(e).__name__}: {e}".splitlines()[0]}
        print(f"  v8 {name}: {result['error']}")
        return result
    for line in describe(result):
        print(f"  {line}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", default="mnist", choices=("mnist", "random"),
                    help="the workers' pixels (their timing does not depend on them); the chain "
                         "needs mnist")
    ap.add_argument("--repeats", type=int, default=3, help="timed launches a variant")
    ap.add_argument("--json", metavar="PATH", help="write the figures here")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        print(f"v8_probes: --repeats {args.repeats}: at least 1", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("v8_probes: needs a CUDA GPU (sm_90: clusters, st.async, mma)", file=sys.stderr)
        return 2
    from fasttrain.ladder import v8_chain, v8_grams, v8_workers

    env = env_block()
    print(f"v8_probes on {hardware_line(env)}")
    result = {"schema": "fasttrain.v8_probes/1", "env": env,
              "config": {"data": args.data, "repeats": args.repeats}}
    result["workers"] = guarded("workers", lambda: workers(args.repeats, args.data),
                                v8_workers.describe)
    result["chain"] = guarded("chain", lambda: chain(args.repeats, args.data), v8_chain.describe)
    # Last: a fault in a kernel never run on a GPU before is sticky, and would fail the others.
    result["grams"] = guarded("Grams", lambda: grams(args.repeats, args.data),
                              lambda r: [v8_grams.describe_grams(r)])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=float)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs `fasttrain train ...` in this process, then writes what torch.compile did: dynamo's
counters (frames and graphs captured, graph breaks, AOTAutograd graphs), for
tests/engine/test_tp_compile.py:

    torchrun --standalone --nproc-per-node 2 tests/engine/compile_driver.py DIR train ... --compile

Each rank writes DIR/dynamo-rank<r>.json; the exit code is the command's.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from torch._dynamo.utils import counters

from fasttrain.cli import main


def run() -> int:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    code = main(argv)
    out.mkdir(parents=True, exist_ok=True)
    seen = {group: dict(values) for group, values in counters.items()}
    (out / f"dynamo-rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(seen))
    return code


if __name__ == "__main__":
    raise SystemExit(run())

"""One torchrun launch for a module's `fasttrain train` commands of one process count: they run
one after the other in its processes (runs_driver.py --record), all of them at the first
request of any. A launch costs the start-up and torch import of each of its processes: seconds
each on a busy 2-core machine, where CI runs close to its 20 minutes.

    four = Launch(tmp_path_factory.mktemp("four"), procs=4, args=ARGS)
    four.add("pp2-tp2", "--max-steps", "20", "--pp", "2", "--tp", "2")  # → its --out
    four.add("tp8", "--tp", "8")                      # refused: exit 2 on every rank
    four("pp2-tp2").ok()                              # launches all, once; this one's outcome

Commands that must stop with a UserError go last: the ranks go on past one in step (it is
raised on every rank at the same point), but what a refused build leaves behind should not
meet the runs that train. A command after a failure of another kind did not run, and says so
with the launch's log.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # where `-m tests.engine.runs_driver` is found


@dataclass
class Outcome:
    """One command's result on every rank (rank order)."""

    name: str
    codes: list[int]
    stdouts: list[str]
    stderrs: list[str]
    dynamo: list[dict]  # torch.compile's counters (runs_driver.recorded); {} without --compile

    @property
    def log(self) -> str:
        return "\n".join(f"-- {self.name}, rank {r}:\n{out}{err}" for r, (out, err)
                         in enumerate(zip(self.stdouts, self.stderrs, strict=True)))

    @property
    def errors(self) -> list[str]:
        """The `error: ` lines of every rank."""
        return [line for err in self.stderrs for line in err.splitlines()
                if line.startswith("error: ")]

    def ok(self) -> Outcome:
        assert self.codes == [0] * len(self.codes), self.log
        return self


class Launch:
    def __init__(self, root: Path, procs: int, args: list[str]):
        self.root, self.procs, self.args = root, procs, args  # args: every command's first
        self.commands: dict[str, list[str] | dict] = {}
        self.log: str | None = None  # torchrun's, once launched

    def add(self, name: str, *extra: str, out: str | None = None,
            env: dict[str, str] | None = None) -> Path:
        """`fasttrain train ARGS --out ROOT/<out or name> EXTRA`, with `env` set in its
        processes while it runs (runs_driver.py); returns that --out."""
        assert self.log is None, "added after the launch"
        path = self.root / (out or name)
        argv = ["train", *self.args, "--out", str(path), *extra]
        self.commands[name] = {"argv": argv, "env": env} if env else argv
        return path

    def __call__(self, name: str) -> Outcome:
        if self.log is None:
            proc = subprocess.run(
                [sys.executable, "-m", "torch.distributed.run", "--standalone",
                 "--nproc-per-node", str(self.procs), "-m", "tests.engine.runs_driver", "--record",
                 str(self.root / "record"), *map(json.dumps, self.commands.values())],
                capture_output=True, text=True, timeout=400 * len(self.commands), cwd=ROOT)
            self.log = proc.stdout + proc.stderr
        record = self.root / "record" / str(list(self.commands).index(name))
        ranks = [json.loads((record / f"rank{r}.json").read_text())
                 for r in range(self.procs) if (record / f"rank{r}.json").is_file()]
        assert len(ranks) == self.procs, f"{name} did not run on every rank:\n{self.log}"
        return Outcome(name, *([r[k] for r in ranks] for k in
                               ("code", "stdout", "stderr", "dynamo")))

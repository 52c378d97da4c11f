"""One torchrun launch for a module's `fasttrain train` commands of one process count: they run
one after the other in its processes (runs_driver.py --record), all of them at the first
request of any. A launch costs the start-up and torch import of each of its processes: seconds
each on a busy 2-core machine, where CI runs close to its 20 minutes. `Part` (below) puts
the commands of every collected module into one such launch per process count, the session's.

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
        self.commands: dict[str, dict] = {}  # name: runs_driver's command
        self.log: str | None = None  # torchrun's, once launched
        self.made: list[Path] = []  # the --out folders made before the launch

    def add(self, name: str, *extra: str, out: str | None = None,
            env: dict[str, str] | None = None, call: str | None = None) -> Path:
        """`fasttrain train ARGS --out ROOT/<out or name> EXTRA`, with `env` set in its
        processes while it runs (runs_driver.py; "{out}" in a value: that --out, made before the
        launch); returns that --out. With `call` ("pkg.module:function"), that function of
        (argv) → exit code instead of fasttrain's main, given [ROOT/<out or name>, *ARGS,
        *EXTRA] (a test's driver that builds through the engine, as a command of the launch)."""
        assert self.log is None, "added after the launch"
        path = self.root / (out or name)
        argv = ([str(path), *self.args, *extra] if call
                else ["train", *self.args, "--out", str(path), *extra])
        if env:
            env = {k: v.replace("{out}", str(path)) for k, v in env.items()}
            self.made.append(path)
        self.commands[name] = {"argv": argv, "env": env or {}, "call": call}
        return path

    def __call__(self, name: str) -> Outcome:
        if self.log is None:
            for path in self.made:
                path.mkdir(parents=True, exist_ok=True)
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


class Part:
    """A module's commands in the session's shared launch of `procs` processes: the modules
    declare their parts at import (collection), and the first request of any part launches the
    commands of every part of that process count whose module the session collected (runs
    first, refusals last, module by module), once. Running one module alone runs its part
    alone; the slow suite runs one launch per process count, where each module's fixture cost
    a launch of its own (the start-up and torch import of every process, seconds each on a
    busy 2-core machine).

        FOUR = Part(__name__, 4, ARGS)                      # at import
        FOUR.add("pp2-tp2", "--pp", "2", "--tp", "2")
        FOUR.add("tp8", "--tp", "8", refused=True)          # a UserError: after every run
        @pytest.fixture(scope="module")
        def four(shared) -> Part: return FOUR.bound(shared)  # conftest.shared
        four("pp2-tp2").ok(); four.root / "pp2-tp2"         # its outcome, its --out

    What one command leaves in the processes meets the commands of other modules: runs_driver
    resets what is known to outlive a run (dynamo's caches), and a
    command that fails other than with a UserError ends the launch, so every command after it,
    whatever its module, fails with "did not run on every rank" and the launch's log.
    """

    every: list[Part] = []

    def __init__(self, module: str, procs: int, args: list[str]):
        self.module, self.procs, self.args = module, procs, args
        self.name = module.rsplit(".", 1)[-1]
        self.added: list[tuple[str, tuple[str, ...], str | None, dict | None, bool,
                               str | None]] = []
        self.launch: Launch | None = None
        Part.every.append(self)

    def add(self, name: str, *extra: str, out: str | None = None,
            env: dict[str, str] | None = None, refused: bool = False,
            call: str | None = None) -> None:
        assert self.launch is None, "added after the launch"
        self.added.append((name, extra, out, env, refused, call))

    def bound(self, shared: Shared) -> Part:
        self.launch = shared.launch(self.procs)
        return self

    @property
    def root(self) -> Path:
        return self.launch.root / self.name

    def __call__(self, name: str) -> Outcome:
        return self.launch(f"{self.name}:{name}")


class Shared:
    """The session's launches (conftest.shared): one per process count, of the parts of the
    modules collected."""

    def __init__(self, root: Path, modules: set[str]):
        self.root, self.modules, self.launches = root, modules, {}

    def launch(self, procs: int) -> Launch:
        if procs not in self.launches:
            launch = self.launches[procs] = Launch(self.root / str(procs), procs, [])
            parts = [p for p in Part.every if p.procs == procs and p.module in self.modules]
            for refusals in (False, True):
                for part in parts:
                    for name, extra, out, env, refused, call in part.added:
                        if refused == refusals:
                            launch.add(f"{part.name}:{name}", *part.args, *extra, env=env,
                                       out=f"{part.name}/{out or name}", call=call)
        return self.launches[procs]

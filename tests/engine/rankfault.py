"""A user's model that raises on one rank only: `--model tests.engine.rankfault:make` under
torchrun, with FAULT_RANK=R in the environment, raises in its forward at its third training
call on rank R; the other ranks go on into the step's collectives (under --tp, inside this
forward), where they find R gone. userblocks' residual MLP otherwise, with its tp plan."""

import os

from tests.engine.userblocks import ResMLP


class Faulty(ResMLP):
    calls = 0

    def forward(self, x):
        self.calls += self.training
        if self.calls == 3 and os.environ.get("RANK") == os.environ.get("FAULT_RANK"):
            broken(x)
        return super().forward(x)


def broken(x):
    raise ValueError(f"the user's model broke on a batch of {len(x)}")


def make() -> Faulty:
    return Faulty()

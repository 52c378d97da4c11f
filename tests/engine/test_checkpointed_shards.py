"""Activation checkpointing with sharded (DCP) checkpoints: the wrapper is invisible to every name
reader, so a run saved with --activation-checkpointing resumes without it and vice versa.

The failure this guards against: DCP's get_state_dict maps each state_dict key back to its
parameter by walking the module tree by name; a checkpointing wrapper that hides its child from
the keys but not from the tree made that walk fail (`'Checkpointed' object has no attribute
'ln1'`) at the first --checkpoint-every under --parallel fsdp or --tp.
"""

from __future__ import annotations

import pytest
import torch

from fasttrain.models import apply_activation_checkpointing, build_model
from tests.engine.launch import Part
from tests.engine.test_tensor_parallel import ARGS, assert_same_run

# torch.distributed.checkpoint is imported by the tests that use it, not with the module: every
# pytest process collects this module (each xdist worker, `pytest -m slow`, gpu-check's gpu-tests
# step), and the import cost 1.3-2.0 s of CPU a process (`import torch` alone 2.8-3.0 s, with
# torch.distributed.checkpoint 4.3-4.9 s; a busy 2-core EPYC, 2026-11-28).


def dcp_api():
    """torch.distributed.checkpoint, its get_state_dict and set_state_dict, and the options of
    distributed.sharded_state (the optimizer state flattened)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_state_dict,
        set_state_dict,
    )

    return dcp, get_state_dict, set_state_dict, StateDictOptions(flatten_optimizer_state_dict=True)


def trained(checkpointing: bool, seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = build_model("gpt", in_shape=(16,), num_classes=65, n_layer=2, n_embd=32)
    if checkpointing:
        apply_activation_checkpointing(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x = torch.randint(0, 65, (2, 16), generator=torch.Generator().manual_seed(seed))
    model(x).logsumexp(-1).mean().backward()
    opt.step()  # momentum buffers exist: the optimizer state has a key per parameter
    return model, opt


def test_dcp_names_are_the_unwrapped_models():
    _, get_state_dict, _, flat = dcp_api()
    plain = get_state_dict(*trained(False, 0), options=flat)
    wrapped = get_state_dict(*trained(True, 0), options=flat)
    for a, b in zip(plain, wrapped, strict=True):  # model, then optimizer
        assert list(a) == list(b)
        assert not any("_checkpoint_wrapped_module" in k for k in b)


@pytest.mark.parametrize("saved_with, loaded_with", [(True, False), (False, True)])
def test_a_dcp_checkpoint_loads_with_checkpointing_switched(tmp_path, saved_with, loaded_with):
    dcp, get_state_dict, set_state_dict, flat = dcp_api()
    model, opt = trained(saved_with, seed=1)
    dcp.save(dict(zip(("model", "optimizer"), get_state_dict(model, opt, options=flat),
                      strict=True)), checkpoint_id=tmp_path)
    other, other_opt = trained(loaded_with, seed=2)  # different weights and momenta
    state = dict(zip(("model", "optimizer"), get_state_dict(other, other_opt, options=flat),
                     strict=True))
    dcp.load(state, checkpoint_id=tmp_path)
    set_state_dict(other, other_opt, model_state_dict=state["model"],
                   optim_state_dict=state["optimizer"], options=flat)
    want = get_state_dict(model, opt, options=flat)
    got = get_state_dict(other, other_opt, options=flat)
    for a, b in zip(want, got, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=0, atol=0, msg=k)


SWITCHED = {  # name: (processes, layout, checkpointing saved with, resumed with)
    "fsdp2-on-off": (2, ["--parallel", "fsdp"], ["--activation-checkpointing"], []),
    "tp2-off-on": (2, ["--tp", "2"], [], ["--activation-checkpointing"]),
    "fsdp2xtp2-on-off": (4, ["--parallel", "fsdp", "--tp", "2"], ["--activation-checkpointing"],
                         []),
}


# Each layout's first 2 steps, then the 2 after them resumed from its checkpoint, one after the
# other, in the session's shared launches (launch.Part).
PARTS = {2: Part(__name__, 2, ARGS), 4: Part(__name__, 4, ARGS)}
for _name, (_procs, _layout, _first, _then) in SWITCHED.items():
    _every = ["--checkpoint-every", "2", *_layout]
    PARTS[_procs].add(f"{_name}-first", "--max-steps", "2", *_every, *_first, out=_name)
    PARTS[_procs].add(f"{_name}-then", "--max-steps", "4", "--resume", "auto", *_every, *_then,
                      out=_name)


@pytest.fixture(scope="module")
def launches(shared) -> dict[int, Part]:
    """{processes: this module's part of the session's launch of that many}."""
    return {procs: part.bound(shared) for procs, part in PARTS.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", SWITCHED)
def test_resume_switching_checkpointing_equals_uninterrupted(launches, one, name):
    launch = launches[SWITCHED[name][0]]
    launch(f"{name}-first").ok()
    resumed = launch(f"{name}-then").ok()
    run = launch.root / name
    assert (run / "checkpoints" / "step-00000002").is_dir()  # sharded: a DCP folder (kept: 3)
    assert "step-00000002" in resumed.stdouts[0], resumed.log
    assert_same_run(one(4), run)  # one process, 4 steps (conftest.one: shared)

import pytest
import torch


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    """Each test compiles from scratch: many runs of one model class in one process would
    otherwise pile up dynamo cache entries until its recompile limit silently falls back to
    eager. (Inductor's on-disk cache still makes a repeated compilation quick.)"""
    torch.compiler.reset()
    yield
    torch.compiler.reset()


@pytest.fixture(autouse=True)
def tf32_flags_restored():
    """A run with --precision tf32 turns TF32 on for the whole process (a global switch of
    torch's): put it back after each test, so that no later test (the ladder's fp32 rows,
    checked to 2e-5) inherits it, whatever the selection or order."""
    flags = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags

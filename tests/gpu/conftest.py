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

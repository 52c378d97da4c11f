import pytest


@pytest.fixture(scope="session")
def nvcc_cache(tmp_path_factory):
    """One build folder for the session's nvcc builds: a source compiled twice with the same arch
    and flags (build.compile's cache key) builds once, not once a test — cuda_epoch.cu for sm_90a
    is ~1 minute of this machine's two cores, and three tests need it."""
    return tmp_path_factory.mktemp("nvcc")

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from fasttrain.ladder import build


def libs_of(source: str) -> tuple[str, ...]:
    """The libraries a csrc/ source needs, from the headers it (or a local header) includes."""
    path = build.CSRC / source
    text = "".join(f.read_text() for f in (path, *build.local_headers(path)))
    return tuple(name for name, (header, _) in build.LIBS.items() if f"<{header}>" in text)


@pytest.fixture(scope="session")
def hopper_builds(tmp_path_factory) -> dict[str, Path]:
    """Every csrc/*.cu built for Hopper (sm_90a) once a session: {source: its .so}. nvcc needs no
    GPU; a test that only needs a Hopper build should take it from here, not build its own
    (cuda_epoch.cu alone took 35 s of CPU on a busy 2-core machine). Under pytest-xdist the
    workers share one folder of this session's, so the first to ask builds and the others wait
    for its libraries (build's lock per library) instead of building them again."""
    if build.find_nvcc() is None:
        pytest.skip("nvcc not found on PATH")
    sources = {p.name: libs_of(p.name) for p in build.CSRC.glob("*.cu")}
    missing = {src: build.toolchain_reason(libs) for src, libs in sources.items()}
    # A skipped compile test is no compile test: the test extra installs the cuBLAS/cuDNN headers.
    assert not any(missing.values()), missing
    base = tmp_path_factory.getbasetemp()
    # A worker's base is <session>/popen-gwN; without xdist the base is the session's own.
    out = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "hopper"
    # In parallel: nvcc is single-threaded and the cuBLAS/cuDNN sources take ~15 s each.
    with ThreadPoolExecutor(len(sources)) as pool:
        sos = pool.map(lambda kv: build.compile(kv[0], libs=kv[1], arch="sm_90a", out_dir=out),
                       sources.items())
        return dict(zip(sources, sos, strict=True))

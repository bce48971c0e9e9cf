"""Shared pytest helpers for the kvtier Python tests (keep small; add fixtures per area)."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

# Upper bound on any wait for asynchronous results: generous, so a slow shared CI machine
# does not fail; a hang still ends as a failure instead of a stuck run.
WAIT_SECONDS = 60.0


def _collect_results(tier, job_ids: Iterable[int], timeout: float = WAIT_SECONDS) -> dict:
    """Poll ``tier.get_finished()`` until every id in ``job_ids`` is reported.

    Returns ``{job_id: JobResult}``; fails the test if an id is reported twice, an unexpected
    id appears, or the deadline passes.
    """
    wanted = set(job_ids)
    results: dict = {}
    deadline = time.monotonic() + timeout
    while wanted - results.keys():
        for r in tier.get_finished():
            assert r.job_id not in results, f"job {r.job_id} reported twice"
            assert r.job_id in wanted, f"unexpected job {r.job_id} reported"
            results[r.job_id] = r
        if not wanted - results.keys():
            break
        assert time.monotonic() < deadline, f"jobs not finished: {wanted - results.keys()}"
        time.sleep(0.002)
    return results


@pytest.fixture
def collect_results() -> Callable[..., dict]:
    return _collect_results


FAULTS_DIR = Path(__file__).resolve().parent / "faults"


@pytest.fixture(scope="session")
def interposer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """faults/faultinject.c built as an LD_PRELOAD library (skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc/clang) to build the LD_PRELOAD fault injector")
    out = tmp_path_factory.mktemp("faultinject") / "faultinject.so"
    build = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out)]
        + [str(FAULTS_DIR / "faultinject.c"), "-ldl"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    return out


IO_ENGINES = ("psync", "io_uring")


def io_uring_refusal(directory: Path) -> str:
    """Why the native engine refuses io_engine="io_uring" in this process ("" if it accepts).

    The answer is the engine's own (the kernel's refusal: io_uring disabled by sysctl, blocked
    by seccomp, or a build without the io_uring engine), asked of a real engine.
    """
    from kvtier import _core

    directory.mkdir(parents=True, exist_ok=True)
    try:
        engine = _core.Engine(
            str(directory), n_read_threads=1, n_write_threads=0, io_engine="io_uring"
        )
    except OSError as e:
        return e.strerror or str(e)
    engine.shutdown()
    return ""


@pytest.fixture(scope="session")
def _io_uring_refusal(tmp_path_factory: pytest.TempPathFactory) -> str:
    return io_uring_refusal(tmp_path_factory.mktemp("io-uring-probe"))


@pytest.fixture(params=IO_ENGINES)
def io_engine(request: pytest.FixtureRequest, _io_uring_refusal: str) -> str:
    """Each I/O engine in turn; io_uring skips, with the engine's reason, where it is refused."""
    if request.param == "io_uring" and _io_uring_refusal:
        pytest.skip(f"io_uring refused here: {_io_uring_refusal}")
    return request.param

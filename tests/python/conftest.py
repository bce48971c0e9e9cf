"""Shared pytest helpers for the kvtier Python tests (keep small; add fixtures per area)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
from stallfs import make_stallfs, stallfs, stallfs_binary  # noqa: F401 (fixtures)
from uring_faults import seccomp_errno_lib, uring_enter_fault  # noqa: F401 (fixtures)

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


@pytest.fixture
def gated_env(interposer: Path) -> Callable[[Path], dict[str, str]]:
    """``env(gate)``: the environment of a child under the interposer's gate, where every open
    of a block (or block tmp) file waits until ``gate`` exists, holding a block operation in
    flight for as long as the test wants."""

    def env(gate: Path) -> dict[str, str]:
        return dict(
            os.environ,
            LD_PRELOAD=str(interposer),
            KVTIER_FAULT="open",
            KVTIER_FAULT_ERRNO="0",
            KVTIER_FAULT_MATCH=".kvb",
            KVTIER_FAULT_GATE=str(gate),
        )

    return env


IO_ENGINES = ("psync", "io_uring")


@pytest.fixture(scope="session")
def io_uring_refused(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Why the native engine refuses io_engine="io_uring" here ("" where it accepts it)."""
    from kvtier.tiering.fs.engine import io_uring_refusal

    return io_uring_refusal(tmp_path_factory.mktemp("io-uring-probe"))


# A seccomp filter that answers io_uring_setup (425 on every Linux architecture) with `code`,
# as container runtimes' default profiles do; every other system call is allowed.
_SECCOMP_IO_URING = textwrap.dedent(
    """
    import ctypes
    class Insn(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte),
                    ("jf", ctypes.c_ubyte), ("k", ctypes.c_uint)]
    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Insn))]
    insns = (Insn * 4)(
        Insn(0x20, 0, 0, 0),                   # ld [nr]
        Insn(0x15, 0, 1, 425),                 # jeq io_uring_setup, errno, allow
        Insn(0x06, 0, 0, 0x00050000 | {code}), # ret SECCOMP_RET_ERRNO | code
        Insn(0x06, 0, 0, 0x7FFF0000),          # ret SECCOMP_RET_ALLOW
    )
    prog = Prog(4, insns)
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(38, 1, 0, 0, 0) == 0                     # PR_SET_NO_NEW_PRIVS
    assert libc.prctl(22, 2, ctypes.byref(prog), 0, 0) == 0    # PR_SET_SECCOMP, FILTER
    """
)


@pytest.fixture
def seccomp_io_uring() -> Callable[[int], str]:
    """``prelude(code)``: Python source that, run first in a child process, makes the kernel
    refuse io_uring to it with errno ``code`` (a seccomp filter, as a container's profile
    does). Skips where seccomp does not exist."""
    if sys.platform != "linux":
        pytest.skip("seccomp is Linux only")
    return lambda code: _SECCOMP_IO_URING.format(code=code)


@pytest.fixture(params=IO_ENGINES)
def io_engine(request: pytest.FixtureRequest, io_uring_refused: str) -> str:
    """Each I/O engine in turn; io_uring skips, with the engine's reason, where it is refused."""
    if request.param == "io_uring" and io_uring_refused:
        pytest.skip(f"io_uring refused here: {io_uring_refused}")
    return request.param


@pytest.fixture
def tmpfs_mount(tmp_path: Path) -> Iterator[Path]:
    """A fresh tmpfs mounted at a directory of its own (root and mount(8) needed, else the
    test skips); detached at teardown if the test left it mounted. A test may unmount it
    itself, which is how the shutdown tests prove nothing holds the volume."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mnt)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        if os.path.ismount(mnt):
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)

"""Harness for io_uring_enter errors: a child process with an fs tier on the io_uring engine
whose io_uring_enter calls fail with a chosen errno once its rings are set up and used.

Fixture (registered by conftest.py): ``uring_enter_fault(err, times=None, blocks=4, ...)``
runs faults/uring_enter_child.py under a seccomp filter from faults/seccomp_errno.c and
returns an :class:`EnterFaultRun`: the exit status, the steps the child got through (warm-up,
armed, store, load, shutdown, done) and its output. ``times=None`` fails every call, an
integer only the first ``times`` calls. Skips where io_uring is refused or there is no C
compiler.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from faults.seccomp_errno import build

FAULTS = Path(__file__).resolve().parent / "faults"
CHILD = FAULTS / "uring_enter_child.py"
UNREPORTED_EXIT = 3  # uring_enter_child.py: a job was not reported within job_timeout


@dataclass(frozen=True)
class EnterFaultRun:
    returncode: int | None  # None: killed after the harness's timeout (it hung)
    events: dict[str, dict] = field(default_factory=dict)  # by event name, in order
    stdout: str = ""
    stderr: str = ""

    @property
    def signal(self) -> int | None:
        """The signal that ended the child (SIGABRT for std::abort), if one did."""
        if self.returncode is not None and self.returncode < 0:
            return -self.returncode
        return None

    @property
    def exit_status(self) -> int | None:
        """The status as a shell reports it: 128 + signal for a signal (134: SIGABRT)."""
        if self.returncode is None:
            return None
        return 128 + self.signal if self.signal else self.returncode

    def describe(self) -> str:
        return (
            f"exit status {self.exit_status}, steps {list(self.events)}\n"
            f"stdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-3000:]}"
        )


def run_enter_fault(
    lib: Path,
    root: Path,
    err: int,
    times: int | None = None,
    *,
    blocks: int = 4,
    row_bytes: int = 12_000,
    job_timeout: float = 30.0,
    timeout: float = 120.0,
    arm_before: str = "store",
    options: dict | None = None,
) -> EnterFaultRun:
    """Runs the child: ``err`` from io_uring_enter (the first ``times`` calls, or always)
    from just before the store (``arm_before="store"``) or the load (``"load"``) of
    ``blocks`` blocks; ``options`` are more fs tier options. A job not reported within
    ``job_timeout`` ends the child with status 3 (event "unreported"); a child still running
    after ``timeout`` is killed (``returncode`` None)."""
    spec = {
        "lib": str(lib),
        "root": str(root),
        "errno": err,
        "times": times,
        "blocks": blocks,
        "row_bytes": row_bytes,
        "job_timeout": job_timeout,
        "arm_before": arm_before,
        "options": options or {},
    }
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, errs = proc.communicate(timeout=timeout)
        returncode: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, errs = proc.communicate()
        returncode = None
    events: dict[str, dict] = {}
    for line in out.splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            events[record.pop("event")] = record
    return EnterFaultRun(returncode, events, out, errs)


@pytest.fixture(scope="session")
def seccomp_errno_lib(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """faults/seccomp_errno.c built as a shared library (skips without a C compiler)."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc/gcc/clang) to build faults/seccomp_errno.c")
    return build(tmp_path_factory.mktemp("seccomp-errno"), cc)


@pytest.fixture
def uring_enter_fault(
    seccomp_errno_lib: Path, io_uring_refused: str, tmp_path: Path
) -> Callable[..., EnterFaultRun]:
    """``run(err, times=None, **kw) -> EnterFaultRun`` (see :func:`run_enter_fault`)."""
    if sys.platform != "linux":
        pytest.skip("seccomp is Linux only")
    if io_uring_refused:
        pytest.skip(f"io_uring refused here: {io_uring_refused}")
    runs = iter(range(1_000_000))

    def run(err: int, times: int | None = None, **kw) -> EnterFaultRun:
        return run_enter_fault(seccomp_errno_lib, tmp_path / f"root{next(runs)}", err, times, **kw)

    return run

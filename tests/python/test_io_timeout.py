"""I/O deadlines of the native engine (``io_timeout_s``) over a real stall: a stallfs FUSE
mount frozen under the engine's root. Jobs whose block operations are stuck in the kernel are
reported with ETIMEDOUT, ``shutdown()`` and interpreter exit return with workers still stuck,
and nothing is written into a reported job's memory when the mount thaws late. Time the
process is stopped (SIGSTOP) with a job in the kernel does not count against its deadline.

The waits are hang guards (a frozen operation never returns by itself), never timing checks.
"""

from __future__ import annotations

import errno
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import job_control
import numpy as np
import pytest
from kvtier import _core
from kvtier.errors import InvalidArgumentError
from stallfs import WAIT_SECONDS, StallFS

BLOCK = 64 * 1024
CANARY = 0xC5
TIMEOUT = 0.5  # io_timeout_s of these engines


def test_io_timeout_s_default_range_and_refusals(tmp_path: Path) -> None:
    assert _core.ENGINE_DEFAULTS["io_timeout_s"] == 10.0
    lo, hi = _core.ENGINE_LIMITS["io_timeout_s"]
    assert lo == 0.0 and hi >= 3600.0
    base = {"n_read_threads": 1, "n_write_threads": 1, "io_engine": "psync"}
    for bad in (-0.5, math.nan, math.inf, hi * 2):
        with pytest.raises(InvalidArgumentError, match="io_timeout_s"):
            _core.Engine(str(tmp_path / "root"), **base, io_timeout_s=bad)
    for good in (lo, 0.25, hi):
        _core.Engine(str(tmp_path / "root"), **base, io_timeout_s=good).shutdown()
    stats = _core.Engine(str(tmp_path / "root"), **base).stats()
    for key in (
        "io_timeouts",
        "abandoned_ops",
        "workers_replaced",
        "workers_stuck",
        "watchdog_pauses",
    ):
        assert stats[key] == 0, key


def _engine(root: Path, io_engine: str, **kwargs) -> _core.Engine:
    if (
        io_engine == "io_uring"
        and _core.Engine(str(root), io_engine="auto").io_engine != "io_uring"
    ):
        pytest.skip("the kernel refuses io_uring here")
    options = {"n_read_threads": 1, "n_write_threads": 1, "o_direct": False}
    return _core.Engine(
        str(root), io_engine=io_engine, io_timeout_s=TIMEOUT, **{**options, **kwargs}
    )


def _pop(engine: _core.Engine, n: int) -> list[_core.Completion]:
    done: list[_core.Completion] = []
    deadline = time.monotonic() + WAIT_SECONDS
    while len(done) < n:
        assert time.monotonic() < deadline, f"{len(done)} of {n} jobs reported"
        done += engine.pop_completions()
        time.sleep(0.01)
    return done


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT_SECONDS
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _bounded(fn, what: str) -> None:
    """Runs ``fn`` on a thread and fails if it has not returned within the hang guard."""
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(WAIT_SECONDS)
    assert not t.is_alive(), f"{what} did not return with the mount frozen"


def _block(path: Path, buf: np.ndarray) -> tuple[str, bytes, int, int]:
    return (str(path), b"k", buf.ctypes.data, buf.nbytes)


@pytest.mark.parametrize("io_engine", ["psync", "io_uring"])
def test_frozen_mount_jobs_time_out_and_memory_is_untouched(
    stallfs: StallFS, io_engine: str
) -> None:
    root = stallfs.mountpoint / "root"
    engine = _engine(root, io_engine)
    payload = np.frombuffer(np.random.default_rng(1).bytes(BLOCK), dtype=np.uint8).copy()
    engine.submit_store(1, [_block(root / "a", payload)])
    (stored,) = _pop(engine, 1)
    assert stored.success, stored.error

    stallfs.freeze()
    target = np.full(BLOCK, CANARY, dtype=np.uint8)
    source = payload.copy()
    engine.submit_load(2, [_block(root / "a", target)])
    engine.submit_store(3, [_block(root / "b", source)])
    stallfs.wait_blocked(1)
    done = {c.job_id: c for c in _pop(engine, 2)}
    for job_id, path in ((2, root / "a"), (3, root / "b")):
        c = done[job_id]
        assert not c.success
        assert c.block_errnos == [errno.ETIMEDOUT]
        assert c.errno == errno.ETIMEDOUT
        assert c.path == str(path)
        assert "io_timeout_s" in c.message
    stats = engine.stats()
    assert stats["io_timeouts"] == 2
    assert stats["workers_stuck"] >= 1 and stats["abandoned_ops"] >= 1
    # The caller reuses both buffers at once, as an engine reuses its slots.
    source[:] = 0xAB
    _bounded(engine.shutdown, "shutdown()")
    assert engine.stats()["workers_stuck"] >= 1  # shutdown did not wait for the kernel

    stallfs.thaw()
    _wait(lambda: engine.stats()["workers_stuck"] == 0, "the abandoned workers returned")
    assert engine.stats()["abandoned_ops"] == 0
    assert (target == CANARY).all(), "a late read wrote into a reported job's memory"


def test_other_jobs_complete_on_a_replacement_worker(make_stallfs, tmp_path: Path) -> None:
    """One worker, stuck on a frozen mount: the next job (on another root) runs on its
    replacement."""
    frozen = make_stallfs()
    engine = _core.Engine(
        str(frozen.mountpoint / "root"),
        n_read_threads=1,
        n_write_threads=0,
        io_engine="psync",
        o_direct=False,
        io_timeout_s=TIMEOUT,
    )
    healthy = frozen.mountpoint / "root" / "healthy"
    payload = np.arange(BLOCK, dtype=np.uint8)
    engine.submit_store(1, [_block(healthy, payload)])
    assert _pop(engine, 1)[0].success
    frozen.match("stuck")
    frozen.freeze()
    target = np.full(BLOCK, CANARY, dtype=np.uint8)
    engine.submit_load(2, [_block(frozen.mountpoint / "root" / "stuck", target)])
    (timed_out,) = _pop(engine, 1)
    assert timed_out.block_errnos == [errno.ETIMEDOUT]
    out = np.zeros(BLOCK, dtype=np.uint8)
    engine.submit_load(3, [_block(healthy, out)])
    (loaded,) = _pop(engine, 1)
    assert loaded.success, loaded.error
    assert (out == payload).all()
    assert engine.stats()["workers_replaced"] == 1
    frozen.thaw()
    _wait(lambda: engine.stats()["workers_stuck"] == 0, "the abandoned worker returned")
    engine.shutdown()
    assert (target == CANARY).all()


CHILD = textwrap.dedent(
    """
    import atexit, sys, time
    # Registered before kvtier's own exit hook, so it runs after it (atexit is last in, first
    # out): once it prints, every engine has been shut down.
    atexit.register(lambda: print("shut down", flush=True))
    import numpy as np
    from kvtier import _core
    root, io_timeout = sys.argv[1], float(sys.argv[2])
    engine = _core.Engine(root, n_read_threads=1, n_write_threads=1, io_engine="psync",
                          o_direct=False, io_timeout_s=io_timeout)
    buf = np.zeros(65536, dtype=np.uint8)
    engine.submit_store(1, [(root + "/c", b"k", buf.ctypes.data, buf.nbytes)])
    while not engine.pop_completions():
        time.sleep(0.01)
    print("reported", engine.stats()["workers_stuck"], flush=True)
    # Exit with the engine alive and its worker stuck in the kernel.
    """
)


def _read_line(proc: subprocess.Popen[str]) -> str:
    """The child's next line of output, or "" if none comes within the hang guard."""
    line: list[str] = []
    assert proc.stdout is not None
    out = proc.stdout
    reader = threading.Thread(target=lambda: line.append(out.readline()), daemon=True)
    reader.start()
    reader.join(WAIT_SECONDS)
    return line[0] if line else ""


def _thaw_and_reap(stallfs: StallFS, proc: subprocess.Popen[str]) -> str:
    """Thaws the mount, reaps the child (killed past the hang guard), returns its stderr."""
    try:
        stallfs.thaw_and_reap(proc, WAIT_SECONDS)
    finally:
        _, err = proc.communicate()
    return err


def test_interpreter_exit_with_the_mount_still_frozen(stallfs: StallFS) -> None:
    """Interpreter exit shuts the engine down and finishes with a worker still stuck. The
    process itself ends only when the mount thaws: a thread inside a FUSE request the daemon
    has taken cannot be killed (the kernel waits for the answer), kvtier or not."""
    root = stallfs.mountpoint / "root"
    root.mkdir()
    stallfs.freeze("data")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(root), str(TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _read_line(proc) == "reported 1\n"
        assert _read_line(proc) == "shut down\n", "interpreter exit did not get past shutdown"
        assert stallfs.status()["blocked"] >= 1  # with the write still frozen
    finally:
        err = _thaw_and_reap(stallfs, proc)
    assert proc.returncode == 0, err


PAUSED_TIMEOUT = 2.0  # io_timeout_s of the stopped child: long enough to SIGSTOP it in time

PAUSED_CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from kvtier import _core
    root, io_engine, io_timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    engine = _core.Engine(root, n_read_threads=1, n_write_threads=1, io_engine=io_engine,
                          o_direct=False, io_timeout_s=io_timeout)
    payload = np.frombuffer(np.random.default_rng(7).bytes(65536), dtype=np.uint8).copy()
    def run(job_id, submit, buf):
        submit(job_id, [(root + "/paused", b"k", buf.ctypes.data, buf.nbytes)])
        done = []
        while not done:
            done = engine.pop_completions()
            time.sleep(0.01)
        return done[0]
    print("submitting", flush=True)
    stored = run(1, engine.submit_store, payload)
    report = {"stored": stored.success, "errnos": stored.block_errnos}
    if stored.success:
        back = np.zeros_like(payload)
        loaded = run(2, engine.submit_load, back)
        report["loaded"] = loaded.success and bool((back == payload).all())
    s = engine.stats()
    report.update(pauses=s["watchdog_pauses"], timeouts=s["io_timeouts"])
    print(json.dumps(report), flush=True)
    """
)


@pytest.mark.parametrize(
    ("io_engine", "mount_answers_first"),
    [("psync", True), ("io_uring", True), ("psync", False)],
    ids=["psync-answered", "io_uring-answered", "psync-still-frozen"],
)
def test_time_the_process_is_stopped_does_not_count_against_its_deadline(
    stallfs: StallFS, io_engine: str, mount_answers_first: bool
) -> None:
    """A process SIGSTOPped (as by a cgroup freezer or `docker pause`) for longer than
    io_timeout_s with a store inside the kernel: once it runs again, the store is judged by the
    time it ran, not by the clock. A mount that answered meanwhile costs no ETIMEDOUT and
    leaves the root healthy; one still frozen is timed out as before."""
    if (
        io_engine == "io_uring"
        and _core.Engine(str(stallfs.backing / "probe"), io_engine="auto").io_engine != "io_uring"
    ):
        pytest.skip("the kernel refuses io_uring here")
    root = stallfs.mountpoint / "root"
    root.mkdir()
    stallfs.freeze("data")
    proc = subprocess.Popen(
        [sys.executable, "-c", PAUSED_CHILD, str(root), io_engine, str(PAUSED_TIMEOUT)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert _read_line(proc) == "submitting\n"
        stallfs.wait_blocked(1)  # the store's write is inside the kernel
        job_control.stop(proc.pid)
        time.sleep(2 * PAUSED_TIMEOUT)  # its deadline passes while nothing of it runs
        if mount_answers_first:
            stallfs.thaw()
            time.sleep(0.2)  # the daemon answered; the write returns once the process runs
        os.kill(proc.pid, signal.SIGCONT)
        line = _read_line(proc)
    finally:
        os.kill(proc.pid, signal.SIGCONT)
        err = _thaw_and_reap(stallfs, proc)
    assert line, f"the child reported nothing: {err[-3000:]}"
    report = json.loads(line)
    if mount_answers_first:
        # No pause need be counted here: after SIGCONT the worker may return from the write
        # and finish the batch before the watchdog wakes, and a pause with nothing under a
        # deadline credits nothing (Scheduler::credit_pause). Most often the watchdog wakes
        # first; the code before the credit then timed the store out.
        assert report == {**report, "stored": True, "loaded": True, "timeouts": 0}, report
    else:
        assert report["pauses"] >= 1, report  # the store was still in the kernel: credited
        assert report["errnos"] == [errno.ETIMEDOUT] and report["timeouts"] == 1, report
    assert proc.returncode == 0, err

"""Teardown and lookups of an fs tier whose every thread is stuck in the kernel (issue 19):
``shutdown()``, ``drain_jobs()`` and interpreter exit return with the stallfs mount frozen
under the engine, the lookup resolver and the capacity thread, and lookups with or without
``async_lookup`` answer "absent" once a check has not answered by the deadline
(docs/tiers.md, "When storage stalls").

Real stalls: stallfs (tests/stallfs) blocks the frozen operations in the kernel's FUSE request
wait. The waits are hang guards (a frozen operation never returns by itself), never timing
checks: each test fails where the code under test waits for the storage.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hang_guard import expect_line, guarded, prompt
from kvtier import _core
from kvtier.tiering.base import JobMetadata, JobResult, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity.sizes import block_file_bytes
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec
from stallfs import WAIT_SECONDS, StallFS

ROW = 8192
ROWS = 64
FILE = block_file_bytes(ROW)
CTX = ReqContext("req-teardown")
SPEC = OffloadingSpec(model_name="teardown-test", dtype="bfloat16")
TIMEOUT = 0.5  # io_timeout_s: short, so frozen operations are abandoned quickly

pytestmark = pytest.mark.skipif(
    "io_timeout_s" not in _core.ENGINE_DEFAULTS,
    reason="the native core has no io_timeout_s (issue 19, core part)",
)


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _job(job_id: int, keys: list[bytes], rows: list[int]) -> JobMetadata:
    return JobMetadata(job_id, keys, np.array(rows, dtype=np.int64), False, CTX)


def _tier(root: Path, **options: Any) -> FileSystemTierManager:
    buf = np.zeros((ROWS, ROW), dtype=np.uint8)
    for r in range(ROWS):
        buf[r, :] = r % 251
    opts: dict[str, Any] = {
        "root_dir": str(root),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_timeout_s": TIMEOUT,
        **options,
    }
    return FileSystemTierManager(SPEC, memoryview(buf), "fs", **opts)


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _collect(tier: FileSystemTierManager, wanted: set[int]) -> dict[int, JobResult]:
    results: dict[int, JobResult] = {}
    deadline = time.monotonic() + WAIT_SECONDS
    while wanted - results.keys():
        for r in tier.get_finished():
            assert r.job_id not in results, f"job {r.job_id} reported twice"
            results[r.job_id] = r
        assert time.monotonic() < deadline, f"jobs never reported: {wanted - results.keys()}"
        time.sleep(0.005)
    return results


def _alive(prefix: str) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(prefix) and t.is_alive()]


def _in_kernel(thread: threading.Thread) -> bool:
    """Whether ``thread`` waits in the kernel for the FUSE daemon's answer (its kernel stack,
    which root may read): how a test knows a kvtier thread really is stuck on the mount."""
    try:
        stack = Path(f"/proc/self/task/{thread.native_id}/stack").read_text()
    except OSError:
        return False
    return "request_wait_answer" in stack or "fuse_" in stack


def _writer_locks_free(root: Path) -> bool:
    """Whether no writer lock under ``root``'s ledger is held (every tier released its own)."""
    writers = root / ".kvtier" / "writers"
    for lock in writers.glob("*.lock"):
        fd = os.open(lock, os.O_RDWR)
        try:
            probe = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
            got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, probe)
            if struct.unpack("hhqqi", got)[0] != fcntl.F_UNLCK:
                return False
        finally:
            os.close(fd)
    return True


@pytest.mark.parametrize("io_engine", ["psync", "auto"])
def test_shutdown_returns_with_engine_resolver_and_capacity_thread_stuck(
    stallfs: StallFS, io_engine: str
) -> None:
    """Stores queued behind a stuck one, lookups queued behind a stuck check, the capacity
    thread stuck in its tick: shutdown() returns, leaving the stuck threads alive (it did
    not wait for them), every job is reported, and after the thaw each thread finishes its
    own work on its own (the writer lock is released, nothing was freed under it)."""
    root = stallfs.mountpoint / "root"
    tier = _tier(root, async_lookup=True, io_engine=io_engine)
    assert guarded(tier.drain_jobs, "drain_jobs") is None
    resolver = _alive("kvtier-lookup")
    capacity = _alive("kvtier-capacity")
    assert len(resolver) == 1 and len(capacity) == 1
    stallfs.freeze("all")
    jobs = list(range(1, 6))
    for j in jobs:
        tier.submit_store(_job(j, [_key(j)], [j]))
    for i in range(100, 110):
        assert tier.lookup(_key(i), CTX) is None  # queued for the resolver
    # Each of them is in the kernel on the frozen mount (the capacity thread's tick comes
    # within a second; a store's poke may wake it sooner).
    _wait_for("the resolver stuck", lambda: _in_kernel(resolver[0]))
    _wait_for("the capacity thread stuck", lambda: _in_kernel(capacity[0]))
    guarded(tier.shutdown, "shutdown with every thread stuck")
    assert resolver[0].is_alive() and capacity[0].is_alive()  # not waited for
    results = _collect(tier, set(jobs))
    assert all(not r.success for r in results.values())
    assert any(f"errno {errno.ETIMEDOUT}" in (r.error or "") for r in results.values())
    stallfs.thaw()
    # Back from the kernel, the threads finish what they were doing and exit by themselves.
    _wait_for("the resolver exited", lambda: not resolver[0].is_alive())
    _wait_for("the capacity thread exited", lambda: not capacity[0].is_alive())
    assert _writer_locks_free(stallfs.backing / "root")


def test_drain_returns_with_engine_resolver_and_capacity_thread_stuck(stallfs: StallFS) -> None:
    """drain_jobs() with stores stuck in the engine (as many as it can replace workers for:
    docs/tiers.md, "drain_jobs()") and lookups queued behind a stuck check returns once the
    stores met their deadline, without waiting for the resolver or the capacity thread."""
    root = stallfs.mountpoint / "root"
    tier = _tier(root, async_lookup=True)
    resolver = _alive("kvtier-lookup")
    capacity = _alive("kvtier-capacity")
    try:
        stallfs.freeze("all")
        for i in range(100, 110):
            assert tier.lookup(_key(i), CTX) is None
        _wait_for("the resolver stuck", lambda: _in_kernel(resolver[0]))
        _wait_for("the capacity thread stuck", lambda: _in_kernel(capacity[0]))
        tier.submit_store(_job(1, [_key(1)], [1]))
        tier.submit_store(_job(2, [_key(2)], [2]))
        guarded(tier.drain_jobs, "drain_jobs with every thread stuck")
        results = {r.job_id: r for r in tier.get_finished()}  # drained: ready at once
        assert set(results) == {1, 2}
        for r in results.values():
            assert not r.success and f"errno {errno.ETIMEDOUT}" in (r.error or ""), r.error
        assert resolver[0].is_alive() and capacity[0].is_alive()
        assert tier.lookup(_key(100), CTX) is False  # degraded by the stores' timeouts
    finally:
        guarded(tier.shutdown, "shutdown")
        stallfs.thaw()
    _wait_for("the capacity thread exited", lambda: not capacity[0].is_alive())


def test_drain_returns_with_more_jobs_queued_than_workers_can_be_replaced(
    stallfs: StallFS,
) -> None:
    """Five stores and five loads queued on a frozen mount with 1 + 1 workers: past the
    engine's replacement cap they would wait for a stuck worker to return. The first timeout
    degrades the root, and the engine fails every block it has not started, so drain_jobs()
    returns with every job reported. A failed load never runs later: after the thaw, once the
    stuck workers returned, the rows it was to fill are untouched."""
    root = stallfs.mountpoint / "root"
    buf = np.zeros((ROWS, ROW), dtype=np.uint8)
    for r in range(ROWS):
        buf[r, :] = r % 251
    tier = FileSystemTierManager(
        SPEC,
        memoryview(buf),
        "fs",
        root_dir=str(root),
        n_read_threads=1,
        n_write_threads=1,
        io_timeout_s=TIMEOUT,
    )
    try:
        # Files for the loads, written from rows 40..44 while the mount answers.
        present = [_key(40 + i) for i in range(5)]
        tier.submit_store(_job(100, present, [40 + i for i in range(5)]))
        assert _collect(tier, {100})[100].success
        stallfs.freeze("all")
        stores, loads = list(range(1, 6)), list(range(11, 16))
        for j in stores:
            tier.submit_store(_job(j, [_key(j)], [j]))
        for i, j in enumerate(loads):  # into rows 20..24, which hold other bytes
            tier.submit_load(_job(j, [present[i]], [20 + i]))
        guarded(tier.drain_jobs, "drain_jobs with more jobs queued than workers replaced")
        results = {r.job_id: r for r in tier.get_finished()}  # drained: ready at once
        assert set(results) == set(stores + loads)
        for r in results.values():
            assert not r.success and f"errno {errno.ETIMEDOUT}" in (r.error or ""), r.error
        assert all(results[j].successful_keys == [] for j in loads)
        assert tier.health == "degraded"
    finally:
        stallfs.thaw()
    # Back from the kernel, the abandoned workers exit; nothing failed is left to run.
    _wait_for("the stuck workers returned", lambda: tier.stats()["workers_stuck"] == 0)
    guarded(tier.shutdown, "shutdown")
    assert tier.stats()["queued_loads"] == tier.stats()["queued_stores"] == 0
    for i in range(5):
        assert (buf[20 + i] == 20 + i).all(), f"row {20 + i} written after its load was reported"


def test_drain_answers_stores_waiting_for_budget_when_the_capacity_thread_is_stuck(
    stallfs: StallFS,
) -> None:
    """A store waiting for budget is answered by the capacity thread; with that thread
    stuck in the kernel, drain_jobs() (and get_finished) answer it instead once the root
    is degraded, rather than wait for the thread for ever."""
    root = stallfs.mountpoint / "root"
    # A chunk of one block file: a store of several blocks always waits for a top-up.
    tier = _tier(root, max_bytes=64 * FILE)
    present = _key(1)
    tier.submit_store(_job(1, [present], [1]))
    assert _collect(tier, {1})[1].success
    capacity = _alive("kvtier-capacity")
    assert len(capacity) == 1
    stallfs.freeze("all")
    _wait_for("the capacity thread stuck", lambda: _in_kernel(capacity[0]))
    waiting = 2
    tier.submit_store(_job(waiting, [_key(k) for k in range(10, 50)], list(range(10, 50))))
    load = 3
    tier.submit_load(_job(load, [present], [2]))  # its timeout degrades the root
    guarded(tier.drain_jobs, "drain_jobs with the capacity thread stuck")
    results = _collect(tier, {waiting, load})
    assert f"errno {errno.ETIMEDOUT}" in (results[load].error or "")
    assert not results[waiting].success
    assert "is degraded" in (results[waiting].error or ""), results[waiting].error
    assert capacity[0].is_alive()  # still stuck: drain did not wait for it
    guarded(tier.shutdown, "shutdown")
    stallfs.thaw()
    _wait_for("the capacity thread exited", lambda: not capacity[0].is_alive())


def test_interpreter_exit_returns_with_an_eviction_stuck_in_the_kernel(
    stallfs: StallFS, tmp_path: Path
) -> None:
    """An eviction's unlinks run on a pool of threads; with one of them stuck in unlink on
    the frozen mount, interpreter exit still gets to its end (concurrent.futures' pools are
    joined at exit, for ever if a thread never returns; kvtier's unlinkers are not). Stores
    and lookups are queued too, with the mount frozen."""
    root = stallfs.mountpoint / "child"
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, sys, threading, time
            # Registered first, so it runs last: after kvtier's own exit handlers.
            atexit.register(lambda: print("exit-done", flush=True))
            import numpy as np
            from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
            from kvtier.tiering.fs.manager import FileSystemTierManager
            from kvtier.tiering.spec import OffloadingSpec

            buf = np.zeros((64, {ROW}), dtype=np.uint8)
            tier = FileSystemTierManager(
                OffloadingSpec(model_name="teardown-test", dtype="bfloat16"),
                memoryview(buf), "fs", root_dir={str(root)!r}, n_read_threads=1,
                n_write_threads=1, io_timeout_s={TIMEOUT}, max_bytes={32 * FILE},
                min_free_fraction=0, async_lookup=True,
            )
            ids = iter(range(1, 1 << 30))
            key = lambda i: make_offload_key(i.to_bytes(32, "big"), 0)

            def store(first, n):
                job = next(ids)
                keys = [key(first + i) for i in range(n)]
                tier.submit_store(JobMetadata(job, keys, np.arange(n), False, ReqContext("r")))
                return job

            def drain():
                tier.drain_jobs()
                tier.get_finished()

            # Fill past the high watermark once: the pass scans and evicts (its candidates
            # serve the next pass without a scan).
            for i in range(0, 40, 4):
                store(i, 4)
                drain()
            deadline = time.monotonic() + 60
            while tier.stats()["evicted_blocks"] == 0:
                assert time.monotonic() < deadline, "no eviction"
                time.sleep(0.01)
            print("ready", flush=True)
            sys.stdin.readline()  # the parent froze unlinks of block files
            for i in range(100, 140, 4):  # the next pass unlinks: stuck in the kernel
                store(i, 4)
            for i in range(1000, 1010):
                tier.lookup(key(i), None)

            def unlinker_stuck():
                for t in threading.enumerate():
                    if t.name.startswith("kvtier-evict"):
                        try:
                            with open(f"/proc/self/task/{{t.native_id}}/stack") as f:
                                if "fuse" in f.read():
                                    return True
                        except OSError:
                            pass
                return False

            deadline = time.monotonic() + 60
            while not unlinker_stuck():
                assert time.monotonic() < deadline, "no unlink thread stuck in the kernel"
                time.sleep(0.01)
            print("submitted", flush=True)
            sys.stdin.readline()  # the parent saw an unlink blocked
            """
        )
    )
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        expect_line(child, "ready\n", "the child filling its budget")
        # Only unlinks of block files freeze: the stores' writes and the scan go on.
        stallfs.match(".kvb")
        stallfs.freeze("meta")
        prompt(child)
        expect_line(child, "submitted\n", "the child's unlink stuck")
        prompt(child)
        expect_line(child, "exit-done\n", "interpreter exit with an unlink stuck")
    finally:
        stallfs.thaw_and_reap(child, WAIT_SECONDS)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""


def test_synchronous_lookup_on_a_frozen_mount_answers_absent_by_the_deadline(
    stallfs: StallFS,
) -> None:
    """With async_lookup=false the existence check of a key this process does not know runs
    off the caller's thread: with the mount frozen the caller gets False by the deadline,
    the root is degraded by it, and later lookups answer False without touching the
    storage (no second check joins the stuck one)."""
    root = stallfs.mountpoint / "root"
    writer = _tier(root)
    reader = _tier(root, async_lookup=False)  # another instance: it knows none of the blocks
    try:
        keys = [_key(1), _key(2)]
        writer.submit_store(_job(1, keys, [1, 2]))
        assert _collect(writer, {1})[1].success
        assert reader.lookup(_key(3), CTX) is False  # checked, absent
        stallfs.match(".kvb")  # only lookups of the block files freeze
        stallfs.freeze("meta")
        assert guarded(lambda: reader.lookup(keys[0], CTX), "lookup, mount frozen") is False
        stats = reader.stats()
        assert stats["lookup_timeouts"] == 1
        assert stats["health"] == "degraded"
        checker = _alive("kvtier-lookup-check")
        assert len(checker) == 1 and _in_kernel(checker[0])  # abandoned there, not waited for
        # Degraded: answered at once; no new check is started beside the stuck one.
        assert guarded(lambda: reader.lookup(keys[1], CTX), "lookup, degraded") is False
        assert reader.stats()["degraded_lookups"] == 1
        assert stallfs.status()["blocked"] == 1
        stallfs.thaw()
        _wait_for("the root recovered", lambda: reader.health == "healthy")
        _wait_for("the stuck check returned", lambda: not checker[0].is_alive())
        assert reader.lookup(keys[0], CTX) is True
        assert reader.lookup(keys[1], CTX) is True
    finally:
        guarded(writer.shutdown, "shutdown")
        guarded(reader.shutdown, "shutdown")


def test_asynchronous_lookup_on_a_frozen_mount_stops_answering_unknown(
    stallfs: StallFS,
) -> None:
    """With async_lookup=true a lookup answers None (not known yet) while its check runs;
    a check stuck past the deadline degrades the root, so lookups answer False instead of
    None for as long as the storage does not answer."""
    root = stallfs.mountpoint / "root"
    writer = _tier(root)
    reader = _tier(root, async_lookup=True)
    try:
        key = _key(1)
        writer.submit_store(_job(1, [key], [1]))
        assert _collect(writer, {1})[1].success
        stallfs.match(".kvb")
        stallfs.freeze("meta")
        assert reader.lookup(key, CTX) is None
        stallfs.wait_blocked(1)

        def answered() -> bool:
            return guarded(lambda: reader.lookup(key, CTX), "lookup") is False

        _wait_for("a lookup answered absent", answered)
        stats = reader.stats()
        assert stats["health"] == "degraded" and stats["lookup_timeouts"] == 1
        stallfs.thaw()
        _wait_for("the root recovered", lambda: reader.health == "healthy")
        _wait_for("the key resolved", lambda: reader.lookup(key, CTX) is True)
    finally:
        guarded(writer.shutdown, "shutdown")
        guarded(reader.shutdown, "shutdown")


def test_close_failures_of_the_ledger_are_counted_never_raised(stallfs: StallFS) -> None:
    """close(2) of the writer and evictor lock descriptors fails with EIO (a FUSE or
    network file system reports a failed flush there): the capacity thread goes on (its
    evictions included), shutdown() does not raise, one warning is logged, each failure
    is counted, and the lock is released all the same."""
    import logging

    root = stallfs.mountpoint / "root"
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep(logging.WARNING)
    logging.getLogger("kvtier").addHandler(handler)
    try:
        tier = _tier(root, max_bytes=24 * FILE, min_free_fraction=0)
        stallfs.match(".lock")  # the writer and evictor locks; flush is a "data" operation
        stallfs.fail(errno.EIO, "data")
        for j in range(1, 11):  # 40 blocks into a budget of 24: evictions, passes, locks
            keys = [_key(4 * j + i) for i in range(4)]
            tier.submit_store(_job(j, keys, list(range(4))))
            tier.drain_jobs()
        _wait_for("an eviction", lambda: tier.stats()["evicted_blocks"] > 0)
        _wait_for("an evictor lock closed", lambda: tier.stats()["ledger_close_failures"] > 0)
        results = {r.job_id for r in tier.get_finished()}
        assert results == set(range(1, 11))
        before = tier.stats()["ledger_close_failures"]
        guarded(tier.shutdown, "shutdown with close(2) failing")
        assert tier.stats()["ledger_close_failures"] > before  # the writer lock's close
    finally:
        logging.getLogger("kvtier").removeHandler(handler)
        stallfs.fail(0)
    assert _writer_locks_free(stallfs.backing / "root")
    warnings = [r.getMessage() for r in records if "Closing" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "Input/output error" in warnings[0] and ".lock" in warnings[0]
    assert not [r for r in records if "bookkeeping" in r.getMessage()]
    assert not [r for r in records if "closing the capacity budget failed" in r.getMessage()]


def test_gpu_storage_transfer_shutdown_returns_with_its_capacity_thread_stuck(
    stallfs: StallFS,
) -> None:
    """GPUStorageTransfer's teardown is bounded like the fs tier's: with the mount frozen
    under its capacity thread and a store in the kernel, shutdown() returns, its job is
    reported, the stuck thread is left alive (not waited for), and it ends on its own after
    the thaw, releasing its writer lock."""
    torch = pytest.importorskip("torch")
    from kvtier.gpu import GPUStorageTransfer

    root = stallfs.mountpoint / "root"
    kv = [torch.zeros((8, ROW), dtype=torch.uint8)]
    before = set(_alive("kvtier-capacity"))
    transfer = GPUStorageTransfer(
        kv, SPEC, str(root), 0, n_read_threads=1, n_write_threads=1, io_timeout_s=TIMEOUT
    )
    capacity = [t for t in _alive("kvtier-capacity") if t not in before]
    assert len(capacity) == 1
    stallfs.freeze("all")
    transfer.store(1, [0], [_key(1)])
    _wait_for("the capacity thread stuck", lambda: _in_kernel(capacity[0]))
    guarded(transfer.shutdown, "shutdown with the capacity thread stuck")
    assert capacity[0].is_alive()  # not waited for
    results: dict[int, Any] = {}
    deadline = time.monotonic() + WAIT_SECONDS
    while 1 not in results:
        results.update({r.job_id: r for r in transfer.get_finished()})
        assert time.monotonic() < deadline, "the store was never reported"
        time.sleep(0.005)
    assert not results[1].success
    stallfs.thaw()
    _wait_for("the capacity thread exited", lambda: not capacity[0].is_alive())
    assert _writer_locks_free(stallfs.backing / "root")


def test_gpu_storage_transfer_drain_returns_with_more_jobs_queued_than_workers_can_be_replaced(
    stallfs: StallFS,
) -> None:
    """GPUStorageTransfer.drain() collects while it waits, like the fs tier's drain_jobs():
    the first timeout degrades the root and the engine fails what it has not started, so
    drain() returns on a frozen mount with 5 stores and 5 loads queued behind 1 + 1 workers
    (before, it waited in the engine for stuck workers). Every job is then handed out by
    get_finished() exactly once, and a failed load never writes its block after the thaw."""
    torch = pytest.importorskip("torch")
    from kvtier.gpu import GPUStorageTransfer

    root = stallfs.mountpoint / "root"
    kv = [torch.zeros((ROWS, ROW), dtype=torch.uint8)]
    for r in range(ROWS):
        kv[0][r, :] = r % 251
    transfer = GPUStorageTransfer(
        kv, SPEC, str(root), 0, n_read_threads=1, n_write_threads=1, io_timeout_s=TIMEOUT
    )
    try:
        present = [_key(40 + i) for i in range(5)]
        transfer.store(100, [40 + i for i in range(5)], present)
        transfer.drain()
        assert [r.success for r in transfer.get_finished()] == [True]
        stallfs.freeze("all")
        stores, loads = list(range(1, 6)), list(range(11, 16))
        for j in stores:
            transfer.store(j, [j], [_key(j)])
        for i, j in enumerate(loads):  # into blocks 20..24, which hold other bytes
            transfer.load(j, [20 + i], [present[i]])
        guarded(transfer.drain, "GPUStorageTransfer.drain with more jobs than workers replaced")
        results = transfer.get_finished()  # drained: every job is ready at once
        assert sorted(r.job_id for r in results) == stores + loads
        for r in results:
            assert not r.success and f"errno {errno.ETIMEDOUT}" in (r.error or ""), r.error
        assert transfer.stats()["health"] == "degraded"
        assert transfer.get_finished() == []  # handed out once
    finally:
        stallfs.thaw()
    _wait_for("the stuck workers returned", lambda: transfer.stats()["workers_stuck"] == 0)
    guarded(transfer.shutdown, "shutdown")
    for i in range(5):
        assert (kv[0][20 + i] == 20 + i).all(), f"block {20 + i} written after its load failed"


@pytest.mark.parametrize(
    "call,thaw",
    [
        ("unlink_unchanged_files", "finalizing"),
        ("paths_exist", "finalizing"),
        ("tmp_file_writer", "finalizing"),
        ("unlink_unchanged_files", "atexit"),
    ],
)
def test_a_storage_call_that_returns_while_the_interpreter_exits_does_not_abort_it(
    stallfs: StallFS, call: str, thaw: str
) -> None:
    """A daemon thread in one of the core's storage calls (eviction's unlinks, lookups'
    checks, the sweep's lock test) stuck on the frozen mount, which answers only once the
    interpreter exits. "finalizing": a module global's __del__ asks for the thaw and waits;
    taking the GIL back then made CPython end the thread with a forced unwind through a
    noexcept destructor: std::terminate, an abort at exit (rc -6, "terminate called ...").
    "atexit": an atexit hook that runs after kvtier's asks for it and keeps the GIL until
    the call has returned, so the thread is still waiting for the GIL when finalization
    begins (the __del__ then lets it have it): the forced unwind comes while it waits, and
    must not run the binding's cleanups without the GIL either (the thread parks)."""
    target = stallfs.mountpoint / "ns" / "rank-0" / f"{1:072x}.kvb"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"x" * 100)
    mtime = divmod(target.stat().st_mtime_ns, 10**9)
    calls = {
        "unlink_unchanged_files": f"_core.unlink_unchanged_files([{str(target)!r}], "
        f"[{mtime!r}], {str(stallfs.mountpoint)!r})",
        "paths_exist": f"_core.paths_exist([{str(target)!r}], {str(stallfs.mountpoint)!r})",
        "tmp_file_writer": f"_core.tmp_file_writer({str(target)!r})",
    }
    script = textwrap.dedent(
        f"""
        import atexit, os, sys, threading, time, types

        def hold_the_gil(write=os.write, monotonic=time.monotonic):
            sys.setswitchinterval(1000.0)  # no hand-over to the waiting thread in this hook
            write(1, b"thaw\\n")
            end = monotonic() + 1.0
            while monotonic() < end:  # the call returns meanwhile and waits for the GIL
                pass

        if {thaw!r} == "atexit":  # registered first, so it runs last, after kvtier's own
            atexit.register(hold_the_gil)

        from kvtier import _core

        started = threading.Event()

        def stuck():
            started.set()
            {calls[call]}

        class LastWords:
            # Runs while the interpreter clears sys.modules (finalizing already), when globals
            # may be None: what it uses is bound here. Held by a module of its own: __main__
            # outlives finalization while a daemon thread's frame refers to it.
            def __del__(self, write=os.write, sleep=time.sleep):
                if {thaw!r} == "finalizing":
                    write(1, b"thaw\\n")
                sleep(1.0)  # GIL released: the stuck thread returns (or takes it) meanwhile
                write(1, b"finalized\\n")

        holder = types.ModuleType("kvtier_test_last_words")
        holder.keeper = LastWords()
        sys.modules[holder.__name__] = holder
        del holder
        threading.Thread(target=stuck, daemon=True).start()
        started.wait()
        print("ready", flush=True)
        sys.stdin.readline()  # the parent saw the call blocked in the mount
        """
    )
    stallfs.match(".kvb")
    stallfs.freeze("all")
    child = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        expect_line(child, "ready\n", "the child's thread starting")
        stallfs.wait_blocked()
        prompt(child)
        expect_line(child, "thaw\n", "the child's finalization")
        stallfs.thaw()
        expect_line(child, "finalized\n", "the rest of the finalization")
    finally:
        stallfs.thaw_and_reap(child, WAIT_SECONDS)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""

"""Storage that stops answering (issue 19, the Python side): the ``io_timeout_s`` option on
every surface, and a root's degraded state (docs/tiers.md, "When storage stalls").

Real stalls through the stallfs FUSE mount (tests/stallfs): frozen operations block in the
kernel, and ``fail(ETIMEDOUT)`` makes the storage itself answer "timed out" (what an NFS soft
mount does). While a root is degraded lookups answer absent and stores and loads fail at once
through get_finished(); a probe on its own thread restores it once the storage answers, and
nothing on a caller's thread ever waits for the storage.
"""

from __future__ import annotations

import errno
import gc
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hang_guard import guarded
from kvtier import _core
from kvtier.errors import ConfigurationError
from kvtier.gpu.options import GPUTransferOptions
from kvtier.tiering.base import JobMetadata, JobResult, ReqContext, make_offload_key
from kvtier.tiering.fs.health import PROBE_PREFIX
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.fs.options import FsTierOptions
from kvtier.tiering.spec import OffloadingSpec
from stallfs import WAIT_SECONDS, StallFS

ROW = 8192
ROWS = 64
CTX = ReqContext("req-degraded")
SPEC = OffloadingSpec(model_name="degraded-test", dtype="bfloat16")
SHORT_TIMEOUT = 0.5  # seconds: short, so a frozen operation is abandoned quickly
HAS_DEADLINES = "io_timeout_s" in _core.ENGINE_DEFAULTS
needs_deadlines = pytest.mark.skipif(
    not HAS_DEADLINES, reason="the native core has no io_timeout_s (issue 19, core part)"
)


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _job(job_id: int, keys: list[bytes], rows: list[int]) -> JobMetadata:
    return JobMetadata(job_id, keys, np.array(rows, dtype=np.int64), False, CTX)


def _primary() -> memoryview:
    buf = np.zeros((ROWS, ROW), dtype=np.uint8)
    for r in range(ROWS):
        buf[r, :] = r % 251
    return memoryview(buf)


def _tier(root: Path, primary: memoryview, **options: Any) -> FileSystemTierManager:
    opts: dict[str, Any] = {
        "root_dir": str(root),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_timeout_s": SHORT_TIMEOUT,
        **options,
    }
    return FileSystemTierManager(SPEC, primary, "fs", **opts)


class Ids:
    """Fresh job ids for one test."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self) -> int:
        self._next += 1
        return self._next


def _collect(tier: Any, wanted: set[int], timeout: float = WAIT_SECONDS) -> dict[int, JobResult]:
    """Every job of ``wanted`` once (a hang guard, never a timing check)."""
    results: dict[int, JobResult] = {}
    deadline = time.monotonic() + timeout
    while wanted - results.keys():
        for r in tier.get_finished():
            assert r.job_id not in results, f"job {r.job_id} reported twice"
            results[r.job_id] = r
        assert time.monotonic() < deadline, f"jobs never reported: {wanted - results.keys()}"
        time.sleep(0.005)
    return results


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"never happened: {what}"
        time.sleep(0.01)


def _store_one(tier: FileSystemTierManager, ids: Ids, key: bytes, row: int) -> JobResult:
    job_id = ids()
    tier.submit_store(_job(job_id, [key], [row]))
    return _collect(tier, {job_id})[job_id]


def _degrade_with_timeout_errno(
    tier: FileSystemTierManager, stallfs: StallFS, ids: Ids
) -> JobResult:
    """The storage answers ETIMEDOUT to data operations: one store fails, the root degrades."""
    stallfs.fail(errno.ETIMEDOUT, "data")
    result = _store_one(tier, ids, _key(10_000 + ids()), 1)
    assert not result.success
    assert tier.stats()["health"] == "degraded"
    return result


@pytest.fixture
def primary() -> memoryview:
    return _primary()


@pytest.fixture
def tiers() -> Iterator[list[FileSystemTierManager]]:
    made: list[FileSystemTierManager] = []
    yield made
    for tier in made:  # before the mounts go (the stallfs fixture tears down after this)
        guarded(tier.shutdown, "shutdown at teardown")


# ---- the option --------------------------------------------------------------------------


def test_io_timeout_s_defaults_to_the_engines_and_reaches_it() -> None:
    opts = FsTierOptions.parse("fs", {"root_dir": "/x"})
    assert opts.io_timeout_s == _core.ENGINE_DEFAULTS["io_timeout_s"]
    assert opts.engine_kwargs()["io_timeout_s"] == opts.io_timeout_s
    given = FsTierOptions.parse("fs", {"root_dir": "/x", "io_timeout_s": "2.5"})
    assert given.io_timeout_s == 2.5
    assert FsTierOptions.parse("fs", {"root_dir": "/x", "io_timeout_s": 0}).io_timeout_s == 0.0
    gpu = GPUTransferOptions.parse({"root_dir": "/x", "io_timeout_s": 3})
    assert gpu.engine_kwargs()["io_timeout_s"] == 3.0


@pytest.mark.parametrize("bad", [-1, "-0.5", "soon", True, math.nan, math.inf, 10**9, None, [1]])
def test_bad_io_timeout_s_is_refused_naming_the_option(bad: Any) -> None:
    with pytest.raises(ConfigurationError, match="'io_timeout_s'") as info:
        FsTierOptions.parse("fs", {"root_dir": "/x", "io_timeout_s": bad})
    assert "0: no deadline" in str(info.value)
    with pytest.raises(ConfigurationError, match="'io_timeout_s' of GPUStorageTransfer"):
        GPUTransferOptions.parse({"root_dir": "/x", "io_timeout_s": bad})


def test_bench_hands_io_timeout_s_to_the_tier(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--sizes", "64K", "--total", "1M", "--read-threads", "1", "--write-threads", "1",
            "--latency-samples", "2", "--loop-seconds", "0.05", "--repeat", "1", "--no-fio",
            "--quiet", "--io-timeout-s", "2.5", "--json", str(out)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", "bench", "--root", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["config"]["io_timeout_s"] == 2.5


# ---- degraded by a timeout the storage answers (ETIMEDOUT from the file system) ------------


def test_a_timeout_degrades_the_root_until_the_probe_sees_it_answer(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager]
) -> None:
    tier = _tier(stallfs.mountpoint / "root", primary)
    tiers.append(tier)
    ids = Ids()
    present = _key(1)
    assert _store_one(tier, ids, present, 3).success
    assert tier.lookup(present, CTX) is True
    assert tier.stats()["health"] == "healthy"

    failed = _degrade_with_timeout_errno(tier, stallfs, ids)
    assert f"errno {errno.ETIMEDOUT}" in (failed.error or "")
    stats = tier.stats()
    assert stats["health_degraded_count"] == 1

    # Degraded: a known block answers absent, and new work fails at once, reported through
    # get_finished with the root and the reason; submit itself never raises.
    assert tier.lookup(present, CTX) is False
    store_id, load_id = ids(), ids()
    tier.submit_store(_job(store_id, [_key(2)], [4]))
    tier.submit_load(_job(load_id, [present], [5]))
    results = {r.job_id: r for r in tier.get_finished()}  # no wait: they are ready at once
    assert set(results) == {store_id, load_id}
    for r in results.values():
        assert not r.success
        assert "is degraded" in (r.error or "") and str(stallfs.mountpoint / "root") in r.error
        assert "timed out" in r.error
    assert results[load_id].successful_keys == []
    assert np.asarray(primary)[5, 0] == 5  # the failed load wrote nothing
    stats = tier.stats()
    assert stats["degraded_jobs"] == 2 and stats["degraded_lookups"] == 1

    # The storage answers again: the probe (1 s after degrading) restores the root.
    stallfs.fail(0)
    _wait_for("the probe restored the root", lambda: tier.stats()["health"] == "healthy")
    stats = tier.stats()
    assert stats["health_probes"] >= 1
    assert tier.lookup(present, CTX) is True
    assert _store_one(tier, ids, _key(3), 6).success
    load_id = ids()
    tier.submit_load(_job(load_id, [_key(3)], [7]))
    assert _collect(tier, {load_id})[load_id].success
    assert np.asarray(primary)[7, 0] == 6
    # The probes leave nothing behind them.
    state = stallfs.backing / "root" / ".kvtier"
    assert not [p for p in os.listdir(state) if p.startswith(PROBE_PREFIX)]


def test_tiers_on_one_root_share_its_health(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager], tmp_path: Path
) -> None:
    root = stallfs.mountpoint / "root"
    first = _tier(root, primary)
    second = _tier(root, _primary(), n_read_threads=2)  # another tier instance, same root
    elsewhere = _tier(tmp_path / "local", _primary())  # another root: unaffected
    tiers.extend([first, second, elsewhere])
    ids = Ids()
    _degrade_with_timeout_errno(first, stallfs, ids)
    assert second.stats()["health"] == "degraded"
    assert second.lookup(_key(1), CTX) is False
    assert elsewhere.stats()["health"] == "healthy"
    assert _store_one(elsewhere, ids, _key(4), 2).success
    stallfs.fail(0)
    _wait_for("the root recovered", lambda: second.stats()["health"] == "healthy")
    assert first.stats()["health"] == "healthy"


def test_a_probe_stuck_in_the_kernel_is_abandoned_and_not_repeated(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager]
) -> None:
    tier = _tier(stallfs.mountpoint / "root", primary)
    tiers.append(tier)
    ids = Ids()
    _degrade_with_timeout_errno(tier, stallfs, ids)
    # Only the probes' operations freeze (the capacity thread's would count as blocked too).
    stallfs.fail(0)
    stallfs.match(PROBE_PREFIX)
    stallfs.freeze("all")
    # The next probe blocks in the kernel; the monitor gives up on it after its deadline.
    _wait_for("the probe is stuck", lambda: tier.stats()["health_probe_stuck"] == 1)
    stallfs.wait_blocked(1)
    _wait_for("the stuck probe counted failed", lambda: tier.stats()["health_probe_failures"] >= 1)
    # Only that probe is in the kernel however long the stall lasts: no second one beside it.
    probes = tier.stats()["health_probes"]
    time.sleep(3 * 1.0)  # three probe intervals: room for probes that must not start
    assert stallfs.status()["blocked"] == 1
    assert tier.stats()["health_probes"] == probes
    # Meanwhile the caller's calls return at once: nothing of theirs touches the mount.
    assert guarded(lambda: tier.lookup(_key(1), CTX), "lookup") is False
    job_id = ids()
    guarded(lambda: tier.submit_store(_job(job_id, [_key(5)], [1])), "submit_store")
    assert not guarded(tier.get_finished, "get_finished")[0].success
    assert guarded(tier.stats, "stats")["health"] == "degraded"
    stallfs.thaw()
    _wait_for("the root recovered", lambda: tier.stats()["health"] == "healthy", 90.0)
    assert tier.stats()["health_probe_stuck"] == 0
    assert _store_one(tier, ids, _key(6), 2).success


def test_many_threads_while_degraded(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager]
) -> None:
    tier = _tier(stallfs.mountpoint / "root", primary, max_queued_store_jobs=4)
    tiers.append(tier)
    ids = Ids()
    _degrade_with_timeout_errno(tier, stallfs, ids)
    stallfs.freeze("all")  # whatever reached the mount now would hang
    lock = threading.Lock()
    submitted: list[int] = []
    answers: list[bool | None] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(50):
                with lock:
                    job_id = ids()
                    submitted.append(job_id)
                keys = [_key(100_000 + n * 1000 + i)]
                if i % 2:
                    tier.submit_load(_job(job_id, keys, [n]))
                else:
                    tier.submit_store(_job(job_id, keys, [n]))
                answer = tier.lookup(keys[0], CTX)
                stats = tier.stats()
                with lock:
                    answers.append(answer)
                assert stats["health"] == "degraded"
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,), daemon=True) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_SECONDS)
    assert not any(t.is_alive() for t in threads), "a caller blocked on a degraded root"
    assert not errors, errors
    assert set(answers) == {False}
    # Every job reported once, failed at once (not queued: the store queue holds 4 and is
    # never full, since nothing degraded is queued).
    results = guarded(lambda: _collect(tier, set(submitted)), "collecting")
    assert len(results) == 400
    assert all(not r.success and "is degraded" in (r.error or "") for r in results.values())
    assert tier.stats()["dropped_store_jobs"] == 0
    stallfs.reset()


# ---- real stalls: operations frozen in the kernel, deadlines in the core ------------------


def _engine_loop(
    tier: FileSystemTierManager,
    ids: Ids,
    stop: Callable[[dict[int, JobResult]], bool],
    submit_every: int = 5,
) -> tuple[dict[int, JobResult], set[int], int]:
    """An engine's scheduler loop: each step submits now and then (a store, then a load of a
    stored key), looks a key up and collects results; runs until ``stop(results)``. Returns
    the results, the ids submitted and the steps made."""
    results: dict[int, JobResult] = {}
    submitted: set[int] = set()
    steps = 0
    deadline = time.monotonic() + WAIT_SECONDS
    while not stop(results):
        assert time.monotonic() < deadline, "the loop's jobs were never reported"
        if steps % submit_every == 0:
            job_id = ids()
            submitted.add(job_id)
            if (steps // submit_every) % 2:
                tier.submit_load(_job(job_id, [_key(1)], [9]))
            else:
                tier.submit_store(_job(job_id, [_key(500 + steps)], [steps % ROWS]))
        tier.lookup(_key(1), CTX)
        for r in tier.get_finished():
            assert r.job_id not in results, f"job {r.job_id} reported twice"
            results[r.job_id] = r
        steps += 1
        time.sleep(0.002)
    return results, submitted, steps


@needs_deadlines
@pytest.mark.parametrize("io_engine", ["psync", "auto"])
def test_frozen_mount_times_out_degrades_and_recovers(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager], io_engine: str
) -> None:
    tier = _tier(stallfs.mountpoint / "root", primary, io_engine=io_engine)
    tiers.append(tier)
    ids = Ids()
    assert _store_one(tier, ids, _key(1), 8).success
    stallfs.freeze("data")

    # A store into the frozen mount is reported failed with ETIMEDOUT by its deadline, while
    # the loop goes on (a blocked call would fail the guard, not hang the run).
    first = ids()
    tier.submit_store(_job(first, [_key(2)], [2]))
    results, _, _ = guarded(
        lambda: _engine_loop(tier, ids, lambda got: first in got), "the engine loop"
    )
    timed_out = results[first]
    assert not timed_out.success
    assert f"errno {errno.ETIMEDOUT}" in (timed_out.error or ""), timed_out.error
    stats = tier.stats()
    assert stats["health"] == "degraded"
    assert stats["io_timeouts"] >= 1
    assert stats["abandoned_ops"] >= 1  # still in the kernel
    assert {"workers_replaced", "workers_stuck"} <= stats.keys()

    # Degraded: the loop keeps running, every job it submits now fails at once (the jobs the
    # first loop left queued in the engine were failed when the root degraded).
    before = set(results)
    start = ids()
    results, submitted, steps = guarded(
        lambda: _engine_loop(tier, ids, lambda got: sum(i > start for i in got) >= 6),
        "the degraded loop",
    )
    assert steps >= 6
    late = {i: r for i, r in results.items() if i not in before and i in submitted}
    assert late and all(not r.success and "is degraded" in (r.error or "") for r in late.values())
    assert tier.lookup(_key(1), CTX) is False

    stallfs.thaw()
    _wait_for("the root recovered", lambda: tier.stats()["health"] == "healthy")
    _wait_for("the kernel returned", lambda: tier.stats()["abandoned_ops"] == 0)
    assert tier.lookup(_key(1), CTX) is True
    assert _store_one(tier, ids, _key(3), 4).success
    load_id = ids()
    tier.submit_load(_job(load_id, [_key(3)], [11]))
    assert _collect(tier, {load_id})[load_id].success
    assert np.asarray(primary)[11, 0] == 4


@needs_deadlines
def test_drain_shutdown_and_gc_return_with_the_mount_frozen(
    stallfs: StallFS, primary: memoryview
) -> None:
    ids = Ids()
    for how in ("shutdown", "gc"):
        tier = _tier(stallfs.mountpoint / how, primary)
        assert _store_one(tier, ids, _key(1), 1).success
        stallfs.freeze("data")
        job_id = ids()
        tier.submit_store(_job(job_id, [_key(2)], [2]))
        stallfs.wait_blocked(1)
        if how == "shutdown":
            guarded(tier.drain_jobs, "drain_jobs with the mount frozen")
            guarded(tier.shutdown, "shutdown with the mount frozen")
            assert job_id in {r.job_id for r in tier.get_finished()}
        else:
            refs = [tier]
            del tier
            guarded(lambda: (refs.clear(), gc.collect()), "collecting a tier, mount frozen")  # noqa: B023
        stallfs.thaw()


@needs_deadlines
def test_interpreter_exit_returns_with_the_mount_frozen(stallfs: StallFS, tmp_path: Path) -> None:
    """A process whose tier has an operation stuck in the kernel gets through interpreter
    exit (the tiers' shutdown at exit included). Its last step, closing descriptors on the
    frozen mount, is the kernel's (FUSE waits for its flush): the child says it reached the
    end of Python's exit before that, and finishes once the mount thaws."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import atexit, sys
            # Registered first, so it runs last: after kvtier's own exit handlers.
            atexit.register(lambda: (print("exit-done", flush=True)))
            import numpy as np
            from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
            from kvtier.tiering.fs.manager import FileSystemTierManager
            from kvtier.tiering.spec import OffloadingSpec

            buf = np.zeros((4, {ROW}), dtype=np.uint8)
            tier = FileSystemTierManager(
                OffloadingSpec(model_name="degraded-test", dtype="bfloat16"),
                memoryview(buf), "fs", root_dir={str(stallfs.mountpoint / "child")!r},
                n_read_threads=1, n_write_threads=1, io_timeout_s={SHORT_TIMEOUT},
            )
            print("ready", flush=True)
            sys.stdin.readline()  # the parent froze the mount
            key = make_offload_key(b"k" * 32, 0)
            tier.submit_store(JobMetadata(1, [key], np.array([0]), False, ReqContext("r")))
            print("submitted", flush=True)
            sys.stdin.readline()  # the parent saw the write blocked
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
        assert child.stdout is not None and child.stdin is not None
        assert guarded(child.stdout.readline, "the child starting") == "ready\n"
        stallfs.freeze("data")
        child.stdin.write("\n")
        child.stdin.flush()
        assert guarded(child.stdout.readline, "the child submitting") == "submitted\n"
        stallfs.wait_blocked(1)
        child.stdin.write("\n")
        child.stdin.flush()
        line = guarded(child.stdout.readline, "interpreter exit with the mount frozen")
        assert line == "exit-done\n", child.stderr.read() if child.poll() is not None else line
    finally:
        stallfs.thaw_and_reap(child, WAIT_SECONDS)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""


def test_gpu_storage_transfer_shares_the_roots_health(
    stallfs: StallFS, primary: memoryview, tiers: list[FileSystemTierManager]
) -> None:
    """GPUStorageTransfer (here over CPU tensors) on the root an fs tier degraded: its stores
    and loads fail at once through get_finished(), and work again once the probe answers; a
    timeout of its own degrades the fs tier."""
    torch = pytest.importorskip("torch")
    from kvtier.gpu.transfer import GPUStorageTransfer

    root = stallfs.mountpoint / "root"
    tier = _tier(root, primary)
    tiers.append(tier)
    kv = torch.arange(8 * 4096, dtype=torch.float32).reshape(8, 4096)
    xfer = GPUStorageTransfer([kv], SPEC, str(root), n_read_threads=1, n_write_threads=1,
                              io_timeout_s=SHORT_TIMEOUT)  # fmt: skip
    try:
        ids = Ids()
        _degrade_with_timeout_errno(tier, stallfs, ids)
        assert xfer.stats()["health"] == "degraded"
        xfer.store(ids(), [0], [_key(7)])
        load_id = ids()
        xfer.load(load_id, [1], [_key(7)])
        results = {r.job_id: r for r in xfer.get_finished()}  # ready at once
        assert len(results) == 2 and all(not r.success for r in results.values())
        assert all("is degraded" in (r.error or "") for r in results.values())
        assert results[load_id].successful_keys == []

        stallfs.fail(0)
        _wait_for("the root recovered", lambda: xfer.stats()["health"] == "healthy")
        store_id = ids()
        xfer.store(store_id, [2], [_key(8)])
        assert _collect(xfer, {store_id})[store_id].success

        # The transfer's own timeout (the storage answers ETIMEDOUT) degrades the fs tier.
        stallfs.fail(errno.ETIMEDOUT, "data")
        store_id = ids()
        xfer.store(store_id, [3], [_key(9)])
        assert not _collect(xfer, {store_id})[store_id].success
        assert tier.stats()["health"] == "degraded"
        assert tier.lookup(_key(8), CTX) is False
        stallfs.fail(0)
        _wait_for("the root recovered", lambda: tier.stats()["health"] == "healthy")
    finally:
        guarded(xfer.shutdown, "the transfer's shutdown")

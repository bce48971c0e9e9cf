"""Recycling evicted files: under a byte budget with checksum "crc32c", eviction renames some
of the files it evicts to tmp names and the tier's next stores overwrite them instead of
creating new files (docs/tiers.md, "Recycling evicted files"). Real files and threads: the
blocks that stay are byte-exact, the budget holds, the kept files are counted while they
exist and gone once the tier is idle or shut down, and nothing recycles without a checksum
or for the free-space floor."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from block_files import block_bytes_on_disk
from kvtier import _core
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes
from kvtier.tiering.fs.capacity import controller as capacity_controller
from kvtier.tiering.fs.capacity.daemon_pool import DaemonPool
from kvtier.tiering.fs.capacity.evictor import Recycle, evict
from kvtier.tiering.fs.capacity.survey import survey
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

CTX = ReqContext("req-0")
SPEC = OffloadingSpec(model_name="org/recycle", dtype="float16", kv_layout="NHD")
ROW = 64 << 10
FILE = block_file_bytes(ROW)
BUDGET_FILES = 64
WAIT_SECONDS = 60.0


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def payload(i: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, ROW, dtype=np.uint8)


def spares_under(root: Path) -> list[Path]:
    """Tmp files of block names: the kept files (no store is in flight when this is asked)."""
    return [p for p in root.rglob("*.tmp") if ".kvb." in p.name]


class Tier:
    """An fs tier with one primary row per thread and blocking store/load helpers."""

    def __init__(self, root: Path, rows: int = 2, **options: object) -> None:
        self.buf = np.zeros((rows, ROW), dtype=np.uint8)
        options = {
            "n_read_threads": 2,
            "n_write_threads": 2,
            "max_bytes": BUDGET_FILES * FILE,
            "min_free_fraction": 0,
            **options,
        }
        self.tier = FileSystemTierManager(
            SPEC, memoryview(self.buf), "fs", root_dir=str(root), **options
        )
        self._ids = iter(range(1, 1 << 30))
        self._lock = threading.Lock()
        self._finished: dict[int, object] = {}

    def _run(self, keys: list[bytes], slot: int, load: bool):
        with self._lock:
            job_id = next(self._ids)
        job = JobMetadata(job_id, keys, np.full(len(keys), slot, dtype=np.int64), load, CTX)
        (self.tier.submit_load if load else self.tier.submit_store)(job)
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            with self._lock:  # any thread may collect another's result
                for r in self.tier.get_finished():
                    self._finished[r.job_id] = r
                if job_id in self._finished:
                    return self._finished.pop(job_id)
            time.sleep(0.001)
        raise AssertionError(f"job {job_id} did not finish")

    def store(self, i: int, slot: int = 0):
        self.buf[slot] = payload(i)
        return self._run([key(i)], slot, False)

    def load(self, i: int, slot: int = 1):
        r = self._run([key(i)], slot, True)
        if r.success:
            assert bytes(self.buf[slot]) == bytes(payload(i)), f"block {i}: wrong bytes"
        return r

    def settle(self) -> None:
        assert self.tier._capacity.wait_idle(WAIT_SECONDS)


def test_a_full_cache_overwrites_evicted_files_and_keeps_every_block_exact(tmp_path):
    t = Tier(tmp_path)
    try:
        most_kept = 0
        for i in range(4 * BUDGET_FILES):
            assert t.store(i).success
            # Block files and kept files together (both are counted) stay within the budget,
            # and the kept files are taken by stores, not piled up.
            assert block_bytes_on_disk(tmp_path) <= BUDGET_FILES * FILE
            most_kept = max(most_kept, len(spares_under(tmp_path)))
        t.settle()
        stats = t.tier.stats()
        # Of the 3 budgets evicted, passes kept files (up to RECYCLE_FRACTION of the budget at
        # a time) for more than one, and the stores took them.
        assert stats["recycled_blocks"] > BUDGET_FILES, stats
        assert 0 < most_kept <= capacity_controller.RECYCLE_FRACTION * BUDGET_FILES + 1
        assert stats["used_bytes"] <= BUDGET_FILES * FILE
        present = [i for i in range(4 * BUDGET_FILES) if t.load(i).success]
        # The newest blocks stay (LRU) and read back whole; the evicted ones are misses.
        assert 0.8 * BUDGET_FILES <= len(present) <= BUDGET_FILES, len(present)
        assert 4 * BUDGET_FILES - 1 in present
    finally:
        t.tier.shutdown()
    assert spares_under(tmp_path) == []  # shutdown removes the files it kept
    assert block_bytes_on_disk(tmp_path) <= BUDGET_FILES * FILE


def test_kept_files_are_counted_while_they_exist_and_removed_when_idle(tmp_path, monkeypatch):
    monkeypatch.setattr(capacity_controller, "IDLE_SECONDS", 3600.0)  # active throughout
    t = Tier(tmp_path)
    try:
        for i in range(2 * BUDGET_FILES):
            assert t.store(i).success
        t.settle()
        kept = spares_under(tmp_path)
        assert kept, "a pass made no spares"
        # Counted as this writer's tmp files: the ledger's used bytes cover them.
        assert t.tier.stats()["used_bytes"] >= block_bytes_on_disk(tmp_path)
        monkeypatch.setattr(capacity_controller, "IDLE_SECONDS", 0.2)  # idle from now on
        deadline = time.monotonic() + WAIT_SECONDS
        while spares_under(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert spares_under(tmp_path) == []
        assert t.tier.stats()["used_bytes"] >= block_bytes_on_disk(tmp_path)
    finally:
        t.tier.shutdown()


@pytest.mark.parametrize("threads", [1, 4])
def test_eviction_keeps_exactly_the_files_asked_for_across_its_threads(tmp_path, threads):
    """Of the oldest candidates, evict() renames as many of the asked size as Recycle asks
    (no more, whatever number of threads shares a wave), unlinks the others, and counts
    every one of them as evicted."""
    sizes = [FILE] * 12 + [FILE + 4096] * 4
    for i, size in enumerate(sizes):
        d = tmp_path / "ns" / f"{i % 3:02x}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{i:064x}.kvb").write_bytes(b"x" * size)
    found = survey(str(tmp_path), 1 << 40)
    recycle = Recycle(FILE, 5, str(tmp_path / "ns"))
    reported: list[tuple[int, int]] = []
    pool = DaemonPool(threads, "test-evict")
    try:
        done = evict(
            found.candidates,
            sum(sizes),
            on_batch=lambda paths, nbytes, recycled: reported.append((len(paths), len(recycled))),
            workers=threads,
            pool=pool if threads > 1 else None,
            root=str(tmp_path),
            recycle=recycle,
        )
    finally:
        pool.shutdown()
    assert len(done.recycled) == 5 and recycle.files == 0
    assert done.bytes == sum(sizes) and len(done.paths) == len(sizes)
    assert sum(n for n, _ in reported) == len(sizes) and sum(r for _, r in reported) == 5
    assert list(tmp_path.rglob("*.kvb")) == []
    kept = spares_under(tmp_path)
    assert sorted(map(str, kept)) == sorted(done.recycled)
    assert all(p.stat().st_size == FILE for p in kept)


def test_without_a_checksum_eviction_unlinks(tmp_path):
    """A reader that opened a file before eviction could read it mid-overwrite; with no
    checksum to catch that, nothing is recycled."""
    t = Tier(tmp_path, checksum="none")
    try:
        for i in range(3 * BUDGET_FILES):
            assert t.store(i).success
            assert spares_under(tmp_path) == []
        t.settle()
        assert t.tier.stats()["recycled_blocks"] == 0
        assert t.tier.stats()["evicted_blocks"] > BUDGET_FILES
    finally:
        t.tier.shutdown()


def test_threads_storing_and_loading_into_a_recycling_cache_read_no_wrong_byte(tmp_path):
    threads, per_thread = 4, 3 * BUDGET_FILES // 2
    t = Tier(tmp_path, rows=2 * threads, n_read_threads=4, n_write_threads=4)
    errors: list[BaseException] = []
    loads_ok = [0] * threads

    def work(n: int) -> None:
        try:
            for j in range(per_thread):
                i = n * per_thread + j
                assert t.store(i, slot=2 * n).success
                # An older block of any thread: present (exact, checked in load) or a miss.
                if j % 3 == 0:
                    loads_ok[n] += bool(t.load(max(0, i - 20), slot=2 * n + 1).success)
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    try:
        assert not errors, errors
        assert sum(loads_ok) > 0
        t.settle()
        assert t.tier.stats()["recycled_blocks"] > 0
        assert block_bytes_on_disk(tmp_path) <= BUDGET_FILES * FILE
    finally:
        t.tier.shutdown()
    assert spares_under(tmp_path) == []


def test_nothing_is_kept_for_the_free_space_floor(tmpfs_mount):
    """A kept file frees no disk space: eviction for min_free_fraction unlinks."""
    subprocess.run(["mount", "-o", "remount,size=8m", str(tmpfs_mount)], check=True)
    # A budget larger than the file system: only the floor makes eviction run.
    t = Tier(tmpfs_mount, max_bytes=64 << 20, min_free_fraction=0.5)
    try:
        for i in range(100):
            t.store(i)
        t.settle()
        assert t.tier.stats()["evicted_blocks"] > 0
        assert t.tier.stats()["recycled_blocks"] == 0
        assert spares_under(tmpfs_mount) == []
    finally:
        t.tier.shutdown()


def test_stores_that_never_took_their_kept_files_leave_none_behind(tmp_path):
    """A store given a kept file may fail before it takes it (its block's directory is in the
    way), or never run (the tier shuts down with it queued): the file is removed all the same
    (the capacity thread, or shutdown), and counted until it is."""
    t = Tier(tmp_path, n_write_threads=1)
    try:
        i = 0
        while not t.tier._capacity._spares:  # the cache full, and a spare kept right now
            assert t.store(i).success and i < 10 * BUDGET_FILES
            i += 1
        t.settle()
        spare = t.tier._capacity._spares[-1]  # the next store's (white box)
        blocked = next(
            k
            for k in range(10**6, 10**6 + 1000)
            if not Path(t.tier.file_mapper.get_file_name(key(k))).parent.exists()
        )
        leaf = Path(t.tier.file_mapper.get_file_name(key(blocked))).parent
        leaf.parent.mkdir(parents=True, exist_ok=True)
        leaf.write_bytes(b"in the way")
        assert not t.store(blocked).success
        assert t.tier.stats()["used_bytes"] >= block_bytes_on_disk(tmp_path)
        deadline = time.monotonic() + WAIT_SECONDS
        while os.path.exists(spare) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(spare)
        leaf.unlink()
        # Queued stores holding kept files, then shutdown: none is left on disk.
        base = 2 * 10**6
        for i in range(3 * BUDGET_FILES):
            t.buf[0] = payload(base + i)
            job = JobMetadata(base + i, [key(base + i)], np.zeros(1, dtype=np.int64), False, CTX)
            t.tier.submit_store(job)
        assert t.tier.stats()["recycled_blocks"] > 0
    finally:
        t.tier.shutdown()
    assert spares_under(tmp_path) == []


def test_only_a_local_file_system_recycles(tmp_path, stallfs):
    """On FUSE (and network file systems) a client may resolve a block's old name from its
    cache after eviction renamed the file, and a load would then read the overwritten file:
    eviction there unlinks. Here the FUSE mount is stallfs (not stalled)."""
    assert _core.local_file_system(str(tmp_path))
    assert not _core.local_file_system(str(stallfs.mountpoint))
    assert not _core.local_file_system(str(tmp_path / "missing"))
    fuse = Tier(stallfs.mountpoint / "root", n_read_threads=1, n_write_threads=1)
    try:
        for i in range(2 * BUDGET_FILES):
            assert fuse.store(i).success
        fuse.settle()
        assert fuse.tier.stats()["evicted_blocks"] > 0
        assert fuse.tier.stats()["recycled_blocks"] == 0
        assert spares_under(stallfs.mountpoint) == []
    finally:
        fuse.tier.shutdown()


def test_a_tier_without_checksums_keeps_its_blocks_apart(tmp_path):
    """A reader that checks no CRC could return a recycled file's torn bytes, so a tier with
    checksum "none" has its own namespace; tiers with the default keep the one every earlier
    version used (no "checksum" among the layout fields)."""
    checking, trusting = Tier(tmp_path), Tier(tmp_path, checksum="none")
    try:
        assert "checksum" not in checking.tier.file_mapper.layout
        assert trusting.tier.file_mapper.layout["checksum"] == "none"
        assert checking.tier.file_mapper.namespace != trusting.tier.file_mapper.namespace
        assert checking.store(1).success
        assert not trusting.load(1).success  # a miss: never the checking tier's file
        assert trusting.store(2).success and trusting.load(2).success
    finally:
        checking.tier.shutdown()
        trusting.tier.shutdown()


class _CountingBell:
    """The capacity thread's bell, counting the rings (what wakes the thread)."""

    def __init__(self, bell) -> None:
        self.bell, self.rings = bell, 0
        self.get, self.get_nowait = bell.get, bell.get_nowait

    def put(self, item: None) -> None:
        self.rings += 1
        self.bell.put(item)


def test_stores_that_take_kept_files_do_not_wake_the_capacity_thread_each(tmp_path):
    """Kept files serve a store as reservation does. In a full cache that recycles, the
    budget has no room to top up from (the kept files hold it): a store that still asked the
    capacity thread for a top-up would wake it for nothing, once per store. They wake it
    when the kept files run low, and the newest blocks read back whole."""
    t = Tier(tmp_path)
    try:
        for i in range(2 * BUDGET_FILES):  # full, and recycling
            assert t.store(i).success
        t.settle()
        capacity = t.tier._capacity
        bell = capacity._bell = _CountingBell(capacity._bell)
        recycled = t.tier.stats()["recycled_blocks"]
        stores = 4 * BUDGET_FILES
        for i in range(2 * BUDGET_FILES, 2 * BUDGET_FILES + stores):
            assert t.store(i).success
        t.settle()
        taken = t.tier.stats()["recycled_blocks"] - recycled
        assert taken > stores // 2, taken  # most stores took a kept file
        assert bell.rings < stores // 4, (bell.rings, stores)
        newest = range(2 * BUDGET_FILES + stores - BUDGET_FILES // 2, 2 * BUDGET_FILES + stores)
        assert all(t.load(i).success for i in newest)
    finally:
        t.tier.shutdown()


def _submit_stores(t: Tier, first: int, jobs: int, per_job: int) -> list[int]:
    """Submit ``jobs`` store jobs of ``per_job`` new blocks each at once; their job ids."""
    ids = []
    for j in range(jobs):
        keys = [key(first + j * per_job + b) for b in range(per_job)]
        with t._lock:
            job_id = next(t._ids)
        slots = np.arange(per_job, dtype=np.int64) % t.buf.shape[0]
        t.tier.submit_store(JobMetadata(job_id, keys, slots, False, CTX))
        ids.append(job_id)
    return ids


def _results(t: Tier, ids: list[int]) -> list:
    deadline = time.monotonic() + WAIT_SECONDS
    got: dict[int, object] = {}
    while len(got) < len(ids) and time.monotonic() < deadline:
        got.update((r.job_id, r) for r in t.tier.get_finished())
        time.sleep(0.001)
    assert len(got) == len(ids), f"{len(ids) - len(got)} store jobs did not finish"
    return [got[i] for i in ids]


def test_stores_in_flight_for_the_whole_budget_all_find_room_in_a_recycling_cache(tmp_path):
    """Eight store jobs of 8 blocks at once, more than a full cache's whole budget (4 MiB: 60
    block files): the stores wait for room, eviction keeps files for them, and every one is
    stored (under "lru" none is refused while eviction can make room). The pass used to count
    the files it kept for the waiting stores twice as room made, found nothing more to evict,
    and the stores failed with ENOSPC after STORE_WAIT_SECONDS while the capacity thread
    spun."""
    budget, per_job = 4 << 20, 8
    t = Tier(tmp_path, rows=8, max_bytes=budget)
    try:
        fill = budget // FILE
        for i in range(fill):  # full
            assert t.store(i).success
        t.settle()
        first = fill
        for _ in range(4):  # about four budgets' worth
            results = _results(t, _submit_stores(t, first, 8, per_job))
            assert [r.error for r in results if not r.success] == []
            first += 8 * per_job
        t.settle()
        stats = t.tier.stats()
        assert stats["recycled_blocks"] > 0 and stats["rejected_stores"] == 0, stats
        assert block_bytes_on_disk(tmp_path) <= budget
        # The newest block is there and passes its checks (its bytes are whatever its row
        # held when its store ran: the jobs share the rows).
        assert t._run([key(first - 1)], 1, True).success
    finally:
        t.tier.shutdown()


def test_a_store_waiting_while_another_evictor_holds_the_lock_costs_no_spinning(tmp_path):
    """While another evictor (here: a lock of this test's own, like another process's) holds
    the root's evictor lock, a store that waits for room is looked at by the ticks, every
    WAIT_POLL_SECONDS, not by passes asked for again at once; once the lock is free, the
    next tick's pass makes room and the store is stored."""
    from kvtier.tiering.fs.capacity.evictor import evictor_lock

    files = 32
    t = Tier(tmp_path, rows=8, max_bytes=files * FILE)
    try:
        for i in range(files):
            assert t.store(i).success
        t.settle()
        capacity = t.tier._capacity
        passes = [0]
        real = capacity._locked_pass

        def counted() -> None:
            passes[0] += 1
            real()

        capacity._locked_pass = counted
        with evictor_lock(str(tmp_path)) as held:
            assert held
            (job,) = _submit_stores(t, files, 1, files // 2)  # needs eviction
            time.sleep(1.0)
            tried = passes[0]
            assert t.tier.get_finished() == []  # still waiting for room
        (result,) = _results(t, [job])
        assert result.success, result.error
        # One try per poll while it waited (about 20 in the second), not a busy loop (tens
        # of thousands before).
        assert 1 <= tried <= 3 / capacity_controller.WAIT_POLL_SECONDS, tried
    finally:
        t.tier.shutdown()

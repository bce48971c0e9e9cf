"""Capacity of the fs tier on real files and real processes: the byte budget under
concurrency, LRU with shared recency, restarts and adoption, the free-space floor on a small
tmpfs, eviction "none", and what lookups and loads see of evictions."""

from __future__ import annotations

import dataclasses
import errno
import gc
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from block_files import block_bytes_on_disk, block_bytes_still_on_disk, immutable, planted_blocks
from kvtier import _core
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import (
    CapacityController,
    CapacityPolicy,
    block_file_bytes,
    parse_size,
)
from kvtier.tiering.fs.capacity import controller as capacity_controller
from kvtier.tiering.fs.capacity import survey as survey_module
from kvtier.tiering.fs.capacity.controller import DEFERRED
from kvtier.tiering.fs.capacity.evictor import UnlinkTuning, _next_threads, evict, evictor_lock
from kvtier.tiering.fs.capacity.ledger import (
    LEDGER_FILE_NAME,
    Base,
    LedgerState,
    UsageLedger,
    WriterRecord,
)
from kvtier.tiering.fs.capacity.scanner import STATE_DIR_NAME, FileEntry
from kvtier.tiering.fs.capacity.survey import survey
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

CTX = ReqContext("req-0")
SPEC = OffloadingSpec(model_name="org/capacity", dtype="float16", kv_layout="NHD")
ROW = 256 << 10
FILE = block_file_bytes(ROW)
WORKER = str(Path(__file__).with_name("capacity_worker.py"))
WAIT_SECONDS = 60.0


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def payload(i: int) -> np.ndarray:
    # The same function as capacity_worker.payload: any process can check any block.
    return np.random.default_rng(i).integers(0, 256, ROW, dtype=np.uint8)


disk_bytes = block_bytes_on_disk  # the files' bytes, as this test counts them


def block_paths(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.kvb")]


def settled(tier: FileSystemTierManager):
    """A condition: the tier's capacity thread is idle (no eviction asked for or running, no
    store waiting for budget)."""
    return lambda: tier._capacity.wait_idle(WAIT_SECONDS)


def passed(tier: FileSystemTierManager):
    """A condition: a pass has looked at the budget since now, and the thread is idle. The
    last stores can leave the count above the high mark with no pass asked for (kept files
    and the reservation shift with each store); the next tick would then evict, up to a
    second later. This asks for that pass now and waits for it."""
    tier._capacity.request_eviction()
    return settled(tier)


def ledger(root: Path) -> LedgerState:
    return UsageLedger(str(root)).read()


class Tier:
    """An fs tier with a two-row primary buffer and blocking store/load helpers."""

    def __init__(self, root: Path, **options: object) -> None:
        self.buf = np.zeros((2, ROW), dtype=np.uint8)
        options = {"n_read_threads": 2, "n_write_threads": 2, **options}
        self.tier = FileSystemTierManager(
            SPEC, memoryview(self.buf), "fs", root_dir=str(root), **options
        )
        self.next_id = 0

    def _run(self, keys: list[bytes], slot: int, load: bool):
        self.next_id += 1
        job_id = self.next_id
        slots = np.full(len(keys), slot, dtype=np.int64)
        job = JobMetadata(job_id, keys, slots, load, CTX)
        (self.tier.submit_load if load else self.tier.submit_store)(job)
        deadline = time.monotonic() + WAIT_SECONDS
        while time.monotonic() < deadline:
            for r in self.tier.get_finished():
                assert r.job_id == job_id
                return r
            time.sleep(0.001)
        raise AssertionError(f"job {job_id} did not finish")

    def store(self, i: int):
        self.buf[0] = payload(i)
        return self._run([key(i)], 0, False)

    def load(self, i: int):
        r = self._run([key(i)], 1, True)
        if r.success:
            assert bytes(self.buf[1]) == bytes(payload(i)), f"block {i}: wrong bytes"
        return r

    def stats(self) -> dict[str, int]:
        return self.tier.stats()

    def close(self) -> None:
        self.tier.shutdown()


def wait_for(condition, what: str, timeout: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def run_worker(root: Path, first: int, count: int, options: dict, prefix: list[str] = ()):
    args = json.dumps({"row_bytes": ROW, "first": first, "count": count, "options": options})
    return subprocess.Popen(
        [*prefix, sys.executable, WORKER, str(root), args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return json.loads(out.strip().splitlines()[-1])


# -- sizes and options --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (123, 123),
        ("4096", 4096),
        ("500GiB", 500 << 30),
        ("2TB", 2 * 10**12),
        ("750M", 750 << 20),
        ("750m", 750 << 20),
        ("1.5GiB", 3 << 29),
        ("8 KiB", 8192),
    ],
)
def test_size_strings(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "GiB", "12 apples", "-5", "1e9", "5 XB", True, -1, 1.5])
def test_bad_size_strings_are_refused(bad):
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(bad)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("max_bytes", "lots", "max_bytes"),
        ("max_bytes", 0, "positive"),
        ("min_free_fraction", 0.95, r"\[0, 0.9\]"),
        ("min_free_fraction", "half", "min_free_fraction"),
        ("eviction", "fifo", r"\['lru', 'none'\]"),
    ],
)
def test_invalid_capacity_options_raise(tmp_path, option, value, message):
    with pytest.raises(ValueError, match=message):
        Tier(tmp_path, **{option: value})


def test_capacity_options_and_stats(tmp_path):
    t = Tier(tmp_path, max_bytes="4MiB", min_free_fraction="0", eviction="lru")
    try:
        assert t.store(1).success
        stats = t.stats()
        assert stats["capacity_bytes"] == 4 << 20
        assert stats["used_bytes"] >= FILE
        for name in ("evicted_blocks", "evicted_bytes", "rejected_stores"):
            assert stats[name] == 0
    finally:
        t.close()


# -- the budget ---------------------------------------------------------------------------


def test_reporting_a_store_names_none_of_its_block_files_again(tmp_path, monkeypatch):
    """get_finished runs on the caller's thread: a store's report uses the block files named
    at its submit (capacity's finish_store, and the use of a block that was already there)
    instead of hashing every key into a path again."""
    t = Tier(tmp_path, max_bytes=64 << 20)
    try:
        assert t.store(1).success
        path_of = t.tier.file_mapper.get_file_name
        expected = path_of(key(1))
        reporting = threading.Event()
        named_while_reporting: list[bytes] = []
        used: list[list[str]] = []

        def counting_path_of(k):
            if reporting.is_set():
                named_while_reporting.append(k)
            return path_of(k)

        def reporting_get_finished(real=t.tier.get_finished):
            reporting.set()
            try:
                return real()
            finally:
                reporting.clear()

        real_record_use = t.tier._capacity.record_use
        monkeypatch.setattr(t.tier.file_mapper, "get_file_name", counting_path_of)
        monkeypatch.setattr(t.tier, "get_finished", reporting_get_finished)
        monkeypatch.setattr(
            t.tier._capacity,
            "record_use",
            lambda paths: (used.append(list(paths)), real_record_use(paths)),
        )
        assert t.store(2).success  # a new block
        assert t.store(1).success  # already there: the store is its use
        assert named_while_reporting == []
        assert [expected] in used
        assert t.stats()["dedup_skips"] == 1
    finally:
        t.close()


def test_processes_storing_three_budgets_stay_within_it(tmp_path):
    """Four processes store 3x the budget at once; an independent sampler never sees more
    than max_bytes plus the stores in flight (a file renamed during a sample can be seen as
    both its tmp and its final name), and every load that succeeds is byte-exact."""
    budget, procs = 8 << 20, 4
    per_proc = 3 * budget // FILE // procs + 1
    root = tmp_path / "root"
    root.mkdir()
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(disk_bytes(root))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        options = {"max_bytes": budget, "n_read_threads": 1, "n_write_threads": 2}
        workers = [run_worker(root, p * 1000, per_proc, options) for p in range(procs)]
        reports = [finish(w) for w in workers]
    finally:
        stop.set()
        sampler.join()
    margin = procs * 2 * FILE  # stores in flight: n_write_threads per process
    assert max(samples) <= budget + margin, (max(samples), budget)
    assert disk_bytes(root) <= budget
    assert all(not r["errors"] for r in reports), reports
    assert sum(r["stored"] for r in reports) * FILE > 2 * budget  # the budget was exceeded
    assert sum(r["evicted_blocks"] for r in reports) > 0  # ...and made room for
    assert sum(r["loaded"] for r in reports) > 0


def test_two_hosts_evict_one_root(tmp_path):
    """Processes in separate UTS namespaces (other host names) share and evict one root;
    another host's in-flight tmp files are never touched, and no evictor fails."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for separate UTS namespaces")
    probe = subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"unshare --uts is not permitted here: {probe.stderr.decode().strip()}")
    root = tmp_path / "root"
    root.mkdir()
    # A third host's stores in flight (tmp files with a pid that means nothing here).
    seed = Tier(root)
    assert seed.store(0).success
    seed.close()
    leaf = block_paths(root)[0].parent
    foreign = [leaf / f"{'ab' * 18}.kvb.hostc.{1 + n}.{n}.tmp" for n in range(3)]
    for f in foreign:
        f.write_bytes(b"x" * 8192)
    budget = 6 << 20
    options = {"max_bytes": budget, "n_read_threads": 1, "n_write_threads": 2}
    workers = [
        run_worker(
            root,
            1000 * (h + 1),
            3 * budget // FILE // 2,
            options,
            prefix=["unshare", "--uts", "sh", "-c", f'hostname host{h} && exec "$@"', "sh"],
        )
        for h in range(2)
    ]
    reports = [finish(w) for w in workers]
    assert all(not r["errors"] for r in reports), reports
    assert sum(r["evicted_blocks"] for r in reports) > 0
    assert all(f.read_bytes() == b"x" * 8192 for f in foreign)
    assert disk_bytes(root) <= budget + 3 * 8192
    records = ledger(root).writers.values()
    assert all(r.reserved == r.writing == 0 for r in records)  # budget handed back


@pytest.mark.parametrize("use", ["load", "store", "lookup", "touch"])
def test_hot_blocks_outlive_blocks_stored_once(tmp_path, use):
    """Every kind of use (a load, a store of a block already there, a lookup hit, touch)
    keeps a working set alive while blocks stored once are evicted."""
    budget = 64 * FILE
    t = Tier(tmp_path, max_bytes=budget)
    try:
        hot = [0, 1, 2, 3]
        for i in hot:
            assert t.store(i).success
        for i in range(100, 300):
            t.store(i)
            if i % 4 == 0:
                if use == "load":
                    assert all(t.load(h).success for h in hot), "a hot block was evicted"
                elif use == "store":  # each re-store must find the block still there
                    skips = t.stats()["dedup_skips"]
                    assert all(t.store(h).success for h in hot)
                    assert t.stats()["dedup_skips"] == skips + len(hot), "a hot block was evicted"
                elif use == "lookup":
                    assert all(t.tier.lookup(key(h), CTX) for h in hot)
                else:
                    t.tier.touch([key(h) for h in hot], CTX)
        wait_for(lambda: t.stats()["evicted_blocks"] > 100, "evictions")
        assert all(t.load(h).success for h in hot)
        assert not t.load(100).success  # the oldest cold blocks went
        assert disk_bytes(tmp_path) <= budget
    finally:
        t.close()


def test_one_scan_serves_later_passes_in_lru_order(tmp_path):
    """A scan keeps every block as a candidate for the passes after it (no scan per pass).
    Blocks another process used after that scan are kept when their turn comes, and the
    oldest of the rest go first. (Small blocks, and a budget of 1000 of them, so that a pass
    evicts a tenth of the cache, not all of its older part.)"""
    row, n_budget, batch = 4096, 1000, 8
    small = block_file_bytes(row)
    buf = np.zeros((batch, row), dtype=np.uint8)
    tier = FileSystemTierManager(
        SPEC,
        memoryview(buf),
        "fs",
        root_dir=str(tmp_path),
        max_bytes=n_budget * small,
        min_free_fraction=0,
    )
    job_ids = iter(range(1, 10**6))

    def store(first: int, count: int) -> None:
        for j in range(first, first + count, batch):
            for s in range(batch):
                buf[s] = np.random.default_rng(j + s).integers(0, 256, row, dtype=np.uint8)
            keys = [key(j + s) for s in range(batch)]
            job_id = next(job_ids)
            tier.submit_store(JobMetadata(job_id, keys, np.arange(batch), False, CTX))
            tier.drain_jobs()
            assert all(r.success for r in tier.get_finished())

    def present() -> set[str]:
        return {p.name for p in block_paths(tmp_path)}

    try:
        store(0, 1200)
        wait_for(lambda: tier.stats()["evicted_blocks"] > 0, "a first eviction pass")
        wait_for(passed(tier), "the passes to finish")
        names = present()
        survivors = [i for i in range(1200) if f"{key(i).hex()}.kvb" in names]
        used, cold = survivors[:4], survivors[4:40]
        for i in used:  # another process loads each: a use
            args = {"row_bytes": row, "first": i, "count": 1, "options": {}, "load_only": True}
            worker = subprocess.Popen(
                [sys.executable, WORKER, str(tmp_path), json.dumps(args)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            assert finish(worker)["loaded"] == 1
        evicted = tier.stats()["evicted_blocks"]
        store(10_000, 200)  # well within the candidates' lifetime (30 s)
        wait_for(lambda: tier.stats()["evicted_blocks"] > evicted, "another pass")
        wait_for(settled(tier), "eviction to finish")
        names = present()
        assert all(f"{key(i).hex()}.kvb" in names for i in used), "a used block was evicted"
        assert not any(f"{key(i).hex()}.kvb" in names for i in cold), "old blocks were kept"
        assert disk_bytes(tmp_path) <= n_budget * small
    finally:
        tier.shutdown()


def block_index(path: Path) -> int:
    """The i of key(i) (i below 1000) whose block file is ``path``."""
    names = {f"{key(i).hex()}.kvb": i for i in range(1000)}
    return names[Path(path).name]


def stored_in_turn(t: Tier, i: int) -> None:
    """Store block i, then let the clock move: these tests expect eviction in store order,
    and a file system with coarse timestamps (a tick of 1-10 ms) gives stores within one
    tick the same mtime (the evictor then orders them by path)."""
    assert t.store(i).success
    time.sleep(0.005)


def test_a_full_cache_evicts_its_own_stores_without_rescanning_the_root(tmp_path, monkeypatch):
    """Once a scan's candidates have all been tried, the blocks the tier stored since are the
    next ones (an lstat each). A scan walks every directory under the root: a cache that has
    run a while has 65,536 leaf directories per namespace (0.2 s of CPU per scan on tmpfs),
    and a small budget turns over several times a second. Ten budgets stored take the one
    scan that starts the evictions (and the constructor's count), not one per budget, and
    what survives is still the newest."""
    scans = []
    real = capacity_controller.survey

    def counted(*args, **kwargs):
        scans.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(capacity_controller, "survey", counted)
    kept, _, evicted = stored_past_budget(tmp_path, 16, 160)
    assert 12 <= len(kept) <= 16
    assert kept == list(range(160 - len(kept), 160))
    assert evicted == 160 - len(kept)
    assert len(scans) <= 3, scans


def test_a_block_used_after_its_store_outlives_older_stores_among_them(tmp_path):
    """The stores' blocks are candidates by their mtime when they are taken up: one loaded
    (used) since its store is kept while blocks stored after it, unused, go."""
    t = Tier(tmp_path, max_bytes=16 * FILE, min_free_fraction=0)
    try:
        for i in range(40):
            stored_in_turn(t, i)
        wait_for(settled(t.tier), "the passes of the first stores")
        assert t.load(30).success
        for i in range(40, 50):
            stored_in_turn(t, i)
        wait_for(settled(t.tier), "the last pass")
        kept = {block_index(p) for p in block_paths(tmp_path)}
        assert 30 in kept and 31 not in kept, sorted(kept)
    finally:
        t.close()


def stored_past_budget(root: Path, budget_files: int, n: int) -> tuple[list[int], list[int], int]:
    """Blocks 0 to n-1 stored in turn into a tier whose budget holds ``budget_files``, then
    its last pass: newest_kept's two lists, and the blocks the tier says it evicted."""
    t = Tier(root, max_bytes=budget_files * FILE, min_free_fraction=0)
    try:
        for i in range(n):
            stored_in_turn(t, i)
        wait_for(settled(t.tier), "the last pass")
        return (*newest_kept(list(range(n)), root), t.stats()["evicted_blocks"])
    finally:
        t.close()


def newest_kept(order: list[int], root: Path) -> tuple[list[int], list[int]]:
    """The blocks on disk, and what LRU would keep: as many of ``order`` (blocks by last
    use, oldest first) counted from its end."""
    kept = {block_index(p) for p in block_paths(root)}
    return sorted(kept), sorted(order[len(order) - len(kept) :])


def test_blocks_left_out_of_a_scan_go_before_newer_stores(tmp_path, monkeypatch):
    """A scan keeps only the oldest survey.MAX_CANDIDATES blocks (262,144; 4 here): after
    those, the blocks it left out are older than anything stored since, so the pass scans
    again instead of taking the stores."""
    monkeypatch.setattr(survey_module, "MAX_CANDIDATES", 4)
    kept, lru, _ = stored_past_budget(tmp_path, 16, 60)
    assert kept == lru and len(kept) >= 12


def test_stores_beyond_the_kept_paths_are_not_skipped(tmp_path, monkeypatch):
    """Past MAX_STORED_CANDIDATES (16,384; 8 here) stores are not remembered: the next pass
    scans rather than evict the remembered ones, which are newer than those left out."""
    monkeypatch.setattr(capacity_controller, "MAX_STORED_CANDIDATES", 8)
    kept, lru, _ = stored_past_budget(tmp_path, 40, 200)
    assert kept == lru and len(kept) >= 32


def test_a_candidate_used_since_its_scan_is_tried_again_after_older_stores(tmp_path):
    """A candidate loaded after the scan is kept when its turn comes, and is a candidate
    again among the stores (by its new mtime), not spared until the next scan."""
    t = Tier(tmp_path, max_bytes=16 * FILE, min_free_fraction=0)
    try:
        for i in range(20):
            stored_in_turn(t, i)
        wait_for(settled(t.tier), "the passes of the first stores")
        used = min(block_index(p) for p in block_paths(tmp_path))
        time.sleep(0.02)  # its use is later than every store so far, earlier than the next
        assert t.load(used).success
        time.sleep(0.02)
        for i in range(20, 60):
            stored_in_turn(t, i)
        wait_for(settled(t.tier), "the last pass")
        order = [i for i in range(20) if i != used] + [used] + list(range(20, 60))
        kept, lru = newest_kept(order, tmp_path)
        assert kept == lru and used not in kept
    finally:
        t.close()


def test_two_tiers_of_one_process_on_one_root_evict_in_lru_order(tmp_path, monkeypatch):
    """Two ranks' tiers of one process share a root: each remembers only its own stores, so
    when the other's "added" moved since the scan, the pass scans again (here every time:
    SCAN_SHARE lets walks take all the time) instead of evicting only its own newest."""
    monkeypatch.setattr(capacity_controller, "SCAN_SHARE", 1e9)
    a = Tier(tmp_path, max_bytes=24 * FILE, min_free_fraction=0)
    b = Tier.__new__(Tier)
    b.buf = np.zeros((2, ROW), dtype=np.uint8)
    b.tier = FileSystemTierManager(
        dataclasses.replace(SPEC, tp_size=2, rank=1),
        memoryview(b.buf),
        "fs",
        root_dir=str(tmp_path),
        n_read_threads=2,
        n_write_threads=2,
        max_bytes=24 * FILE,
        min_free_fraction=0,
    )
    b.next_id = 0
    order = []
    try:
        for step in range(200):
            tier, i = (b, 500 + step) if step % 4 == 3 else (a, step)
            stored_in_turn(tier, i)
            order.append(i)
        wait_for(settled(a.tier), "a's last pass")
        wait_for(settled(b.tier), "b's last pass")
        names = {f"{key(i).hex()}.kvb": i for i in order}
        kept = sorted(names[p.name] for p in block_paths(tmp_path))
        assert kept == sorted(order[len(order) - len(kept) :]) and len(kept) >= 18
    finally:
        a.close()
        b.close()


@pytest.mark.parametrize(
    ("then", "now", "stored"),
    [
        ({"b": 2, "c": 10}, {"b": 2, "c": 10}, False),
        ({"b": 2, "c": 10}, {"b": 2, "c": 12}, True),
        # b folded in by a reaper while c stored as much: the sum alone would not move.
        ({"b": 2, "c": 10}, {"c": 12}, True),
        ({"b": 2}, {"b": 2, "d": 1}, True),  # a writer that joined since and stored
        ({"b": 2}, {"b": 2, "d": 0}, False),
    ],
)
def test_other_writers_stores_since_a_scan_are_told_writer_by_writer(tmp_path, then, now, stored):
    """The refill from a tier's own stores is refused (the pass walks the root, within
    SCAN_SHARE) when another writer stored since the scan, whatever the others' sum does."""
    c = CapacityController(str(tmp_path), CapacityPolicy(max_bytes=64 * FILE), ROW)
    c.close()  # its thread would read the ledger into _state meanwhile
    c._others_added = then
    writers = {w: WriterRecord(added) for w, added in now.items()}
    writers[c._slot.id] = WriterRecord(5)  # its own stores never count
    c._state = dataclasses.replace(c._state, writers=writers)
    assert c._others_stored_since_scan() is stored


def test_eviction_frees_no_more_than_needed(tmp_path):
    """However many unlink threads there are, a pass removes only the oldest blocks that
    cover what is needed: the newer ones are the recently used part of the cache."""
    ns = tmp_path / "ns" / "rank-0"
    ns.mkdir(parents=True)
    for i in range(40):
        path = ns / f"{i:072x}.kvb"
        path.write_bytes(b"x" * 8192)
        os.utime(path, ns=(10**18 + i, 10**18 + i))  # block i was used at time i
    found = survey(str(tmp_path), 1 << 62)
    assert [Path(e.path).name for e in found.candidates[:2]] == [f"{i:072x}.kvb" for i in (0, 1)]
    with ThreadPoolExecutor(32) as pool:
        done = evict(found.candidates, 3 * 8192, workers=32, pool=pool)
    assert done.bytes == 3 * 8192
    assert sorted(Path(p).name for p in done.paths) == [f"{i:072x}.kvb" for i in range(3)]
    assert len(block_paths(tmp_path)) == 37
    assert done.unlink_cpu_seconds > 0


def test_kept_candidates_cost_the_garbage_collector_nothing(tmp_path):
    """A tier keeps up to 262,144 candidates between passes. As FileEntry objects (a
    NamedTuple, which the collector never stops tracking) every full collection of the
    engine's process traversed all of them with the GIL held; kept as plain tuples they leave
    the collector's lists after one collection."""
    ns = tmp_path / "ns" / "rank-0"
    ns.mkdir(parents=True)
    for i in range(2000):
        path = ns / f"{i:072x}.kvb"
        path.touch()
        os.utime(path, ns=(10**18 + i, 10**18 + i))
    gc.collect()
    before = len(gc.get_objects())
    found = survey(str(tmp_path), 1 << 62)
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    assert len(found.candidates) == 2000 and found.candidates.bytes == 0
    first = found.candidates[0]
    assert isinstance(first, FileEntry) and first.path == str(ns / f"{0:072x}.kvb")
    assert first.mtime_ns == 10**18 and first.is_block and first.namespace == "ns"
    assert [e.mtime_ns for e in found.candidates[1998:]] == [10**18 + 1998, 10**18 + 1999]
    assert found.candidates.drop_first(1990) == 0 and len(found.candidates) == 10


def test_eviction_never_follows_a_link_planted_below_the_root(tmp_path):
    """A directory the scan saw, replaced by a link to a directory outside the root before
    the evictor's turn: the file behind the link is kept, even with the scanned mtime."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    ns = root / "ns" / "rank-0"
    ns.mkdir(parents=True)
    outside.mkdir()
    name = f"{1:072x}.kvb"
    for directory in (ns, outside):
        (directory / name).write_bytes(directory.name.encode() * 1024)
        os.utime(directory / name, ns=(10**18, 10**18))
    found = survey(str(root), 1 << 62)
    assert [Path(e.path).name for e in found.candidates] == [name]
    shutil.rmtree(ns)
    ns.symlink_to(outside)
    done = evict(found.candidates, 1 << 62, workers=1, root=str(root))
    assert done.bytes == 0 and done.paths == [] and done.skipped_recent == 1
    assert (outside / name).read_bytes() == b"outside" * 1024
    # Without the root the path is followed as os.unlink follows it: what root= prevents.
    assert evict(found.candidates, 1 << 62, workers=1, dry_run=True).bytes == 7 * 1024


AUDITED_EVICTION = """
import json, os, sys
from kvtier.tiering.fs.capacity.evictor import evict
from kvtier.tiering.fs.capacity.survey import survey
root, veto = sys.argv[1], sys.argv[2] == "veto"
seen = []
def hook(event, args):
    if event == "kvtier.unlink_unchanged_files":
        seen.append([list(args[0]), args[1], all(os.path.exists(p) for p in args[0])])
        if veto:
            raise PermissionError("vetoed by an audit hook")
sys.addaudithook(hook)
found = survey(root, 1 << 62)
try:
    done = evict(found.candidates, 1 << 62, workers=1, root=root)
    print(json.dumps({"seen": seen, "removed": len(done.paths)}))
except PermissionError as e:
    print(json.dumps({"seen": seen, "refused": str(e)}))
"""


@pytest.mark.parametrize("veto", [False, True])
def test_audit_hooks_see_and_may_veto_the_evictors_removals(tmp_path, veto):
    """No os.remove runs for an evicted block: the native batch raises an audit event of its
    own first, with every path it may remove (as os.remove raises "os.remove")."""
    ns = tmp_path / "ns" / "rank-0"
    ns.mkdir(parents=True)
    names = [f"{i:072x}.kvb" for i in range(3)]
    for name in names:
        (ns / name).write_bytes(b"x" * 100)
    proc = subprocess.run(
        [sys.executable, "-c", AUDITED_EVICTION, str(tmp_path), "veto" if veto else "allow"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    ((paths, root, all_there_before),) = report["seen"]
    assert sorted(Path(p).name for p in paths) == names and root == str(tmp_path)
    assert all_there_before
    if veto:
        assert report["refused"] == "vetoed by an audit hook"
        assert sorted(p.name for p in ns.iterdir()) == names
    else:
        assert report["removed"] == 3 and list(ns.iterdir()) == []


VETO_ONE_OF_FOUR_SLICES = """
import json, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
from kvtier.tiering.fs.capacity.evictor import evict
from kvtier.tiering.fs.capacity.survey import survey
root = sys.argv[1]
calls, lock = [0], threading.Lock()
def hook(event, args):
    if event == "kvtier.unlink_unchanged_files":
        with lock:
            calls[0] += 1
            if calls[0] == 2:
                raise PermissionError("vetoed by an audit hook")
sys.addaudithook(hook)
reported = []
with ThreadPoolExecutor(4) as pool:
    try:
        evict(survey(root, 1 << 62).candidates, 1 << 62, workers=4, pool=pool, root=root,
              on_batch=lambda paths, nbytes, recycled: reported.extend(paths))
        print(json.dumps({"raised": None, "reported": reported}))
    except PermissionError as e:
        print(json.dumps({"raised": str(e), "reported": reported}))
"""


def test_a_veto_on_one_thread_still_reports_what_the_others_removed(tmp_path):
    """An audit hook refuses one of a wave's four slices: the pass stops with its error, and
    every file the other three threads removed is reported (the ledger is told), none lost."""
    ns = tmp_path / "ns" / "rank-0"
    ns.mkdir(parents=True)
    for i in range(8):
        (ns / f"{i:072x}.kvb").write_bytes(b"x" * 100)
    proc = subprocess.run(
        [sys.executable, "-c", VETO_ONE_OF_FOUR_SLICES, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["raised"] == "vetoed by an audit hook"
    left = {p.name for p in ns.iterdir()}
    assert len(left) == 2  # the vetoed slice's two files
    assert sorted(Path(p).name for p in report["reported"]) == sorted(
        f"{i:072x}.kvb" for i in range(8) if f"{i:072x}.kvb" not in left
    )


def test_a_block_this_process_may_not_remove_is_kept_and_eviction_goes_on(tmp_path):
    """EPERM (an immutable directory; another user's directory gives EACCES the same way) is
    about that file only: it is kept and counted, the other candidates go, and no error
    stops the pass (it once stopped every pass at the same oldest file, for ever)."""
    theirs, mine = tmp_path / "ns" / "theirs", tmp_path / "ns" / "mine"
    planted_blocks(theirs, 0, 4, 100, 10**18)  # the oldest
    planted_blocks(mine, 4, 4, 100, 2 * 10**18)
    with immutable(theirs):
        found = survey(str(tmp_path), 1 << 62)
        reported: list[str] = []
        done = evict(
            found.candidates,
            1 << 62,
            workers=1,
            root=str(tmp_path),
            on_batch=lambda paths, nbytes, recycled: reported.extend(paths),
        )
    assert done.denied == 4 and Path(done.first_denied).parent == theirs
    assert len(done.paths) == 4 and done.bytes == 400 and sorted(reported) == sorted(done.paths)
    assert len(list(theirs.iterdir())) == 4 and list(mine.iterdir()) == []


def test_a_tier_keeps_evicting_past_blocks_it_may_not_remove_and_says_so_once(tmp_path, caplog):
    theirs = tmp_path / "other-namespace" / "rank-0" / "00"
    planted_blocks(theirs, 10**6, 4, FILE - 100, 10**18)  # old, and not this tier's to remove
    caplog.set_level("WARNING")
    with immutable(theirs):
        t = Tier(tmp_path, max_bytes=12 * FILE, min_free_fraction=0)
        try:
            refused = [r.error for r in (t.store(i) for i in range(40)) if not r.success]
            assert not refused, refused[:3]
            wait_for(settled(t.tier), "eviction to settle")
            assert len(list(theirs.iterdir())) == 4
            assert t.stats()["evicted_blocks"] >= 40 - 8
        finally:
            t.close()
    warnings = [m for m in caplog.messages if "may not remove" in m]
    assert len(warnings) == 1 and str(theirs) in warnings[0], warnings


def test_the_native_unlink_names_a_root_it_cannot_open_and_refuses_a_nul(tmp_path):
    missing = str(tmp_path / "gone")
    assert _core.unlink_unchanged_files([], [], missing) == ([], None, [])  # nothing to open
    outcomes, error, _ = _core.unlink_unchanged_files([missing + "/a.kvb"], [(0, 0)], missing)
    assert outcomes == [] and error.errno == errno.ENOENT and error.filename == missing
    with pytest.raises(TypeError, match="sequence of paths"):  # not one path per character
        _core.unlink_unchanged_files(str(tmp_path / "a.kvb"), [], str(tmp_path))
    with pytest.raises(ValueError, match="one mtime per path"):
        _core.unlink_unchanged_files([], [(0, 0)], str(tmp_path))
    with pytest.raises(ValueError, match="embedded null byte"):
        _core.unlink_unchanged_files([str(tmp_path / "a\0b.kvb")], [(0, 0)], str(tmp_path))


def test_blocks_below_a_directory_whose_name_is_not_utf8_are_evicted(tmp_path):
    """A directory under the root named with bytes that are not UTF-8 (a co-tenant's, or an
    old namespace): its paths reach the core as the file system spells them."""
    odd = os.fsencode(tmp_path) + b"/ns-\xff/rank-0"
    os.makedirs(odd)
    for i in range(3):
        with open(odd + b"/%072x.kvb" % i, "wb") as f:
            f.write(b"x" * 100)
    found = survey(str(tmp_path), 1 << 62)
    done = evict(found.candidates, 1 << 62, workers=1, root=str(tmp_path))
    assert len(done.paths) == 3 and done.bytes == 300
    assert os.listdir(odd) == []


@pytest.mark.parametrize("workers", [1, 4])
def test_an_unlink_error_stops_eviction_after_reporting_what_it_removed(tmp_path, workers):
    """EROFS (a read-only bind mount over part of the root) stops the pass: every file it
    removed before was passed to on_batch, and the error names the file it failed on."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a read-only bind mount")
    ns = tmp_path / "ns" / "rank-0"
    writable, frozen = ns / "a", ns / "b"
    for n, directory in enumerate((writable, frozen)):
        directory.mkdir(parents=True)
        for i in range(6):
            path = directory / f"{n * 6 + i:072x}.kvb"
            path.write_bytes(b"x" * 8192)
            os.utime(path, ns=(10**18 + n * 6 + i, 10**18 + n * 6 + i))  # a's are older
    subprocess.run(["mount", "--bind", str(frozen), str(frozen)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(frozen)], check=True)
        found = survey(str(tmp_path), 1 << 62)
        reported: list[str] = []
        with ThreadPoolExecutor(workers) as pool, pytest.raises(OSError) as caught:
            evict(
                found.candidates,
                1 << 62,
                workers=workers,
                pool=pool if workers > 1 else None,
                on_batch=lambda paths, nbytes, recycled: reported.extend(paths),
                root=str(tmp_path),
            )
        assert caught.value.errno == errno.EROFS
        assert Path(caught.value.filename).parent == frozen
        assert "(unlink)" in str(caught.value)
        assert sorted(Path(p).name for p in reported) == [f"{i:072x}.kvb" for i in range(6)]
        assert list(writable.iterdir()) == []  # the older half went, and was reported
        assert len(list(frozen.iterdir())) == 6
    finally:
        subprocess.run(["umount", str(frozen)], check=False)


def test_evicted_block_is_a_clean_miss(tmp_path):
    """The evicting process stops reporting an evicted block at once; a load of it fails
    as a miss with ENOENT in its error."""
    t = Tier(tmp_path, max_bytes=40 * FILE)
    try:
        for i in range(120):
            t.store(i)
        wait_for(lambda: t.stats()["evicted_blocks"] > 0, "evictions")
        present = {p.name for p in block_paths(tmp_path)}
        gone = [i for i in range(120) if f"{key(i).hex()}.kvb" not in present]
        assert gone and t.tier.lookup(key(gone[0]), CTX) is False
        r = t.load(gone[0])
        assert not r.success and "No such file" in r.error and "errno 2" in r.error
    finally:
        t.close()


def test_eviction_none_refuses_stores_and_keeps_serving_loads(tmp_path):
    budget = 8 * FILE
    t = Tier(tmp_path, max_bytes=budget, eviction="none", min_free_fraction=0)
    try:
        results = [t.store(i) for i in range(12)]
        refused = [r for r in results if not r.success]
        assert refused and all("errno 28" in r.error and "No space" in r.error for r in refused)
        assert t.stats()["rejected_stores"] == len(refused)
        assert t.stats()["evicted_blocks"] == 0
        kept = [i for i, r in enumerate(results) if r.success]
        assert len(block_paths(tmp_path)) == len(kept)
        assert all(t.load(i).success for i in kept)
        assert disk_bytes(tmp_path) <= budget
    finally:
        t.close()


# -- restarts -----------------------------------------------------------------------------


@pytest.mark.parametrize("ledger", ["kept", "removed"])
def test_restart_into_a_smaller_budget(tmp_path, ledger):
    """A root filled by one instance is brought within a smaller budget by the next, whose
    blocks still load; without the ledger (files adopted from anyone) too."""
    first = Tier(tmp_path)
    for i in range(40):
        assert first.store(i).success
        if i == 19:
            time.sleep(0.05)  # file systems keep coarse timestamps: keep the halves apart
    first.close()
    if ledger == "removed":
        shutil.rmtree(tmp_path / STATE_DIR_NAME)
    budget = 12 * FILE
    second = Tier(tmp_path, max_bytes=budget)
    try:
        wait_for(lambda: disk_bytes(tmp_path) <= budget, "the smaller budget")
        wait_for(settled(second.tier), "eviction to finish")
        names = {p.name for p in block_paths(tmp_path)}
        left = [i for i in range(40) if f"{key(i).hex()}.kvb" in names]
        assert left and all(second.load(i).success for i in left)
        assert min(left) >= 20  # the most recently stored survive
    finally:
        second.close()


CRASHER = """
import os, signal, sys, numpy as np
from kvtier.tiering.base import JobMetadata
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec
buf = np.ones((1, int(sys.argv[2])), dtype=np.uint8)
spec = OffloadingSpec(model_name="org/capacity", dtype="float16", kv_layout="NHD")
tier = FileSystemTierManager(spec, memoryview(buf), "fs", root_dir=sys.argv[1],
                             max_bytes=sys.argv[3])
for i in range(4):
    tier.submit_store(JobMetadata(i, [bytes(36 - 1) + bytes([i])], np.zeros(1, np.int64),
                                  False, None))
tier.drain_jobs()
os.kill(os.getpid(), signal.SIGKILL)  # dies holding its lease: no shutdown, no settle
"""


def test_budget_of_a_crashed_process_comes_back(tmp_path):
    """A process killed while holding budget leaves its record in the ledger; the next tier
    sees its lock free, folds it in, recounts, and the ledger agrees with the files again."""
    budget = 64 * FILE
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, str(tmp_path), str(ROW), str(budget)],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    dead = ledger(tmp_path).writers
    assert sum(r.reserved + r.writing for r in dead.values()) > 0  # the dead process's budget
    t = Tier(tmp_path, max_bytes=budget)
    try:

        def recounted() -> bool:
            state = ledger(tmp_path)
            return (
                not set(dead) & set(state.writers)
                and state.files == disk_bytes(tmp_path) == 4 * FILE
                and state.reserved <= t.tier._capacity.chunk_bytes
            )

        wait_for(recounted, "the ledger to drop the dead lease and recount")
        assert t.store(7).success and t.load(7).success
    finally:
        t.close()


def test_blocks_deleted_behind_the_ledgers_back_are_recounted(tmp_path):
    """Files removed by someone else (rm, an old gc) make the ledger over-count; the next
    eviction pass's scan notices and recounts instead of waiting for RECONCILE_SECONDS. The
    stores race that recount (a block both scanned and settled on top); the recount once the
    root is quiet makes the ledger exact again."""
    budget = 64 * FILE
    t = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:
        for i in range(40):
            assert t.store(i).success
        for path in block_paths(tmp_path):
            path.unlink(missing_ok=True)  # an eviction pass may be removing some too
        for i in range(100, 200):
            assert t.store(i).success

        def agrees() -> bool:
            return ledger(tmp_path).files == disk_bytes(tmp_path)

        wait_for(settled(t.tier), "eviction to finish")
        wait_for(agrees, "the ledger to agree with the files")
    finally:
        t.close()


def test_a_store_settled_while_a_recount_scans_is_not_counted_twice(tmp_path, monkeypatch):
    """A store in flight when a reconcile scan starts renames its file before the scan
    reaches it and is settled after: the scan counts the file and the writer's record adds
    it on top. The controller notices that the scan was raced and recounts once the root is
    quiet, so the ledger becomes exact instead of staying a block above the files for
    RECONCILE_SECONDS (deterministic form of the race the test above hits by chance)."""
    t = Tier(tmp_path, max_bytes=16 * FILE, min_free_fraction=0)
    ctrl = t.tier._capacity
    try:
        for i in range(12):
            assert t.store(i).success
        for path in block_paths(tmp_path):
            path.unlink()  # behind the ledger's back: the next eviction scan recounts
        assert ctrl.admit(1) is None  # a store in flight (its tmp file not written yet)
        raced = threading.Event()
        real_survey = capacity_controller.survey

        def survey_racing_a_store(*args, **kwargs):
            if not raced.is_set():
                raced.set()
                # The store renames its block before the scan lists the root, and is
                # settled (in memory; its record later) while the scan runs.
                (tmp_path / "raced.kvb").write_bytes(b"\0" * FILE)
                ctrl.finish_store(1, 1)
            return real_survey(*args, **kwargs)

        monkeypatch.setattr(capacity_controller, "survey", survey_racing_a_store)
        for i in range(100, 108):  # the ledger passes the watermark: a pass scans
            assert t.store(i).success
        wait_for(raced.is_set, "an eviction scan")
        wait_for(settled(t.tier), "eviction to finish")

        def exact() -> bool:
            # This tier's record must show the raced store settled: before it does, the
            # ledger can agree with the files by chance.
            state = ledger(tmp_path)
            mine = state.writers.get(ctrl._slot.id)
            settled_here = mine is not None and mine.added == ctrl._added and not mine.writing
            return settled_here and state.files == disk_bytes(tmp_path)

        wait_for(exact, "an exact ledger")
    finally:
        t.close()


def test_large_root_without_ledger_starts_at_once_and_reaches_budget(tmp_path):
    """20k small block files written by someone else: the tier does not scan them before
    it starts (STARTUP_SCAN_FILES), counts them in the background and evicts to budget."""
    leaf_root = tmp_path / "adopted-ns" / "rank-0"
    n, size = 20_000, 4096
    for d in range(100):
        (leaf_root / f"{d:02x}").mkdir(parents=True)
    data = b"\0" * size
    for i in range(n):
        (leaf_root / f"{i % 100:02x}" / f"{i:072x}.kvb").write_bytes(data)
    budget = n * size // 2
    t = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:
        # Until the scan finishes, the file system's used bytes bound the usage.
        wait_for(lambda: disk_bytes(tmp_path) <= budget, "the budget")
        assert t.store(1).success
        assert t.stats()["evicted_blocks"] >= n // 2 - 1
    finally:
        t.close()


# -- free space ----------------------------------------------------------------------------


def test_min_free_fraction_on_a_small_tmpfs(tmp_path):
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount(8) for a size-limited tmpfs")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {proc.stderr.decode().strip()}")
    try:
        floor = 0.25
        t = Tier(mnt, min_free_fraction=floor)
        try:
            results = []
            for i in range(3 * (16 << 20) // FILE):
                results.append(t.store(i))
            failed = [r.error for r in results if not r.success]
            assert not failed, failed[:3]
            assert t.stats()["evicted_blocks"] > 0
            wait_for(
                lambda: os.statvfs(mnt).f_bavail / os.statvfs(mnt).f_blocks >= floor,
                "free space above the floor",
            )
        finally:
            t.close()
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def test_a_store_held_by_the_free_space_floor_says_so(tmpfs_mount, monkeypatch, caplog):
    """A volume other tenants filled below the floor: kvtier's own blocks cannot make room,
    so the store waits its bound and is refused with the floor (not "the byte budget") as
    the reason, and the operator gets one warning, not one per store."""
    subprocess.run(["mount", "-o", "remount,size=8m", str(tmpfs_mount)], check=True)
    (tmpfs_mount / "other-tenant").write_bytes(b"x" * (6 << 20))  # 2 MiB left of 8
    monkeypatch.setattr(capacity_controller, "STORE_WAIT_SECONDS", 0.5)
    caplog.set_level("WARNING")
    t = Tier(tmpfs_mount, min_free_fraction=0.5)  # no max_bytes: only the floor holds it
    try:
        refused = [t.store(i) for i in range(3)]
        for r in refused:
            assert not r.success
            assert "free space stayed below min_free_fraction 0.5" in r.error, r.error
            assert "the floor is 4 MiB" in r.error, r.error
            assert "byte budget" not in r.error, r.error
        warnings = [m for m in caplog.messages if "free space on the volume" in m]
        assert len(warnings) == 1, warnings
        assert str(tmpfs_mount) in warnings[0]
        assert t.stats()["rejected_stores"] == 3
        (tmpfs_mount / "other-tenant").unlink()  # the tenant frees its space: stores go on
        wait_for(lambda: t.store(10).success, "a store once the floor is met")
    finally:
        t.close()


# -- shared state that nothing can corrupt (issue 18) --------------------------------------


def ledger_warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and LEDGER_FILE_NAME in r.getMessage()
    ]


def filled_root(root: Path, n: int) -> None:
    t = Tier(root)
    for i in range(n):
        assert t.store(i).success
    t.close()


def test_torn_ledger_is_rebuilt_by_a_scan_with_one_warning(tmp_path, caplog):
    """A ledger torn by a crash mid-write (trailing bytes of an older, longer version) is
    neither trusted nor silently reset: one warning, a recount, and stores go on."""
    filled_root(tmp_path, 10)
    path = tmp_path / STATE_DIR_NAME / LEDGER_FILE_NAME
    path.write_bytes(path.read_bytes() + b"\0" * 37)
    caplog.set_level("WARNING")
    t = Tier(tmp_path, max_bytes=64 * FILE, min_free_fraction=0)
    try:
        assert t.store(100).success
        wait_for(lambda: ledger(tmp_path).files == disk_bytes(tmp_path) == 11 * FILE, "a recount")
        assert len(ledger_warnings(caplog)) == 1, ledger_warnings(caplog)
    finally:
        t.close()


def test_a_count_older_than_the_records_is_rebuilt(tmp_path):
    """A tier's evictor reads the count as it was before it folded a dead writer in (what a
    client cache of a network file system can serve after another host's evictor did it):
    an entry for a writer whose record is gone. Trusted, the count would be that writer's
    four files short until the next periodic recount; it is rebuilt by a scan instead."""
    assert (
        finish(run_worker(tmp_path, 0, 4, {"max_bytes": 64 * FILE, "min_free_fraction": 0}))[
            "stored"
        ]
        == 4
    )
    path = tmp_path / STATE_DIR_NAME / LEDGER_FILE_NAME
    older = path.read_bytes()  # the worker's entry, none of its four files
    (dead,) = ledger(tmp_path).writers
    assert Base.decode(older).folded == {dead: 0} and Base.decode(older).files == 0
    t = Tier(tmp_path, max_bytes=64 * FILE, min_free_fraction=0)
    try:
        wait_for(lambda: dead not in ledger(tmp_path).writers, "the dead writer to be folded in")
        assert ledger(tmp_path).files == disk_bytes(tmp_path) == 4 * FILE
        tmp = path.with_name("older.tmp")
        tmp.write_bytes(older)
        tmp.rename(path)  # read with no record of the worker left: four files short
        wait_for(lambda: ledger(tmp_path).files == 4 * FILE, "a recount", timeout=15)
        assert ledger(tmp_path).orphans == []
    finally:
        t.close()


@pytest.mark.parametrize("bad", ["nested", "infinity", "sparse-1TiB", "fifo", "out-of-range"])
def test_invalid_ledger_contents_are_rebuilt_by_a_scan(tmp_path, caplog, bad):
    """Whatever lies at the ledger's path, the tier starts, warns once and recounts: no
    RecursionError, OverflowError or MemoryError, nor a value trusted because it decodes."""
    filled_root(tmp_path, 6)
    path = tmp_path / STATE_DIR_NAME / LEDGER_FILE_NAME
    path.unlink(missing_ok=True)
    if bad == "nested":
        path.write_bytes(b"[" * 100_000)
    elif bad == "infinity":
        path.write_bytes(b'{"files": Infinity, "added": 1e999, "leases": {"a": [1e999, 0]}}')
    elif bad == "sparse-1TiB":
        with open(path, "wb") as f:
            f.truncate(1 << 40)
    elif bad == "fifo":
        os.mkfifo(path)
    else:  # a well-formed record whose count is no real file system's
        path.write_bytes(Base(files=(1 << 63) + 5, complete=True).encode())
    caplog.set_level("WARNING")
    t = Tier(tmp_path, max_bytes=64 * FILE, min_free_fraction=0)
    try:
        assert t.store(100).success
        wait_for(lambda: ledger(tmp_path).files == disk_bytes(tmp_path) == 7 * FILE, "a recount")
        assert t.stats()["used_bytes"] == 7 * FILE
        assert len(ledger_warnings(caplog)) == 1, ledger_warnings(caplog)
    finally:
        t.close()


HOLDER = """
import os, sys, time
writer = int(sys.argv[2])
root = sys.argv[1]
tier = None
if writer:  # a writer that dies holding budget, in another PID namespace ("a container")
    import numpy as np
    from kvtier.tiering.base import JobMetadata
    from kvtier.tiering.fs.manager import FileSystemTierManager
    from kvtier.tiering.spec import OffloadingSpec
    buf = np.ones((1, int(sys.argv[3])), dtype=np.uint8)
    spec = OffloadingSpec(model_name="org/capacity", dtype="float16", kv_layout="NHD")
    tier = FileSystemTierManager(spec, memoryview(buf), "fs", root_dir=root,
                                 max_bytes=sys.argv[4], min_free_fraction=0)
    for i in range(3):
        tier.submit_store(JobMetadata(i, [bytes(35) + bytes([200 + i])],
                                      np.zeros(1, np.int64), False, None))
    tier.drain_jobs()
    time.sleep(1.5)  # its record written (a tick)
print(os.getpid(), flush=True)
time.sleep(600)
"""


def test_a_dead_writer_of_another_pid_namespace_with_a_fast_clock_is_dead(tmp_path):
    """A writer killed inside its own PID namespace (its pid means nothing here, and may be
    a live pid of this one), whose files are dated an hour ahead (a host with a fast clock):
    its lock is free, so its reservation is dropped and its blocks are counted at once."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a separate PID namespace")
    budget = 64 * FILE
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-c", HOLDER]
        + [str(tmp_path), "1", str(ROW), str(budget)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline()
    if not line:
        pytest.skip(f"unshare --pid is not permitted here: {proc.stderr.read().strip()}")
    assert int(line) == 1  # pid 1 of its namespace: alive from anyone's point of view here
    dead = ledger(tmp_path).writers
    assert sum(r.added + r.reserved for r in dead.values()) > 0
    proc.kill()
    proc.wait(timeout=30)
    future = time.time() + 3600
    for path in (tmp_path / STATE_DIR_NAME).rglob("*"):
        os.utime(path, (future, future), follow_symlinks=False)
    t = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:

        def folded() -> bool:
            state = ledger(tmp_path)
            return not set(dead) & set(state.writers) and state.files == disk_bytes(tmp_path)

        wait_for(folded, "the dead writer's record to be folded in")
        assert disk_bytes(tmp_path) == 3 * FILE
        assert ledger(tmp_path).reserved <= t.tier._capacity.chunk_bytes
        assert t.store(7).success
    finally:
        t.close()


def test_two_paths_to_one_root_are_one_root(tmp_path):
    """A symlinked root_dir is the same root: one evictor lock between the two paths, also
    within one process, and one budget."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real)
    with evictor_lock(str(real)) as first, evictor_lock(str(link)) as second:
        assert first and not second
    a = Tier(real, max_bytes=20 * FILE, min_free_fraction=0)
    b = Tier(link, max_bytes=20 * FILE, min_free_fraction=0)
    try:
        for i in range(30):
            assert (a if i % 2 else b).store(i).success
        wait_for(settled(a.tier), "a idle")
        wait_for(settled(b.tier), "b idle")
        assert disk_bytes(real) <= 20 * FILE
        assert a.stats()["evicted_blocks"] + b.stats()["evicted_blocks"] >= 10
    finally:
        a.close()
        b.close()


def descriptors_under(root: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(root)):
            found.append(target)
    return found


def test_shutdown_releases_every_descriptor_and_the_volume_unmounts(tmpfs_mount):
    mnt = tmpfs_mount
    tiers = [Tier(mnt, max_bytes=8 * FILE, min_free_fraction=0) for _ in range(3)]
    for n, t in enumerate(tiers):
        for i in range(12):
            assert t.store(100 * n + i).success
    for t in tiers:
        t.close()
    # Everything is released at shutdown(), the tier objects still referenced.
    assert descriptors_under(mnt) == []
    umount = subprocess.run(["umount", str(mnt)], capture_output=True, text=True)
    assert umount.returncode == 0, umount.stderr


def _remove_state_directory_under_live_tiers(root: Path) -> None:
    """Removes root/.kvtier/ as an operator's rm -rf would, repeated until one removal went
    through: a live tier may write its record into it meanwhile (ENOTEMPTY, or ENOENT for a
    file it renamed away). A tier may rejoin (recreate .kvtier/) the moment it is gone, so
    what proves the removal is the rmtree that succeeded, not its absence after."""
    for _ in range(100):
        try:
            shutil.rmtree(root / STATE_DIR_NAME)
            return
        except FileNotFoundError:
            if not (root / STATE_DIR_NAME).exists():
                return  # gone (the previous attempt removed the rest)
        except OSError as e:
            if e.errno != errno.ENOTEMPTY:
                raise
    pytest.fail(".kvtier/ could not be removed in 100 attempts")


def test_a_tier_alone_on_a_removed_state_directory_recounts_and_stores_on(tmp_path):
    """Alone on its root, a tier whose .kvtier/ was removed rejoins with no count; until a
    scan counts the root, the file system's used bytes stand in for it, so the rejoin must
    scan at once. (It waited for the periodic recount, and stores failed with ENOSPC "used
    0 B" meanwhile, wherever the file system held more than the budget.)"""
    root = tmp_path / "root"
    root.mkdir()
    budget = 24 * FILE
    # The file system holds more than the budget, whatever else is on it.
    (tmp_path / "ballast").write_bytes(b"\xa5" * (2 * budget))
    t = Tier(root, max_bytes=budget, min_free_fraction=0)
    try:
        for i in range(3 * 24):  # past the first reservations: the count decides
            assert t.store(i).success
        _remove_state_directory_under_live_tiers(root)
        wait_for(lambda: len(ledger(root).writers) == 1, "the tier to rejoin")
        for i in range(100, 100 + 3 * 24):
            r = t.store(i)
            assert r.success, r.error
        wait_for(settled(t.tier), "the tier idle")
        assert disk_bytes(root) <= budget
    finally:
        t.close()


def test_a_replaced_state_directory_is_rejoined(tmp_path):
    """A tier whose .kvtier/ was removed under it joins the new one: tiers started later
    see it, and usage stays within the budget."""
    budget = 24 * FILE
    a = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:
        assert a.store(1).success
        _remove_state_directory_under_live_tiers(tmp_path)
        b = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
        try:
            wait_for(lambda: len(ledger(tmp_path).writers) == 2, "the first tier to rejoin")
            for i in range(60):
                assert (a if i % 2 else b).store(100 + i).success
            wait_for(settled(a.tier), "a idle")
            wait_for(settled(b.tier), "b idle")
            assert disk_bytes(tmp_path) <= budget
        finally:
            b.close()
    finally:
        a.close()


LOCKER = """
import fcntl, os, sys, select
held = 0
for d, _, names in os.walk(os.path.join(sys.argv[1], ".kvtier")):
    for n in names:
        fd = os.open(os.path.join(d, n), os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held += 1
        except OSError:
            os.close(fd)  # a live writer's own lock: not ours to take
print("held", held, flush=True)
ready, _, _ = select.select([sys.stdin], [], [], 90)
print("released on request" if ready else "released by timeout", flush=True)
"""


def test_calls_do_not_wait_for_a_process_holding_the_roots_locks(tmp_path):
    """Another process holds a lock on every file of the state directory (a frozen
    co-tenant). submit_store (beyond this instance's reservation), lookup, touch,
    get_finished and shutdown all return while it still holds them: it releases only when
    told to, after they returned, and says so."""
    t = Tier(tmp_path, max_bytes=2000 * FILE, min_free_fraction=0)
    assert t.store(0).success
    locker = subprocess.Popen(
        [sys.executable, "-c", LOCKER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        held = locker.stdout.readline().split()
        assert held[0] == "held" and int(held[1]) >= 2  # the ledger and the evictor lock
        n_jobs = 3 * t.tier._capacity.chunk_bytes // FILE  # beyond one reservation
        for j in range(n_jobs):
            job = JobMetadata(1000 + j, [key(1000 + j)], np.zeros(1, np.int64), False, CTX)
            t.tier.submit_store(job)
        assert t.tier.lookup(key(0), CTX) in (True, None)
        t.tier.touch([key(0)], CTX)
        results = t.tier.get_finished()
        t.tier.shutdown()
        locker.stdin.write("release\n")
        locker.stdin.flush()
        assert locker.stdout.readline().strip() == "released on request"
    finally:
        locker.kill()
        locker.wait()
    results += t.tier.get_finished()
    assert sorted(r.job_id for r in results) == list(range(1000, 1000 + n_jobs))


def test_a_failure_inside_submit_is_one_failed_job_and_frees_its_slot(tmp_path):
    """With the root gone, each store is reported once as failed, never raised from
    submit_store and never left in flight: the store queue does not fill up."""
    t = Tier(tmp_path, max_bytes=64 * FILE, max_queued_store_jobs=2)
    try:
        shutil.rmtree(tmp_path)
        for i in range(6):
            r = t.store(i)
            assert not r.success and r.error
        stats = t.stats()
        assert stats["queued_store_jobs"] == 0 and stats["dropped_store_jobs"] == 0
    finally:
        t.close()


# -- budget behaviour (issue 18) -----------------------------------------------------------


@pytest.mark.parametrize("files", [16, 40])
def test_small_budgets_are_used(tmp_path, files):
    """In steady state block bytes stay between 80% and 100% of a budget of 16 or more
    block files (sampled after each store once its eviction, if any, is over)."""
    budget = files * FILE
    t = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:
        samples = []
        for i in range(4 * files):
            assert t.store(i).success
            wait_for(settled(t.tier), "the capacity thread to be idle")
            samples.append(len(block_paths(tmp_path)) * FILE)
        steady = samples[files:]
        assert t.stats()["evicted_blocks"] > 0
        assert 0.8 * budget <= min(steady) and max(steady) <= budget, steady
    finally:
        t.close()


def test_used_bytes_are_block_bytes_and_reservations_are_separate(tmp_path):
    t = Tier(tmp_path, max_bytes=1 << 30, min_free_fraction=0)
    try:
        assert t.stats()["used_bytes"] == 0
        assert t.store(1).success
        stats = t.stats()
        assert stats["used_bytes"] == FILE == disk_bytes(tmp_path)
        assert stats["reserved_bytes"] >= 0
    finally:
        t.close()


def test_idle_reservations_do_not_evict_an_active_tiers_blocks(tmp_path):
    """Ten instances stored once and went idle; their reservations go back, and the one
    active instance keeps at least 80% of the budget in blocks."""
    budget = 64 * FILE
    idle = [Tier(tmp_path, max_bytes=budget, min_free_fraction=0) for _ in range(10)]
    active = Tier(tmp_path, max_bytes=budget, min_free_fraction=0)
    try:
        for n, t in enumerate(idle):
            assert t.store(10_000 + n).success
        wait_for(lambda: ledger(tmp_path).reserved == 0, "idle reservations to go back")
        for i in range(2 * 64):
            assert active.store(i).success
        wait_for(settled(active.tier), "eviction to finish")
        assert len(block_paths(tmp_path)) * FILE >= 0.8 * budget
    finally:
        for t in [*idle, active]:
            t.close()


def test_lru_never_refuses_a_store_while_eviction_can_make_room(tmp_path):
    """Waves of store jobs submitted at once, each wave larger than the budget: under "lru"
    none is refused (a store with no room yet waits for eviction off the caller's thread),
    and block bytes sampled meanwhile never pass max_bytes (the margin is zero: stores wait
    instead) beyond the files a sample can see twice (a rename between two directories)."""
    row, budget, wave, waves, rows = 64 << 10, 16 << 20, 400, 3, 8
    small = block_file_bytes(row)
    buf = np.random.default_rng(0).integers(0, 256, (rows, row), dtype=np.uint8)
    tier = FileSystemTierManager(
        SPEC,
        memoryview(buf),
        "fs",
        root_dir=str(tmp_path),
        max_bytes=budget,
        min_free_fraction=0,
        max_queued_store_jobs=10 * wave,
        n_write_threads=2,
    )
    samples: list[int] = []
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(block_bytes_still_on_disk(tmp_path))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample)
    sampler.start()
    failed = []
    try:
        for w in range(waves):
            ids = range(w * wave, (w + 1) * wave)
            for j in ids:
                keys = [key(j)]
                tier.submit_store(JobMetadata(j, keys, np.array([j % rows]), False, CTX))
            tier.drain_jobs()
            results = {}
            deadline = time.monotonic() + WAIT_SECONDS
            while len(results) < wave and time.monotonic() < deadline:
                results.update((r.job_id, r) for r in tier.get_finished())
                time.sleep(0.01)
            assert set(results) == set(ids)
            failed += [r.error for r in results.values() if not r.success]
        assert not failed, failed[:3]
        assert tier.stats()["evicted_blocks"] > 0
    finally:
        stop.set()
        sampler.join()
        tier.shutdown()
    assert max(samples) <= budget + 2 * small, (max(samples), budget)


def test_restart_into_a_smaller_budget_stores_at_once(tmp_path):
    filled_root(tmp_path, 40)
    t = Tier(tmp_path, max_bytes=12 * FILE, min_free_fraction=0)
    try:
        assert t.store(1000).success  # waits for room, is not refused
        wait_for(settled(t.tier), "eviction to finish")
        assert disk_bytes(tmp_path) <= 12 * FILE
    finally:
        t.close()


def test_capacity_calls_return_while_the_state_directory_is_frozen(stallfs):
    """The root's state directory stops answering (a hung network file system): admission,
    uses, stats and close() all return while it is still frozen; stores that need more
    budget are deferred, not waited for."""
    root = stallfs.mountpoint
    c = CapacityController(str(root), CapacityPolicy(max_bytes=64 * FILE, min_free_fraction=0), ROW)
    assert c.admit(1) is None  # the file system answers: a first reservation
    c.finish_store(1, 1)
    stallfs.match(STATE_DIR_NAME)
    stallfs.freeze("all")
    stallfs.wait_blocked(1)  # the capacity thread is stuck in the state directory
    answers: list = []
    for _ in range(3):
        answers.append(c.admit(1, then=answers.append))
    c.record_use([str(root / "x.kvb")])
    assert c.stats()["capacity_bytes"] == 64 * FILE
    c.close()
    assert stallfs.status()["blocked"] >= 1  # all of the above returned while frozen
    assert DEFERRED in answers
    stallfs.thaw()
    assert c._exited.wait(WAIT_SECONDS)  # the thread ends once the mount answers again


def test_stores_a_stuck_capacity_thread_cannot_answer_are_refused_by_the_callers_thread(
    stallfs, monkeypatch
):
    """The capacity thread is stuck in the kernel (a frozen state directory) while stores
    wait for budget: get_finished's expire_waiting() refuses each one once it is past its
    wait and the thread's grace (a tick, in which the thread itself would have answered),
    saying the thread did not answer, and leaves a store that is not alone. Called from
    several threads at once, each store is answered exactly once."""
    wait, grace = 0.4, 0.6
    monkeypatch.setattr(capacity_controller, "STORE_WAIT_SECONDS", wait)
    monkeypatch.setattr(capacity_controller, "TICK_SECONDS", grace)
    root = stallfs.mountpoint
    c = CapacityController(str(root), CapacityPolicy(max_bytes=64 * FILE, min_free_fraction=0), ROW)

    def expire_from_threads() -> None:
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda _: c.expire_waiting(), range(8)))

    try:
        assert c.admit(1) is None  # the file system answers: a first reservation
        c.finish_store(1, 1)
        stallfs.match(STATE_DIR_NAME)
        stallfs.freeze("all")
        stallfs.wait_blocked(1)  # the capacity thread is stuck in the state directory
        answers: dict[str, list] = {"old": [], "new": []}
        # More than any reservation holds, less than the budget: each waits for the thread.
        assert c.admit(40, then=answers["old"].append) is DEFERRED
        time.sleep(wait + grace / 3)  # past its wait, not past the grace
        expire_from_threads()
        assert answers["old"] == [], answers  # the thread's tick is not over yet
        time.sleep(grace)  # past both
        assert c.admit(40, then=answers["new"].append) is DEFERRED
        expire_from_threads()
        assert len(answers["old"]) == 1, answers
        assert "the capacity thread did not answer in time" in answers["old"][0], answers
        assert answers["new"] == [], answers  # its own wait has just begun
        time.sleep(wait + grace + 0.1)
        expire_from_threads()
        assert len(answers["new"]) == 1, answers
        assert "the capacity thread did not answer in time" in answers["new"][0], answers
        assert c.stats()["rejected_stores"] == 2
    finally:
        c.close()
        stallfs.thaw()
    assert c._exited.wait(WAIT_SECONDS)


def test_a_request_made_while_the_thread_is_busy_runs_next_not_a_tick_later(tmp_path, monkeypatch):
    """Callers ring the capacity thread only while it sleeps; one that asks while it is busy
    only sets a flag, which the thread must read before it sleeps again. The thread's first
    tick is held at its end while a store waits for budget: once let go, the thread serves it
    at once, not a tick (here 30 s) later."""
    monkeypatch.setattr(capacity_controller, "TICK_SECONDS", 30.0)
    monkeypatch.setattr(capacity_controller, "WAIT_POLL_SECONDS", 30.0)
    c = CapacityController(str(tmp_path), CapacityPolicy(max_bytes=64 * FILE), ROW)
    held, release = threading.Event(), threading.Event()
    real_tick = c._tick

    def tick(asked: bool) -> None:
        real_tick(asked)
        if not held.is_set():  # the first tick, its work done: busy until let go
            held.set()
            release.wait(WAIT_SECONDS)

    c._tick = tick  # type: ignore[method-assign]
    answers: list[str | None] = []
    answered = threading.Event()
    try:
        c.request_eviction()  # the thread sleeps (a 30 s tick): this rings it
        assert held.wait(WAIT_SECONDS)
        assert c._busy
        # More than any reservation holds: the store waits, and asks for a pass.
        assert c.admit(40, then=lambda r: (answers.append(r), answered.set())) is DEFERRED
        release.set()
        assert answered.wait(10.0), "the request made while the thread was busy was lost"
        assert answers == [None]
    finally:
        release.set()
        c.close()
    assert c._exited.wait(WAIT_SECONDS)


def test_stores_from_several_threads_are_answered_with_no_tick_to_fall_back_on(
    tmp_path, monkeypatch
):
    """Four threads admit 300 stores each into a budget of 64 block files (each store gives
    its room back when answered): the thread is woken only by rings, its ticks 30 s apart, so
    a wake-up lost between a caller and the thread going to sleep would leave a store
    waiting far longer than the 10 s each is given. The interpreter switches threads every
    microsecond here, so that callers and the thread interleave as finely as they can."""
    monkeypatch.setattr(capacity_controller, "TICK_SECONDS", 30.0)
    monkeypatch.setattr(capacity_controller, "WAIT_POLL_SECONDS", 30.0)
    c = CapacityController(
        str(tmp_path), CapacityPolicy(max_bytes=64 * FILE, min_free_fraction=0), ROW
    )

    def stores(n: int) -> list[str | None]:
        results: list[str | None] = []
        for i in range(300):
            done = threading.Event()
            got: list[str | None] = []

            def then(reason: str | None, got=got, done=done) -> None:
                got.append(reason)
                done.set()

            path = [f"t{n}-{i}"]
            first = c.admit(8, then=then, paths=path)
            if first is DEFERRED:
                assert done.wait(10.0), f"store {i} of thread {n} was never answered"
                first = got[0]
            results.append(first)
            c.finish_store(8, 0, path)  # created nothing: its room goes back
        return results

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(4) as pool:
            answers = [r for rs in pool.map(stores, range(4)) for r in rs]
        sys.setswitchinterval(interval)
        assert answers == [None] * 1200
        assert c.stats()["rejected_stores"] == 0
    finally:
        sys.setswitchinterval(interval)
        c.close()
    assert c._exited.wait(WAIT_SECONDS)


def test_stores_finished_but_not_collected_are_not_evicted_from_under_their_count(tmp_path):
    """Stores whose files are written but whose results the engine has not collected yet
    still count as in flight: evicting those files frees nothing in the count, so the evictor
    kept evicting and emptied the cache (a burst of stores drained in one go did this). They
    are not eviction candidates until they are collected; then eviction brings the cache to
    its watermark, not to empty."""
    files = 20  # all admitted at once, and past the high watermark
    t = Tier(tmp_path, max_bytes=files * FILE + FILE // 2, min_free_fraction=0)
    try:
        for i in range(files):
            t.buf[0] = payload(i)
            t.tier.submit_store(JobMetadata(1000 + i, [key(i)], np.array([0]), False, CTX))
        # Written by the engine, not collected (no get_finished or drain_jobs yet).
        wait_for(lambda: t.stats()["store_blocks"] == files, "the engine to write every block")
        for _ in range(3):  # passes asked for and run while the stores are uncollected
            t.tier._capacity.request_eviction()
            wait_for(settled(t.tier), "the capacity thread to be idle")
        assert t.stats()["evicted_blocks"] == 0
        assert len(block_paths(tmp_path)) == files
        results = t.tier.get_finished()
        assert len(results) == files and all(r.success for r in results)
        t.tier._capacity.request_eviction()
        wait_for(settled(t.tier), "eviction to finish")
        assert 0.8 * files <= len(block_paths(tmp_path)) < files
    finally:
        t.close()


def test_unlink_waves_keep_fewer_threads_only_while_they_are_as_fast():
    """The thread count of eviction waves: halved while the files per second hold, doubled
    back (and held there for a while) when halving made a wave slower."""
    tune = UnlinkTuning(32)
    seen = []
    for _ in range(6):  # CPU-bound unlinks: the same rate at every count
        _next_threads(tune, 1000.0, 32)
        seen.append(tune.threads)
    assert seen == [16, 8, 4, 2, 1, 1]
    tune = UnlinkTuning(32)
    _next_threads(tune, 1000.0, 32)  # 32 -> 16
    _next_threads(tune, 1000.0, 32)  # 16 held the rate -> 8
    _next_threads(tune, 500.0, 32)  # 8 was slower: back to 16, held
    assert tune.threads == 16
    for _ in range(8):
        _next_threads(tune, 1000.0, 32)
        assert tune.threads == 16
    _next_threads(tune, 1000.0, 32)  # the hold is over: fewer are tried again
    assert tune.threads == 8

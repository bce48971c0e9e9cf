"""Capacity of the fs tier on real files and real processes: the byte budget under
concurrency, LRU with shared recency, restarts and adoption, the free-space floor on a small
tmpfs, eviction "none", and what lookups and loads see of evictions."""

from __future__ import annotations

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
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes, parse_size
from kvtier.tiering.fs.capacity.evictor import evict
from kvtier.tiering.fs.capacity.scanner import STATE_DIR_NAME
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


def disk_bytes(root: Path) -> int:
    """Bytes of block and block tmp files, counted independently of kvtier's scanner."""
    total = 0
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".kvb") or (n.endswith(".tmp") and ".kvb." in n):
                try:
                    total += os.lstat(os.path.join(d, n)).st_size
                except FileNotFoundError:
                    pass
    return total


def block_paths(root: Path) -> list[Path]:
    return [p for p in root.rglob("*.kvb")]


def settled(root: Path):
    """A condition: the set of block files did not change over the last 1.5 s (longer than
    a capacity tick), so an eviction pass has finished."""

    def check() -> bool:
        before = set(block_paths(root))
        time.sleep(1.5)
        return before == set(block_paths(root))

    return check


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
    leases = json.loads((root / STATE_DIR_NAME / "usage.json").read_text())["leases"]
    assert leases == {}  # both hosts handed their budget back


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
        wait_for(settled(tmp_path), "the pass to finish")
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
        wait_for(settled(tmp_path), "eviction to finish")
        names = present()
        assert all(f"{key(i).hex()}.kvb" in names for i in used), "a used block was evicted"
        assert not any(f"{key(i).hex()}.kvb" in names for i in cold), "old blocks were kept"
        assert disk_bytes(tmp_path) <= n_budget * small
    finally:
        tier.shutdown()


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
        wait_for(settled(tmp_path), "eviction to finish")
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
    """A process killed while holding budget leaves a lease in the ledger; the next tier
    on this host recounts at once, and the ledger agrees with the files again."""
    budget = 64 * FILE
    proc = subprocess.run(
        [sys.executable, "-c", CRASHER, str(tmp_path), str(ROW), str(budget)],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == -9, proc.stderr
    ledger = tmp_path / STATE_DIR_NAME / "usage.json"
    assert json.loads(ledger.read_text())["leases"]  # the dead process's budget
    t = Tier(tmp_path, max_bytes=budget)
    try:

        def recounted() -> bool:
            state = json.loads(ledger.read_text())
            others = [k for k in state["leases"] if k.split(":")[1] != str(os.getpid())]
            return not others and state["files"] == disk_bytes(tmp_path) == 4 * FILE

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
        ledger = tmp_path / STATE_DIR_NAME / "usage.json"

        def agrees() -> bool:
            return json.loads(ledger.read_text())["files"] == disk_bytes(tmp_path)

        wait_for(settled(tmp_path), "eviction to finish")
        wait_for(agrees, "the ledger to agree with the files")
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

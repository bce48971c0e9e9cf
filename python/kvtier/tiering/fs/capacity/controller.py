"""CapacityController: one tier instance's part in keeping a shared root within its budget.

Hot-path calls (``admit``, ``finish_store``, ``record_use``) touch only memory, except
``admit`` reserving a new chunk of budget from the ledger (one locked read-modify-write per
``chunk_bytes``). A background thread settles the lease, flushes recency, reconciles the
ledger with a scan when due and evicts when the budget or the free-space floor asks for it,
if it gets the root's evictor lock.
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from kvtier._fork import after_fork_in_child
from kvtier.tiering.fs.capacity.evictor import UNLINK_WORKERS, evict, evictor_lock
from kvtier.tiering.fs.capacity.ledger import HEARTBEAT_SECONDS, LedgerState, UsageLedger
from kvtier.tiering.fs.capacity.policy import CapacityPolicy, fs_used_bytes
from kvtier.tiering.fs.capacity.recency import FLUSH_SECONDS, RecencyLog
from kvtier.tiering.fs.capacity.scanner import FileEntry
from kvtier.tiering.fs.capacity.sizes import block_file_bytes, format_size
from kvtier.tiering.fs.capacity.survey import Interrupted, Survey, survey
from kvtier.tiering.fs.file_mapper import host_label

logger = logging.getLogger(__name__)

TICK_SECONDS = 1.0
# A full scan recounts the root at least this often (crashed writers, external deletes).
RECONCILE_SECONDS = 300.0
# A root without a ledger is counted before the constructor returns if it holds at most this
# many files; larger ones are counted in the background (see _pass) under the statvfs bound.
STARTUP_SCAN_FILES = 4096
# Candidates of a scan are used for later passes for at most this long.
CANDIDATES_SECONDS = 30.0
# A scan keeps every block as a candidate (up to survey.MAX_CANDIDATES, the oldest).
_ALL_BYTES = 1 << 62
# Per-instance budget chunk: at most this much, and at most 1/64 of max_bytes.
MAX_CHUNK_BYTES = 64 << 20
_instances = itertools.count()
_registry_lock = threading.Lock()
_by_root: dict[str, weakref.WeakSet[CapacityController]] = {}


@after_fork_in_child
def _forget_parent_controllers() -> None:
    # The parent's controllers have no thread here and may be mid-call on its locks: a
    # child's own tiers must neither wait for them nor fan evictions out to them.
    global _registry_lock
    _registry_lock = threading.Lock()
    _by_root.clear()


class CapacityController:
    """Budget admission, recency and eviction for one tier instance on ``root``.

    ``on_evicted(paths)`` is called (from the evicting thread) with block files this process
    removed, for every controller of this process on the same root.
    """

    def __init__(
        self,
        root: str,
        policy: CapacityPolicy,
        payload_bytes: int,
        file_mode: int = 0o600,
        on_evicted: Callable[[list[str]], None] | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.file_bytes = block_file_bytes(payload_bytes)
        self.policy = dataclasses.replace(policy, file_bytes=self.file_bytes)
        self.ledger = UsageLedger(self.root, file_mode)
        self.recency = RecencyLog(self.root)
        self._file_mode = file_mode
        self._on_evicted = on_evicted
        self._lease_id = f"{host_label()}:{os.getpid()}:{next(_instances)}"
        cap = MAX_CHUNK_BYTES if policy.max_bytes is None else policy.max_bytes // 64
        self.chunk_bytes = max(self.file_bytes, min(MAX_CHUNK_BYTES, cap))
        # _ledger_lock keeps reservations and settles of this lease in order; _lock guards
        # the local counters (lock order: _ledger_lock, then _lock).
        self._ledger_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pool = 0  # reserved from the ledger, not yet given to a store
        self._inflight = 0  # given to stores that have not finished
        self._committed = 0  # new block files not yet moved into the ledger's "files"
        self._state: LedgerState = self.ledger.read()
        # A process of this host that died holding budget: recount at once, not in 300 s.
        self._recount = bool(self.ledger.stale_leases(self._state))
        # "added" when the last reconcile scan began, until the root is next quiet (see
        # _check_recount); the last "added" seen and since when.
        self._recheck_added: int | None = None
        self._seen_added, self._seen_since = -1, 0.0
        if not self._state.complete:
            self._count_small_root()
        self._below_floor = False
        # How fast this instance takes budget and how long an eviction pass takes: their
        # product (doubled) is how early eviction starts (CapacityPolicy.budget_need's lead).
        self._rate = 0.0  # bytes/s, moving average over reservations
        self._last_reserve = time.monotonic()
        self._pass_seconds = self._survey_seconds = 0.0
        # Least recently used blocks found by the last scan, oldest first, not yet tried, and
        # their bytes.
        self._candidates: list[FileEntry] = []
        self._candidate_bytes = 0
        self._candidates_at = 0.0
        self._unlinkers: ThreadPoolExecutor | None = None
        self._admitted_since_statvfs = 0
        self._free_check_bytes = 0  # statvfs at the first admission
        self._last_write = 0.0
        self.evicted_blocks = self.evicted_bytes = self.rejected_stores = 0
        # CPU seconds of eviction passes (scans, ledger, unlinks; every thread involved):
        # what a full cache costs beyond storing, reported by `kvtier bench --max-bytes`.
        self.eviction_cpu_seconds = 0.0
        with _registry_lock:
            _by_root.setdefault(self.root, weakref.WeakSet()).add(self)
        self._wake = threading.Condition()
        self._evict_asked = False
        self._busy = False  # the thread is in a bookkeeping or eviction step (see wait_idle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-capacity", daemon=True)
        self._thread.start()

    def _count_small_root(self) -> None:
        with evictor_lock(self.root, file_mode=self._file_mode) as held:
            if not held:
                return
            added = self.ledger.read().added
            try:
                found = survey(self.root, 0, max_files=STARTUP_SCAN_FILES)
            except Interrupted:
                return
            self._state = self.ledger.reconcile(found.block_bytes, added)

    # -- hot path --------------------------------------------------------------------------

    def admit(self, n_blocks: int) -> str | None:
        """Reserve room for ``n_blocks`` new files; None, or why the store is refused."""
        need = n_blocks * self.file_bytes
        self._watch_free_space(need)
        with self._lock:
            if self._pool >= need and not (self.policy.eviction == "none" and self._below_floor):
                self._pool -= need
                self._inflight += need
                return None
        if self.policy.eviction == "none" and self._below_floor:
            return self._refuse(need, "free space is below min_free_fraction")
        with self._ledger_lock:
            # Settling this lease's finished stores in the same locked write keeps the lease
            # small (at most about one chunk of unsettled stores) at no extra lock traffic.
            with self._lock:
                short = max(0, need - self._pool)
                committed = self._committed
                lease = self._pool + self._inflight
            floor = 0 if self._state.complete else fs_used_bytes(os.statvfs(self.root))
            granted = False
            for take in dict.fromkeys((max(self.chunk_bytes, short), short)):
                granted, self._state = self.ledger.settle(
                    self._lease_id, lease, committed, take, self.policy.max_bytes, floor
                )
                with self._lock:
                    self._committed -= committed
                    if granted:
                        self._pool += take - need
                        self._inflight += need
                committed = 0
                if granted:
                    now = time.monotonic()
                    elapsed = max(now - self._last_reserve, 1e-3)
                    self._rate = 0.7 * self._rate + 0.3 * (take / elapsed)
                    self._last_reserve = now
                    break
        if self.policy.budget_need(self._state.bounded_used(floor), self._lead()):
            self.request_eviction()
        if not granted:
            return self._refuse(need, "the byte budget is full")
        return None

    def _watch_free_space(self, nbytes: int) -> None:
        """Notice a shrinking free space between ticks: statvfs again once the stores admitted
        since the last one could have used FREE_CHECK_FRACTION of the file system."""
        with self._lock:
            self._admitted_since_statvfs += nbytes
            if self._admitted_since_statvfs < self._free_check_bytes:
                return
            self._admitted_since_statvfs = 0
        st = os.statvfs(self.root)
        self._free_check_bytes = max(self.file_bytes, int(st.f_blocks * st.f_frsize * 0.01))
        self._below_floor = self.policy.free_need(st) > 0
        if self._below_floor and self.policy.eviction == "lru":
            self.request_eviction()

    def _refuse(self, need: int, why: str) -> str:
        with self._lock:
            self.rejected_stores += 1
        if self.policy.eviction == "lru":
            self.request_eviction()
        budget = self.policy.max_bytes
        return (
            f"{os.strerror(errno.ENOSPC)} (errno {errno.ENOSPC}): {why} (need "
            f"{format_size(need)}, used {format_size(self._state.bounded_used(0))} of max_bytes "
            f"{'unlimited' if budget is None else format_size(budget)}, "
            f"eviction={self.policy.eviction!r})"
        )

    def finish_store(self, n_blocks: int, new_blocks: int) -> None:
        """A store admitted for ``n_blocks`` finished having created ``new_blocks`` files."""
        reserved = n_blocks * self.file_bytes
        kept = min(new_blocks, n_blocks) * self.file_bytes
        with self._lock:
            self._inflight -= reserved
            self._committed += kept
            self._pool += reserved - kept

    def record_use(self, paths: list[str]) -> None:
        self.recency.record(paths)

    def request_eviction(self) -> None:
        with self._wake:
            self._evict_asked = True
            self._wake.notify_all()  # the thread, and wait_idle's waiters (they wait on more)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "used_bytes": self._state.used,
                "capacity_bytes": self.policy.max_bytes or 0,
                "evicted_blocks": self.evicted_blocks,
                "evicted_bytes": self.evicted_bytes,
                "rejected_stores": self.rejected_stores,
            }

    # -- background --------------------------------------------------------------------------

    def _run(self) -> None:
        last_flush = time.monotonic()
        while not self._stop.is_set():
            with self._wake:
                if not self._evict_asked:
                    self._busy = False
                    self._wake.notify_all()
                    self._wake.wait(TICK_SECONDS)
                asked, self._evict_asked = self._evict_asked, False
                self._busy = True
            if self._stop.is_set():
                return
            try:
                now = time.monotonic()
                if now - last_flush >= FLUSH_SECONDS:
                    self.recency.flush()
                    last_flush = now
                self._settle(force=False)
                self._maybe_pass(asked)
            except Exception:  # never let the thread die: the budget would stop moving
                logger.exception("Capacity bookkeeping under %s failed; retrying", self.root)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no eviction is asked for or running (True), or ``timeout`` seconds
        passed (False): a condition benchmarks and tests wait on instead of a quiet period."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._busy or self._evict_asked:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._wake.wait(left)
        return True

    def _settle(self, force: bool) -> None:
        with self._ledger_lock:
            with self._lock:
                committed = self._committed
                if self._pool > 2 * self.chunk_bytes:  # give unneeded budget back
                    self._pool = self.chunk_bytes
                lease = self._pool + self._inflight + self._committed - committed
            quiet = time.monotonic() - self._last_write < HEARTBEAT_SECONDS
            held = self._state.leases.get(self._lease_id, (0, 0.0))[0]
            if not force and committed == 0 and lease == held and quiet:
                self._state = self.ledger.read()
                return
            _, self._state = self.ledger.settle(self._lease_id, lease, committed)
            self._last_write = time.monotonic()
            with self._lock:
                self._committed -= committed

    def _lead(self) -> int:
        # Capped: a burst must not make the cache evict most of itself.
        cap = (self.policy.max_bytes or 0) // 10
        return min(cap, int(2 * self._rate * self._pass_seconds))

    def _needs(self, state: LedgerState, st: os.statvfs_result) -> tuple[int, int]:
        used = state.bounded_used(fs_used_bytes(st))
        return self.policy.budget_need(used, self._lead()), self.policy.free_need(st)

    def _maybe_pass(self, asked: bool) -> None:
        st = os.statvfs(self.root)
        budget_need, free_need = self._needs(self._state, st)
        self._below_floor = free_need > 0
        self._check_recount(self._state.added)
        due = self._recount or self._reconcile_due(self._state)
        evicting = self.policy.eviction == "lru" and (budget_need or free_need)
        if due or evicting or (asked and self.policy.eviction == "lru"):
            self._pass()

    def _check_recount(self, added: int) -> None:
        """Recount once more, when the root is quiet, after a reconcile that stores raced.

        A block committed while (or just after) a reconcile scan ran may be both seen by it
        and settled on top: an over-count no later pass would notice if the root then stays
        under the watermark (the scan recounts only far less than the ledger). Such a block
        is settled within a tick of its rename, so once "added" stayed put for a tick,
        a change since the scan began means the reconcile may have over-counted; a scan of
        the quiet root is exact. Busy roots never get here (no extra scans under load).
        """
        now = time.monotonic()
        if added != self._seen_added:
            self._seen_added, self._seen_since = added, now
        quiet = now - self._seen_since >= TICK_SECONDS
        if self._recheck_added is not None and quiet:
            self._recount = self._recount or added != self._recheck_added
            self._recheck_added = None

    @staticmethod
    def _reconcile_due(state: LedgerState) -> bool:
        return not state.complete or time.time() - state.scanned_at > RECONCILE_SECONDS

    def _pass(self) -> None:
        started = time.thread_time()
        try:
            self._locked_pass()
        finally:
            self.eviction_cpu_seconds += time.thread_time() - started

    def _locked_pass(self) -> None:
        with evictor_lock(self.root, self._file_mode) as held:
            if not held:
                return  # another process (or gc) is at it; no repeated work
            self.recency.flush()
            # Finished stores into "files" first: the scan counts their files.
            self._settle(force=True)
            state = self.ledger.read()
            st = os.statvfs(self.root)
            budget_need, free_need = self._needs(state, st)
            lru = self.policy.eviction == "lru"
            need = max(budget_need, free_need) if lru else 0
            due = self._recount or self._reconcile_due(state)
            if not need and not due:
                return
            # The last scan's candidates serve until they run out (then the pass scans again
            # for the rest, below): scanning costs more CPU per block than unlinking.
            reuse = (
                not due
                and time.monotonic() - self._candidates_at < CANDIDATES_SECONDS
                and self._candidate_bytes > 0
            )
            if not reuse:
                try:
                    found = self._scan(need > 0)
                except Interrupted:
                    return  # closing: the next instance to start recounts
            # Only when due, or when a fresh scan finds far less than the ledger holds (files
            # removed behind its back): stores settled while the scan ran are counted twice
            # (seen by it and added on top), an over-count that lasts until the next one.
            # (The scan cannot legitimately find less: this process holds the evictor lock,
            # and others' unsettled stores are in their leases, not in "files".)
            if not reuse and found.block_bytes + 4 * self.file_bytes < state.files:
                due = True
            if due:
                self._state = self.ledger.reconcile(found.block_bytes, state.added)
                self._recount = False
                self._recheck_added = state.added
            else:
                self._state = self.ledger.read()
            if not lru:
                return
            budget_need, free_need = self._needs(self._state, os.statvfs(self.root))
            need = max(budget_need, free_need)
            if need:
                started = time.monotonic()
                freed = self._evict_candidates(need)
                if freed < need and reuse and not self._stop.is_set():
                    try:
                        self._scan(True)  # the old candidates ran out: the rest from a new one
                    except Interrupted:
                        return
                    self._evict_candidates(need - freed)
                self._pass_seconds = time.monotonic() - started + self._survey_seconds
            self._below_floor = self.policy.free_need(os.statvfs(self.root)) > 0

    def _scan(self, keep_candidates: bool) -> Survey:
        """Survey the root; with ``keep_candidates``, every block (oldest first, up to
        survey.MAX_CANDIDATES) becomes a candidate. The list stays in LRU order for later
        passes: a block stored after the scan is newer than all of it, and one used or removed
        since is checked and skipped when its turn comes (evict())."""
        started = time.monotonic()
        found = survey(self.root, _ALL_BYTES if keep_candidates else 0, self._stop)
        self._survey_seconds = time.monotonic() - started
        self._candidates, self._candidates_at = found.candidates, time.monotonic()
        self._candidate_bytes = sum(e.size for e in self._candidates)
        return found

    def _evict_candidates(self, need: int) -> int:
        """Evict the oldest candidates until ``need`` bytes are freed; returns bytes freed."""
        if self._unlinkers is None:
            self._unlinkers = ThreadPoolExecutor(UNLINK_WORKERS, "kvtier-evict")
        done = evict(
            self._candidates,
            need,
            in_use=_in_use_here(self.root),
            on_batch=self._evicted,
            stop=self._stop,
            pool=self._unlinkers,
        )
        self.eviction_cpu_seconds += done.unlink_cpu_seconds
        tried = len(done.paths) + done.skipped_recent + done.vanished
        self._candidate_bytes -= sum(e.size for e in self._candidates[:tried])
        del self._candidates[:tried]
        return done.bytes

    def _evicted(self, paths: list[str], nbytes: int) -> None:
        self._state = self.ledger.subtract(nbytes)
        with self._lock:
            self.evicted_blocks += len(paths)
            self.evicted_bytes += nbytes
        with _registry_lock:
            peers = list(_by_root.get(self.root, ()))
        for peer in peers:
            if peer._on_evicted is not None:
                peer._on_evicted(paths)

    # -- lifecycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread, flush uses and hand the lease back (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.request_eviction()
        if self._thread is not threading.current_thread():
            self._thread.join()
        if self._unlinkers is not None:
            self._unlinkers.shutdown()
        self.recency.flush()
        with self._ledger_lock, self._lock:
            # Stores still in flight may yet create their files: count them as committed.
            committed = self._committed + self._inflight
            self._pool = self._inflight = self._committed = 0
            _, self._state = self.ledger.settle(self._lease_id, 0, committed)


def _in_use_here(root: str) -> Callable[[str], bool]:
    """Whether any controller of this process on ``root`` has an unflushed use of a path."""
    with _registry_lock:
        logs = [c.recency for c in _by_root.get(root, ())]
    return lambda path: any(log.is_pending(path) for log in logs)


__all__ = ["CapacityController", "RECONCILE_SECONDS"]

"""CapacityController: one tier instance's part in keeping a shared root within its budget.

Hot-path calls (``admit``, ``finish_store``, ``record_use``, ``stats``) touch only this
process's memory: no lock another process can hold, no ledger I/O. Budget is taken ahead in
chunks by the instance's capacity thread, which also writes the instance's own ledger record,
flushes recency, and, holding the root's evictor lock, reaps dead writers, reconciles the
count with a scan when due and evicts (ledger.py says what is shared and how).
"""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import queue
import random
import stat
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier._fork import after_fork_in_child
from kvtier.tiering.fs.capacity.daemon_pool import DaemonPool
from kvtier.tiering.fs.capacity.evictor import (
    UNLINK_WORKERS,
    Recycle,
    UnlinkTuning,
    evict,
    evictor_lock,
)
from kvtier.tiering.fs.capacity.ledger import (
    CloseFailures,
    LedgerState,
    UsageLedger,
    WriterRecord,
    WriterSlot,
    root_identity,
)
from kvtier.tiering.fs.capacity.policy import CapacityPolicy, fs_used_bytes
from kvtier.tiering.fs.capacity.recency import FLUSH_SECONDS, RecencyLog
from kvtier.tiering.fs.capacity.sizes import block_file_bytes, format_size
from kvtier.tiering.fs.capacity.survey import Candidates, Interrupted, Survey, survey

logger = logging.getLogger(__name__)

TICK_SECONDS = 1.0
# The evictor recounts the root by a full scan at least this often (crashed writers,
# external deletes), measured on its own monotonic clock.
RECONCILE_SECONDS = 300.0
# Dead writers' records are folded in (and their reservations dropped) this often.
REAP_SECONDS = 2.0
# A root without a valid ledger is counted before the constructor returns if it holds at
# most this many files; larger ones are counted in the background under the statvfs bound.
STARTUP_SCAN_FILES = 4096
# Candidates of a scan are used for later passes for at most this long.
CANDIDATES_SECONDS = 30.0
# A scan keeps every block as a candidate (up to survey.MAX_CANDIDATES, the oldest).
_ALL_BYTES = 1 << 62
# Paths of blocks stored (or used) since the last scan kept as later candidates, at most
# (about 250 bytes each with the set's room): beyond them the next pass scans.
MAX_STORED_CANDIDATES = 1 << 14
# While other writers' blocks stored since the last scan wait for the next one, walks of the
# root take at most this share of the time (a walk of a namespace that has all its 65,536
# leaf directories takes about 0.2 s of CPU on tmpfs).
SCAN_SHARE = 0.1
# Per-instance budget chunk: at most this much, and at most 1/64 of max_bytes.
MAX_CHUNK_BYTES = 64 << 20
# An active instance reserves ahead what it admitted between two top-ups, at least a chunk
# and at most this fraction of max_bytes: less than the gap between the watermarks (5%), or
# every top-up after a pass would take the budget past the high mark and start another one.
RESERVE_FRACTION = 1 / 32
# An instance that admitted no store for this long gives its reservation back.
IDLE_SECONDS = 2.0
# Evicted files an instance that recycles keeps ahead for its next stores at most, as a
# fraction of max_bytes: twice the gap between the watermarks. A pass frees that gap, and the
# files kept by the pass before are not all taken yet when it starts; at 5% a full cache of
# 256 KiB blocks recycled 58% of its stores, at 10% 90% (docs/PERFORMANCE.md section 32).
# Spares are room made for this instance only: others see them as its tmp files.
RECYCLE_FRACTION = 0.10
# A store the budget has no room for right now waits (off the caller's thread) this long
# for eviction to make room, then fails with ENOSPC.
STORE_WAIT_SECONDS = 10.0
WAIT_POLL_SECONDS = 0.05
# close() without a deadline waits this long for the capacity thread's last record (a stalled
# file system must not hold shutdown()); the fs tier passes its own deadline instead, derived
# from io_timeout_s (docs/tiers.md, "When storage stalls").
CLOSE_WAIT_SECONDS = 5.0
# Why a waiting store was refused when the free-space floor was not what held it.
_BUDGET_FULL = "the byte budget is full"

_instances = itertools.count()
_registry_lock = threading.Lock()
_by_root: dict[tuple[int, int], weakref.WeakSet[CapacityController]] = {}


@after_fork_in_child
def _forget_parent_controllers() -> None:
    # The parent's controllers have no thread here and may be mid-call on its locks: a
    # child's own tiers must neither wait for them nor fan evictions out to them.
    global _registry_lock
    _registry_lock = threading.Lock()
    _by_root.clear()


class Deferred:
    """admit()'s answer when the store waits for budget: ``then`` is called later."""

    def __repr__(self) -> str:
        return "DEFERRED"


DEFERRED = Deferred()


@dataclass
class _Wait:
    need: int
    then: Callable[[str | None], None]
    deadline: float
    paths: Sequence[str] = ()
    spares: list[str] | None = None  # admit()'s: receives the recycled files it is given


class CapacityController:
    """Budget admission, recency and eviction for one tier instance on ``root``.

    ``on_evicted(paths)`` is called (from the evicting thread) with block files this process
    removed, for every controller of this process on the same root.

    With ``recycle_below`` (and a byte budget), eviction keeps evicted files of this
    instance's file size below that directory (its engine's root) for its next stores to
    overwrite instead of unlinking them (evictor.Recycle), and admit() hands them out. Only
    for writers whose loads check a checksum, on a local file system: a reader that opened
    such a file before it was evicted may read it while it is overwritten.
    """

    def __init__(
        self,
        root: str,
        policy: CapacityPolicy,
        payload_bytes: int,
        file_mode: int = 0o600,
        on_evicted: Callable[[list[str]], None] | None = None,
        recycle_below: str | None = None,
    ) -> None:
        self.root = os.path.abspath(root)
        self.identity = root_identity(self.root)
        self.file_bytes = block_file_bytes(payload_bytes)
        self.policy = dataclasses.replace(policy, file_bytes=self.file_bytes)
        self.ledger = UsageLedger(self.root, file_mode)
        self.recency = RecencyLog(self.root)
        self._file_mode = file_mode
        self._on_evicted = on_evicted
        cap = MAX_CHUNK_BYTES if policy.max_bytes is None else policy.max_bytes // 64
        self.chunk_bytes = max(self.file_bytes, min(MAX_CHUNK_BYTES, cap))
        # _lock guards the counters below and the waiting stores; held only for memory.
        self._lock = threading.Lock()
        self._pool = 0  # budget reserved in this instance's record, not yet given to a store
        self._inflight = 0  # given to stores that have not finished (their tmp files), spares
        # Evicted files kept for this instance's next stores (tmp names, unlocked): on disk, so
        # counted in _inflight (the record's "writing") until a store takes one, but room for
        # this instance's stores all the same, so left out of what makes eviction run
        # (_demand) and counted as reservation by _serve.
        self._spares: list[str] = []
        # Spares given to stores not finished yet, and spares of finished stores that may
        # still exist (their block failed first): the capacity thread removes the latter, and
        # _finish both (a store that finds its spare gone creates a new file).
        self._handed: set[str] = set()
        self._leftover: list[str] = []
        self._recycle_files = 0  # how many at most (0: this instance does not recycle)
        self._recycle_below = recycle_below or ""
        if recycle_below is not None and policy.max_bytes is not None:
            self._recycle_files = max(
                1, int(policy.max_bytes * RECYCLE_FRACTION) // self.file_bytes
            )
        self._added = 0  # bytes of block files this instance's identity committed
        self._waiting: deque[_Wait] = deque()
        # Block paths of admitted or waiting stores not finished yet (a count per path): the
        # evictor keeps them. A file a store has renamed into place is still in ``writing``
        # until its result is collected, so evicting it would free nothing in the count and
        # the evictor would go on to the next (it emptied a cache whose stores were drained
        # in one go). Read without _lock by the unlink threads (a dict lookup is atomic).
        self._storing: dict[str, int] = {}
        self._last_admit = -IDLE_SECONDS
        # The largest burst (bytes admitted between two top-ups) since the instance was last
        # idle, and the bytes admitted since the last top-up.
        self._recent_need = self._since_serve = 0
        self.reserve_cap = max(self.chunk_bytes, int((policy.max_bytes or 0) * RESERVE_FRACTION))
        self._closed = False
        # close(2) failures of the writer and evictor lock descriptors (a FUSE or network
        # file system reports a failed flush there): counted, logged once, never raised.
        self.close_failures = CloseFailures()
        self._slot = WriterSlot(self.root, file_mode, self.close_failures)
        self._state: LedgerState = self.ledger.read()
        self._since_statvfs = 0
        self._free_check_bytes = 0  # 1% of the file system, from the thread's statvfs
        # Free bytes at the last statvfs less those admitted since (None: no floor), and
        # the floor itself.
        self._avail: int | None = None
        self._floor_bytes = 0
        self._floor_warned = False  # a refusal for the floor was logged, until it is met
        self._denied_warned = False  # eviction met a file it may not remove (logged once)
        self._observe(os.statvfs(self.root))
        self._reconciled_at = time.monotonic()
        self._reaped_at = 0.0
        self._recount = not self._state.complete
        # The last reconcile scan was raced by stores (one may be both scanned and settled
        # on top): recount once the root is quiet (_quiet). ``_last_added`` is "added" as
        # the previous tick read it.
        self._recheck = False
        self._last_added = -1
        self._quiet_ticks = 0
        # Least recently used blocks found by the last scan, oldest first, not yet tried.
        self._candidates = Candidates()
        self._candidate_bytes = 0
        # Block paths this instance's stores finished since the last scan, and candidates
        # kept because they were used since it (an ordered set): the next candidates once
        # the scan's run out (_refill_from_stores). ``_stored_whole``: none was left out.
        self._stored: dict[str, None] = {}
        self._stored_whole = True
        self._collect_stored = policy.eviction == "lru"
        # The last scan kept every block as a candidate; the other writers' "added" then,
        # and how long the walk took (SCAN_SHARE).
        self._scan_kept_all = False
        self._others_added: dict[str, int] = {}
        self._scan_seconds = 0.0
        self._candidates_at = 0.0
        self._pass_seconds = 0.0
        # The last pass found nothing to evict, or could not run (another evictor held the
        # lock): _serve asks for no other pass until a store finishes; the ticks still look.
        self._fruitless = False
        self._unlinkers: DaemonPool | None = None
        self._unlink_tuning: UnlinkTuning | None = None  # where the last pass's waves settled
        self.evicted_blocks = self.evicted_bytes = self.rejected_stores = 0
        self.recycled_blocks = 0  # evicted files handed to stores to overwrite
        # CPU seconds of eviction passes (scans, ledger, unlinks; every thread involved):
        # what a full cache costs beyond storing, reported by `kvtier bench --max-bytes`.
        self.eviction_cpu_seconds = 0.0
        try:
            self._slot.write(self._record())
            if self._recount:
                self._count_small_root()
        except BaseException:
            self._slot.close()
            raise
        with _registry_lock:
            _by_root.setdefault(self.identity, weakref.WeakSet()).add(self)
        # The thread sleeps on the bell. Callers ring it with a put, which takes no lock the
        # thread holds, and only while it sleeps (see _run; docs/PERFORMANCE.md section 35).
        self._bell: queue.SimpleQueue[None] = queue.SimpleQueue()
        self._wake = threading.Condition()  # the thread going idle, for wait_idle()
        self._evict_asked = False
        self._poked = False  # a top-up was asked for and the thread has not started it yet
        # The thread is in a bookkeeping or eviction step (see wait_idle), and will read the
        # flags above before it sleeps: callers need not ring (see _run).
        self._busy = False
        self._stop = threading.Event()
        self._exited = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kvtier-capacity", daemon=True)
        self._thread.start()

    def _count_small_root(self) -> None:
        with evictor_lock(self.root, self._file_mode, self.close_failures) as held:
            if not held:
                return
            state, _ = self.ledger.reap_dead(self.ledger.read(), keep=self._slot.id)
            try:
                found = survey(self.root, 0, max_files=STARTUP_SCAN_FILES)
            except Interrupted:
                return
            self._state = self.ledger.reconcile(found.block_bytes, state.added)
            self._recount = False

    # -- hot path (memory only) --------------------------------------------------------------

    def admit(
        self,
        n_blocks: int,
        then: Callable[[str | None], None] | None = None,
        paths: Sequence[str] = (),
        spares: list[str] | None = None,
    ) -> str | None | Deferred:
        """Take room for ``n_blocks`` new files from this instance's reservation.

        ``paths`` (the store's block files) are kept from eviction until ``finish_store``
        names them again or the store is refused; a caller that passes none gets no such
        protection for files its uncollected stores have written.

        ``spares``, for an instance that recycles: once the store is admitted, it holds up to
        ``n_blocks`` recycled files (at most one per block, for the first blocks), which then
        need no room of their own. The caller hands each to its block's store
        (``BlockOp::recycle``) and names them again in finish_store().

        Returns None (admitted), a reason the store is refused, or, with ``then``, DEFERRED:
        there is no room right now, and ``then(None)`` (admitted) or ``then(reason)`` will be
        called from the capacity thread once the budget has room, or at the latest after
        STORE_WAIT_SECONDS. Without ``then``, the caller waits for that answer.
        """
        need = n_blocks * self.file_bytes
        with self._lock:
            if self._closed:
                # Closed with its tier: the tier's engine refuses the store as shut down.
                return None
            self._last_admit = time.monotonic()
            # The reservation is kept as large as the stores admitted between two top-ups
            # (a burst), up to RESERVE_FRACTION of the budget: a store larger than a chunk,
            # or a burst of them, would otherwise wait for the capacity thread every time.
            self._since_serve += need
            if self._since_serve > self._recent_need:
                self._recent_need = self._since_serve
            # Free space can shrink faster than a tick: once the stores admitted since the
            # last statvfs could have used 1% of the file system, the thread looks again
            # (only where there is a floor to keep: otherwise it would be a pass for nothing).
            self._since_statvfs += need
            check_free = self._avail is not None and self._since_statvfs >= self._free_check_bytes
            if check_free:
                self._since_statvfs = 0
            free_ok = self._free_ok(need)
            if self.policy.eviction == "none" and not free_ok:
                self.rejected_stores += 1
                return self._refusal(need, "free space is below min_free_fraction")
            budget = self.policy.max_bytes
            if budget is not None and need > budget:
                self.rejected_stores += 1
                return self._refusal(need, "the store is larger than the whole budget")
            reuse = min(n_blocks, len(self._spares)) if spares is not None else 0
            new = need - reuse * self.file_bytes  # what the files not recycled need
            if (
                not self._waiting
                and (free_ok or self._free_ok(new))
                and (budget is None or self._pool >= new)
            ):
                self._take(new)
                if reuse:
                    spares.extend(self._pop_spares(reuse))  # type: ignore[union-attr]
                self._hold(paths)
                # Topped up ahead: before the next store of this size would find too little.
                # Kept files serve a recycling store as reservation does: in a full cache that
                # recycles, the budget has no room to top up from (the kept files hold it),
                # and a wake-up per store would find nothing to do.
                room = self._pool
                if spares is not None:
                    room += len(self._spares) * self.file_bytes
                low = budget is not None and room < max(self.chunk_bytes // 2, need)
                answer: str | None | Deferred = None
            else:
                low = True
                then_: Callable[[str | None], None]
                if then is None:  # only a caller that waits gets an event (a lock, a deque)
                    box: list[str | None] = []
                    done = threading.Event()

                    def answer_here(reason: str | None) -> None:
                        box.append(reason)
                        done.set()

                    then_ = answer_here
                else:
                    then_ = then
                # The deadline: expire_waiting() relies on the waits' deadlines following
                # their order in _waiting (this is the one place that appends).
                wait = _Wait(need, then_, time.monotonic() + STORE_WAIT_SECONDS, paths, spares)
                self._hold(paths)
                self._waiting.append(wait)
                answer = DEFERRED
        if check_free or (answer is DEFERRED and self.policy.eviction == "lru"):
            self.request_eviction()
        elif low:
            self._poke()
        if answer is DEFERRED and then is None:
            # The caller asked to wait (no callback); the thread answers within the bound.
            if not done.wait(STORE_WAIT_SECONDS + CLOSE_WAIT_SECONDS):
                with self._lock:
                    if wait in self._waiting:
                        self._waiting.remove(wait)
                        self._release(paths)
                        self.rejected_stores += 1
                        return self._refusal(need, "no budget became free in time")
                done.wait()
            return box[0]
        return answer

    def _free_ok(self, need: int) -> bool:
        """Whether ``need`` more bytes keep free space above the floor, as far as the last
        statvfs and the stores admitted since tell (call under _lock)."""
        return self._avail is None or self._avail - need >= self._floor_bytes

    def _pop_spares(self, n: int) -> list[str]:
        """Hand ``n`` spares to a store: their bytes stay in _inflight as its tmp files
        (call under _lock)."""
        taken = self._spares[-n:]
        del self._spares[-n:]
        self._handed.update(taken)
        self.recycled_blocks += n
        return taken

    def _take_spares(self) -> list[str]:
        """Every spare kept ahead, no longer counted (call under _lock); the caller removes
        them."""
        spares, self._spares = self._spares, []
        self._inflight -= len(spares) * self.file_bytes
        return spares

    def _remove_leftovers(self) -> None:
        """Remove spares of finished stores that may still exist; counted until then (the
        capacity thread's: unlinks may wait on the storage)."""
        with self._lock:
            leftover, self._leftover = self._leftover, []
        if leftover:
            kept = _remove_spares(leftover)  # tried again next tick, counted until then
            with self._lock:
                self._inflight -= (len(leftover) - len(kept)) * self.file_bytes
                self._leftover += kept

    def _hold(self, paths: Sequence[str]) -> None:
        """Keep ``paths`` from eviction while their store runs (call under _lock)."""
        storing = self._storing
        for path in paths:
            storing[path] = storing.get(path, 0) + 1

    def _release(self, paths: Sequence[str]) -> None:
        """The store of ``paths`` finished or was refused (call under _lock)."""
        storing = self._storing
        for path in paths:
            left = storing.get(path, 0) - 1
            if left > 0:
                storing[path] = left
            else:
                storing.pop(path, None)

    def is_storing(self, path: str) -> bool:
        """Whether a store of this instance for ``path`` is admitted (or waiting) and not
        finished: the evictor keeps such a file."""
        return path in self._storing

    def _take(self, need: int) -> None:
        """Give ``need`` bytes to a store (call under _lock)."""
        if self.policy.max_bytes is not None:
            self._pool -= need
        self._inflight += need
        if self._avail is not None:
            self._avail -= need

    def _observe(self, st: os.statvfs_result) -> None:
        """Free space as statvfs reports it now (the capacity thread's, never the caller's)."""
        floor = int(self.policy.min_free_fraction * st.f_blocks * st.f_frsize)
        with self._lock:
            self._free_check_bytes = max(self.file_bytes, int(st.f_blocks * st.f_frsize * 0.01))
            self._floor_bytes = floor
            self._avail = None if floor <= 0 else st.f_bavail * st.f_frsize
            if self._avail is None or self._avail >= floor:
                self._floor_warned = False

    def _refusal(self, need: int, why: str, code: int = errno.ENOSPC) -> str:
        budget = self.policy.max_bytes
        # Before a first scan has counted the root, the file system's used bytes stand in for
        # the count (LedgerState.bounded_used): "used 0 B" alone would hide why.
        uncounted = "" if self._state.complete else ", the root not counted yet by a scan"
        return (
            f"{os.strerror(code)} (errno {code}): {why} (need {format_size(need)}, "
            f"used {format_size(self._state.used)} of max_bytes "
            f"{'unlimited' if budget is None else format_size(budget)}{uncounted}, "
            f"eviction={self.policy.eviction!r})"
        )

    def finish_store(
        self,
        n_blocks: int,
        new_blocks: int,
        paths: Sequence[str] = (),
        spares: Sequence[str] = (),
        leftover: Sequence[str] = (),
    ) -> None:
        """A store admitted for ``n_blocks`` finished having created ``new_blocks`` files;
        ``paths`` and ``spares`` are those of admit(). ``leftover``: its spares that may still
        exist (a block that failed before its store took the file, or a store never
        submitted): they stay counted until the capacity thread has removed them."""
        reserved = n_blocks * self.file_bytes
        kept = min(new_blocks, n_blocks) * self.file_bytes
        left = len(leftover) * self.file_bytes
        with self._lock:
            self._release(paths)
            self._fruitless = False  # its files may be evicted now
            if self._collect_stored:
                self._keep_for_refill(paths)
            self._handed.difference_update(spares)
            self._inflight -= reserved
            self._added += kept
            if self.policy.max_bytes is not None:
                self._pool += reserved - kept - left
            if leftover and not self._closed:  # once closed, _finish removed them already
                self._inflight += left
                self._leftover += leftover
        if leftover:
            self._poke()

    def _keep_for_refill(self, paths: Sequence[str]) -> None:
        """Remember ``paths`` as later candidates (call under _lock)."""
        if len(self._stored) + len(paths) > MAX_STORED_CANDIDATES:
            self._stored_whole = False  # the refill would skip these: the next pass scans
        else:
            self._stored.update(dict.fromkeys(paths))

    def record_use(self, paths: list[str]) -> None:
        self.recency.record(paths)

    def request_eviction(self) -> None:
        """Ask the thread for an eviction pass. Asked already and not started yet: the pass
        to come sees what the caller changed before asking (the thread clears the flag before
        it looks), so a second wake-up would only hand it the GIL between the caller's stores.
        No lock, like _poke."""
        if self._evict_asked:
            return
        self._evict_asked = True
        self._ring()

    def _poke(self) -> None:
        """Wake the thread for a top-up (not an eviction). One wake-up serves every store
        admitted until the thread runs: waking it for each would hand it the GIL (and, on
        few cores, the CPU) between the caller's stores for nothing. Read unlocked: a race
        costs one more ring at most."""
        if self._poked:
            return
        self._poked = True
        self._ring()

    def _ring(self) -> None:
        """After a request flag was set: wake the thread, unless it is busy and so reads the
        flags before it sleeps again (the order of the two writes and reads: see _run)."""
        if not self._busy:
            self._bell.put(None)

    def stats(self) -> dict[str, int]:
        with self._lock:
            state = self._with_mine(self._state)
            return {
                "used_bytes": state.used,
                "reserved_bytes": state.reserved,
                "capacity_bytes": self.policy.max_bytes or 0,
                "evicted_blocks": self.evicted_blocks,
                "evicted_bytes": self.evicted_bytes,
                "recycled_blocks": self.recycled_blocks,
                "rejected_stores": self.rejected_stores,
                "ledger_close_failures": self.close_failures.count,
            }

    def _record(self, extra: int = 0) -> WriterRecord:
        return WriterRecord(self._added, self._inflight, self._pool + extra)

    def _with_mine(self, state: LedgerState, extra: int = 0) -> LedgerState:
        """``state`` with this instance's record as it is in memory now (call under _lock)."""
        writers = dict(state.writers)
        writers[self._slot.id] = self._record(extra)
        return dataclasses.replace(state, writers=writers)

    # -- background --------------------------------------------------------------------------

    def _run(self) -> None:
        last_flush = time.monotonic()
        try:
            while not self._stop.is_set():
                # A top-up asked for while the thread was busy runs now, not a tick later.
                # Callers set a flag, then ring only if the thread is not busy; the thread
                # clears _busy, then reads the flags: one of the two sees the other's write,
                # so no request is left asleep, and the stores that come during a pass cost
                # no wake-up.
                self._busy = False
                if not self._evict_asked and not self._poked:
                    with self._wake:
                        self._wake.notify_all()  # wait_idle's waiters
                    # Stores waiting for budget: look again soon (others may give some back,
                    # an evictor elsewhere may make room); a top-up request or an eviction
                    # rings at once.
                    self._sleep(WAIT_POLL_SECONDS if self._waiting else TICK_SECONDS)
                with self._wake:
                    asked, self._evict_asked = self._evict_asked, False
                    self._poked = False
                    self._busy = True
                if self._stop.is_set():
                    break
                try:
                    now = time.monotonic()
                    if now - last_flush >= FLUSH_SECONDS:
                        self.recency.flush()
                        last_flush = now
                    self._tick(asked)
                except Exception as e:  # never let the thread die: the budget would stop
                    logger.exception("Capacity bookkeeping under %s failed; retrying", self.root)
                    # Stores waiting for budget cannot learn it now: they fail at once (a
                    # later miss) rather than wait out STORE_WAIT_SECONDS.
                    self._refuse_waiting(f"the root's usage could not be read ({e})")
                    self._stop.wait(TICK_SECONDS)
        finally:
            self._finish()

    def _sleep(self, seconds: float) -> None:
        """Until the bell rings or ``seconds`` pass. Rings that came meanwhile are taken too,
        before the flags are read: a ring left for later costs one tick, while one taken after
        the flags were cleared could hide a request a caller made during the clear."""
        try:
            self._bell.get(timeout=seconds)
            while True:
                self._bell.get_nowait()
        except queue.Empty:
            pass

    def _tick(self, asked: bool) -> None:
        if self._slot.lost():
            # The state directory was removed or replaced: others no longer see this
            # instance. Start a new identity there (the root is recounted by a scan).
            logger.warning("kvtier state under %s was replaced; rejoining it", self.root)
            self._slot.close()
            self._slot.open()
            with self._lock:
                self._added = 0
            # Until a scan counts it, a root without a count is bounded by the file
            # system's used bytes (LedgerState.bounded_used): without this scan now, stores
            # would wait RECONCILE_SECONDS on a count that never comes.
            self._recount = True
        self._remove_leftovers()
        st = os.statvfs(self.root)
        self._observe(st)
        self._state = self.ledger.read()
        self._watch_quiet(self._state)
        self._serve(st)
        self._expire()
        with self._lock:
            record = self._record()
        self._slot.write(record)
        self._maybe_pass(asked, st)

    def _taken(self, state: LedgerState, st: os.statvfs_result, extra: int = 0) -> int:
        with self._lock:
            mine = self._with_mine(state, extra)
        return mine.bounded_used(0 if mine.complete else fs_used_bytes(st))

    def _demand(self, state: LedgerState, st: os.statvfs_result) -> int:
        """Budget taken plus what waiting stores need beyond the room ready for them: what
        eviction must make room for.

        The room ready is this instance's reservation and its kept files. Kept files are
        counted in the budget taken (they are this instance's tmp files), and a recycling
        store takes them before any reservation (admit). Those no waiting store will take
        are room made already, for the stores to come: not counted, or a full cache that
        keeps files would evict again for them. Those the waiting stores will take are not
        room for anything else."""
        with self._lock:
            spare = len(self._spares) * self.file_bytes
            waiting = sum(w.need for w in self._waiting)
            recycling = sum(w.need for w in self._waiting if w.spares is not None)
            taken_by_waiting = min(spare, recycling)
            extra = max(0, waiting - taken_by_waiting - self._pool)
            # Room for the oldest waiting store, or a chunk, at a time: a burst of waiting
            # stores must not evict the whole cache in one pass.
            first = self._waiting[0].need if self._waiting else 0
            extra = min(extra, max(first, self.chunk_bytes))
        return self._taken(state, st, extra) - (spare - taken_by_waiting)

    def _free_demand(self, st: os.statvfs_result) -> int:
        """Bytes to evict for the free-space floor, waiting stores included."""
        need = self.policy.free_need(st)
        if self.policy.min_free_fraction > 0:
            with self._lock:
                waiting = sum(w.need for w in self._waiting)
            floor = int(self.policy.min_free_fraction * st.f_blocks * st.f_frsize)
            if waiting:
                need = max(need, floor + waiting - st.f_bavail * st.f_frsize)
        return need

    def _serve(self, st: os.statvfs_result) -> None:
        """Top the reservation up for waiting stores and ahead of active ones; give it back
        when idle; admit waiting stores from it (oldest first)."""
        budget = self.policy.max_bytes
        if budget is None:
            self._admit_waiting()
            with self._lock:
                waiting_left = bool(self._waiting)
            if waiting_left and self.policy.eviction == "lru":
                self.request_eviction()
            return
        with self._lock:
            waiting = sum(w.need for w in self._waiting)
            active = time.monotonic() - self._last_admit < IDLE_SECONDS
            if not active:
                self._recent_need = 0
            self._since_serve = 0
            ahead = max(self.chunk_bytes, min(self._recent_need, self.reserve_cap))
            target = waiting + (ahead if active else 0)
            if self._pool > target:  # idle budget goes back to the others
                self._pool = target
            # Spares serve as reservation; an idle instance removes them.
            idle_spares = self._take_spares() if not active and not waiting else []
            spare = len(self._spares) * self.file_bytes
            short = target - self._pool - spare
            first = self._waiting[0].need - self._pool - spare if self._waiting else 0
        if idle_spares and (kept := _remove_spares(idle_spares)):
            with self._lock:  # still on disk: kept (and counted) for a later try
                self._spares += kept
                self._inflight += len(kept) * self.file_bytes
        # As much of what is wanted as fits, if that serves the oldest waiting store.
        take = min(short, budget - self._taken(self._state, st)) if short > 0 else 0
        if take >= max(first, 1):
            self._reserve(take, budget, st)
        self._admit_waiting()
        with self._lock:
            waiting_left = bool(self._waiting)
        if waiting_left or self.policy.budget_need(self._demand(self._state, st)):
            if self.policy.eviction == "lru" and not self._fruitless:
                self.request_eviction()

    def _reserve(self, take: int, budget: int, st: os.statvfs_result) -> None:
        # Write, then read back: of two writers racing for the last room, at least one sees
        # the other's record and gives its take back (ledger.py).
        with self._lock:
            record = self._record(take)
        self._slot.write(record)
        self._state = self.ledger.read()
        if self._taken(self._state, st, take) <= budget:
            with self._lock:
                self._pool += take
            return
        with self._lock:
            record = self._record()
        self._slot.write(record)
        self._stop.wait(random.uniform(0, WAIT_POLL_SECONDS))  # break the tie

    def _admit_waiting(self) -> None:
        granted: list[_Wait] = []
        with self._lock:
            budget = self.policy.max_bytes
            while self._waiting:
                wait = self._waiting[0]
                reuse = 0
                if wait.spares is not None:
                    reuse = min(wait.need // self.file_bytes, len(self._spares))
                need = wait.need - reuse * self.file_bytes
                if (budget is not None and self._pool < need) or not self._free_ok(need):
                    break
                self._take(need)
                if reuse:
                    wait.spares.extend(self._pop_spares(reuse))  # type: ignore[union-attr]
                granted.append(self._waiting.popleft())
        for w in granted:
            w.then(None)

    def _expire(
        self,
        overdue_only: bool = False,
        grace: float = 0.0,
        why: str | None = None,
    ) -> None:
        """Refuse waiting stores past their deadline (plus ``grace``), and (unless
        ``overdue_only``) every one under eviction "none" (nothing will make room for them).
        Without ``why``, each refusal names what held the store: the budget or the floor."""
        refused: list[tuple[_Wait, str]] = []
        now = time.monotonic() - grace
        refuse_all = self.policy.eviction == "none" and not overdue_only
        floor_refusal = None  # the first refusal that names the floor
        with self._lock:
            keep: deque[_Wait] = deque()
            for w in self._waiting:
                if refuse_all or now >= w.deadline:
                    self._release(w.paths)
                    self.rejected_stores += 1
                    reason = why or self._held_by(w.need)
                    refused.append((w, self._refusal(w.need, reason)))
                    if why is None and reason != _BUDGET_FULL and floor_refusal is None:
                        floor_refusal = refused[-1][1]
                else:
                    keep.append(w)
            self._waiting = keep
            # Once per episode: a volume other tenants filled is not kvtier's to fix, and a
            # refusal per store would bury the one line that says so.
            warn = floor_refusal is not None and not self._floor_warned
            self._floor_warned = self._floor_warned or warn
        if warn:
            logger.warning(
                "Stores into %s are refused: %s. kvtier's own blocks cannot make up the "
                "difference; free space on the volume or lower min_free_fraction",
                self.root,
                floor_refusal,
            )
        for w, reason in refused:
            w.then(reason)

    def _held_by(self, need: int) -> str:
        """What kept a store of ``need`` bytes waiting (call under _lock)."""
        if self._free_ok(need):
            return _BUDGET_FULL
        avail = self._avail or 0
        return (
            f"free space stayed below min_free_fraction {self.policy.min_free_fraction:g} "
            f"({format_size(avail)} free, the floor is {format_size(self._floor_bytes)})"
        )

    def _refuse_waiting(self, why: str, code: int = errno.ENOSPC) -> None:
        """Refuse every waiting store with ``why`` (memory only: any thread)."""
        with self._lock:
            waiting, self._waiting = list(self._waiting), deque()
            for w in waiting:
                self._release(w.paths)
            self.rejected_stores += len(waiting)
            refused = [(w, self._refusal(w.need, why, code)) for w in waiting]
        for w, reason in refused:
            w.then(reason)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until no eviction is asked for or running and no store waits for budget
        (True), or ``timeout`` seconds passed (False): a condition benchmarks and tests wait
        on instead of a quiet period."""
        deadline = time.monotonic() + timeout
        with self._wake:
            while self._busy or self._evict_asked or self._poked or self._waiting:
                left = deadline - time.monotonic()
                if left <= 0 or self._stop.is_set():
                    return False
                self._wake.wait(min(left, TICK_SECONDS))
        return True

    def _watch_quiet(self, state: LedgerState) -> None:
        """Count the ticks in a row that saw no store of any writer in flight or settled."""
        with self._lock:
            mine_idle = self._inflight == 0 and not self._waiting
        if mine_idle and state.writing == 0 and state.added == self._last_added:
            self._quiet_ticks += 1
        else:
            self._quiet_ticks = 0
        self._last_added = state.added

    def _quiet(self) -> bool:
        """Whether a scan now would be exact: no store in flight here, and for two ticks no
        writer's record showed one in flight or a change of "added" (another process's
        record follows its stores within its tick)."""
        with self._lock:
            mine_idle = self._inflight == 0 and not self._waiting
        return mine_idle and self._quiet_ticks >= 2

    def _reconcile_due(self) -> bool:
        return (
            self._recount
            or time.monotonic() - self._reconciled_at > RECONCILE_SECONDS
            or (self._recheck and self._quiet())
        )

    def _maybe_pass(self, asked: bool, st: os.statvfs_result) -> None:
        budget_need = self.policy.budget_need(self._demand(self._state, st))
        free_need = self._free_demand(st)
        now = time.monotonic()
        due = self._reconcile_due()
        # Others' records to fold in if they died, or entries of writers with no record left
        # (a count to rebuild: LedgerState.orphans).
        others = len(self._state.writers) > 1 or bool(self._state.orphans)
        reap = others and now - self._reaped_at > REAP_SECONDS
        lru = self.policy.eviction == "lru"
        if due or reap or (lru and (budget_need or free_need or asked)):
            started = time.thread_time()
            try:
                self._locked_pass()
            finally:
                self.eviction_cpu_seconds += time.thread_time() - started

    def _locked_pass(self) -> None:
        with evictor_lock(self.root, self._file_mode, self.close_failures) as held:
            if not held:
                # Another process (or gc) is at it; no repeated work. Nor a request for
                # another pass at once (_serve): the ticks, every WAIT_POLL_SECONDS while
                # stores wait, look again, instead of this thread spinning on the lock.
                with self._lock:
                    self._fruitless = True
                return
            self.recency.flush()
            with self._lock:
                record = self._record()
            self._slot.write(record)  # finished stores first: the scan counts their files
            before = self._racers(record)
            self._reaped_at = time.monotonic()
            state, uncertain = self.ledger.reap_dead(self.ledger.read(), keep=self._slot.id)
            self._recount = self._recount or uncertain
            self._state = state
            st = os.statvfs(self.root)
            lru = self.policy.eviction == "lru"
            budget_need = self.policy.budget_need(self._demand(state, st))
            need = max(budget_need, self._free_demand(st)) if lru else 0
            due = self._reconcile_due()
            if not need and not due:
                # Nothing to evict: stores that wait are waiting for a top-up or for others
                # to give budget back, which the ticks look for.
                with self._lock:
                    self._fruitless = True
                return
            # The last scan's candidates serve until they run out, then the blocks this
            # instance stored since (_refill_from_stores), then the pass scans again (below):
            # a scan walks every directory under the root, and once a cache has run a while
            # each namespace has 65,536 leaf directories (about 0.2 s of CPU on tmpfs),
            # while a small budget turns over several times a second.
            reuse = (
                not due
                and time.monotonic() - self._candidates_at < CANDIDATES_SECONDS
                and (self._candidate_bytes > 0 or self._refill_from_stores())
            )
            if not reuse:
                try:
                    found = self._scan(need > 0)
                except Interrupted:
                    return  # closing: the next instance to start recounts
                # A fresh scan finding far less than the ledger holds: files removed behind
                # its back (the scan cannot legitimately find less: this instance holds the
                # evictor lock, and others' stores in flight are in their records).
                if found.block_bytes + 4 * self.file_bytes < state.files:
                    due = True
                if due:
                    self._state = self.ledger.reconcile(found.block_bytes, state.added)
                    self._recount = False
                    self._reconciled_at = time.monotonic()
                    # A store that renamed its file before the scan reached it and was
                    # settled in a record after the scan began is counted twice (by the
                    # scan and on top): only a scan no store raced is exact.
                    with self._lock:
                        record = self._record()
                    after = self._racers(record, self._state)
                    self._recheck = before != after or not _idle(before)
            if not lru:
                return
            st = os.statvfs(self.root)
            need = max(
                self.policy.budget_need(self._demand(self._state, st)), self._free_demand(st)
            )
            if need:
                started = time.monotonic()
                # A spare frees no disk space: none for the free-space floor.
                recycle = self._recycle_files > 0 and not self._free_demand(st)
                freed = self._evict_candidates(need, recycle)
                if freed < need and reuse and self._refill_from_stores():
                    freed += self._evict_candidates(need - freed, recycle)
                if freed < need and reuse and not self._stop.is_set():
                    try:
                        self._scan(True)  # the old candidates ran out: the rest from a new one
                    except Interrupted:
                        return
                    freed += self._evict_candidates(need - freed, recycle)
                self._pass_seconds = time.monotonic() - started
                # Everything there is in use or being stored: asking again at once would only
                # rescan; the next tick (or a store that waits) tries again.
                with self._lock:
                    self._fruitless = freed == 0
            self._observe(os.statvfs(self.root))

    def _racers(
        self, mine: WriterRecord, state: LedgerState | None = None
    ) -> dict[str, tuple[int, int]]:
        """Every writer's (added, writing): this instance's from memory (``mine``), the
        others' from their records (read now, or from ``state``)."""
        state = self.ledger.read() if state is None else state
        seen = {w: (r.added, r.writing) for w, r in state.writers.items()}
        seen[self._slot.id] = (mine.added, mine.writing)
        return seen

    def _scan(self, keep_candidates: bool) -> Survey:
        """Survey the root; with ``keep_candidates``, every block (oldest first, up to
        survey.MAX_CANDIDATES) becomes a candidate. The list stays in LRU order for later
        passes: a block stored after the scan is newer than all of it, and one used or removed
        since is checked and skipped when its turn comes (evict())."""
        with self._lock:
            self._stored.clear()  # the scan sees them
            self._stored_whole = True
        self._scan_kept_all = False  # until this scan has kept them all
        others = self._others_added_now()
        started = time.monotonic()
        found = survey(self.root, _ALL_BYTES if keep_candidates else 0, self._stop)
        self._scan_seconds = time.monotonic() - started
        self._candidates, self._candidates_at = found.candidates, time.monotonic()
        self._candidate_bytes = self._candidates.bytes
        # Blocks stored from now on are newer than every candidate of a scan that kept them
        # all; after one that kept none, or only the oldest MAX_CANDIDATES, the older blocks
        # it left out must go first.
        self._scan_kept_all = keep_candidates and len(found.candidates) == found.blocks
        self._others_added = others
        return found

    def _others_added_now(self) -> dict[str, int]:
        """The other writers' "added" in the ledger as last read: it moves when they store."""
        return {w: r.added for w, r in self._state.writers.items() if w != self._slot.id}

    def _others_stored_since_scan(self) -> bool:
        """Whether another writer's record shows stores since the last scan (within a tick:
        records are written on their writers' ticks): one whose "added" grew, a new one with
        any, or one gone since (folded in by a reaper: its last stores may be newer)."""
        then, now = self._others_added, self._others_added_now()
        return any(then.get(w, 0) < added for w, added in now.items()) or any(
            w not in now for w in then
        )

    def _refill_from_stores(self) -> bool:
        """Make the blocks this instance stored since the last scan (and the candidates it
        kept because they were used since) the candidates, least recently used first: an
        lstat each, no walk. Only once that scan's candidates were all tried, when the scan
        kept every block, and while no block is left out: the blocks of other writers stored
        since (their "added" moved) wait for the next scan, which comes once the last walk
        has taken no more than SCAN_SHARE of the time since. False: the pass scans."""
        with self._lock:
            paths, self._stored = list(self._stored), {}
            whole, self._stored_whole = self._stored_whole, True
        if not (paths and whole and self._scan_kept_all) or self._stop.is_set():
            return False
        since = time.monotonic() - self._candidates_at
        if self._others_stored_since_scan() and since * SCAN_SHARE >= self._scan_seconds:
            return False
        rows = []
        prefix = len(self.root) + 1
        for path in paths:
            try:
                st = os.lstat(path)
            except FileNotFoundError:  # evicted, or never written (a failed store)
                continue
            except OSError:  # unreadable now: left out, so the next pass scans
                self._scan_kept_all = False
                continue
            if stat.S_ISREG(st.st_mode):
                namespace = path[prefix:].split(os.sep, 1)[0]
                rows.append((True, namespace, path, st.st_size, st.st_mtime_ns))
        rows.sort(key=lambda row: (row[4], row[2]))
        self._candidates = Candidates(rows)
        self._candidate_bytes = self._candidates.bytes
        return bool(rows)

    def _evict_candidates(self, need: int, recycle: bool = False) -> int:
        """Evict the oldest candidates until ``need`` bytes are freed (with ``recycle``, up to
        the spares this instance may still keep are kept for its stores: freed for the
        budget); returns bytes freed."""
        if self._unlinkers is None:
            # Daemon threads: an unlink stuck in the kernel must not hold interpreter exit.
            self._unlinkers = DaemonPool(UNLINK_WORKERS, "kvtier-evict")
        with self._lock:
            # Beyond the spares kept ahead, one for each block of a store waiting for room
            # (it takes them as soon as the wave that made them ends: _evicted).
            waiting = sum(w.need for w in self._waiting if w.spares is not None)
            wanted = (
                self._recycle_files - len(self._spares) + waiting // self.file_bytes
                if recycle
                else 0
            )
        done = evict(
            self._candidates,
            need,
            in_use=_in_use_here(self.identity),
            on_batch=self._evicted,
            stop=self._stop,
            pool=self._unlinkers,
            tuning=self._unlink_tuning,
            root=self.root,
            recycle=Recycle(self.file_bytes, wanted, self._recycle_below) if wanted > 0 else None,
        )
        self._unlink_tuning = done.tuning
        self.eviction_cpu_seconds += done.unlink_cpu_seconds
        if done.used_since and self._collect_stored:
            with self._lock:  # newer now than when they were listed: tried again later
                self._keep_for_refill(done.used_since)
        tried = len(done.paths) + done.skipped_recent + done.vanished + done.denied
        self._candidate_bytes -= self._candidates.drop_first(tried)
        if done.denied and not self._denied_warned:
            # Once per instance: a file this process may not remove stays, and every later
            # scan offers it again, so a warning per pass would repeat the same thing.
            self._denied_warned = True
            logger.warning(
                "Eviction under %s may not remove %d block file(s), e.g. %s (EACCES or "
                "EPERM: the directory is another user's, or the file is immutable); they "
                "are kept and count against max_bytes. Every process sharing a root must be "
                "able to write its directories (file_mode).",
                self.root,
                done.denied,
                done.first_denied,
            )
        return done.bytes

    def _evicted(self, paths: list[str], nbytes: int, recycled: list[str]) -> None:
        if recycled:
            # Spares are on disk: in this instance's record before they leave the count of
            # block files, so that no reader of the ledger sees their bytes nowhere.
            with self._lock:
                self._spares += recycled
                self._inflight += len(recycled) * self.file_bytes
                record = self._record()
            self._slot.write(record)
        self._state = self.ledger.subtract(nbytes)
        if self._state.orphans:
            self._recount = True  # the count read may miss what they added (reap_dead)
        with self._lock:
            self.evicted_blocks += len(paths)
            self.evicted_bytes += nbytes
        # Stores waiting for room get it wave by wave, not at the end of the pass.
        st = os.statvfs(self.root)
        self._observe(st)
        self._serve(st)
        with _registry_lock:
            peers = list(_by_root.get(self.identity, ()))
        for peer in peers:
            if peer._on_evicted is not None:
                peer._on_evicted(paths)

    # -- lifecycle ----------------------------------------------------------------------------

    def _finish(self) -> None:
        """The thread's last step: refuse waiting stores, flush uses, write the final record
        (stores still in flight count as committed: they may yet create their files) and
        release every descriptor."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
            for w in waiting:
                self._release(w.paths)
            # Spares kept ahead, given to stores still queued or running (such a store creates
            # a new file once its spare is gone), and left over: none is to be counted again.
            spares = self._take_spares() + sorted(self._handed) + self._leftover
            self._handed.clear()
            self._inflight -= len(self._leftover) * self.file_bytes
            self._leftover = []
            self._added += self._inflight
            self._pool = self._inflight = 0
            record = self._record()
        for w in waiting:
            w.then(self._refusal(w.need, "the tier is shutting down", errno.ECANCELED))
        try:
            _remove_spares(spares)  # any left is an unlocked tmp file: a start-up sweep's
            if self._unlinkers is not None:
                self._unlinkers.shutdown()
            self.recency.flush()
            if not self._slot.lost():
                self._slot.write(record)
        except Exception:
            logger.exception("Capacity: final record under %s not written", self.root)
        finally:
            self._slot.close()  # releases the writer lock: the evictor folds the record in
            self._exited.set()
            with self._wake:
                self._busy = False
                self._wake.notify_all()

    def stop(self) -> None:
        """Ask the thread to finish: refuse waiting stores, flush uses, write the last record
        and release its descriptors, all on the thread (so nothing it may be stuck on is
        closed or freed under it). Returns at once; idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.request_eviction()

    def join(self, deadline: float) -> bool:
        """Wait until the thread has finished (True) or ``deadline`` (time.monotonic())
        passed (False): a thread stuck in the kernel on a stalled file system is left to
        finish on its own when the kernel returns (the evictor folds its record in once its
        lock is gone, at the latest when the process exits)."""
        if self._thread is threading.current_thread():
            return self._exited.is_set()
        return self._exited.wait(max(0.0, deadline - time.monotonic()))

    def close(self, deadline: float | None = None) -> None:
        """Stop the thread, flush uses and hand the reservation back (idempotent). Waits for
        the thread until ``deadline`` (time.monotonic()), or at most CLOSE_WAIT_SECONDS
        without one (a stalled file system may hold it)."""
        self.stop()
        self.join(time.monotonic() + CLOSE_WAIT_SECONDS if deadline is None else deadline)

    def expire_waiting(self, reason: str | None = None) -> None:
        """Answer stores waiting for budget from the caller's thread, touching only memory:
        with ``reason`` (the root is degraded), every one is refused with it at once (they
        would be sent into the stall); without, those past their deadline are refused. The
        capacity thread does the latter itself, but a thread stuck in the kernel cannot, and
        a store must not wait for it for ever (get_finished and drain_jobs call this)."""
        if not self._waiting:  # read unlocked: the common case costs no lock
            return
        if reason is None:
            # Deadlines follow the order the stores began to wait (each STORE_WAIT_SECONDS
            # from its admit(), appended in turn), so none is overdue while the oldest is not:
            # a full cache, where stores always wait, then costs get_finished no lock and no
            # walk of the waiting stores (read unlocked: a store answered meanwhile only
            # makes the answer "nothing to do" sooner).
            try:
                oldest = self._waiting[0]
            except IndexError:
                return
            if time.monotonic() - TICK_SECONDS < oldest.deadline:
                return
            # The thread answers a store within WAIT_POLL_SECONDS of its deadline unless it
            # is stuck: say so, not "the budget is full", which nobody found out.
            self._expire(
                overdue_only=True,
                grace=TICK_SECONDS,
                why="the capacity thread did not answer in time (its storage may be stalled)",
            )
        else:
            self._refuse_waiting(reason, errno.ETIMEDOUT)


def _remove_spares(spares: list[str]) -> list[str]:
    """Unlink spares nobody took (a sweep or gc may have been first); returns those that could
    not be removed (still there: to be counted). Their names are this process's own tmp names,
    which nothing else carries."""
    failed = []
    for path in spares:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as e:
            logger.warning("Could not remove the evicted file kept for reuse %s: %s", path, e)
            failed.append(path)
    return failed


def _idle(racers: dict[str, tuple[int, int]]) -> bool:
    return all(writing == 0 for _, writing in racers.values())


def _in_use_here(identity: tuple[int, int]) -> Callable[[str], bool]:
    """Whether any controller of this process on the root has an unflushed use of a path,
    or a store of it not finished yet."""
    with _registry_lock:
        controllers = list(_by_root.get(identity, ()))
    logs = [c.recency for c in controllers]
    return lambda path: (
        any(c.is_storing(path) for c in controllers) or any(log.is_pending(path) for log in logs)
    )


__all__ = ["DEFERRED", "CapacityController", "RECONCILE_SECONDS", "STORE_WAIT_SECONDS"]

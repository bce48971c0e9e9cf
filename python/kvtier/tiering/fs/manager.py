"""FileSystemTierManager: KV blocks as files under a local or shared directory.

The Python side only plans: it maps keys to paths and primary rows to addresses, and hands
each job to the native engine (kvtier._core.Engine), whose worker threads move every byte
with the GIL released. Results come back through a lock-free completion queue that
get_finished() drains without blocking.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from kvtier import _core
from kvtier._fork import inherited, owner_process_only, this_process
from kvtier._rate_limited_log import RateLimitedLog
from kvtier.errors import InvalidArgumentError, ShutDownError
from kvtier.tiering.base import (
    JobId,
    JobMetadata,
    JobResult,
    OffloadKey,
    ReqContext,
    SecondaryTierManager,
)
from kvtier.tiering.fs.capacity import CapacityController
from kvtier.tiering.fs.capacity.controller import CLOSE_WAIT_SECONDS as CAPACITY_CLOSE_WAIT_SECONDS
from kvtier.tiering.fs.capacity.controller import Deferred
from kvtier.tiering.fs.engine import EngineIoReport, open_engine
from kvtier.tiering.fs.file_mapper import BLOCK_SUFFIX, FileMapper, host_label
from kvtier.tiering.fs.health import RootHealth, join_root_for
from kvtier.tiering.fs.lookup import CLOSE_WAIT_SECONDS as LOOKUP_CLOSE_WAIT_SECONDS
from kvtier.tiering.fs.lookup import LookupCache
from kvtier.tiering.fs.options import FsTierOptions
from kvtier.tiering.fs.oserror import naming
from kvtier.tiering.fs.sweep import sweep_dead_tmp_files
from kvtier.tiering.spec import OffloadingSpec

logger = logging.getLogger(__name__)

# shutdown(), collection and interpreter exit return within io_timeout_s plus this: the engine
# takes at most about io_timeout_s (the core's I/O deadlines), and the lookup and capacity
# threads, stopped at the start, are waited for until the same deadline (docs/tiers.md).
SHUTDOWN_GRACE_S = 1.0
# How often drain_jobs() collects what finished while it waits for the engine.
DRAIN_POLL_S = 0.05


@dataclass
class _Job:
    is_load: bool
    keys: tuple[OffloadKey, ...]
    # A store that holds budget for its blocks (capacity): their files, kept from the submit
    # so that reporting it (get_finished, on the caller's thread) names none of them again.
    admitted_paths: tuple[str, ...] | None = None
    # Evicted files admission gave its first blocks to overwrite (BlockOp::recycle).
    spares: tuple[str, ...] = ()
    epoch: int = 0  # the root's health epoch at submission (a timeout of older work is stale)


class FileSystemTierManager(SecondaryTierManager, EngineIoReport):
    """Secondary tier that keeps each KV block in its own file (see docs/tiers.md).

    Options (validated by :class:`~kvtier.tiering.fs.options.FsTierOptions`): ``root_dir``
    (required), ``n_read_threads``, ``n_write_threads``, ``o_direct``, ``checksum``,
    ``durability``, ``file_mode``, ``worker_nice``, ``load_nice``,
    ``max_stores_in_flight_while_loading``, ``io_engine``, ``io_timeout_s``, ``async_lookup``,
    ``max_queued_store_jobs``, and the capacity options ``max_bytes``, ``min_free_fraction``,
    ``eviction``.
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str = "fs",
        **options: Any,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self._owner_pid = this_process()  # a forked child may not use it (kvtier._fork)
        # Options are taken as **options so that an unknown key is a ValueError naming the
        # valid keys, also when the tier is constructed directly rather than by the factory.
        self.options = FsTierOptions.parse(tier_type, options)
        opts = self.options

        # Rows are addressed as bytes whatever the view's element format. The view stays
        # referenced by the base class, so the addresses stay valid for the tier's life.
        self._base_address: int = _core.buffer_address(primary_kv_view, False)
        try:
            _core.buffer_address(primary_kv_view, True)
            self._writable = True
        except (BufferError, TypeError, ValueError):
            self._writable = False

        self.file_mapper = FileMapper(
            opts.root_dir, offloading_spec, self._block_size_bytes, opts.checksum
        )
        with naming(self.file_mapper.config_path):
            self.file_mapper.prepare(opts.file_mode)
        # Crashed writers of this host leave tmp files; nobody else will ever rename them.
        self._host = host_label()
        sweep_dead_tmp_files(
            [self.file_mapper.namespace_dir], [self.file_mapper.rank_dir], self._host
        )

        self._engine = open_engine(self.file_mapper, opts, f"secondary tier '{tier_type}'")
        # The engine keeps its own view of the primary memory: it stays allocated until the
        # workers have stopped, whatever order the tier is torn down in (and even if the
        # caller releases primary_kv_view).
        self._engine.keep_alive([memoryview(primary_kv_view)])

        self._lookups = LookupCache(
            self.file_mapper.get_file_name,
            opts.async_lookup,
            name="kvtier-lookup",
            root_dir=self.file_mapper.rank_dir,
            timeout_s=opts.io_timeout_s,
        )
        self._eviction_listeners: list[Callable[[list[OffloadKey]], None]] = []
        self._capacity = CapacityController(
            opts.root_dir,
            opts.capacity_policy(),
            self._block_size_bytes,
            opts.file_mode,
            on_evicted=_forget_evicted(
                self._lookups, self.file_mapper.rank_dir, self._eviction_listeners
            ),
            recycle_below=self.file_mapper.rank_dir if _may_recycle(opts) else None,
        )
        # Stop the engine and the resolver and capacity threads even if the tier is dropped
        # without shutdown() (and at interpreter exit), within one deadline.
        self._finalizer = weakref.finalize(
            self,
            _close,
            self._engine,
            self._lookups,
            self._capacity,
            self._owner_pid,
            opts.io_timeout_s,
        )
        # Degraded after a block operation times out, until a probe answers (fs/health.py);
        # shared with the other tiers of this process on the same root.
        self._health: RootHealth
        # When it degrades, the engine fails what it has not started beneath the rank directory.
        self._health, self._health_finalizer = join_root_for(
            self, self._capacity, opts.io_timeout_s, self._engine, self.file_mapper.rank_dir
        )
        # A lookup's check that does not answer by the deadline degrades the root; once it
        # is degraded, no lookup waits for one.
        self._lookups.watch(self._health)
        self._degraded_jobs = 0
        self._degraded_lookups = 0

        # _lock guards the job table, the ready list and the counters; _consumer_lock keeps
        # the ready list in completion order when get_finished runs on several threads.
        self._lock = threading.Lock()
        self._consumer_lock = threading.Lock()
        self._jobs: dict[JobId, _Job] = {}
        # Ids submitted and not yet handed out by get_finished(): reusing one would report
        # two results that cannot be told apart.
        self._unreported: set[JobId] = set()
        self._ready: list[JobResult] = []
        self._queued_stores = 0
        # Stores waiting for budget on the capacity thread (drain_jobs waits for them).
        self._admitting = 0
        self._admissions = threading.Condition(self._lock)
        self._dropped_stores = 0
        self._shut_down = False
        self._failure_log = RateLimitedLog(logger)
        logger.info(
            "Secondary tier '%s' at %s (direct I/O: %s, io engine: %s, %d read + %d write threads)",
            tier_type,
            self.file_mapper.rank_dir,
            self._engine.direct_io,
            self._engine.io_engine,
            self._engine.n_read_threads,
            self._engine.n_write_threads,
        )

    # -- lookups ---------------------------------------------------------------------------

    @owner_process_only
    def lookup(self, key: OffloadKey, req_context: ReqContext | None = None) -> bool | None:
        if self._health.degraded:  # answered without touching the stalled storage
            with self._lock:
                self._degraded_lookups += 1
            return False
        found = self._lookups.lookup(key)
        if found:  # a hit is a use: it keeps the block from eviction (shared recency)
            self._capacity.record_use([self.file_mapper.get_file_name(key)])
        return found

    @owner_process_only
    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext | None = None) -> None:
        path_of = self.file_mapper.get_file_name
        self._capacity.record_use([path_of(k) for k in keys])

    def add_eviction_listener(self, listener: Callable[[list[OffloadKey]], None]) -> None:
        """Call ``listener(keys)`` with this tier's blocks whenever this process evicts some.

        It runs on the capacity thread, so it must be quick and thread-safe. Blocks named by
        a hash of a long key cannot be named back and are not reported.
        """
        self._eviction_listeners.append(listener)

    # -- jobs --------------------------------------------------------------------------------

    @owner_process_only
    def submit_store(self, job: JobMetadata) -> None:
        self._submit(job, is_load=False)

    @owner_process_only
    def submit_load(self, job: JobMetadata) -> None:
        if not self._writable:
            raise InvalidArgumentError(
                f"Secondary tier '{self.tier_type}' cannot load: primary_kv_view is read-only"
            )
        self._submit(job, is_load=True)

    def _submit(self, job: JobMetadata, is_load: bool) -> None:
        job_id, keys, block_ids = self._check_job(job)
        with self._lock:
            self._check_open()
            if job_id in self._unreported:
                raise InvalidArgumentError(
                    f"Job {job_id} is already in flight (or finished and not yet returned by "
                    "get_finished()); job ids must be unique until reported"
                )
            self._unreported.add(job_id)
            refusal = self._health.refusal(f"submit_{'load' if is_load else 'store'}")
            if refusal is not None:
                # Degraded root: failed at once, through get_finished like any failure; no
                # work is sent into the stall (a load reports that none of its keys arrived).
                self._degraded_jobs += 1
                self._ready.append(
                    JobResult(job_id, False, [] if is_load else None, 0, 0.0, refusal)
                )
                self._failure_log.error("Job %s block I/O failed: %s", job_id, refusal)
                return
            if not is_load and self._queued_stores >= self.options.max_queued_store_jobs:
                # Dropping is safe: a store that never happens is a later miss, never lost
                # data, and it frees the primary slots instead of pinning them behind slow
                # storage.
                self._dropped_stores += 1
                error = (
                    f"submit_store: {os.strerror(errno.EAGAIN)} (errno {errno.EAGAIN}): store "
                    f"queue full ({self._queued_stores} store jobs queued, "
                    f"max_queued_store_jobs={self.options.max_queued_store_jobs})"
                )
                self._ready.append(JobResult(job_id, False, None, 0, 0.0, error))
                self._failure_log.error("Job %s block I/O failed: %s", job_id, error)
                return
            self._jobs[job_id] = _Job(is_load, keys, epoch=self._health.epoch)
            if not is_load:
                self._queued_stores += 1
        try:
            if is_load:
                blocks = self._blocks(keys, block_ids)
                self._capacity.record_use([b[0] for b in blocks])
                self._engine.submit_load(job_id, blocks)
                self._fail_if_degraded()
                return
            if not keys:
                self._engine.submit_store(job_id, [])
                self._fail_if_degraded()
                return
            # Admission touches only memory; a store the budget has no room for yet is
            # submitted later from the capacity thread, or fails there (never waits here).
            with self._lock:
                self._admitting += 1
            try:
                store = _Admission(self, job_id, keys, block_ids)
                admitted = self._capacity.admit(len(keys), store, store.paths, store.spares)
            except BaseException:
                self._admission_done()
                raise
            if not isinstance(admitted, Deferred):
                self._admission_done()
                self._admitted(store, admitted, False)
        except ShutDownError:
            self._forget(job_id, is_load)
            raise
        except Exception as e:
            # Whatever failed after the job was registered, it is reported once and its
            # store slot freed, never left "in flight".
            if self._engine.is_shut_down:
                self._forget(job_id, is_load)
                self._raise_shut_down()
            if not isinstance(e, OSError):
                self._forget(job_id, is_load)
                raise
            self._fail(job_id, is_load, f"submit_{'load' if is_load else 'store'}: {e}")

    def _admitted(self, store: _Admission, refusal: str | None, deferred: bool) -> None:
        """A store's admission: submit it, or fail it like a full store queue (a later miss;
        loads go on). Runs on the caller's thread or, when the store waited for budget, on
        the capacity thread."""
        job_id, spares = store.job_id, store.spares
        if deferred:
            try:
                self._admitted(store, refusal, False)
            except BaseException as e:
                reason = "the tier shut down" if self._engine.is_shut_down else str(e)
                self._fail(job_id, False, f"submit_store: {reason}")
            finally:
                self._admission_done()
            return
        if refusal is not None:
            self._fail(job_id, False, f"submit_store: {refusal}")
            return
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                job.admitted_paths = store.paths
                job.spares = tuple(spares)
        try:
            blocks = self._rows(store.paths, store.keys, store.block_ids)
            self._engine.submit_store(job_id, _recycling(blocks, spares))
        except BaseException:
            # The engine took nothing (all or nothing): every spare is still there.
            self._capacity.finish_store(len(store.keys), 0, list(store.paths), spares, spares)
            raise
        self._fail_if_degraded()

    def _fail_if_degraded(self) -> None:
        """After a submit: a root that degraded since the job was let through had the engine
        fail what it had not started before this job got there (RootHealth.report_timeout);
        fail it now, or it waits behind workers stuck in the stall."""
        if self._health.degraded:
            self._engine.fail_unstarted(self.file_mapper.rank_dir)

    def _admission_done(self) -> None:
        with self._admissions:
            self._admitting -= 1
            self._admissions.notify_all()

    def _forget(self, job_id: JobId, is_load: bool) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            self._unreported.discard(job_id)
            if not is_load and job is not None:
                self._queued_stores -= 1

    def _fail(self, job_id: JobId, is_load: bool, error: str) -> None:
        with self._lock:
            job = self._jobs.pop(job_id, None)
            if job is None:
                return  # already reported
            if not is_load:
                self._queued_stores -= 1
            self._ready.append(JobResult(job_id, False, None, 0, 0.0, error))
        self._failure_log.error("Job %s block I/O failed: %s", job_id, error)

    def _blocks(
        self, keys: Sequence[OffloadKey], block_ids: Sequence[int]
    ) -> list[tuple[str, bytes, int, int]]:
        path_of = self.file_mapper.get_file_name
        return self._rows([path_of(k) for k in keys], keys, block_ids)

    def _rows(
        self, paths: Sequence[str], keys: Sequence[OffloadKey], block_ids: Sequence[int]
    ) -> list[tuple[str, bytes, int, int]]:
        """The engine's blocks: each block's file, key and primary row."""
        row = self._block_size_bytes
        base = self._base_address
        return [(p, k, base + b * row, row) for p, k, b in zip(paths, keys, block_ids)]

    @owner_process_only
    def get_finished(self) -> list[JobResult]:
        self._expire_waiting()
        self._collect()
        with self._lock:
            results, self._ready = self._ready, []
            self._unreported.difference_update(r.job_id for r in results)
        return results

    def _expire_waiting(self) -> None:
        """Answer stores waiting for budget that the capacity thread cannot answer (it may be
        stuck in the kernel on the stalled root): every one at once while the root is
        degraded, those past their wait otherwise. Memory only; nothing when none waits."""
        reason = self._health.reason
        self._capacity.expire_waiting(
            None if reason is None else f"root {self._health.root} is degraded ({reason})"
        )

    def _collect(self) -> None:
        """Move finished engine jobs into the ready list (their store slots count as free)."""
        with self._consumer_lock:
            completions = self._engine.pop_completions()
            if not completions:
                return
            with self._lock:
                jobs = [self._jobs.pop(c.job_id, None) for c in completions]
            results = [self._result(c, job) for c, job in zip(completions, jobs)]
            with self._lock:
                self._queued_stores -= sum(1 for j in jobs if j is not None and not j.is_load)
                self._ready.extend(results)

    def _result(self, c: Any, job: _Job | None) -> JobResult:
        keys: tuple[OffloadKey, ...] = job.keys if job is not None else ()
        errnos = c.block_errnos
        if job is not None and (c.errno == errno.ETIMEDOUT or errno.ETIMEDOUT in errnos):
            # The first timeout degrades the root (docs/tiers.md, "When storage stalls").
            self._health.report_timeout(
                f"a block operation timed out (io_timeout_s={self.options.io_timeout_s:g}): "
                f"{c.error}",
                job.epoch,
            )
        if job is not None and job.admitted_paths is not None:
            # The engine counts a block's payload in c.bytes only when it wrote a file (a key
            # already on disk is skipped): that many new files now hold budget. A new file's
            # mtime is its use; a block that was there already is used by this store.
            new_blocks = c.bytes // max(1, self._block_size_bytes)
            paths = job.admitted_paths
            # A block that failed may have failed before its store took its spare.
            leftover = [s for s, e in zip(job.spares, errnos) if e != 0]
            self._capacity.finish_store(len(keys), new_blocks, list(paths), job.spares, leftover)
            if new_blocks < len(keys):
                self._capacity.record_use([p for p, e in zip(paths, errnos) if e == 0])
        ok_keys = [k for k, e in zip(keys, errnos) if e == 0]
        # Files that exist are worth remembering; a load that failed verification or found no
        # file means the block is gone (the core removed a corrupt file).
        self._lookups.mark_present(ok_keys)
        if job is not None and job.is_load:
            self._lookups.mark_absent(k for k, e in zip(keys, errnos) if e != 0)
        if c.success:
            return JobResult(c.job_id, True, None, c.bytes, c.seconds)
        self._failure_log.error("Job %s block I/O failed: %s", c.job_id, c.error)
        successful = ok_keys if job is not None and job.is_load else None
        return JobResult(c.job_id, False, successful, c.bytes, c.seconds, c.error)

    @owner_process_only
    def drain_jobs(self) -> None:
        # Stores waiting for budget are answered within STORE_WAIT_SECONDS (or at shutdown);
        # meanwhile finished stores are collected, which gives their budget back for them.
        while True:
            with self._admissions:
                if self._admitting == 0:
                    break
                self._admissions.wait(0.01)
            self._expire_waiting()
            self._collect()
        # Collected meanwhile, a timeout degrades the root, and the engine fails every block
        # it has not started (RootHealth.report_timeout): on a frozen mount those would wait
        # for stuck workers, past the replacement cap for ever.
        while not self._engine.drain_for(DRAIN_POLL_S):
            self._collect()
        # Collect now: drained stores stop counting against max_queued_store_jobs before the
        # caller's next get_finished().
        self._collect()

    # -- lifecycle ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Running block operations finish, queued ones fail (ECANCELED); idempotent.

        Returns within ``io_timeout_s`` plus SHUTDOWN_GRACE_S even with every thread stuck
        in the kernel (docs/tiers.md, "When storage stalls"). Results of every job stay
        available from get_finished().
        """
        if inherited(self._owner_pid):
            return  # a forked child's copy: nothing of it runs here (see kvtier._fork)
        with self._lock:
            self._shut_down = True
        # Stops the engine, the lookup and capacity threads, and hands the lease back.
        self._finalizer()
        self._health_finalizer()  # the last tier on the root stops its probing

    @property
    def is_shut_down(self) -> bool:
        return self._shut_down or inherited(self._owner_pid)

    def _check_open(self) -> None:
        if self._shut_down:
            self._raise_shut_down()

    def _raise_shut_down(self) -> NoReturn:
        raise ShutDownError(
            f"Secondary tier '{self.tier_type}' is shut down; submit_store/submit_load refused"
        )

    @owner_process_only
    def stats(self) -> dict[str, Any]:
        """Engine counters plus lookup, dropped-store, capacity and health counts; ``health``
        is ``"healthy"`` or ``"degraded"`` (the only value that is not an int)."""
        stats: dict[str, Any] = dict(self._engine.stats())
        stats.update(self._lookups.stats())
        stats.update(self._capacity.stats())
        stats.update(self._health.stats())
        with self._lock:
            stats["dropped_store_jobs"] = self._dropped_stores
            stats["queued_store_jobs"] = self._queued_stores
            stats["degraded_jobs"] = self._degraded_jobs
            stats["degraded_lookups"] = self._degraded_lookups
        return stats

    @property
    def health(self) -> str:
        """``"healthy"``, or ``"degraded"`` while the root's storage is not answering."""
        return "degraded" if self._health.degraded else "healthy"

    @property
    def direct_io(self) -> bool:
        return bool(self._engine.direct_io)


def _close(
    engine: Any,
    lookups: LookupCache,
    capacity: CapacityController,
    owner_pid: int,
    io_timeout_s: float,
) -> None:
    """The tier's teardown (shutdown(), collection, interpreter exit), bounded by one
    deadline: io_timeout_s + SHUTDOWN_GRACE_S from the start. The lookup and capacity threads
    are asked to stop first, so they wind down while the engine stops (at most about
    io_timeout_s, the core's deadlines); then both are waited for until the deadline. A
    thread still stuck in the kernel then is left to finish on its own: it closes its own
    descriptors, and holds nothing the tier frees. Without a deadline (io_timeout_s=0) the
    engine waits for every running operation, however long, and then the threads are waited
    for at most lookup.CLOSE_WAIT_SECONDS and capacity.CLOSE_WAIT_SECONDS (together, not in
    turn)."""
    # In a forked child (at its exit) the threads and the budget lease are the parent's.
    if inherited(owner_pid):
        return
    started = time.monotonic()
    lookups.stop()
    capacity.stop()
    engine.shutdown()
    if io_timeout_s > 0:
        deadline = started + io_timeout_s + SHUTDOWN_GRACE_S
        lookup_deadline = capacity_deadline = deadline
    else:
        stopped = time.monotonic()
        lookup_deadline = stopped + LOOKUP_CLOSE_WAIT_SECONDS
        capacity_deadline = stopped + CAPACITY_CLOSE_WAIT_SECONDS
    # shutdown() never raises for the storage's sake: a volume that fails every call (EIO) or
    # is gone still lets the tier stop; what could not be written back is said once.
    for part, close, until in (
        ("lookup cache", lookups.close, lookup_deadline),
        ("capacity budget", capacity.close, capacity_deadline),
    ):
        try:
            close(until)
        except OSError as e:
            # str(e): a record holding the exception would keep its frames (and their open
            # files) alive for as long as a handler keeps the record.
            logger.warning(
                "closing the %s failed: %s (the tier is shut down all the same)", part, str(e)
            )


def _may_recycle(opts: FsTierOptions) -> bool:
    """Whether eviction may keep files for this tier's stores to overwrite (docs/tiers.md,
    "Recycling evicted files"): only where a load that reads such a file meanwhile fails its
    checksum, and on a local file system, where no reader reaches it by its old name after
    the rename (a network client's name cache might, and fail loads that would have hit)."""
    return opts.checksum == "crc32c" and _core.local_file_system(opts.root_dir)


class _Admission:
    """A store on its way through admission: called with the budget's answer when the store
    had to wait for room (on the capacity thread). It holds as few objects for the garbage
    collector as it can while it waits: a callable with slots rather than a closure (whose
    cells are five more), and the rows as a tuple of ints rather than the engine's block
    tuples (one per block), which are made once the store is admitted. The collector's
    young passes run on whichever thread allocates next, the caller's most of all, and a full
    cache defers most stores (docs/PERFORMANCE.md section 33)."""

    __slots__ = ("tier", "job_id", "keys", "block_ids", "paths", "spares")

    def __init__(
        self,
        tier: FileSystemTierManager,
        job_id: JobId,
        keys: tuple[OffloadKey, ...],
        block_ids: Sequence[int],
    ) -> None:
        self.tier = tier
        self.job_id = job_id
        self.keys = keys
        self.block_ids = tuple(block_ids)  # ints only: the collector stops tracking it
        path_of = tier.file_mapper.get_file_name
        self.paths = tuple(path_of(k) for k in keys)  # kept from eviction; reported at the end
        self.spares: list[str] = []  # evicted files admission gives its first blocks

    def __call__(self, refusal: str | None) -> None:
        self.tier._admitted(self, refusal, True)


def _recycling(
    blocks: list[tuple[str, bytes, int, int]], spares: list[str]
) -> list[tuple[str, bytes, int, int]] | list[tuple[str, bytes, int, int, str | None]]:
    """The store's blocks, the first ones naming the evicted file each overwrites."""
    if not spares:
        return blocks
    return [(*b, spares[i] if i < len(spares) else None) for i, b in enumerate(blocks)]


def _forget_evicted(
    lookups: LookupCache,
    rank_dir: str,
    listeners: list[Callable[[list[OffloadKey]], None]],
) -> Callable[[list[str]], None]:
    """Tells ``lookups`` and ``listeners`` about evicted files of its rank (no reference to
    the tier: a tier dropped without shutdown() can still be collected)."""
    prefix = rank_dir + os.sep

    def forget(paths: list[str]) -> None:
        keys: list[OffloadKey] = []
        for path in paths:
            if not path.startswith(prefix):
                continue
            name = os.path.basename(path)[: -len(BLOCK_SUFFIX)]
            if name.startswith("h"):  # a long key named by its hash: cannot be named back
                lookups.forget_present()
                continue
            keys.append(OffloadKey(bytes.fromhex(name)))
        lookups.mark_absent(keys)
        if keys:
            for listener in listeners:
                listener(keys)

    return forget


__all__ = ["FileSystemTierManager"]

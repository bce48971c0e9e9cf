"""GPUStorageTransfer: a worker's KV cache (GPU or CPU tensors) to block files and back.

Bytes never pass through Python: block ids become per-layer segments in the native engine,
whose workers gather them into pinned staging buffers with CUDA async copies (memcpy for CPU
tensors) and write them with the same file format, paths and namespace as the ``fs`` tier.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any, cast

from kvtier import _core
from kvtier._fork import inherited, owner_process_only, this_process
from kvtier._rate_limited_log import RateLimitedLog
from kvtier.errors import CoreError, InvalidArgumentError, ShutDownError
from kvtier.gpu.layout import describe_kv_caches
from kvtier.gpu.options import GPUTransferOptions
from kvtier.gpu.writable import read_only_tensor
from kvtier.tiering.base import JobId, JobResult, OffloadKey
from kvtier.tiering.fs.capacity import CapacityController
from kvtier.tiering.fs.capacity.controller import Deferred
from kvtier.tiering.fs.engine import EngineIoReport, open_engine
from kvtier.tiering.fs.file_mapper import FileMapper
from kvtier.tiering.fs.health import RootHealth, join_root_for
from kvtier.tiering.fs.manager import DRAIN_POLL_S, SHUTDOWN_GRACE_S
from kvtier.tiering.fs.oserror import naming
from kvtier.tiering.spec import OffloadingSpec
from kvtier.tiering.validation import check_block_ids, check_job_id, check_keys

logger = logging.getLogger(__name__)


def cuda_available() -> bool:
    """Whether the GPU path is live: a CUDA runtime and at least one device are present."""
    return bool(_core.cuda_available())


class GPUStorageTransfer(EngineIoReport):
    """Stores blocks of ``kv_caches`` into files and loads them back, asynchronously.

    ``kv_caches`` is a list of tensors (all CUDA tensors on one device, or all CPU tensors) in which
    dimension ``block_dim`` indexes blocks. ``options`` are the fs tier's storage options
    (``n_read_threads``, ``n_write_threads``, ``o_direct``, ``checksum``, ``durability``,
    ``file_mode``, ``worker_nice``, ``load_nice``, ``max_stores_in_flight_while_loading``,
    ``io_engine``, ``io_timeout_s``, and the capacity options ``max_bytes``,
    ``min_free_fraction``, ``eviction``) plus ``staging_bytes_total``, ``staging_buffer_bytes`` and
    ``numa_bind``. With the same ``offloading_spec`` and ``root_dir`` an ``fs`` tier whose primary
    rows are ``block_bytes`` long reads and writes the same files.
    """

    def __init__(
        self,
        kv_caches: Sequence[Any],
        offloading_spec: OffloadingSpec,
        root_dir: str,
        block_dim: int = 0,
        **options: Any,
    ) -> None:
        self._owner_pid = this_process()  # a forked child may not use it (kvtier._fork)
        self.options = GPUTransferOptions.parse({"root_dir": root_dir, **options})
        opts = self.options
        self.kv_caches = list(kv_caches)
        described = describe_kv_caches(self.kv_caches, block_dim)
        devices = {str(t.device) for t in self.kv_caches}
        if len(devices) != 1:
            raise InvalidArgumentError(
                f"kv_caches must all live on one device, got {sorted(devices)}"
            )
        self._on_gpu = described[0].is_device
        self.device = self.kv_caches[0].device
        if self._on_gpu and not cuda_available():
            raise CoreError(
                "kv_caches are CUDA tensors but kvtier found no usable CUDA runtime: "
                + _core.cuda_unavailable_reason()
            )
        self.layout = _core.BlockLayout(
            [
                (d.address, d.block_stride, d.num_blocks, list(d.runs), d.is_device)
                for d in described
            ]
        )
        self.block_bytes: int = self.layout.payload_length
        self.num_blocks: int = self.layout.num_blocks
        # Checked once here, as the fs tier checks its view: stores still work.
        self._read_only = None if self._on_gpu else read_only_tensor(described)

        self.file_mapper = FileMapper(
            opts.root_dir, offloading_spec, self.block_bytes, opts.checksum
        )
        with naming(self.file_mapper.config_path):
            self.file_mapper.prepare(opts.file_mode)
        self._engine = open_engine(
            self.file_mapper,
            opts,
            "GPUStorageTransfer",
            use_cuda=self._on_gpu,
            cuda_device=self.device.index if self._on_gpu and self.device.index is not None else -1,
        )
        # The engine holds the tensors: their memory stays allocated until its workers have
        # stopped, whatever order this object is torn down in.
        self._engine.keep_alive(self.kv_caches)
        # Stores hold budget on the root like the fs tier's; a refused store is a failed job.
        self._capacity = CapacityController(
            opts.root_dir, opts.capacity_policy(), self.block_bytes, opts.file_mode
        )
        # Results answered here and not handed out yet: stores refused for budget or health,
        # and jobs drain() collected from the engine (see drain()).
        self._ready: list[JobResult] = []
        # Stop the capacity thread even if the transfer is dropped without shutdown().
        self._finalizer = weakref.finalize(
            self, _close, self._capacity, self._owner_pid, opts.io_timeout_s
        )
        # The root's health, shared with the fs tiers of this process on it (fs/health.py):
        # while it is degraded, stores and loads fail at once, and when it degrades the engine
        # fails what it has not started.
        self._health: RootHealth
        self._health, self._health_finalizer = join_root_for(
            self, self._capacity, opts.io_timeout_s, self._engine, self.file_mapper.rank_dir
        )
        self._epochs: dict[JobId, int] = {}  # health epoch at submission, by job
        self._keys: dict[JobId, tuple[OffloadKey, ...]] = {}
        # Admitted stores' block files, kept from eviction until the store is collected.
        self._admitted_jobs: dict[JobId, list[str]] = {}
        # Stores whose admission is not answered yet (waiting for budget): drain() waits.
        self._admissions = threading.Condition()
        self._admitting = 0
        self._failure_log = RateLimitedLog(logger)
        self._lock = threading.Lock()

    # ---- jobs ------------------------------------------------------------------------------
    @owner_process_only
    def store(self, job_id: JobId, block_ids: Sequence[int], keys: Sequence[OffloadKey]) -> None:
        """Write blocks ``block_ids`` as ``keys``; returns at once. On a GPU, the copies start
        after the work already queued on the caller's current CUDA stream."""
        self._submit(job_id, block_ids, keys, _core.Direction.STORE)

    @owner_process_only
    def load(self, job_id: JobId, block_ids: Sequence[int], keys: Sequence[OffloadKey]) -> None:
        """Read ``keys`` into blocks ``block_ids``; returns at once. On a GPU, the copies start
        after the work already queued on the caller's current CUDA stream (kernels still
        reading the old contents of those blocks). A block is usable once its job is reported
        by get_finished() (the copies have completed by then). Raises InvalidArgumentError (a
        ValueError) when the tensors lie in read-only memory."""
        if self._read_only is not None:
            raise InvalidArgumentError(f"GPUStorageTransfer cannot load: {self._read_only}")
        self._submit(job_id, block_ids, keys, _core.Direction.LOAD)

    def _submit(
        self, job_id: JobId, block_ids: Sequence[int], keys: Sequence[OffloadKey], direction: Any
    ) -> None:
        job_id = check_job_id(job_id)
        keys = cast("tuple[OffloadKey, ...]", check_keys(job_id, keys))
        ids = check_block_ids(job_id, block_ids, len(keys), self.num_blocks)
        paths = [self.file_mapper.get_file_name(k) for k in keys]
        stream = 0
        if self._on_gpu:
            import torch  # only GPU callers get here, and they have torch

            stream = torch.cuda.current_stream(self.device).cuda_stream
        store = direction == _core.Direction.STORE
        with self._lock:
            # Entries leave _keys only when get_finished() hands the result out.
            if job_id in self._keys:
                raise InvalidArgumentError(
                    f"Job {job_id} is already in flight (or finished and not yet returned by "
                    "get_finished()); job ids must be unique until reported"
                )
            self._keys[job_id] = keys
            refusal = self._health.refusal("store" if store else "load")
            if refusal is None:
                self._epochs[job_id] = self._health.epoch
        if refusal is not None:  # degraded root: failed at once, reported by get_finished
            self._refuse(job_id, refusal, load=not store)
            return
        if store and keys:
            # Admission touches only memory; a store the budget has no room for yet is
            # submitted later from the capacity thread, or fails there (never waits here).
            with self._admissions:
                self._admitting += 1
            try:
                answer = self._capacity.admit(
                    len(keys),
                    lambda refusal: self._admitted(job_id, keys, ids, paths, stream, refusal, True),
                    paths,
                )
            except OSError as e:  # the ledger's disk fails: a failed job, never a raise
                answer = f"capacity ledger: {e.strerror or e} (errno {e.errno})"
            except BaseException:
                self._admission_done()
                with self._lock:
                    del self._keys[job_id]
                raise
            if not isinstance(answer, Deferred):
                self._admission_done()
                self._admitted(job_id, keys, ids, paths, stream, answer, False)
            return
        if not store:
            self._capacity.record_use(paths)
        self._submit_blocks(job_id, direction, keys, ids, paths, stream)

    def _admitted(
        self,
        job_id: JobId,
        keys: tuple[OffloadKey, ...],
        ids: Any,
        paths: list[str],
        stream: int,
        refusal: str | None,
        deferred: bool,
    ) -> None:
        """A store's admission: submit it, or report it failed. Runs on the caller's thread
        or, when the store waited for budget, on the capacity thread (where nothing may
        raise: a failure is the job's result)."""
        if deferred:
            try:
                if refusal is not None:
                    self._refuse(job_id, f"store: {refusal}")
                    return
                with self._lock:
                    self._admitted_jobs[job_id] = paths
                self._submit_blocks(job_id, _core.Direction.STORE, keys, ids, paths, stream, True)
            finally:
                self._admission_done()
            return
        if refusal is not None:
            self._refuse(job_id, f"store: {refusal}")
            return
        with self._lock:
            self._admitted_jobs[job_id] = paths
        self._submit_blocks(job_id, _core.Direction.STORE, keys, ids, paths, stream)

    def _refuse(self, job_id: JobId, error: str, load: bool = False) -> None:
        self._failure_log.error("Job %s block I/O failed: %s", job_id, error)
        with self._lock:  # the id stays taken until get_finished() hands this out
            self._epochs.pop(job_id, None)
            self._ready.append(
                JobResult(job_id, False, successful_keys=[] if load else None, error=error)
            )

    def _admission_done(self) -> None:
        with self._admissions:
            self._admitting -= 1
            self._admissions.notify_all()

    def _submit_blocks(
        self,
        job_id: JobId,
        direction: Any,
        keys: tuple[OffloadKey, ...],
        ids: Any,
        paths: list[str],
        stream: int,
        deferred: bool = False,
    ) -> None:
        """Hand the job to the engine. On the caller's thread a failure frees the id and
        raises; a deferred store's failure (the capacity thread's) is the job's result."""
        try:
            self._engine.submit_blocks(
                job_id, direction, paths, list(keys), ids, self.layout, stream
            )
        except BaseException as e:
            with self._lock:
                admitted = self._admitted_jobs.pop(job_id, None)
                if not deferred:
                    del self._keys[job_id]
                    self._epochs.pop(job_id, None)
            if admitted is not None:
                self._capacity.finish_store(len(keys), 0, admitted)
            if deferred:
                shut = isinstance(e, ShutDownError)
                self._refuse(job_id, f"store: {'GPUStorageTransfer is shut down' if shut else e}")
                return
            if isinstance(e, ShutDownError):
                raise ShutDownError(
                    "GPUStorageTransfer is shut down; store/load refused (create a new one)"
                ) from e
            raise
        if self._health.degraded:
            # Degraded since the job was let through: the engine failed what it had not
            # started before this job got there (RootHealth.report_timeout); fail it too.
            self._engine.fail_unstarted(self.file_mapper.rank_dir)

    @owner_process_only
    def get_finished(self) -> list[JobResult]:
        """Every submitted job exactly once, as it finishes; never blocks. Safe from several
        threads at once: each job reaches exactly one caller."""
        self._collect()
        with self._lock:
            results, self._ready = self._ready, []
            for r in results:
                del self._keys[r.job_id]
        return results

    def _collect(self) -> None:
        """Moves the jobs the engine finished into the results get_finished() hands out
        (their ids stay taken until then); a timeout among them degrades the root."""
        for c in self._engine.pop_completions():
            with self._lock:
                keys = self._keys.get(c.job_id, ())
                epoch = self._epochs.pop(c.job_id, -1)
                admitted = self._admitted_jobs.pop(c.job_id, None)
            if admitted is not None:  # c.bytes counts the payload of each file the store created
                new_blocks = c.bytes // max(1, self.block_bytes)
                self._capacity.finish_store(len(keys), new_blocks, admitted)
                if new_blocks < len(keys):  # some were there already: this store used them
                    self._capacity.record_use(
                        [p for p, e in zip(admitted, c.block_errnos) if e == 0]
                    )
            if c.errno == errno.ETIMEDOUT or errno.ETIMEDOUT in c.block_errnos:
                self._health.report_timeout(
                    "a block operation timed out "
                    f"(io_timeout_s={self.options.io_timeout_s:g}): {c.error}",
                    epoch,
                )
            successful = None
            if not c.success and c.direction == _core.Direction.LOAD:
                successful = [k for k, e in zip(keys, c.block_errnos) if e == 0]
            if not c.success:
                self._failure_log.error("Job %s block I/O failed: %s", c.job_id, c.error)
            result = JobResult(
                c.job_id,
                c.success,
                successful_keys=successful,
                transfer_bytes=c.bytes,
                transfer_time=c.seconds,
                error=c.error,
            )
            with self._lock:
                self._ready.append(result)

    @owner_process_only
    def drain(self) -> None:
        """Block until every job submitted before the call has finished (results stay for
        get_finished); jobs submitted meanwhile by other threads are not waited for. Stores
        waiting for budget are waited for too (answered within STORE_WAIT_SECONDS). On a
        frozen mount it returns within about two ``io_timeout_s`` (docs/tiers.md, "When
        storage stalls")."""
        with self._admissions:
            while self._admitting:
                self._admissions.wait(0.01)
        # Collected meanwhile (and kept for get_finished()), a timeout degrades the root, and
        # the engine fails every block it has not started (RootHealth.report_timeout): on a
        # frozen mount those would wait for stuck workers, past the replacement cap for ever.
        while not self._engine.drain_for(DRAIN_POLL_S):
            self._collect()

    def shutdown(self) -> None:
        """Running block operations finish, queued ones fail (ECANCELED); idempotent."""
        if inherited(self._owner_pid):
            return  # a forked child's copy: nothing of it runs here (see kvtier._fork)
        self._capacity.stop()  # winds down while the engine stops
        self._engine.shutdown()  # within about io_timeout_s, whatever the kernel holds
        self._finalizer()
        self._health_finalizer()

    @owner_process_only
    def stats(self) -> dict[str, Any]:
        """Engine, capacity and health counters; ``health`` is ``"healthy"`` or
        ``"degraded"``."""
        return {**self._engine.stats(), **self._capacity.stats(), **self._health.stats()}

    @property
    def numa_node(self) -> int:
        """The NUMA node the workers are pinned to (``numa_bind``), or -1."""
        return int(self._engine.numa_node)


def _close(capacity: CapacityController, owner_pid: int, io_timeout_s: float) -> None:
    # In a forked child (at its exit) the capacity thread and the budget lease are the parent's.
    if inherited(owner_pid):
        return
    try:
        # With a deadline, teardown is bounded as the fs tier's is (a capacity thread stuck
        # in the kernel is left to return on its own); without, the fixed wait of close().
        capacity.close(time.monotonic() + SHUTDOWN_GRACE_S if io_timeout_s > 0 else None)
    except OSError as e:  # shutdown never raises for the storage's sake (str(e): see fs)
        logger.warning(
            "closing the capacity budget failed: %s (the transfer is shut down all the same)",
            str(e),
        )

"""The LMCache peer: the same workload through LMCache's own storage backends.

Imported only for ``--peer lmcache``, in a Python that has LMCache 0.5.6 (``bash
.ci/lmcache-env.sh`` builds one). Each backend is driven at LMCache's storage API, the calls
LMCache's storage manager makes, with LMCache's asyncio loop running in a thread of its own:

- ``lmcache-disk``: ``LocalDiskBackend`` (LMCache's local disk tier), buffered I/O;
- ``lmcache-disk-odirect``: the same with ``use_odirect`` (only where O_DIRECT works);
- ``lmcache-fs``: ``RemoteBackend`` over LMCache's ``FSConnector`` (its file-system plugin).

Stores are ``batched_submit_put_task`` of memory objects that wrap the rows of the bench's
primary memory (page-aligned, as LMCache's O_DIRECT writes need: with a buffer that is not,
a write fails inside LMCache's worker and the put never completes, without an error). A job
is finished when LMCache's completion callback has fired for each of its blocks; a put that
never completes fails the run once no put has completed for ``PUT_STALL_S`` seconds.

Loads are ``batched_get_blocking`` from one loader thread (LMCache's retrieve is a blocking
call), over every load job queued at that moment, so LMCache's own read pool sees as many
blocks at once as the jobs hold. LocalDiskBackend allocates the destination of each block
from its memory allocator, in key order, before it reads; the peer's allocator hands it the
job's rows in that order, so the blocks are read straight into primary memory, as kvtier's
and vLLM's tiers read them. The FSConnector allocates inside its coroutines, in no fixed
order: its blocks land in a page-aligned staging pool and are copied into their rows (the
copy is counted in its CPU time and noted in the report).

LMCache keeps its index in memory only, and the measurements remove block files behind the
tier's back between passes: each store of a bench key is therefore stored under a new LMCache
key (a generation counter), and loads read the latest one.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvtier.bench.errors import BenchError
from kvtier.bench.workload import (
    FADVISE,
    O_DIRECT,
    DriverFactory,
    Finished,
    Job,
    PrimaryMemory,
    TierDriver,
)

logger = logging.getLogger(__name__)

SUPPORTED = "LMCache 0.5.6"
#: The backends `--peer lmcache` runs, in this order.
VARIANTS = ("lmcache-disk", "lmcache-disk-odirect", "lmcache-fs")
#: A store job fails when no put of the backend has completed for this long while some are
#: outstanding: LMCache drops a failed disk write's exception in its executor, so a put that
#: failed looks exactly like one that never ran.
PUT_STALL_S = 60.0
_MODEL = "kvtier-bench"
_TOKENS = 256  # LMCache's default chunk size; a block of N bytes holds N / 256 per token


def lmcache_status() -> dict:
    """Whether LMCache's storage backends can run here: {"available", "version", "reason"}."""
    # LMCache logs every backend's creation (INFO, and WARNINGs about the cluster controller
    # the bench does not run) on its own handlers: the bench's lines would drown. Its errors
    # (a failed read) still show; LMCACHE_LOG_LEVEL set by the user wins.
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    try:
        import lmcache
        from lmcache.v1.storage_backend.connector import fs_connector  # noqa: F401
        from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend  # noqa: F401
        from lmcache.v1.storage_backend.remote_backend import RemoteBackend  # noqa: F401

        if not hasattr(lmcache, "device_ops"):  # LMCache imports without numba, but cannot run
            raise ImportError("lmcache.device_ops is missing (is numba installed?)")
    except Exception as exc:  # ImportError, or LMCache failing inside its own import
        return {
            "available": False,
            "reason": (
                f"LMCache is not importable in this Python ({type(exc).__name__}: {exc}); "
                "build its environment with `bash .ci/lmcache-env.sh` and run "
                "`.venv-lmcache/bin/python -m kvtier bench --peer lmcache`"
            ),
        }
    return {"available": True, "version": getattr(lmcache, "__version__", "unknown")}


class _LoopThread:
    """An asyncio event loop running forever in a daemon thread (LMCache submits to it).

    Its default executor, where the FSConnector runs its file I/O (aiofiles and O_DIRECT
    reads both use it), gets ``threads`` workers, as LMCache's disk backend's pools do."""

    def __init__(self, threads: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._executor = ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="kvtier-bench-lmcache-io"
        )
        self.loop.set_default_executor(self._executor)
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="kvtier-bench-lmcache-loop", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Cancels LMCache's coroutines still running (a run stopped by a failed job leaves
        puts in flight) on the loop, then stops it and waits for its executor's threads.

        Stopping the loop under a pending coroutine leaves it to be destroyed later, outside
        any loop: the FSConnector's ``put`` then fails in its cleanup (aiofiles asks for the
        running loop) and LMCache logs "Failed to write file ...: no running event loop" for
        each, which reads like the cause of the run's failure but is its aftermath. Cancelled
        here, the coroutines unwind on their loop, and once the executor has finished no
        LMCache thread reads or writes the bench's primary memory any more."""
        if self._thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(_cancel_pending(), self.loop)
            with contextlib.suppress(Exception):
                done.result(timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
        self._executor.shutdown(wait=True, cancel_futures=True)
        if not self._thread.is_alive():
            self.loop.close()


async def _cancel_pending() -> None:
    """Cancels every other task of the running loop and waits until each has unwound."""
    tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


class _RowAllocator:
    """LMCache's memory allocator interface over the bench's primary memory.

    ``expect(rows)`` queues the rows the next ``allocate`` calls hand out, in order (the
    order LocalDiskBackend allocates a batch's destinations in); ``free`` returns nothing to
    any pool: the rows belong to primary memory.
    """

    def __init__(self, primary: PrimaryMemory, shape: Any, dtype: Any):
        import torch

        self._shape, self._dtype = shape, dtype
        self._rows = torch.from_numpy(primary.array)  # shares the memory, no copy
        self._queue: collections.deque[int] = collections.deque()
        self._lock = threading.Lock()

    def row_object(self, row: int) -> Any:
        from lmcache.v1.memory_management import MemoryFormat, MemoryObjMetadata, TensorMemoryObj

        size = self._rows.shape[1]
        metadata = MemoryObjMetadata(
            self._shape, self._dtype, row * size, size, 1, 0, MemoryFormat.KV_2LTD,
            shapes=[self._shape], dtypes=[self._dtype],
        )  # fmt: skip
        return TensorMemoryObj(self._rows[row], metadata, parent_allocator=self)

    def row_pointer(self, row: int) -> int:
        return self._rows[row].data_ptr()

    def expect(self, rows: Sequence[int]) -> None:
        with self._lock:
            self._queue.extend(rows)

    def drain(self) -> int:
        with self._lock:
            left = len(self._queue)
            self._queue.clear()
            return left

    def allocate(self, shapes: Any, dtypes: Any, fmt: Any = None, *args: Any, **kw: Any) -> Any:
        with self._lock:
            row = self._queue.popleft() if self._queue else None
        return None if row is None else self.row_object(row)

    def batched_allocate(self, *args: Any, **kwargs: Any) -> Any:  # pragma: no cover
        raise NotImplementedError("the bench's LMCache peer allocates one block at a time")

    def free(self, memory_obj: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def batched_free(self, memory_objs: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def memcheck(self) -> bool:
        return True

    def close(self) -> None:
        pass


class LmcacheDriver:
    """One LMCache storage backend on a fresh directory, adapted to the bench's jobs."""

    def __init__(
        self,
        root: Path,
        primary: PrimaryMemory,
        *,
        variant: str,
        threads: int,
        direct: bool,
        put_stall_s: float = PUT_STALL_S,
    ):
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.config import LMCacheEngineConfig
        from lmcache.v1.memory_allocators.tensor_memory_allocator import TensorMemoryAllocator
        from lmcache.v1.metadata import LMCacheMetadata
        from lmcache.v1.storage_backend.local_cpu_backend import LocalCPUBackend

        if variant not in VARIANTS:
            raise BenchError(f"unknown LMCache backend {variant!r}; expected one of {VARIANTS}")
        self.name = variant
        self._key_type = CacheEngineKey
        self._dtype = torch.uint8
        block = primary.block_size
        if block % (2 * _TOKENS):
            raise BenchError(
                f"--peer lmcache: a block of {block} bytes is not a whole number of "
                f"{_TOKENS}-token chunks"
            )
        # (layers, k/v, tokens, heads, head bytes): one layer of uint8 whose chunk is a block.
        kv_shape = (1, 2, _TOKENS, 1, block // (2 * _TOKENS))
        self._metadata = LMCacheMetadata(
            model_name=_MODEL, world_size=1, local_world_size=1, worker_id=0,
            local_worker_id=0, kv_dtype=self._dtype, kv_shape=kv_shape, chunk_size=_TOKENS,
        )  # fmt: skip
        shape = self._metadata.get_shapes()[0]
        self._rows = _RowAllocator(primary, shape, self._dtype)
        self._primary = primary
        self._root = root
        self._odirect = variant == "lmcache-disk-odirect"
        # Far above anything the bench stores: LMCache evicts nothing during a measurement.
        extra: dict[str, Any] = {"disk_io_threads": threads, "use_odirect": self._odirect}
        config_args: dict[str, Any] = {
            "chunk_size": _TOKENS, "local_cpu": False, "max_local_cpu_size": 1.0,
            "max_local_disk_size": 1 << 20, "extra_config": extra,
        }  # fmt: skip
        if variant == "lmcache-fs":
            extra.update({"remote_storage_plugin.fs.base_path": str(root)})
            extra.update({"save_chunk_meta": False})
        else:
            config_args["local_disk"] = str(root)
        self._config = LMCacheEngineConfig.from_defaults(**config_args)

        self._put_stall_s = put_stall_s
        self._loop = _LoopThread(threads)
        self._staging: Any = None
        self._backend: Any = None
        try:
            if variant == "lmcache-fs":
                from lmcache.v1.storage_backend.remote_backend import RemoteBackend

                # The connector reads into LMCache's CPU pool: a page-aligned staging area.
                self._staged = max(64, 4 * threads)  # blocks the staging pool holds
                self._staging = _PageAlignedPool(self._staged * block)
                pool = LocalCPUBackend(
                    self._config,
                    self._metadata,
                    memory_allocator=TensorMemoryAllocator(self._staging.tensor),
                )
                self._backend = RemoteBackend(
                    self._config, self._metadata, self._loop.loop, pool, "cpu", plugin_name="fs"
                )
                if self._backend.connection is None:
                    raise BenchError(
                        "LMCache's RemoteBackend could not create its FSConnector on "
                        f"{root} (LMCache's log says why)"
                    )
            else:
                from lmcache.v1.storage_backend.local_disk_backend import LocalDiskBackend

                pool = LocalCPUBackend(self._config, self._metadata, memory_allocator=self._rows)
                self._backend = LocalDiskBackend(
                    self._config, self._loop.loop, pool, "cpu", metadata=self._metadata
                )
        except BaseException:
            self._loop.close()
            raise
        self.cache_bypass = O_DIRECT if (self._odirect and direct) else FADVISE
        self._generation: dict[bytes, int] = {}
        self._lock = threading.Lock()
        self._done: list[Finished] = []
        #: Store job id -> LMCache keys not yet reported written.
        self._stores: dict[int, set[Any]] = {}
        self._store_of_key: dict[Any, int] = {}
        self._last_put = time.monotonic()
        self._loads: collections.deque[Job] = collections.deque()
        self._wake = threading.Condition(self._lock)
        self._closing = False
        self._loader = threading.Thread(
            target=self._load_loop, name="kvtier-bench-lmcache-loads", daemon=True
        )
        self._loader.start()

    # -- keys ---------------------------------------------------------------------------

    def _lmcache_key(self, key: bytes, generation: int) -> Any:
        digest = hashlib.blake2b(key + generation.to_bytes(4, "big"), digest_size=8).digest()
        return self._key_type(_MODEL, 1, 0, int.from_bytes(digest, "big"), self._dtype)

    def _current(self, key: bytes) -> Any:
        return self._lmcache_key(key, self._generation.get(key, 0))

    # -- stores -------------------------------------------------------------------------

    def submit_store(self, job: Job) -> None:
        with self._lock:
            keys = []
            for key in job.keys:
                self._generation[key] = self._generation.get(key, -1) + 1
                keys.append(self._current(key))
            self._stores[job.job_id] = set(keys)
            for k in keys:
                self._store_of_key[k] = job.job_id
            if len(self._stores) == 1:
                self._last_put = time.monotonic()
        objects = [self._rows.row_object(int(r)) for r in job.block_ids]
        self._backend.batched_submit_put_task(keys, objects, on_complete_callback=self._put_done)
        # As LMCache's storage manager does: the backend holds its own reference until the
        # write is done.
        for obj in objects:
            obj.ref_count_down()

    def _put_done(self, key: Any) -> None:
        with self._lock:
            self._last_put = time.monotonic()
            job_id = self._store_of_key.pop(key, None)
            if job_id is None:
                return
            left = self._stores[job_id]
            left.discard(key)
            if not left:
                del self._stores[job_id]
                self._done.append(Finished(job_id, True, None))

    def _stalled_stores(self) -> list[Finished]:
        """The lock is held. Fails every outstanding store once puts stopped completing."""
        if not self._stores or time.monotonic() - self._last_put < self._put_stall_s:
            return []
        why = (
            f"LMCache's {self.name} backend completed no put for {self._put_stall_s:g} s with "
            f"{sum(map(len, self._stores.values()))} outstanding: LMCache drops the error of "
            "a failed disk write (an O_DIRECT write from a buffer that is not page-aligned "
            "fails this way), so the put never completes"
        )
        failed = [Finished(job_id, False, why) for job_id in self._stores]
        self._stores.clear()
        self._store_of_key.clear()
        return failed

    # -- loads --------------------------------------------------------------------------

    def submit_load(self, job: Job) -> None:
        with self._wake:
            self._loads.append(job)
            self._wake.notify()

    def _load_loop(self) -> None:
        while True:
            with self._wake:
                while not self._loads and not self._closing:
                    self._wake.wait()
                if self._closing:
                    return
                jobs = self._take_loads()
                keys = [self._current(k) for job in jobs for k in job.keys]
            rows = [int(r) for job in jobs for r in job.block_ids]
            try:
                errors = self._load_batch(keys, rows)
            except Exception as exc:  # noqa: BLE001 - reported as the jobs' failure
                errors = [f"{type(exc).__name__}: {exc}"] * len(rows)
            results, start = [], 0
            for job in jobs:
                bad = [e for e in errors[start : start + len(job.keys)] if e]
                start += len(job.keys)
                results.append(Finished(job.job_id, not bad, bad[0] if bad else None))
            with self._lock:
                self._done.extend(results)

    def _take_loads(self) -> list[Job]:
        """The lock is held. Every queued load job, or for the FSConnector as many whole jobs
        as its staging pool holds (one job at least: the pool is sized for one)."""
        if self._staging is None:
            jobs = list(self._loads)
            self._loads.clear()
            return jobs
        jobs, blocks = [], 0
        while self._loads and (not jobs or blocks + len(self._loads[0].keys) <= self._staged):
            job = self._loads.popleft()
            jobs.append(job)
            blocks += len(job.keys)
        return jobs

    def _load_batch(self, keys: list[Any], rows: list[int]) -> list[str | None]:
        """Reads the blocks into their rows; per block, None or what went wrong."""
        if self._staging is None:
            self._rows.expect(rows)
        started = time.monotonic()
        try:
            got = self._backend.batched_get_blocking(keys)
        finally:
            if self._staging is None and self._rows.drain():
                logger.debug("LMCache allocated fewer blocks than it was asked to load")
        elapsed = time.monotonic() - started
        errors: list[str | None] = []
        for row, obj in zip(rows, got):
            if obj is None:
                errors.append(self._missing(row, elapsed))
                continue
            if self._staging is None:
                # LocalDiskBackend allocated this row for the block (in key order): check it.
                same = obj.tensor.data_ptr() == self._rows.row_pointer(row)
                obj.ref_count_down()
                if not same:
                    errors.append(
                        f"LMCache's {self.name} backend read a block into another buffer than "
                        "the one allocated for it in key order (has LMCache changed how "
                        "batched_get_blocking allocates?)"
                    )
                    continue
            else:
                self._primary.array[row] = obj.tensor.view(self._dtype).reshape(-1).numpy()
                obj.ref_count_down()
            errors.append(None)
        return errors

    def _missing(self, row: int, elapsed: float) -> str:
        """Why a block LMCache returned as None is missing, as far as the driver can tell."""
        why = f"LMCache's {self.name} backend returned no block for row {row}"
        timeout = self._config.blocking_timeout_secs
        if self.name == "lmcache-fs" and elapsed >= timeout:
            # RemoteBackend waits blocking_timeout_secs for each get and then returns None,
            # with only a WARNING (hidden at the bench's LMCACHE_LOG_LEVEL=ERROR).
            why += (
                f": its batched_get_blocking took {elapsed:.1f} s, past LMCache's "
                f"blocking_timeout_secs ({timeout} s), after which LMCache's RemoteBackend "
                "gives a block up and returns None (its gets wait in the same executor as the "
                "queued puts: a store flood on a busy machine delays them this long)"
            )
        return why

    # -- the driver interface -----------------------------------------------------------

    def finished(self) -> list[Finished]:
        with self._lock:
            done = self._done + self._stalled_stores()
            self._done = []
        return done

    def file_paths(self, keys: Sequence[bytes]) -> list[str]:
        with self._lock:
            current = [self._current(k) for k in keys]
        if self.name == "lmcache-fs":
            # RemoteBackend wraps its connector in LMCache's instrumented connector.
            connector = getattr(self._backend.connection, "_connector", None)
            connector = connector or self._backend.connection
            return [os.fspath(connector._get_file_path(k)) for k in current]
        return [self._backend._key_to_path(k) for k in current]

    def close(self) -> None:
        with self._wake:
            self._closing = True
            self._wake.notify()
        self._loader.join(timeout=60)
        try:
            if self._backend is not None:
                self._backend.close()
        finally:
            self._loop.close()
            if self._staging is not None:
                self._staging.close()


class _PageAlignedPool:
    """Anonymous memory (page-aligned, as O_DIRECT needs) as a flat uint8 tensor."""

    def __init__(self, size: int):
        import mmap

        import numpy as np
        import torch

        self._map = mmap.mmap(-1, size)
        self.tensor = torch.from_numpy(np.frombuffer(self._map, dtype=np.uint8))

    def close(self) -> None:
        del self.tensor
        with contextlib.suppress(BufferError):
            self._map.close()


def lmcache_factory(variant: str, threads: int, direct: bool) -> DriverFactory:
    def create(root: Path, primary: PrimaryMemory) -> TierDriver:
        return LmcacheDriver(root, primary, variant=variant, threads=threads, direct=direct)

    return create

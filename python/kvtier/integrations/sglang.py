"""kvtier's file-system tier as an SGLang HiCache storage backend ("L3").

SGLang (0.5.23) loads a storage backend it does not ship through its ``dynamic`` backend::

    --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.integrations.sglang", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "root_dir": "/mnt/nvme/kv"}'

SGLang constructs the class as ``KvtierHiCacheStorage(storage_config, kwargs)`` and then calls
``register_mem_pool_host(host_pool)``. Every key of the extra config other than SGLang's own
(``backend_name``, ``module_path``, ``class_name``, ``interface_v1``) is an option of kvtier's
``fs`` tier (``n_read_threads``, ``n_write_threads``, ``o_direct``, ``checksum``,
``durability``, ``file_mode``, ``worker_nice``, ``load_nice``,
``max_stores_in_flight_while_loading``, ``io_engine``, ``io_timeout_s``,
the capacity options ``max_bytes``, ``min_free_fraction`` and ``eviction``, and whatever
FsTierOptions gains), validated with the fs tier's errors. The capacity options hold this
backend's pages within the root's budget exactly as the fs tier's blocks (one budget for every
process and host on the root, LRU by last use), so SGLang, vLLM and ``kvtier gc`` can share a
root.
``interface_v1`` makes SGLang use the zero-copy calls (``batch_get_v1`` / ``batch_set_v1``);
without it SGLang uses the generic ones (``batch_get`` / ``batch_set`` with one flat tensor per
page). Both write the same files. See docs/sglang.md.

One SGLang page is one kvtier block file (checksummed, in the fs tier's layout, so the fs
tier's tooling works on it). The zero-copy path describes the host pool once as a
``_core.BlockLayout`` (a page of a ``layer_first`` pool is spread over every layer), so one
batch is one engine job whose workers gather and scatter pages straight from and into the
host pool, with the GIL released. SGLang's calls are synchronous: each waits for its own job
only, so several SGLang threads can call at once.

This is the only kvtier module that imports SGLang; importing it without a supported SGLang
raises ImportError naming the supported versions.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import select
import shutil
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier import _core
from kvtier._rate_limited_log import RateLimitedLog
from kvtier.errors import InvalidArgumentError, ShutDownError, StorageError
from kvtier.integrations._engine_version import EngineRequirement
from kvtier.tiering.fs.capacity import CapacityController
from kvtier.tiering.fs.engine import open_engine
from kvtier.tiering.fs.file_mapper import FileMapper, host_label
from kvtier.tiering.fs.health import RootHealth, join_root_for
from kvtier.tiering.fs.manager import SHUTDOWN_GRACE_S
from kvtier.tiering.fs.options import FsTierOptions, OptionParser
from kvtier.tiering.fs.sweep import sweep_dead_tmp_files
from kvtier.tiering.spec import OffloadingSpec

SUPPORTED_SGLANG_VERSIONS: tuple[str, ...] = ("0.5.23",)
"""SGLang releases this module is written and tested against (HiCache's API moves often)."""

_SUPPORTED_TEXT = ", ".join(SUPPORTED_SGLANG_VERSIONS)


def _is_supported(version: str) -> bool:
    """Post releases and local builds of a supported release are supported."""
    release = version.split("+", 1)[0].split(".post", 1)[0]
    return release in SUPPORTED_SGLANG_VERSIONS


SGLANG_VERSION: str = EngineRequirement(
    integration="kvtier.integrations.sglang",
    engine="SGLang",
    package="sglang",
    supported_text=_SUPPORTED_TEXT,
    pip_requirement=f"sglang=={SUPPORTED_SGLANG_VERSIONS[-1]}",
).supported_installed_version(_is_supported)

try:
    import torch
    from sglang.srt.mem_cache.hicache_storage import (
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
    )
except ImportError as e:
    raise ImportError(
        f"kvtier.integrations.sglang supports SGLang {_SUPPORTED_TEXT}; SGLang {SGLANG_VERSION} "
        f"is installed but its HiCache storage API could not be imported ({e})."
    ) from e

logger = logging.getLogger(__name__)

SGLANG_KEYS: tuple[str, ...] = ("backend_name", "module_path", "class_name", "interface_v1")
"""Keys of the extra config that SGLang itself reads; every other key is a kvtier option."""

# Options of the fs tier that belong to its vLLM-style asynchronous job queue, which this
# backend does not have (SGLang's calls are synchronous).
_QUEUE_ONLY_OPTIONS: tuple[str, ...] = ("async_lookup", "max_queued_store_jobs")

_OWNER = "SGLang storage backend 'kvtier'"


def parse_options(extra_config: dict[str, Any] | None) -> FsTierOptions:
    """The fs options in SGLang's extra config; ValueError naming the key and what it takes."""
    raw = {k: v for k, v in (extra_config or {}).items() if k not in SGLANG_KEYS}
    valid = [n for n in FsTierOptions.option_names() if n not in _QUEUE_ONLY_OPTIONS]
    OptionParser(_OWNER, valid + list(SGLANG_KEYS)).reject_unknown(raw)
    # The fs tier's own parser checks every value, including options added to it later.
    return FsTierOptions.parse("kvtier", raw)


# -- waiting for one job ---------------------------------------------------------------------


class _JobWaiter:
    """Lets any number of threads each wait for their own engine job.

    The engine reports completions on one queue with a single consumer. One waiting thread at
    a time consumes: it sleeps in poll() on the engine's eventfd (GIL released), pops every
    completion, files each under its job id and wakes the others, which sleep on a condition
    variable (GIL released) until their job is filed or it is their turn to consume.
    """

    def __init__(self, engine: _core.Engine) -> None:
        self._engine = engine
        self._poll = select.poll()
        self._poll.register(engine.eventfd, select.POLLIN)
        self._cond = threading.Condition()
        self._done: dict[int, Any] = {}
        self._consuming = False

    def wait(self, job_id: int) -> Any:
        """The completion of ``job_id`` (which must have been submitted)."""
        while True:
            with self._cond:
                while job_id not in self._done and self._consuming:
                    self._cond.wait()
                if job_id in self._done:
                    return self._done.pop(job_id)
                self._consuming = True
            completions: list[Any] = []
            try:
                completions = self._engine.pop_completions()
                if not completions:
                    # A completion that lands after pop_completions() leaves the eventfd
                    # readable, so this poll cannot miss it. The timeout is only a backstop.
                    if self._poll.poll(1000):
                        with contextlib.suppress(BlockingIOError):
                            os.eventfd_read(self._engine.eventfd)
                    completions = self._engine.pop_completions()
            finally:
                with self._cond:
                    for c in completions:
                        self._done[c.job_id] = c
                    self._consuming = False
                    self._cond.notify_all()


# -- the host pool as a BlockLayout ----------------------------------------------------------


def _contiguous_runs(view: torch.Tensor) -> list[tuple[int, int]]:
    """(byte offset from view.data_ptr(), byte length) of the pieces of a strided view, in
    the order of ``view.flatten()``."""
    shape, strides, item = list(view.shape), list(view.stride()), view.element_size()
    # The longest suffix of dimensions that is contiguous is one run.
    k, run = len(shape), 1
    while k > 0 and (shape[k - 1] == 1 or strides[k - 1] == run):
        run *= shape[k - 1]
        k -= 1
    runs: list[tuple[int, int]] = []
    for index in itertools.product(*(range(n) for n in shape[:k])):
        offset = sum(i * s for i, s in zip(index, strides)) * item
        if runs and runs[-1][0] + runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], runs[-1][1] + run * item)
        else:
            runs.append((offset, run * item))
    return runs


@dataclass(frozen=True)
class _PoolLayout:
    """Where each page of a host pool lives, and what identifies its byte format."""

    layout: _core.BlockLayout
    page_size: int  # tokens per page
    page_bytes: int
    description: str  # goes into the namespace fingerprint

    @classmethod
    def of(cls, pool: Any) -> _PoolLayout:
        page_size = int(pool.page_size)
        num_pages = int(pool.size) // page_size
        # SGLang's own flat page (get_data_page) defines the byte order of a stored page, so
        # the generic and the zero-copy paths write identical files.
        first = pool.get_data_page(0, flat=False)
        runs = _contiguous_runs(first)
        page_bytes = sum(length for _, length in runs)
        if page_bytes != first.numel() * first.element_size():
            raise InvalidArgumentError(f"host pool {type(pool).__name__}: pages overlap themselves")
        stride = 0
        if num_pages > 1:
            stride = pool.get_data_page(page_size, flat=False).data_ptr() - first.data_ptr()
            last = pool.get_data_page((num_pages - 1) * page_size, flat=False).data_ptr()
            if stride <= 0 or last != first.data_ptr() + (num_pages - 1) * stride:
                raise InvalidArgumentError(
                    f"host pool {type(pool).__name__} ({pool.layout}): pages are not evenly "
                    "spaced; kvtier cannot address them"
                )
        layout = _core.BlockLayout([(first.data_ptr(), stride, num_pages, runs, False)])
        tag = getattr(pool, "storage_format_tag", None)
        description = f"sglang:{type(pool).__name__}:{pool.layout}:page{tuple(first.shape)}" + (
            f":{tag}" if tag else ""
        )
        return cls(layout, page_size, page_bytes, description)


def _spec(config: HiCacheStorageConfig, pool: Any, pool_layout: _PoolLayout) -> OffloadingSpec:
    """The fs tier's view of this rank: what fixes a page's bytes, and which shard it is.

    Pages are identical on every DP replica (dp_rank is not part of the path: replicas share
    pages). MLA pages are identical on every TP rank, so TP is left out for MLA (without DCP,
    even different TP sizes share pages), and only the writer rank stores them.
    """
    cp_rank, cp_size = config.attn_cp_rank, config.attn_cp_size
    if config.is_mla_model:
        tp_size = config.tp_size if config.dcp_size > 1 else 1
        shard, shards = config.dcp_rank, config.dcp_size
    else:
        tp_size = config.tp_size
        shard, shards = config.tp_rank, config.tp_size
    rank = (config.pp_rank * cp_size + cp_rank) * shards + shard
    return OffloadingSpec(
        model_name=config.model_name or "unnamed-model",
        dtype=str(pool.dtype).removeprefix("torch."),
        tokens_per_block=pool_layout.page_size,
        blocks_per_file=1,
        tp_size=tp_size,
        pp_size=config.pp_size,
        pcp_size=cp_size,
        dcp_size=config.dcp_size,
        rank=rank,
        kv_layout=pool_layout.description,
    )


# -- the backend -----------------------------------------------------------------------------


class KvtierHiCacheStorage(HiCacheStorage):
    """SGLang HiCache storage backed by kvtier's file-system tier (see the module docstring).

    Raises ValueError for bad options and OSError when ``root_dir`` cannot be created.
    """

    def __init__(
        self, storage_config: HiCacheStorageConfig, kwargs: dict[str, Any] | None = None
    ) -> None:
        self.storage_config = storage_config
        self.options = parse_options(storage_config.extra_config)
        try:
            os.makedirs(self.options.root_dir, exist_ok=True)
        except OSError as e:
            raise StorageError(
                e.errno, f"cannot create kvtier root_dir ({e.strerror})", e.filename
            ) from e
        self.is_writer = bool(storage_config.is_storage_writer)
        self.file_mapper: FileMapper | None = None
        self._engine: _core.Engine | None = None
        self._waiter: _JobWaiter | None = None
        self._pool_layout: _PoolLayout | None = None
        self._capacity: CapacityController | None = None
        self._health: RootHealth | None = None
        self._job_ids = itertools.count(1)
        self._lock = threading.Lock()
        self._closed = False
        self._failure_log = RateLimitedLog(logger)
        self._metrics_on = bool(storage_config.enable_storage_metrics)
        self._metrics: dict[str, list[float]] = {
            "prefetch_pgs": [],
            "backup_pgs": [],
            "prefetch_bandwidth": [],
            "backup_bandwidth": [],
        }

    # -- setup ---------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Describe the host pool and open the namespace and the engine (once)."""
        super().register_mem_pool_host(mem_pool_host)
        if self._engine is not None:
            raise RuntimeError("KvtierHiCacheStorage: a host pool is already registered")
        if str(getattr(mem_pool_host, "device", "cpu")) != "cpu":
            raise InvalidArgumentError(
                f"KvtierHiCacheStorage needs a host (CPU) pool, got device {mem_pool_host.device!r}"
            )
        pool_layout = _PoolLayout.of(mem_pool_host)
        spec = _spec(self.storage_config, mem_pool_host, pool_layout)
        mapper = FileMapper(
            self.options.root_dir, spec, pool_layout.page_bytes, self.options.checksum
        )
        mapper.prepare(self.options.file_mode)
        # Crashed writers of this host leave tmp files; nobody else will ever rename them.
        sweep_dead_tmp_files([mapper.namespace_dir], [mapper.rank_dir], host_label())
        engine = open_engine(mapper, self.options, _OWNER, completion_eventfd=True)
        # Pages hold budget on the root like the fs tier's blocks; a refused page is a failed
        # set (SGLang keeps the page in host memory and may back it up later).
        capacity = CapacityController(
            self.options.root_dir,
            self.options.capacity_policy(),
            pool_layout.page_bytes,
            self.options.file_mode,
        )
        # Stop the capacity thread and hand its lease back even without close().
        weakref.finalize(self, capacity.close)
        self._capacity = capacity
        # The root's health, shared with kvtier's other users of the root in this process
        # (fs/health.py): while it is degraded, exists() misses and get/set fail at once, and
        # when it degrades the engine fails what it has not started.
        self._health, self._leave_health = join_root_for(
            self, capacity, self.options.io_timeout_s, engine, mapper.rank_dir
        )
        self.file_mapper, self._pool_layout = mapper, pool_layout
        self._waiter = _JobWaiter(engine)
        self._engine = engine
        logger.info(
            "kvtier HiCache storage at %s (%s, direct I/O: %s, io engine: %s, %d read + %d "
            "write threads%s)",
            mapper.rank_dir,
            pool_layout.description,
            engine.direct_io,
            engine.io_engine,
            engine.n_read_threads,
            engine.n_write_threads,
            "" if self.is_writer else ", reader only (MLA: another rank writes)",
        )

    def _ready(self) -> tuple[_core.Engine, FileMapper, _PoolLayout]:
        if self._closed:
            raise ShutDownError("KvtierHiCacheStorage is closed")
        if (
            self._engine is None
            or self.file_mapper is None
            or self._pool_layout is None
            or self._capacity is None
        ):
            raise RuntimeError(
                "KvtierHiCacheStorage: register_mem_pool_host() must be called before I/O"
            )
        return self._engine, self.file_mapper, self._pool_layout

    # -- one job ---------------------------------------------------------------------------

    def _paths_keys(self, keys: Sequence[str]) -> tuple[list[str], list[bytes]]:
        _, mapper, _ = self._ready()
        raw = [k.encode() for k in keys]
        return [mapper.get_file_name(k) for k in raw], raw

    def _run(self, is_load: bool, paths: Sequence[str], submit: Any) -> list[bool]:
        """Submit one job for the blocks at ``paths`` through ``submit(engine, job_id)``, wait
        for it, per-block results. A store first takes budget for its pages; a store refused
        for budget fails every page (no I/O)."""
        engine, mapper, pool_layout = self._ready()
        assert self._waiter is not None and self._capacity is not None
        assert self._health is not None
        capacity, health = self._capacity, self._health
        job_id = next(self._job_ids)
        degraded = health.refusal("get" if is_load else "set")
        if degraded is not None:  # degraded root: fail at once, send nothing into the stall
            self._failure_log.error("Job %s block I/O failed: %s", job_id, degraded)
            return [False] * len(paths)
        epoch = health.epoch
        if not is_load and paths:
            refusal = capacity.admit(len(paths), paths=paths)
            if refusal is not None:
                self._failure_log.error("Job %s block I/O failed: set: %s", job_id, refusal)
                return [False] * len(paths)
        started = time.perf_counter()
        try:
            submit(engine, job_id)
        except BaseException:
            if not is_load and paths:
                capacity.finish_store(len(paths), 0, paths)
            raise
        if health.degraded:  # degraded since the check: failed like the rest of the queue
            engine.fail_unstarted(mapper.rank_dir)
        c = self._waiter.wait(job_id)
        if not c.success:
            self._failure_log.error("Job %s block I/O failed: %s", job_id, c.error)
        if c.errno == errno.ETIMEDOUT or errno.ETIMEDOUT in c.block_errnos:
            health.report_timeout(
                "a block operation timed out "
                f"(io_timeout_s={self.options.io_timeout_s:g}): {c.error}",
                epoch,
            )
        ok = [e == 0 for e in c.block_errnos]
        new_blocks = len(paths)  # a loaded page is used; a newly written file's mtime is its use
        if not is_load and paths:
            # c.bytes counts the payload of each file the store created (a page on disk
            # already is skipped, and used by this set).
            new_blocks = c.bytes // max(1, pool_layout.page_bytes)
            capacity.finish_store(len(paths), new_blocks, paths)
        if is_load or new_blocks < len(paths):
            capacity.record_use([p for p, good in zip(paths, ok) if good])
        if self._metrics_on and ok:
            seconds = max(time.perf_counter() - started, 1e-9)
            kind = "prefetch" if is_load else "backup"
            with self._lock:
                self._metrics[f"{kind}_pgs"].append(len(ok))
                self._metrics[f"{kind}_bandwidth"].append(c.bytes / seconds / 1e9)
        return ok

    def _pages(self, keys: Sequence[str], host_indices: torch.Tensor) -> list[int | None]:
        """Page number in the host pool of each key's page, or None where not page-aligned."""
        _, _, pool_layout = self._ready()
        page = pool_layout.page_size
        firsts = host_indices[::page][: len(keys)].tolist()
        if len(firsts) != len(keys):
            raise InvalidArgumentError(
                f"{len(keys)} keys need {len(keys) * page} host indices, got {host_indices.numel()}"
            )
        return [i // page if i % page == 0 else None for i in firsts]

    def _page_job(
        self, keys: Sequence[str], host_indices: torch.Tensor, is_load: bool
    ) -> list[bool]:
        pages = self._pages(keys, host_indices)
        paths, raw = self._paths_keys(keys)
        picked = [i for i, p in enumerate(pages) if p is not None]
        if len(picked) != len(pages):
            self._failure_log.error("host indices not on page boundaries; those pages fail")
        _, _, pool_layout = self._ready()
        direction = _core.Direction.LOAD if is_load else _core.Direction.STORE

        def submit(engine: _core.Engine, job_id: int) -> None:
            engine.submit_blocks(
                job_id,
                direction,
                [paths[i] for i in picked],
                [raw[i] for i in picked],
                [p for p in pages if p is not None],  # the pages of `picked`, in order
                pool_layout.layout,
            )

        results = [False] * len(keys)
        for i, ok in zip(picked, self._run(is_load, [paths[i] for i in picked], submit)):
            results[i] = ok
        return results

    def _buffer_job(
        self, keys: Sequence[str], tensors: Sequence[torch.Tensor], is_load: bool
    ) -> list[bool]:
        paths, raw = self._paths_keys(keys)
        blocks = [
            (p, k, t.data_ptr(), t.numel() * t.element_size())
            for p, k, t in zip(paths, raw, tensors)
        ]

        def submit(engine: _core.Engine, job_id: int) -> None:
            if is_load:
                engine.submit_load(job_id, blocks)
            else:
                engine.submit_store(job_id, blocks)

        # tensors stay referenced by the caller until _run returns: the job is done by then.
        return self._run(is_load, paths, submit)

    # -- the zero-copy interface (extra config "interface_v1": 1) ---------------------------

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Read each key's page straight into the host pool pages at ``host_indices``."""
        if not keys:
            return []
        return self._page_job(keys, host_indices, is_load=True)

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Write the host pool pages at ``host_indices`` under ``keys``; a reader-only rank
        (MLA, not the writer) writes nothing and reports success, as SGLang's backends do."""
        if not self.is_writer:
            return [True] * len(keys)
        if not keys:
            return []
        return self._page_job(keys, host_indices, is_load=False)

    # -- the generic interface (one flat tensor per page) -----------------------------------

    def get(
        self,
        key: str,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> torch.Tensor | None:
        return self.batch_get([key], [target_location])[0]

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> list[torch.Tensor | None]:
        """Read each key into its (contiguous CPU) target tensor; None where it missed."""
        if target_locations is None or len(target_locations) != len(keys):
            raise InvalidArgumentError(
                "KvtierHiCacheStorage.batch_get needs one target tensor per key"
            )
        for t in target_locations:
            if t.device.type != "cpu" or not t.is_contiguous():
                raise InvalidArgumentError(
                    "KvtierHiCacheStorage.batch_get needs contiguous CPU tensors"
                )
        if not keys:
            return []
        ok = self._buffer_job(keys, target_locations, is_load=True)
        return [t if good else None for t, good in zip(target_locations, ok)]

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        return self.batch_set([key], [value])

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Write each value tensor under its key; True only if every page was stored."""
        if not self.is_writer:
            return True
        if values is None or len(values) != len(keys):
            raise InvalidArgumentError(
                "KvtierHiCacheStorage.batch_set needs one value tensor per key"
            )
        if not keys:
            return True
        tensors = [v.detach().to("cpu").contiguous() for v in values]
        return all(self._buffer_job(keys, tensors, is_load=False))

    # -- lookups -----------------------------------------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many keys, from the first, have a page stored (SGLang prefetches that prefix)."""
        if not keys:
            return 0
        paths, _ = self._paths_keys(keys)
        if self._health is not None and self._health.degraded:
            return 0  # a degraded root answers "absent" without touching the storage
        found = _core.paths_exist(paths)  # one stat each, GIL released
        return next((i for i, hit in enumerate(found) if not hit), len(keys))

    # -- housekeeping ------------------------------------------------------------------------

    def clear(self) -> bool:
        """Remove every page of this rank's namespace (also for other instances sharing it)."""
        _, mapper, _ = self._ready()
        try:
            for entry in os.scandir(mapper.rank_dir):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path)
                else:
                    os.unlink(entry.path)
        except OSError as e:
            logger.error("Clearing %s failed: %s", mapper.rank_dir, e)
            return False
        logger.info("Cleared kvtier HiCache storage at %s", mapper.rank_dir)
        return True

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call, when storage metrics are enabled."""
        if not self._metrics_on:
            return None
        from sglang.srt.observability.metrics_collector import StorageMetrics

        with self._lock:
            taken = {k: list(v) for k, v in self._metrics.items()}
            for v in self._metrics.values():
                v.clear()
        metrics = StorageMetrics()
        metrics.prefetch_pgs.extend(int(v) for v in taken["prefetch_pgs"])
        metrics.backup_pgs.extend(int(v) for v in taken["backup_pgs"])
        metrics.prefetch_bandwidth.extend(taken["prefetch_bandwidth"])
        metrics.backup_bandwidth.extend(taken["backup_bandwidth"])
        # SGLang's collector reads its own fields; kvtier's counters (health, io_timeouts,
        # abandoned_ops, ...) ride along for whoever reads the object.
        with contextlib.suppress(AttributeError, RuntimeError):
            metrics.kvtier_stats = self.engine_stats()
        return metrics

    def engine_stats(self) -> dict[str, Any]:
        """kvtier's engine counters (jobs, blocks, bytes, corrupt files removed,
        ``io_timeouts``, ``abandoned_ops``, ``workers_replaced``, ``workers_stuck``, ...), the
        root's capacity counters (``used_bytes``, ``capacity_bytes``, ``evicted_blocks``,
        ``rejected_stores``, ...) and its health (``health``: ``"healthy"`` or
        ``"degraded"``, ``health_probes``, ...)."""
        engine, _, _ = self._ready()
        assert self._capacity is not None and self._health is not None
        return {**engine.stats(), **self._capacity.stats(), **self._health.stats()}

    @property
    def direct_io(self) -> bool:
        engine, _, _ = self._ready()
        return bool(engine.direct_io)

    @property
    def io_engine(self) -> str:
        """``"io_uring"`` or ``"psync"``: the engine moving the bytes (what ``"auto"`` chose)."""
        engine, _, _ = self._ready()
        return str(engine.io_engine)

    def close(self) -> None:
        """Stop the engine (running block operations finish) and the capacity thread (its
        budget lease is handed back); idempotent."""
        self._closed = True
        if self._capacity is not None:
            self._capacity.stop()  # winds down while the engine stops
        if self._engine is not None:
            self._engine.shutdown()  # within about io_timeout_s, whatever the kernel holds
        if self._capacity is not None:
            # Bounded like the fs tier's teardown: a capacity thread stuck in the kernel is
            # left to return on its own (without a deadline, close()'s fixed wait).
            timeout = self.options.io_timeout_s
            self._capacity.close(time.monotonic() + SHUTDOWN_GRACE_S if timeout > 0 else None)
        if self._health is not None:
            self._leave_health()


__all__ = [
    "SGLANG_KEYS",
    "SGLANG_VERSION",
    "SUPPORTED_SGLANG_VERSIONS",
    "KvtierHiCacheStorage",
    "parse_options",
]

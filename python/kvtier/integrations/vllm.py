"""kvtier's file-system tier as an out-of-tree secondary tier of vLLM's tiered KV offloading.

vLLM (0.33.x) loads a secondary tier that it does not ship from a config entry naming a class
and a module. In ``kv_connector_extra_config`` of the ``OffloadingConnector``::

    {
        "spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 17179869184,
        "secondary_tiers": [
            {
                "type": "KvtierFileSystemTier",
                "module_path": "kvtier.integrations.vllm",
                "root_dir": "/mnt/kv"
            }
        ]
    }

Every other key of the entry is an option of kvtier's ``fs`` tier (``n_read_threads``,
``n_write_threads``, ``o_direct``, ``checksum``, ``durability``, ``file_mode``, ``worker_nice``,
``load_nice``, ``max_stores_in_flight_while_loading``, ``io_engine``, ``io_timeout_s``,
``async_lookup``, ``max_queued_store_jobs``, and the capacity
options ``max_bytes``, ``min_free_fraction``, ``eviction``), validated by kvtier, plus the keys
vLLM itself understands for storage tiers: ``locality`` (``"LOCAL"`` or ``"REMOTE"``),
``enable_kv_events`` and ``backpressure`` (which vLLM's factory turns into a detector). See
docs/vllm.md.

The tier runs in vLLM's scheduler process. It converts vLLM's types to kvtier's and back: a
``TransferJob`` (``chunk_ids``) becomes a kvtier ``JobMetadata`` (``block_ids``); kvtier's
``lookup`` answers True / False / None become ``HIT`` / ``MISS`` / ``RETRY``; kvtier's
``JobResult`` becomes vLLM's, keeping ``successful_keys`` of a partly failed load. Lookups
are asynchronous by default (``async_lookup`` is on), so slow storage never blocks the
scheduler: an unknown key answers ``RETRY`` and is resolved off the scheduler thread.

This is the only kvtier module that imports vLLM; importing it without a supported vLLM
raises ImportError naming the supported versions.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from kvtier.errors import ConfigurationError
from kvtier.integrations._engine_version import EngineRequirement
from kvtier.tiering.base import JobMetadata, JobResult, ReqContext
from kvtier.tiering.fs.file_mapper import FileMapper
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.fs.options import FsTierOptions, OptionParser
from kvtier.tiering.spec import OffloadingSpec

SUPPORTED_VLLM_SERIES: tuple[str, ...] = ("0.33",)
"""vLLM release series (major.minor) this module is written and tested against."""

_SUPPORTED_TEXT = ", ".join(f"{s}.x" for s in SUPPORTED_VLLM_SERIES)


def _is_supported(version: str) -> bool:
    """Every release of a supported series (major.minor) is supported."""
    return ".".join(version.split(".")[:2]) in SUPPORTED_VLLM_SERIES


VLLM_VERSION: str = EngineRequirement(
    integration="kvtier.integrations.vllm",
    engine="vLLM",
    package="vllm",
    supported_text=_SUPPORTED_TEXT,
    pip_requirement=f"vllm=={SUPPORTED_VLLM_SERIES[-1]}.*",
).supported_installed_version(_is_supported)

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
        OffloadingConnectorStats,
    )
    from vllm.v1.kv_offload.base import (
        Locality,
        LookupResult,
        Medium,
        OffloadingCounterMetadata,
        OffloadingEvent,
        OffloadingGaugeMetadata,
        OffloadingMetricMetadata,
        OffloadKey,
        RequestOffloadingContext,
    )
    from vllm.v1.kv_offload.base import OffloadingSpec as VllmOffloadingSpec
    from vllm.v1.kv_offload.base import ReqContext as VllmReqContext
    from vllm.v1.kv_offload.tiering.backpressure import BackpressureDetector
    from vllm.v1.kv_offload.tiering.base import JobId, TransferJob
    from vllm.v1.kv_offload.tiering.base import JobResult as VllmJobResult
    from vllm.v1.kv_offload.tiering.base import (
        SecondaryTierManager as VllmSecondaryTierManager,
    )
except ImportError as e:
    raise ImportError(
        f"kvtier.integrations.vllm supports vLLM {_SUPPORTED_TEXT}; vLLM {VLLM_VERSION} is "
        f"installed but its tiered offloading API could not be imported ({e})."
    ) from e

logger = logging.getLogger(__name__)

# Keys of a tier entry that this adapter consumes itself; the rest go to the fs tier.
_ADAPTER_OPTIONS: tuple[str, ...] = ("locality", "enable_kv_events")

# Capacity counters in vLLM's Prometheus endpoint (counters get "_total" appended there),
# labelled by root_dir: several kvtier tiers may be configured.
_GAUGES = {
    "used_bytes": "Bytes of block files under the kvtier root, as its usage ledger counts them.",
    "reserved_bytes": "Budget kvtier tiers on the root hold for stores not yet submitted.",
    "capacity_bytes": "max_bytes of the kvtier root (0: no byte budget).",
    "degraded": "1 while the kvtier root is degraded (a block operation timed out; lookups "
    "miss and jobs fail at once until a probe answers), else 0.",
    "abandoned_ops": "kvtier block operations past their deadline still in the kernel.",
    "workers_stuck": "kvtier I/O workers held by an operation past its deadline.",
}
_COUNTERS = {
    "evicted_blocks": "kvtier block files this engine evicted.",
    "evicted_bytes": "Bytes of kvtier block files this engine evicted.",
    "recycled_blocks": "Evicted kvtier block files this engine's stores were given to "
    "overwrite instead of creating new files.",
    "rejected_stores": "kvtier stores refused for lack of budget (eviction 'none').",
    "io_timeouts": "kvtier block operations that missed their deadline (io_timeout_s).",
    "workers_replaced": "kvtier I/O workers replaced because they were stuck in the kernel.",
    "watchdog_pauses": "Times kvtier found this process had been paused (SIGSTOP, a cgroup "
    "freezer) with I/O under a deadline and gave that I/O the paused time back.",
    "degraded_jobs": "kvtier jobs failed at once because the root was degraded.",
    "lookup_timeouts": "kvtier lookups whose check did not answer by io_timeout_s (answered "
    "absent).",
    "ledger_close_failures": "Closes of kvtier's usage-ledger files that failed (counted, "
    "never raised; the descriptor is released all the same).",
}
_METRIC_PREFIX = "vllm:kvtier_"
_METRIC_LABELS = ("root_dir",)


def offloading_spec_from_vllm(spec: VllmOffloadingSpec | OffloadingSpec) -> OffloadingSpec:
    """Convert vLLM's offloading spec into the :class:`OffloadingSpec` kvtier tiers read.

    The fields are the facts that determine a block's bytes, so that two vLLM instances share
    blocks on one ``root_dir`` exactly when their blocks are interchangeable:

    - ``model_name``, ``dtype``: vLLM's model name and KV-cache dtype.
    - ``tokens_per_block``: tokens per block hash; ``blocks_per_file``: blocks per offloaded
      chunk (one chunk is one primary-tier row and one kvtier file).
    - ``kv_cache_groups``: per KV-cache group, its tokens per block and layer names.
    - ``kv_layout``: vLLM's KV-cache layout name, plus the canonical format id when the
      canonical layout is on and ``replicated`` for a single-copy (replicated) layout.
    - parallel sizes and rank: as configured, except that they collapse to 1 (and rank 0) when
      vLLM certifies the offloaded bytes as independent of the parallel layout, so instances
      with different tensor/pipeline parallelism share blocks.

    A kvtier :class:`OffloadingSpec` is returned unchanged.
    """
    if isinstance(spec, OffloadingSpec):
        return spec
    config = spec.config
    parallel = config.parallel
    agnostic = bool(parallel.is_parallelism_agnostic or config.replicated_layout)
    layout_parts = [config.kv_cache_layout or ""]
    if config.canonical_layout:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.canonical_mapping import (
            canonical_format_id,
        )

        if config.kv_cache_layout is None:
            raise ConfigurationError(
                "vLLM's offloading config enables canonical_layout but names no "
                "kv_cache_layout; kvtier cannot tell which canonical format the blocks use"
            )
        layout_parts.append(f"canonical={canonical_format_id(config.kv_cache_layout)}")
    if config.replicated_layout:
        layout_parts.append("replicated")
    groups = tuple(
        {"tokens_per_block": int(g.tokens_per_block), "layer_names": list(g.layer_names)}
        for g in config.groups
    )
    return OffloadingSpec(
        model_name=str(config.model.name),
        dtype=str(config.model.dtype),
        tokens_per_block=int(config.cache.tokens_per_hash),
        blocks_per_file=int(config.cache.blocks_per_chunk),
        tp_size=1 if agnostic else int(parallel.tp_size),
        pp_size=1 if agnostic else int(parallel.pp_size),
        pcp_size=1 if agnostic else int(parallel.pcp_size),
        dcp_size=1 if agnostic else int(parallel.dcp_size),
        rank=0 if agnostic else int(parallel.rank),
        kv_cache_groups=groups,
        kv_layout=";".join(layout_parts),
    )


@dataclass
class _RequestState:
    """What the tier remembers about one request between on_new_request and its end."""

    kv_context: ReqContext
    # Keys answered MISS for this request, and keys whose promotion failed: MISS until the
    # request ends. vLLM's scheduler may look a key up several times in one step (it re-runs
    # its lookups until the hit length converges); the answer must not flip back to RETRY,
    # and a block that keeps failing to load must be recomputed, not promoted again and again.
    misses: set[OffloadKey] = field(default_factory=set)


@dataclass(frozen=True)
class _InFlight:
    keys: tuple[OffloadKey, ...]
    req_id: str
    is_promotion: bool


class KvtierFileSystemTier(VllmSecondaryTierManager):
    """vLLM secondary tier backed by kvtier's file-system tier (``fs``).

    Created by vLLM's ``SecondaryTierFactory`` from a ``secondary_tiers`` entry with
    ``"type": "KvtierFileSystemTier"`` and ``"module_path": "kvtier.integrations.vllm"``;
    the entry's other keys are the options listed in the module docstring.

    Like every vLLM secondary tier, it is called on the scheduler side under the tiering
    manager's lock, and every method returns at once: block I/O runs on kvtier's native
    threads and finished jobs are collected by :meth:`get_finished_jobs`.
    """

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: VllmOffloadingSpec | OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: BackpressureDetector | None = None,
        locality: str | None = None,
        enable_kv_events: bool | str = False,
        **options: Any,
    ) -> None:
        """Validate the options and open kvtier's fs tier under ``root_dir``.

        Raises ValueError for unknown or invalid options, OSError when ``root_dir`` cannot be
        created or written.
        """
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = _parse_locality(tier_type, locality)
        self.kvtier_spec = offloading_spec_from_vllm(offloading_spec)

        unknown = sorted(k for k in options if k not in FsTierOptions.option_names())
        if unknown:
            noun = "option" if len(unknown) == 1 else "options"
            valid = sorted([*FsTierOptions.option_names(), *_ADAPTER_OPTIONS, "backpressure"])
            raise ConfigurationError(
                f"Unknown {noun} {', '.join(repr(k) for k in unknown)} for secondary tier "
                f"'{tier_type}'. Valid options: {valid}"
            )
        options.setdefault("async_lookup", True)

        self._events: list[OffloadingEvent] | None = None
        if _parse_bool(tier_type, "enable_kv_events", enable_kv_events):
            events_config = getattr(offloading_spec, "kv_events_config", None)
            if events_config is not None and events_config.enable_kv_cache_events:
                self._events = []
            else:
                logger.warning(
                    "enable_kv_events is set on secondary tier '%s' but KV cache events are "
                    "disabled in vLLM; the tier emits no events",
                    tier_type,
                )

        self._tier = FileSystemTierManager(
            self.kvtier_spec, primary_kv_view, tier_type=tier_type, **options
        )
        if self._events is not None:
            # Evictions are found on the capacity thread; take_events() runs on the scheduler's.
            self._removed: list[OffloadKey] = []
            self._removed_lock = threading.Lock()
            self._tier.add_eviction_listener(self._on_evicted)
        self._reported: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self._requests: dict[str, _RequestState] = {}
        self._in_flight: dict[JobId, _InFlight] = {}
        # Results of jobs that could not even be submitted; reported like any other.
        self._refused: list[VllmJobResult] = []

    # -- what users and tests may inspect -----------------------------------------------------

    @property
    def kvtier_tier(self) -> FileSystemTierManager:
        """The kvtier ``fs`` tier this adapter drives."""
        return self._tier

    @property
    def file_mapper(self) -> FileMapper:
        """Maps keys to block file paths (``file_mapper.get_file_name(key)``)."""
        return self._tier.file_mapper

    def stats(self) -> dict[str, Any]:
        """kvtier's counters for this tier (engine, lookups, dropped stores, capacity) and
        ``health`` (``"healthy"`` or ``"degraded"``)."""
        return self._tier.stats()

    @property
    def io_engine(self) -> str:
        """``"io_uring"`` or ``"psync"``: the engine moving the bytes (what ``"auto"`` chose)."""
        return self._tier.io_engine

    # -- requests ---------------------------------------------------------------------------

    def on_new_request(self, req_context: VllmReqContext) -> RequestOffloadingContext:
        self._request(req_context)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: VllmReqContext) -> None:
        self._requests.pop(req_context.req_id, None)

    def _request(self, req_context: VllmReqContext) -> _RequestState:
        """The state of a live request, created on first sight (on_new_request or lookup)."""
        state = self._requests.get(req_context.req_id)
        if state is None:
            state = _RequestState(_to_kv_context(req_context))
            self._requests[req_context.req_id] = state
        return state

    def _kv_context(self, req_context: VllmReqContext) -> ReqContext:
        # Jobs and touches may follow a request's end (cascades of its last stores), so they
        # do not register state that on_request_finished would never clear.
        state = self._requests.get(req_context.req_id)
        return state.kv_context if state is not None else _to_kv_context(req_context)

    # -- lookups ----------------------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: VllmReqContext) -> LookupResult:
        state = self._request(req_context)
        if key in state.misses:
            return LookupResult.MISS
        found = self._tier.lookup(key, state.kv_context)
        if found is None:
            return LookupResult.RETRY
        if not found:
            state.misses.add(key)
            return LookupResult.MISS
        return LookupResult.HIT

    def touch(self, keys: Collection[OffloadKey], req_context: VllmReqContext) -> None:
        self._tier.touch(keys, self._kv_context(req_context))

    # -- jobs --------------------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata)

    def _submit(self, job: TransferJob) -> None:
        keys = tuple(job.keys)
        kv_job = JobMetadata(
            job_id=job.job_id,
            keys=keys,
            block_ids=np.asarray(job.chunk_ids, dtype=np.int64).reshape(-1),
            is_promotion=job.is_promotion,
            req_context=self._kv_context(job.req_context),
        )
        self._in_flight[job.job_id] = _InFlight(keys, job.req_context.req_id, job.is_promotion)
        try:
            if job.is_promotion:
                self._tier.submit_load(kv_job)
            else:
                self._tier.submit_store(kv_job)
        except Exception as e:  # noqa: BLE001  (any failure to start is a failed job)
            # vLLM has already registered the job and pinned its primary slots; raising here
            # would unwind the scheduler with them pinned. A job that cannot start is a failed
            # job like any other: the store becomes a later miss, the promotion a recompute.
            logger.error("Job %s could not be submitted: %s", job.job_id, e)
            self._refused.append(self._translate(JobResult(job.job_id, False, error=str(e))))

    def get_finished_jobs(self) -> Iterable[VllmJobResult]:
        refused, self._refused = self._refused, []
        return refused + [self._translate(r) for r in self._tier.get_finished()]

    def _translate(self, result: JobResult) -> VllmJobResult:
        job = self._in_flight.pop(result.job_id, None)
        successful_keys = None
        if job is not None and job.is_promotion and not result.success:
            successful_keys = tuple(result.successful_keys or ()) or None
            arrived = set(successful_keys or ())
            state = self._requests.get(job.req_id)
            if state is not None:
                state.misses.update(k for k in job.keys if k not in arrived)
        elif (
            job is not None and not job.is_promotion and result.success and self._events is not None
        ):
            self._events.append(
                OffloadingEvent(
                    keys=list(job.keys),
                    medium=self.medium,
                    removed=False,
                    locality=self.locality,
                )
            )
        return VllmJobResult(
            job_id=result.job_id,
            success=result.success,
            successful_keys=successful_keys,
            transfer_time=result.transfer_time,
            transfer_bytes=result.transfer_bytes,
        )

    def _on_evicted(self, keys: list[OffloadKey]) -> None:
        with self._removed_lock:
            self._removed.extend(keys)

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        with self._removed_lock:
            removed, self._removed = self._removed, []
        if removed:  # vLLM publishes these as BlockRemoved
            self._events.append(
                OffloadingEvent(
                    keys=removed, medium=self.medium, removed=True, locality=self.locality
                )
            )
        events, self._events = self._events, []
        return events

    # -- metrics (vLLM's tier-metrics hooks) ------------------------------------------------

    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, OffloadingMetricMetadata]:
        metrics: dict[str, OffloadingMetricMetadata] = {
            _METRIC_PREFIX + name: OffloadingGaugeMetadata(doc, _METRIC_LABELS)
            for name, doc in _GAUGES.items()
        }
        metrics.update(
            {
                _METRIC_PREFIX + name: OffloadingCounterMetadata(doc, _METRIC_LABELS)
                for name, doc in _COUNTERS.items()
            }
        )
        return metrics

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Capacity and health gauges, and counter increases since the last call."""
        stats = self._tier.stats()
        out = OffloadingConnectorStats()
        labels = (self._tier.options.root_dir,)
        stats["degraded"] = int(stats["health"] == "degraded")
        for name in _GAUGES:
            out.set_gauge(_METRIC_PREFIX + name, stats[name], labels)
        for name in _COUNTERS:
            delta = stats[name] - self._reported[name]
            if delta:
                out.increase_counter(_METRIC_PREFIX + name, delta, labels)
                self._reported[name] = stats[name]
        return out

    def drain_jobs(self) -> None:
        self._tier.drain_jobs()

    def shutdown(self) -> None:
        self._tier.shutdown()


def _to_kv_context(req_context: VllmReqContext) -> ReqContext:
    params = req_context.kv_transfer_params
    return ReqContext(req_context.req_id, dict(params) if params is not None else None)


def _parse_locality(tier_type: str, value: Any) -> Locality | None:
    if value is None or isinstance(value, Locality):
        return value
    choices = [m.value for m in Locality]
    if isinstance(value, str) and value.strip().upper() in choices:
        return Locality(value.strip().upper())
    raise ConfigurationError(
        f"Invalid value {value!r} for option 'locality' of secondary tier '{tier_type}': "
        f"expected one of {choices}"
    )


def _parse_bool(tier_type: str, name: str, value: Any) -> bool:
    return OptionParser(f"secondary tier '{tier_type}'", []).boolean(name, value)


__all__ = [
    "SUPPORTED_VLLM_SERIES",
    "VLLM_VERSION",
    "KvtierFileSystemTier",
    "offloading_spec_from_vllm",
]

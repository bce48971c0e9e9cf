"""The contract between an engine and a secondary tier: keys, jobs, results, the tier ABC.

Names mirror vLLM's ``vllm.v1.kv_offload.tiering.base`` so engine developers find their way
at once. See DESIGN.md §2 and docs/tiers.md.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NewType, cast

import numpy as np

from kvtier.errors import InvalidArgumentError, InvalidTypeError
from kvtier.tiering.validation import check_block_ids, check_job_id, check_keys

if TYPE_CHECKING:
    from kvtier.tiering.spec import OffloadingSpec

# A key is raw bytes (block hash + 4-byte big-endian group index), not a tuple: millions of
# keys live in dicts and sets, and bytes cost the garbage collector nothing.
OffloadKey = NewType("OffloadKey", bytes)

# Caller-chosen job identifier; unique among the jobs of one tier not yet reported finished.
JobId = int

_GROUP_IDX_BYTES = 4


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack a block hash and a KV-cache group index into an :data:`OffloadKey`."""
    if not 0 <= group_idx < 1 << (8 * _GROUP_IDX_BYTES):
        raise InvalidArgumentError(f"group_idx must be in [0, 2**32), got {group_idx}")
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(_GROUP_IDX_BYTES, "big"))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash part of a key."""
    return bytes(key[:-_GROUP_IDX_BYTES])


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV-cache group index of a key."""
    return int.from_bytes(key[-_GROUP_IDX_BYTES:], "big")


@dataclass(frozen=True)
class ReqContext:
    """Per-request context handed to tiers with each call (opaque to most tiers)."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None


@dataclass(frozen=True)
class JobMetadata:
    """One store or load job: ``keys[i]`` goes to / comes from primary slot ``block_ids[i]``."""

    job_id: JobId
    keys: Sequence[OffloadKey]
    block_ids: np.ndarray  # int64, one primary-tier slot per key
    is_promotion: bool
    req_context: ReqContext


@dataclass(frozen=True)
class JobResult:
    """What a finished job reports, exactly once (field names as in current vLLM)."""

    job_id: JobId
    # True only if every block of the job succeeded.
    success: bool
    # For a failed load: the keys whose blocks did arrive (a subset of the job's keys).
    # None means every key shares the fate given by ``success``.
    successful_keys: Collection[OffloadKey] | None = None
    transfer_bytes: int | None = None
    transfer_time: float | None = None
    # The first error of a failed job as one line of text.
    error: str | None = None


class SecondaryTierManager(ABC):
    """A secondary tier behind the engine's CPU primary tier.

    Every method returns quickly and may be called from any thread, ``get_finished`` from
    several at once (each job reaches exactly one caller). Production tiers copy no data on
    the calling thread.

    Subclasses accept their own options as keyword arguments after ``tier_type``; the factory
    passes the keys of the tier's configuration dict (minus ``type``) as those keywords.
    """

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str,
    ) -> None:
        if not isinstance(primary_kv_view, memoryview):
            raise InvalidTypeError(
                f"primary_kv_view must be a memoryview, got {type(primary_kv_view).__name__}"
            )
        if primary_kv_view.ndim < 1 or not primary_kv_view.c_contiguous:
            raise InvalidArgumentError(
                "primary_kv_view must be a C-contiguous memoryview with at least one dimension "
                f"(got ndim={primary_kv_view.ndim}, c_contiguous={primary_kv_view.c_contiguous})"
            )
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        # Row b starts at b * strides[0]; rows are the unit of transfer whatever the format.
        # (shape and strides are tuples for every memoryview; typeshed allows None.)
        shape, strides = primary_kv_view.shape or (0,), primary_kv_view.strides or (0,)
        self._block_size_bytes: int = strides[0]
        self._num_blocks: int = shape[0]
        if self._block_size_bytes <= 0:
            raise InvalidArgumentError(
                f"primary_kv_view rows must be at least one byte, got {self._block_size_bytes}"
            )
        # A single row counts as C-contiguous whatever strides[0] says (e.g. a slice of a
        # memoryview with a step): rows must tile the view exactly, or a block would reach
        # past its end.
        if self._block_size_bytes * self._num_blocks != primary_kv_view.nbytes:
            raise InvalidArgumentError(
                "primary_kv_view must be C-contiguous with rows of strides[0] bytes: got "
                f"shape {primary_kv_view.shape}, strides {primary_kv_view.strides} "
                f"({primary_kv_view.nbytes} bytes); pass a contiguous view"
            )

    @property
    def offloading_spec(self) -> OffloadingSpec:
        return self._offloading_spec

    @property
    def block_size_bytes(self) -> int:
        """Bytes per primary-tier row (``primary_kv_view.strides[0]``)."""
        return self._block_size_bytes

    @property
    def num_blocks(self) -> int:
        """Rows in the primary tier (``primary_kv_view.shape[0]``)."""
        return self._num_blocks

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        """True: present and loadable; False: absent; None: not known yet, ask again later."""

    @abstractmethod
    def submit_store(self, job: JobMetadata) -> None:
        """Copy primary slots ``job.block_ids`` into this tier (asynchronously)."""

    @abstractmethod
    def submit_load(self, job: JobMetadata) -> None:
        """Copy this tier's blocks ``job.keys`` into primary slots ``job.block_ids``."""

    @abstractmethod
    def get_finished(self) -> list[JobResult]:
        """Every submitted job exactly once, as it finishes. Never blocks."""

    def get_finished_jobs(self) -> list[JobResult]:
        """Alias of :meth:`get_finished` (the name vLLM's tiering manager calls)."""
        return self.get_finished()

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Recency hint for eviction; optional."""
        return

    def drain_jobs(self) -> None:
        """Block until the result of every job submitted before the call is ready (jobs
        submitted meanwhile are not waited for); optional for synchronous tiers."""
        return

    def shutdown(self) -> None:
        """Stop: running operations finish, queued ones fail; idempotent."""
        return

    def _check_job(self, job: JobMetadata) -> tuple[JobId, tuple[OffloadKey, ...], list[int]]:
        """Validate a job synchronously (see :mod:`kvtier.tiering.validation`): its id, its
        keys as immutable bytes and its slots as Python ints."""
        job_id = check_job_id(job.job_id)
        keys = check_keys(job_id, job.keys)
        ids = check_block_ids(job_id, job.block_ids, len(keys), self._num_blocks)
        return job_id, cast("tuple[OffloadKey, ...]", keys), ids


__all__ = [
    "JobId",
    "JobMetadata",
    "JobResult",
    "OffloadKey",
    "ReqContext",
    "SecondaryTierManager",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]

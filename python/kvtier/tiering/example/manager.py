"""ExampleSecondaryTierManager: an in-memory reference tier, and the template for new tiers.

It keeps a real copy of every stored block and completes jobs synchronously, on the caller's
thread. That makes it a readable reference and a test double; a production tier hands the
copy to worker threads instead (see kvtier.tiering.fs.manager) and reports the job later.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection

from kvtier.errors import ConfigurationError, ShutDownError
from kvtier.tiering.base import (
    JobMetadata,
    JobResult,
    OffloadKey,
    ReqContext,
    SecondaryTierManager,
)
from kvtier.tiering.spec import OffloadingSpec

logger = logging.getLogger(__name__)


class ExampleSecondaryTierManager(SecondaryTierManager):
    """Keeps blocks in a dict ``key -> bytes``; every job finishes before submit returns."""

    def __init__(
        self,
        offloading_spec: OffloadingSpec,
        primary_kv_view: memoryview,
        tier_type: str = "example",
        custom_param: int = 0,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        # Options arrive from JSON/YAML too: validate them here, with a message that says
        # what was expected. A bad option value is bad configuration: ConfigurationError, a
        # ValueError.
        if isinstance(custom_param, bool) or not isinstance(custom_param, int):
            raise ConfigurationError(  # noqa: TRY004
                f"Option 'custom_param' of secondary tier '{tier_type}' must be an int, "
                f"got {custom_param!r}"
            )
        self.custom_param = custom_param
        # Rows are addressed as bytes whatever the element format of the view.
        self._rows = primary_kv_view.cast("B")
        self._blocks: dict[OffloadKey, bytes] = {}
        self._finished: list[JobResult] = []
        # Methods may be called from any thread.
        self._lock = threading.Lock()
        self._shut_down = False
        logger.info("Example tier created (custom_param=%d)", custom_param)

    def _row(self, block_id: int) -> memoryview:
        start = block_id * self._block_size_bytes
        return self._rows[start : start + self._block_size_bytes]

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> bool | None:
        with self._lock:
            return key in self._blocks

    def submit_store(self, job: JobMetadata) -> None:
        job_id, keys, block_ids = self._check_job(job)
        with self._lock:
            self._check_open()
            for key, block_id in zip(keys, block_ids):
                self._blocks[key] = bytes(self._row(block_id))
            self._finished.append(
                JobResult(
                    job_id,
                    True,
                    transfer_bytes=len(block_ids) * self._block_size_bytes,
                    transfer_time=0.0,
                )
            )

    def submit_load(self, job: JobMetadata) -> None:
        job_id, keys, block_ids = self._check_job(job)
        with self._lock:
            self._check_open()
            arrived: list[OffloadKey] = []
            missing: list[OffloadKey] = []
            for key, block_id in zip(keys, block_ids):
                data = self._blocks.get(key)
                if data is None:
                    missing.append(key)
                    continue
                self._row(block_id)[:] = data
                arrived.append(key)
            nbytes = len(arrived) * self._block_size_bytes
            if missing:
                error = f"{len(missing)} of {len(block_ids)} keys not present in the tier"
                logger.error("Job %s block I/O failed: %s", job_id, error)
                result = JobResult(job_id, False, arrived, nbytes, 0.0, error)
            else:
                result = JobResult(job_id, True, transfer_bytes=nbytes, transfer_time=0.0)
            self._finished.append(result)

    def get_finished(self) -> list[JobResult]:
        with self._lock:
            finished, self._finished = self._finished, []
            return finished

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        return

    def drain_jobs(self) -> None:
        # Jobs complete inside submit_*: nothing is ever in flight.
        return

    def shutdown(self) -> None:
        with self._lock:
            self._shut_down = True

    def _check_open(self) -> None:
        if self._shut_down:
            raise ShutDownError(f"Secondary tier '{self.tier_type}' is shut down; submit refused")

    def get_num_blocks_stored(self) -> int:
        with self._lock:
            return len(self._blocks)


__all__ = ["ExampleSecondaryTierManager"]

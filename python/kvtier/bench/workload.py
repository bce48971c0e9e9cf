"""The shared workload: primary memory (kvtier.bench.primary), block keys, jobs, and the
kvtier `fs` tier driver.

A *driver* adapts one secondary-tier implementation (kvtier's `fs` tier, or vLLM's in
`kvtier.bench.peer_vllm`) to the few calls the measurements make, so every measurement runs
the same code against each tier.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

# Imported here, not lazily in the middle of a run: an import interrupted by Ctrl-C can lose
# the KeyboardInterrupt (numpy.random's lazy import does), and a run must stop and clean up.
import numpy.random  # noqa: F401

from kvtier.bench.errors import BenchError

# Re-exported: every measurement takes its rows from here (the layouts: kvtier.bench.primary).
from kvtier.bench.primary import PrimaryMemory
from kvtier.tiering.base import JobMetadata, OffloadKey, ReqContext
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

#: How long the measuring thread sleeps between polls for finished jobs. Short enough not to
#: stretch a phase, long enough that polling itself costs well under 1% of a core.
POLL_INTERVAL_S = 0.001

O_DIRECT = "O_DIRECT"
FADVISE = "posix_fadvise(DONTNEED)"


@dataclass(frozen=True)
class Job:
    """One store or load job: ``keys[i]`` lives in primary row ``block_ids[i]``."""

    job_id: int
    keys: tuple[OffloadKey, ...]
    block_ids: np.ndarray


@dataclass(frozen=True)
class Finished:
    job_id: int
    success: bool
    error: str | None = None


class TierDriver(Protocol):
    """What a measurement needs from a tier; one instance per phase (fresh root)."""

    name: str
    #: How loads are kept away from the page cache: O_DIRECT or FADVISE.
    cache_bypass: str

    def submit_store(self, job: Job) -> None: ...
    def submit_load(self, job: Job) -> None: ...
    def finished(self) -> list[Finished]: ...
    def file_paths(self, keys: Sequence[bytes]) -> list[str]: ...
    def close(self) -> None: ...


#: Creates a driver for a tier rooted at the given directory over the given primary memory.
DriverFactory = Callable[[Path, "PrimaryMemory"], TierDriver]


def block_keys(prefix: bytes, start: int, count: int, group_idx: int = 0) -> list[OffloadKey]:
    """``count`` distinct keys: a 32-byte block hash (prefix + index) plus the group index."""
    hash_prefix = prefix[:24].ljust(24, b"\0")
    group = group_idx.to_bytes(4, "big")
    return [OffloadKey(hash_prefix + (start + i).to_bytes(8, "big") + group) for i in range(count)]


def make_jobs(
    first_job_id: int, keys: Sequence[OffloadKey], block_ids: Sequence[int], blocks_per_job: int
) -> list[Job]:
    """Split keys/rows into jobs of ``blocks_per_job`` blocks, with consecutive job ids."""
    jobs = []
    for n, start in enumerate(range(0, len(keys), blocks_per_job)):
        stop = start + blocks_per_job
        jobs.append(
            Job(
                job_id=first_job_id + n,
                keys=tuple(keys[start:stop]),
                block_ids=np.asarray(block_ids[start:stop], dtype=np.int64),
            )
        )
    return jobs


class JobIds:
    """Job ids unique within one driver (engines reject duplicate in-flight ids)."""

    def __init__(self) -> None:
        self._next = 1

    def take(self, n: int) -> int:
        first = self._next
        self._next += n
        return first


def wait_for(driver: TierDriver, pending: set[int], what: str) -> None:
    """Poll until every job in ``pending`` is reported; raise BenchError if any failed."""
    errors: list[str] = []
    while pending:
        results = driver.finished()
        if not results:
            time.sleep(POLL_INTERVAL_S)
            continue
        for result in results:
            pending.discard(result.job_id)
            if not result.success:
                errors.append(result.error or "the tier reported a failure (see its log)")
    if errors:
        raise_job_failures(driver, what, errors)


def raise_job_failures(driver: TierDriver, what: str, errors: list[str]) -> None:
    raise BenchError(
        f"{len(errors)} {what} job(s) failed in the {driver.name} tier; first error: {errors[0]}"
    )


def drop_from_page_cache(paths: Iterable[str]) -> None:
    """Write back and evict cached pages of these files, so the next read hits storage.

    Used when O_DIRECT is unavailable. DONTNEED only drops clean pages, hence the fsync first.
    """
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def remove_files(paths: Iterable[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


class KvtierDriver:
    """kvtier's `fs` tier, created through the public factory as an engine would."""

    name = "kvtier"

    def __init__(
        self,
        root: Path,
        primary: PrimaryMemory,
        *,
        read_threads: int,
        write_threads: int,
        max_queued_store_jobs: int,
        worker_nice: int | None = None,
        io_engine: str = "auto",
        checksum: str = "crc32c",
        io_timeout_s: float | None = None,
        max_stores_in_flight_while_loading: int | None = None,
    ):
        self._job_metadata = JobMetadata
        self._req = ReqContext(req_id="kvtier-bench")
        spec = OffloadingSpec(model_name="kvtier-bench", dtype="bfloat16")
        config = {
            "type": "fs",
            "root_dir": str(root),
            "n_read_threads": read_threads,
            "n_write_threads": write_threads,
            "o_direct": "auto",
            "max_queued_store_jobs": max_queued_store_jobs,
            "io_engine": io_engine,
            "checksum": checksum,
        }
        if worker_nice is not None:  # else the tier's default
            config["worker_nice"] = worker_nice
        if io_timeout_s is not None:  # else the tier's default
            config["io_timeout_s"] = io_timeout_s
        if max_stores_in_flight_while_loading is not None:  # else the tier's default
            config["max_stores_in_flight_while_loading"] = max_stores_in_flight_while_loading
        try:
            tier = SecondaryTierFactory.create_secondary_tier(config, primary.view, spec)
        except ValueError as exc:
            raise BenchError(f"the kvtier fs tier refused the settings: {exc}") from exc
        except OSError as exc:
            # The path would be the scratch directory, which the user never chose.
            raise BenchError(f"the kvtier fs tier cannot start on --root: {exc.strerror}") from exc
        # The factory returns the base class; the bench also reads what only the fs tier has
        # (its file names, direct I/O, the engine that runs).
        if not isinstance(tier, FileSystemTierManager):
            tier.shutdown()
            raise BenchError(
                f"the factory built a {type(tier).__name__} for type 'fs', expected "
                "FileSystemTierManager; reinstall kvtier"
            )
        self._tier = tier
        self.cache_bypass = O_DIRECT if tier.direct_io else FADVISE
        #: The engine that moves the bytes, as the tier reports it ("auto" resolved), and why
        #: "auto" fell back to psync (empty when it did not).
        self.io_engine: str = self._tier.io_engine
        self.io_engine_fallback_reason: str = self._tier.io_engine_fallback_reason

    def _meta(self, job: Job, is_promotion: bool) -> JobMetadata:
        return self._job_metadata(
            job_id=job.job_id,
            keys=list(job.keys),
            block_ids=job.block_ids,
            is_promotion=is_promotion,
            req_context=self._req,
        )

    def submit_store(self, job: Job) -> None:
        self._tier.submit_store(self._meta(job, False))

    def submit_load(self, job: Job) -> None:
        self._tier.submit_load(self._meta(job, True))

    def finished(self) -> list[Finished]:
        return [
            Finished(r.job_id, bool(r.success), getattr(r, "error", None))
            for r in self._tier.get_finished()
        ]

    def file_paths(self, keys: Sequence[bytes]) -> list[str]:
        get = self._tier.file_mapper.get_file_name
        return [str(get(k)) for k in keys]

    def close(self) -> None:
        self._tier.shutdown()


def kvtier_factory(
    read_threads: int,
    write_threads: int,
    max_queued_store_jobs: int,
    io_engine: str = "auto",
    checksum: str = "crc32c",
    io_timeout_s: float | None = None,
    max_stores_in_flight_while_loading: int | None = None,
    ran: dict[str, str] | None = None,
) -> DriverFactory:
    """Creates kvtier drivers; ``ran`` (if given) receives the engine the last one runs
    (``io_engine``) and why "auto" fell back (``fallback_reason``), as the tier reports them."""

    def create(root: Path, primary: PrimaryMemory) -> TierDriver:
        driver = KvtierDriver(
            root,
            primary,
            read_threads=read_threads,
            write_threads=write_threads,
            max_queued_store_jobs=max_queued_store_jobs,
            io_engine=io_engine,
            checksum=checksum,
            io_timeout_s=io_timeout_s,
            max_stores_in_flight_while_loading=max_stores_in_flight_while_loading,
        )
        if ran is not None:
            ran["io_engine"] = driver.io_engine
            ran["fallback_reason"] = driver.io_engine_fallback_reason
        return driver

    return create

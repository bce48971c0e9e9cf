"""Load latency: small load jobs (4 blocks) with the tier idle, then under a store flood.

An engine promotes a few blocks for a request that is waiting; a long queue of stores (the
engine offloading everything it computes) must not make that request wait for the whole
queue. The flood is the whole workload submitted as store jobs at once; load jobs are issued
one after another while it drains, each timed from submit to the poll that sees it finished.
Loads keep coming until the flood has drained (the first ``samples`` of them are timed), so
the flood's store rate is also measured while loads run: what a tier's priority for loads
costs its stores.
"""

from __future__ import annotations

import time
from typing import TypedDict

import numpy as np

from kvtier.bench.workload import (
    FADVISE,
    JobIds,
    PrimaryMemory,
    TierDriver,
    block_keys,
    drop_from_page_cache,
    make_jobs,
    raise_job_failures,
    remove_files,
    wait_for,
)
from kvtier.tiering.base import OffloadKey

BLOCKS_PER_LOAD = 4
_MAX_HOT_BLOCKS = 64
_MAX_FLOOD_ROUNDS = 10
_SPIN_S = 0.0001  # poll interval while a load is in flight (sleep releases the GIL)


class _SampleCount(TypedDict):
    n: int


class Percentiles(_SampleCount, total=False):
    """What :func:`percentiles` reports: only ``n`` (0) when there were no samples."""

    p50_ms: float
    p95_ms: float
    p99_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    samples_ms: list[float]


def percentiles(samples_s: list[float]) -> Percentiles:
    """p50/p95/p99 (and min, max, mean) in milliseconds; ``n`` = number of samples."""
    if not samples_s:
        return {"n": 0}
    ms = np.asarray(samples_s) * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return {
        "n": len(samples_s),
        "p50_ms": float(p50),
        "p95_ms": float(p95),
        "p99_ms": float(p99),
        "min_ms": float(ms.min()),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
        "samples_ms": [round(float(v), 4) for v in ms],
    }


def hot_set_size(n_blocks: int) -> int:
    """Blocks the load jobs cycle over: a multiple of 4, leaving most rows for the flood."""
    hot = min(_MAX_HOT_BLOCKS, n_blocks // 4)
    return max(BLOCKS_PER_LOAD, hot - hot % BLOCKS_PER_LOAD)


class _Sampler:
    def __init__(self, driver: TierDriver, keys: list[OffloadKey], ids: JobIds):
        self._driver = driver
        self._keys = keys
        self._ids = ids
        self._next = 0
        self.store_pending: set[int] = set()
        self.store_errors: list[str] = []

    def load_once(self) -> float:
        """Submit one 4-block load of the hot set and time it until it is reported."""
        start_row = self._next
        self._next = (self._next + BLOCKS_PER_LOAD) % len(self._keys)
        rows = list(range(start_row, start_row + BLOCKS_PER_LOAD))
        keys = [self._keys[r] for r in rows]
        if self._driver.cache_bypass == FADVISE:
            drop_from_page_cache(self._driver.file_paths(keys))
        job = make_jobs(self._ids.take(1), keys, rows, BLOCKS_PER_LOAD)[0]
        t0 = time.perf_counter()
        self._driver.submit_load(job)
        elapsed: float | None = None
        while elapsed is None:
            # Handle the whole batch: store completions popped with the load must not be lost.
            for result in self._driver.finished():
                if result.job_id == job.job_id:
                    elapsed = time.perf_counter() - t0
                    if not result.success:
                        raise_job_failures(self._driver, "load", [result.error or "failed"])
                    continue
                self.store_pending.discard(result.job_id)
                if not result.success:
                    self.store_errors.append(result.error or "failed")
            if elapsed is None:
                time.sleep(_SPIN_S)
        return elapsed


def measure_latency(
    driver: TierDriver,
    primary: PrimaryMemory,
    *,
    blocks_per_job: int,
    key_prefix: bytes,
    samples: int,
) -> dict[str, object]:
    n = primary.n_blocks
    hot = hot_set_size(n)
    ids = JobIds()
    hot_keys = block_keys(key_prefix, 0, hot)
    hot_jobs = make_jobs(ids.take(hot), hot_keys, range(hot), blocks_per_job)
    for job in hot_jobs:
        driver.submit_store(job)
    wait_for(driver, {j.job_id for j in hot_jobs}, "store")

    sampler = _Sampler(driver, hot_keys, ids)
    idle = [sampler.load_once() for _ in range(samples)]

    flood: list[float] = []
    flood_bytes = 0
    rounds = 0
    drain_s = 0.0  # from each round's first store submitted to its last store finished
    while len(flood) < samples and rounds < _MAX_FLOOD_ROUNDS:
        # Each round stores the rows outside the hot set, then removes their files, so the
        # flood can last as long as needed without filling the disk. The keys are the same
        # every round (and as in the other measurements): their directories already exist.
        rounds += 1
        round_keys = block_keys(key_prefix, hot, n - hot)
        jobs = make_jobs(ids.take(n), round_keys, range(hot, n), blocks_per_job)
        started = time.perf_counter()
        for job in jobs:
            driver.submit_store(job)
        sampler.store_pending = {j.job_id for j in jobs}
        flood_bytes += (n - hot) * primary.block_size
        # As an engine's would, loads keep coming until the round's stores have finished.
        while sampler.store_pending:
            elapsed = sampler.load_once()
            if len(flood) < samples:
                flood.append(elapsed)
        drain_s += time.perf_counter() - started
        if sampler.store_errors:
            raise_job_failures(driver, "store", sampler.store_errors)
        remove_files(driver.file_paths(round_keys))

    remove_files(driver.file_paths(hot_keys))
    idle_ms, flood_ms = percentiles(idle), percentiles(flood)
    result: dict[str, object] = {
        "blocks_per_load": BLOCKS_PER_LOAD,
        "hot_blocks": hot,
        "flood_bytes": flood_bytes,
        "flood_rounds": rounds,
        "idle": idle_ms,
        "flood": flood_ms,
    }
    if idle and flood:
        result["p95_ratio"] = flood_ms["p95_ms"] / idle_ms["p95_ms"]
    result["flood_drain_s"] = drain_s
    if flood_bytes and drain_s > 0:  # every store succeeded (a failure raised above)
        result["flood_store_gbps"] = flood_bytes / drain_s / 1e9
    return result

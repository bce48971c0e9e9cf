"""Throughput: store then load every block of the workload, GB/s and CPU seconds per GiB."""

from __future__ import annotations

import hashlib
import time

from kvtier.bench.config import GiB
from kvtier.bench.errors import BenchError
from kvtier.bench.workload import (
    FADVISE,
    JobIds,
    PrimaryMemory,
    TierDriver,
    block_keys,
    drop_from_page_cache,
    make_jobs,
    remove_files,
    wait_for,
)

#: Rows whose bytes are checked after the load (first, middle, last): a wrong answer is a bug.
_VERIFY_ROWS = 3


def measure_throughput(
    driver: TierDriver, primary: PrimaryMemory, *, blocks_per_job: int, key_prefix: bytes
) -> dict:
    """Store all rows of ``primary`` into the tier, then load them back into the same rows.

    The store runs twice. The first pass goes into a fresh root, so it also creates the
    tier's hashed directory tree (a one-time cost of a new cache directory); its files are then
    removed, directories kept, and the second pass measures stores in steady state, which is
    what ``store_gbps`` reports (``first_store_gbps`` keeps the first pass).

    The load runs twice too, for the same reason: the first pass is the first load each of
    the tier's threads makes, with whatever a tier sets up on first use (kvtier's workers
    allocate the buffer a load under a deadline is read into, once per worker: huge pages
    the kernel zeroes), a one-time cost of a new tier. ``load_gbps`` reports the second
    pass, ``first_load_gbps`` keeps the first. Both passes are checked byte for byte.

    CPU time is the whole process's (every thread: the tier's workers and this one, which
    sleeps between polls), so it is what the tier costs the engine's host.
    """
    n = primary.n_blocks
    moved = n * primary.block_size
    keys = block_keys(key_prefix, 0, n)
    ids = JobIds()

    def store_pass() -> tuple[float, float]:
        stores = make_jobs(ids.take(n), keys, range(n), blocks_per_job)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for job in stores:
            driver.submit_store(job)
        wait_for(driver, {j.job_id for j in stores}, "store")
        return time.perf_counter() - t0, time.process_time() - cpu0

    first_s, first_cpu = store_pass()
    remove_files(driver.file_paths(keys))
    store_s, store_cpu = store_pass()

    rows = sorted({0, n // 2, n - 1})[:_VERIFY_ROWS]
    expected = {r: hashlib.blake2b(primary.array[r].tobytes()).digest() for r in rows}

    def load_pass() -> tuple[float, float, int]:
        if driver.cache_bypass == FADVISE:  # the first pass's reads cached them too
            drop_from_page_cache(driver.file_paths(keys))
        for r in rows:
            primary.array[r].fill(0)
        loads = make_jobs(ids.take(n), keys, range(n), blocks_per_job)
        cpu0, t0 = time.process_time(), time.perf_counter()
        for job in loads:
            driver.submit_load(job)
        wait_for(driver, {j.job_id for j in loads}, "load")
        took, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        for r in rows:
            if hashlib.blake2b(primary.array[r].tobytes()).digest() != expected[r]:
                raise BenchError(
                    f"the {driver.name} tier loaded different bytes than it stored (row {r}); "
                    "this is a bug, please report it"
                )
        return took, cpu, len(loads)

    first_load_s, first_load_cpu, _ = load_pass()
    load_s, load_cpu, load_jobs = load_pass()

    remove_files(driver.file_paths(keys))  # directories stay for the next measurement
    gib = moved / GiB
    return {
        "bytes": moved,
        "blocks": n,
        "jobs_per_direction": load_jobs,
        "store_seconds": store_s,
        "load_seconds": load_s,
        "store_gbps": moved / store_s / 1e9,
        "load_gbps": moved / load_s / 1e9,
        "store_cpu_s_per_gib": store_cpu / gib,
        "load_cpu_s_per_gib": load_cpu / gib,
        "first_store_gbps": moved / first_s / 1e9,
        "first_store_cpu_s_per_gib": first_cpu / gib,
        "first_load_gbps": moved / first_load_s / 1e9,
        "first_load_cpu_s_per_gib": first_load_cpu / gib,
        "cache_bypass": driver.cache_bypass,
    }

"""Scheduler interference: how fast a pure-Python loop runs while the tier streams stores.

An engine's scheduler is a Python loop on the main thread. A tier whose workers hold the GIL
(pure-Python I/O threads) or burn the CPUs slows it down; a native tier that releases the GIL
should not. The loop below stands in for the scheduler: pure-Python arithmetic, and a poll of
the tier for finished jobs every millisecond, as a scheduler step would.
"""

from __future__ import annotations

import time

from kvtier.bench.workload import (
    POLL_INTERVAL_S,
    JobIds,
    PrimaryMemory,
    TierDriver,
    block_keys,
    make_jobs,
    raise_job_failures,
    remove_files,
)

_CHUNK = 200  # loop iterations between clock reads


def _python_loop(
    driver: TierDriver, seconds: float, pending: set[int] | None
) -> tuple[int, float, list[str]]:
    """Spin for ``seconds``, or (``pending`` given) until those jobs are all reported."""
    iterations = 0
    x = 1
    errors: list[str] = []
    start = time.perf_counter()
    next_poll = start + POLL_INTERVAL_S
    while True:
        for _ in range(_CHUNK):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        iterations += _CHUNK
        now = time.perf_counter()
        if now >= next_poll:
            for result in driver.finished():
                if pending is not None:
                    pending.discard(result.job_id)
                if not result.success:
                    errors.append(result.error or "the tier reported a failure")
            next_poll = now + POLL_INTERVAL_S
            if pending is not None and not pending:
                break
        if pending is None and now - start >= seconds:
            break
    return iterations, now - start, errors


def measure_interference(
    driver: TierDriver,
    primary: PrimaryMemory,
    *,
    blocks_per_job: int,
    key_prefix: bytes,
    idle_seconds: float,
) -> dict:
    """Loop rate idle (before and after) and while every row of ``primary`` is stored."""
    n = primary.n_blocks
    it_before, s_before, _ = _python_loop(driver, idle_seconds, None)

    keys = block_keys(key_prefix, 0, n)
    jobs = make_jobs(JobIds().take(n), keys, range(n), blocks_per_job)
    # The busy window opens before the submits: submitting is the scheduler thread's work
    # too, and on a small host the workers start (and take the CPUs) while it submits.
    t0 = time.perf_counter()
    for job in jobs:
        driver.submit_store(job)
    submit_s = time.perf_counter() - t0
    it_busy, s_loop, errors = _python_loop(driver, 0.0, {j.job_id for j in jobs})
    if errors:
        raise_job_failures(driver, "store", errors)
    s_busy = submit_s + s_loop

    it_after, s_after, _ = _python_loop(driver, idle_seconds, None)
    remove_files(driver.file_paths(keys))
    idle_rate = (it_before + it_after) / (s_before + s_after)
    busy_rate = it_busy / s_busy
    return {
        "idle_iter_per_s": idle_rate,
        "busy_iter_per_s": busy_rate,
        "busy_seconds": s_busy,
        "submit_seconds": submit_s,
        "ratio": busy_rate / idle_rate,
    }

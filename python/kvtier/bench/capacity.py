"""What a byte budget costs (`kvtier bench --max-bytes`): stores into a full cache next to the
same stores without a budget, the CPU of eviction, the caller's ``submit_store`` latency, and
recency bookkeeping on load latency.

Steady state: before the measured part the cache is filled to its budget and the evictor has
brought it under its high watermark; then ``2 x max_bytes`` of new blocks are stored (at most
``inflight`` jobs in flight), so every store makes room. A store refused for lack of budget
(ENOSPC, the designed back-pressure) is offered again 1 ms later, as an engine offers new
blocks; GB/s counts stored bytes only. The run without a budget stores ``max_bytes`` first
too, untimed, and keeps it: its tier is as warm (workers started, buffers allocated, the
namespace's first directory level made) and its root holds as many files when the timing
starts. Then it stores the same new blocks, and the two alternate run by run. Eviction CPU
is the thread CPU time of the tier's eviction passes (scans, ledger, unlinks) per GiB
evicted. Both runs set ``min_free_fraction=0``, so a nearly full file system does not turn
the unbudgeted run into a budgeted one.

Submit: the caller's time in ``submit_store`` alone (the stores run on the tier's workers),
with a full budget (every store makes room) against the same stores without one, alternating
run by run: p50 and p99 over every call of each kind (``submit_cost``).

Recency: one-block loads, one at a time, alternating between the tier as shipped and the same
tier with its use bookkeeping switched off.

bench/capacity_bench.py runs the same measurements from the command line, plus eviction on
its own and a root of a million files.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from kvtier.bench.config import TIER_OPTION_FLAGS, BenchConfig, GiB, MiB
from kvtier.bench.errors import BenchError
from kvtier.bench.primary import PrimaryMemory
from kvtier.bench.progress import Progress
from kvtier.tiering.base import JobMetadata, OffloadKey, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes, format_size
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="kvtier-bench/capacity", dtype="float16")
_CTX = ReqContext("kvtier-bench")
JOB_BLOCKS = 8
INFLIGHT_JOBS = 8
#: Rows of primary memory the stores cycle through (block contents do not matter).
_ROWS = 64
#: The issue's targets: full-cache stores at >= 0.9x, submit_store p99 with a budget at most
#: 1.2x without, recency adding <= 5% to load p50.
STORE_RATIO_TARGET = 0.9
SUBMIT_P99_TARGET = 1.2
RECENCY_P50_TARGET = 1.05
_RETRY_SECONDS = 0.001
_SETTLE_TIMEOUT_S = 120.0


def _key(i: int) -> OffloadKey:
    return make_offload_key(i.to_bytes(32, "big"), 0)


@dataclass(frozen=True)
class TierSettings:
    """What `kvtier bench` asks of its tiers that the capacity runs honour too: the fs tier's
    options (``io_engine``, ``checksum``, ``io_timeout_s``,
    ``max_stores_in_flight_while_loading``) and the primary memory's layout (``--primary``).
    The default is the tier's defaults over plain memory (bench/capacity_bench.py)."""

    options: Mapping[str, object] = field(default_factory=dict)
    primary: str = "plain"

    @classmethod
    def of(cls, config: BenchConfig) -> TierSettings:
        options: dict[str, object] = {"io_engine": config.io_engine, "checksum": config.checksum}
        for name in TIER_OPTION_FLAGS:
            if getattr(config, name) is not None:  # else the tier's default
                options[name] = getattr(config, name)
        return cls(options, config.primary)


@contextlib.contextmanager
def _tier(
    root: Path, rows: int, row: int, settings: TierSettings, **options: object
) -> Iterator[FileSystemTierManager]:
    """A fs tier on ``root`` over ``rows`` rows of ``row`` bytes of primary memory laid out
    as ``settings`` say, with their options and ``options``; shut down on the way out."""
    primary = PrimaryMemory(rows, row, settings.primary)
    try:
        primary.fill(seed=row)
        tier = FileSystemTierManager(
            SPEC, primary.view, "fs", root_dir=str(root), **settings.options, **options
        )
        try:
            yield tier
        finally:
            tier.shutdown()
    finally:
        primary.close()


@contextlib.contextmanager
def _quiet_refusals() -> Iterator[None]:
    """Refused stores are expected here and counted in the results: do not log each one."""
    log = logging.getLogger("kvtier.tiering.fs.manager")
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _collect(tier: FileSystemTierManager, sizes: dict[int, int]) -> tuple[int, int]:
    """Failed jobs and bytes of succeeded ones, among the jobs finished so far."""
    failed = stored = 0
    for r in tier.get_finished():
        nbytes = sizes.pop(r.job_id)
        if r.success:
            stored += nbytes
        else:
            failed += 1
    return failed, stored


def _store_before(tier: FileSystemTierManager, row: int, nbytes: int, first: int) -> None:
    """Store ``nbytes`` worth of blocks (keys below ``first``), INFLIGHT_JOBS jobs at a time
    (more at once would overrun the tier's store queue, which drops what does not fit), and
    wait for them; BenchError if any failed (the run would not start from the cache it
    measures)."""
    fill = nbytes // block_file_bytes(row)
    failed: list[str] = []
    for j in range(0, fill, JOB_BLOCKS):
        keys = [_key(first - 1 - i) for i in range(j, min(fill, j + JOB_BLOCKS))]
        ids = np.arange(len(keys), dtype=np.int64) % _ROWS
        tier.submit_store(JobMetadata(j, keys, ids, False, _CTX))
        if j // JOB_BLOCKS % INFLIGHT_JOBS == INFLIGHT_JOBS - 1:
            tier.drain_jobs()
            failed += [str(r.error) for r in tier.get_finished() if not r.success]
    tier.drain_jobs()
    failed += [str(r.error) for r in tier.get_finished() if not r.success]
    if failed:
        raise BenchError(
            f"storing the blocks a capacity run starts from failed ({len(failed)} jobs): "
            f"{failed[0]}"
        )


def _fill(tier: FileSystemTierManager, row: int, budget: int, first: int) -> None:
    """Store the budget's worth of blocks, then wait until the evictor has brought the cache
    under its high watermark: a cache that has been full for a while."""
    _store_before(tier, row, budget, first)
    high = tier._capacity.policy.high_bytes or 0  # bench only: the tier's own watermark
    deadline = time.monotonic() + _SETTLE_TIMEOUT_S
    while tier.stats()["used_bytes"] > high:
        if time.monotonic() > deadline:
            raise BenchError(f"the cache did not come under {format_size(high)} in time")
        time.sleep(0.05)


def _make_leaf_dirs(rank_dir: Path) -> None:
    for a in range(256):
        for b in range(256):
            (rank_dir / f"{a:02x}" / f"{b:02x}").mkdir(parents=True, exist_ok=True)


def store_run(
    root: Path,
    row: int,
    total: int,
    budget: int | None,
    first: int,
    *,
    inflight: int = INFLIGHT_JOBS,
    threads: tuple[int, int] = (16, 16),
    leaf_dirs: bool = False,
    settings: TierSettings = TierSettings(),
    before: int = 0,
) -> dict:
    """Store ``total`` bytes of new ``row``-byte blocks into a tier on ``root``; with a
    ``budget``, into a cache filled to it first; without one, after ``before`` bytes stored
    untimed (keys below ``first``) and kept, so that the tier is as warm as a budgeted one.
    Keys start at ``first``. With ``leaf_dirs``, the namespace's 65,536 leaf directories
    (docs/FORMAT.md) are made first, as a cache that has run a while has them: every walk of
    the root passes them."""
    with _tier(
        root,
        _ROWS,
        row,
        settings,
        max_bytes=budget,
        min_free_fraction=0,
        n_read_threads=threads[0],
        n_write_threads=threads[1],
        max_queued_store_jobs=max(1024, 2 * inflight),
    ) as tier:
        if leaf_dirs:
            _make_leaf_dirs(Path(tier.file_mapper.rank_dir))
        if budget is not None:
            _fill(tier, row, budget, first)
        else:
            _store_before(tier, row, before, first)
        capacity = tier._capacity  # bench only: the CPU its eviction passes took
        at_start = tier.stats()
        evicted0, evict_cpu0 = at_start["evicted_bytes"], capacity.eviction_cpu_seconds
        cpu0, t0 = time.process_time(), time.perf_counter()
        sizes: dict[int, int] = {}
        failed = stored = j = 0
        n_blocks = total // row
        # Until `total` bytes are stored: a refused store is a job the engine offers again
        # later (new blocks keep coming), so the run measures how fast the cache takes them.
        while stored + sum(sizes.values()) < n_blocks * row:
            keys = [_key(first + i) for i in range(j, j + JOB_BLOCKS)]
            j += JOB_BLOCKS
            ids = np.arange(len(keys), dtype=np.int64) % _ROWS
            sizes[j] = len(keys) * row
            tier.submit_store(JobMetadata(j, keys, ids, False, _CTX))
            if len(sizes) >= inflight:  # an engine's stores in flight are bounded too
                tier.drain_jobs()
                f, b = _collect(tier, sizes)
                failed, stored = failed + f, stored + b
                if f:
                    time.sleep(_RETRY_SECONDS)
        tier.drain_jobs()
        f, b = _collect(tier, sizes)
        failed, stored = failed + f, stored + b
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        # The last stores' room is made on the capacity thread: count that eviction too.
        if not capacity.wait_idle(_SETTLE_TIMEOUT_S):
            raise BenchError("the evictor did not finish its pass in time")
        stats = tier.stats()
        evicted = stats["evicted_bytes"] - evicted0
        evict_cpu = capacity.eviction_cpu_seconds - evict_cpu0
        return {
            "gbps": stored / wall / 1e9,
            "cpu_s_per_gib": cpu / (stored / GiB),
            "refused_jobs": failed,
            "evicted_bytes": evicted,
            "eviction_cpu_s": evict_cpu,
            "eviction_cpu_s_per_gib": evict_cpu / (evicted / GiB) if evicted else None,
            # Evicted files the stores overwrote instead of new ones (docs/tiers.md).
            "recycled_blocks": stats["recycled_blocks"] - at_start["recycled_blocks"],
            "stored_blocks": stored // row,
            "used_bytes": stats["used_bytes"],
            "tier": _ran(tier),
        }


def _ran(tier: FileSystemTierManager) -> dict:
    """The settings a tier ran with, as it reports them ("auto" resolved)."""
    opts = tier.options
    return {
        "io_engine": tier.io_engine,
        "checksum": opts.checksum,
        "io_timeout_s": opts.io_timeout_s,
        "max_stores_in_flight_while_loading": opts.max_stores_in_flight_while_loading,
    }


def steady(
    root: Path,
    rows: tuple[int, ...],
    budget: int,
    total: int,
    repeat: int,
    *,
    threads: tuple[int, int] = (16, 16),
    inflight: int = INFLIGHT_JOBS,
    leaf_dirs: bool = False,
    settings: TierSettings = TierSettings(),
    on_run: Callable[[str], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> dict:
    """Full cache next to no budget, per block size, ``repeat`` pairs of runs alternating
    (which goes first alternates too). The ratio is the median of the pairs' ratios. The run
    without a budget stores ``budget`` bytes first, untimed (store_run's ``before``): its root
    holds ``budget + total``. ``leaf_dirs``: as store_run, for both runs of each pair."""
    out: dict = {}
    for row in rows:
        runs: dict[str, list[dict]] = {"no_budget": [], "full_cache": []}
        for rep in range(repeat):
            order = [("no_budget", None), ("full_cache", budget)]
            for name, limit in order if rep % 2 == 0 else reversed(order):
                if on_run is not None:
                    on_run(f"{format_size(row)} {name.replace('_', ' ')} (run {rep + 1}/{repeat})")
                directory = root / f"capacity-{row}-{rep}-{name}"
                directory.mkdir()
                try:
                    with _quiet_refusals():
                        runs[name].append(
                            store_run(
                                directory,
                                row,
                                total,
                                limit,
                                10**9 * (rep + 1),
                                inflight=inflight,
                                threads=threads,
                                leaf_dirs=leaf_dirs,
                                settings=settings,
                                before=budget,
                            )
                        )
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                if on_done is not None:
                    on_done()
        pairs = [b["gbps"] / a["gbps"] for a, b in zip(runs["no_budget"], runs["full_cache"])]
        evicted = sum(r["evicted_bytes"] for r in runs["full_cache"])
        evict_cpu = sum(r["eviction_cpu_s"] for r in runs["full_cache"])
        out[str(row)] = {
            "block_size": row,
            "label": format_size(row),
            "threads": list(threads),
            "store_gbps_no_budget": statistics.median(r["gbps"] for r in runs["no_budget"]),
            "store_gbps_full_cache": statistics.median(r["gbps"] for r in runs["full_cache"]),
            "ratio": statistics.median(pairs),
            "ratio_spread": [min(pairs), max(pairs)],
            "store_cpu_s_per_gib_no_budget": statistics.median(
                r["cpu_s_per_gib"] for r in runs["no_budget"]
            ),
            "store_cpu_s_per_gib_full_cache": statistics.median(
                r["cpu_s_per_gib"] for r in runs["full_cache"]
            ),
            "eviction_cpu_s_per_gib": evict_cpu / (evicted / GiB) if evicted else None,
            "evicted_bytes_per_run": evicted // repeat,
            "recycled_share": sum(r["recycled_blocks"] for r in runs["full_cache"])
            / max(1, sum(r["stored_blocks"] for r in runs["full_cache"])),
            "refused_jobs": [r["refused_jobs"] for r in runs["full_cache"]],
            "runs": runs,
        }
    return out


def submit_latencies(
    root: Path,
    row: int,
    jobs: int,
    budget: int | None,
    *,
    blocks_per_job: int,
    inflight: int,
    threads: tuple[int, int] | None = None,
    first: int = 10**9,
    before: int = 0,
    settings: TierSettings = TierSettings(),
) -> dict:
    """``seconds`` of each of ``jobs`` ``submit_store()`` calls (the caller's thread only) of
    ``blocks_per_job`` new ``row``-byte blocks, at most ``inflight`` jobs in flight; the store
    jobs that ``failed``; the bytes the tier ``evicted`` while they ran. With a ``budget`` the
    cache is filled to it first, so every store makes room; without one, ``before`` bytes are
    stored first (keys below ``first``, the timed blocks' from it on). A failed store is timed
    like any other (its submit returned before anyone knew), and counted. ``threads``: the
    tier's read and write threads (None: the tier's own default)."""
    slots = max(_ROWS, blocks_per_job)
    seconds: list[float] = []
    failed = pending = 0
    workers = (
        {} if threads is None else {"n_read_threads": threads[0], "n_write_threads": threads[1]}
    )
    with _tier(
        root,
        slots,
        row,
        settings,
        max_bytes=budget,
        min_free_fraction=0,
        max_queued_store_jobs=max(1024, 4 * inflight),
        **workers,
    ) as tier:

        def collect() -> None:
            nonlocal failed, pending
            for r in tier.get_finished():
                pending -= 1
                failed += not r.success

        # Both kinds of run store ``before`` bytes first, untimed: the budget's runs to fill
        # the cache, the others so that their tier is as warm (its workers started, their
        # buffers allocated) and their root holds as many files.
        if budget is not None:
            _fill(tier, row, budget, first)
        else:
            _store_before(tier, row, before, first)
        evicted = tier.stats()["evicted_bytes"]
        for j in range(jobs):
            while pending >= inflight:
                collect()
                time.sleep(0.0001)
            start = first + j * blocks_per_job  # a block hash of its own for every block
            keys = [_key(start + b) for b in range(blocks_per_job)]
            ids = np.arange(start, start + blocks_per_job, dtype=np.int64) % slots
            job = JobMetadata(j, keys, ids, False, _CTX)
            began = time.perf_counter()
            tier.submit_store(job)
            seconds.append(time.perf_counter() - began)
            pending += 1
        tier.drain_jobs()
        collect()
        # The last stores' room is made on the capacity thread: count that eviction too.
        if not tier._capacity.wait_idle(_SETTLE_TIMEOUT_S):  # bench only
            raise BenchError("the evictor did not finish its pass in time")
        evicted = tier.stats()["evicted_bytes"] - evicted
    return {"seconds": seconds, "failed": failed, "evicted": evicted}


def submit_cost(
    root: Path,
    row: int,
    budget: int,
    jobs: int,
    repeat: int,
    *,
    blocks_per_job: int,
    inflight: int,
    threads: tuple[int, int] | None = None,
    settings: TierSettings = TierSettings(),
    on_run: Callable[[str], None] | None = None,
    on_done: Callable[[], None] | None = None,
) -> dict:
    """``submit_store()`` latency with a full budget against the same stores without one,
    ``repeat`` pairs of runs alternating (which goes first alternates too), each run in a
    fresh directory below ``root`` on a tier that stored ``budget`` bytes first (the run
    without a budget keeps them: it needs room for ``budget`` + the jobs' bytes). p50 and
    p99 are taken over every call of a kind, and the target's ratio is that of the two p99s;
    ``p99_ratio_spread`` is the range of the pairs' own ratios."""
    calls: dict[str, list[float]] = {"budget": [], "none": []}
    pairs: list[dict[str, float]] = []
    failed = {"budget": 0, "none": 0}
    evicted = {"budget": 0, "none": 0}
    for rep in range(repeat):
        order = [("budget", budget), ("none", None)]
        pair: dict[str, float] = {}
        for name, limit in order if rep % 2 == 0 else reversed(order):
            if on_run is not None:
                label = "full cache" if limit is not None else "no budget"
                on_run(f"submit_store latency, {label} (run {rep + 1}/{repeat})")
            directory = root / f"capacity-submit-{rep}-{name}"
            directory.mkdir()
            try:
                with _quiet_refusals():
                    run = submit_latencies(
                        directory,
                        row,
                        jobs,
                        limit,
                        blocks_per_job=blocks_per_job,
                        inflight=inflight,
                        threads=threads,
                        first=10**9 * (rep + 1),
                        before=budget,
                        settings=settings,
                    )
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            calls[name] += run["seconds"]
            failed[name] += run["failed"]
            evicted[name] += run["evicted"]
            pair[name] = float(np.quantile(run["seconds"], 0.99))
            if on_done is not None:
                on_done()
        pairs.append(pair)
    out: dict = {}
    for name, seconds in calls.items():
        p50, p99 = np.quantile(np.array(seconds), [0.5, 0.99])
        out[name] = {"p50_us": round(p50 * 1e6, 1), "p99_us": round(p99 * 1e6, 1)}
    ratios = [p["budget"] / p["none"] for p in pairs]
    out.update(
        {
            "p99_ratio": round(out["budget"]["p99_us"] / out["none"]["p99_us"], 2),
            "p99_ratio_spread": [round(min(ratios), 2), round(max(ratios), 2)],
            "budget_bytes": budget,
            "block_size": row,
            "blocks_per_job": blocks_per_job,
            "inflight_jobs": inflight,
            "submits_each": len(calls["none"]),
            "failed_jobs": failed,
            "evicted_bytes": evicted,
        }
    )
    return out


def recency_cost(
    root: Path, samples: int, repeat: int, settings: TierSettings = TierSettings()
) -> dict:
    """p50 of one-block (256 KiB) loads with the tier's recency bookkeeping, and with it
    switched off (the same tier, ``record_use`` replaced by a no-op), ``samples`` loads each
    per repetition, alternating."""
    row, n = 256 << 10, 256
    directory = root / "capacity-recency"
    directory.mkdir()
    lat: dict[str, list[float]] = {"on": [], "off": []}
    try:
        with _tier(directory, JOB_BLOCKS, row, settings) as tier:
            for j in range(0, n, JOB_BLOCKS):
                keys = [_key(i) for i in range(j, j + JOB_BLOCKS)]
                ids = np.arange(JOB_BLOCKS, dtype=np.int64)
                tier.submit_store(JobMetadata(j, keys, ids, False, _CTX))
            tier.drain_jobs()
            tier.get_finished()
            capacity = tier._capacity  # bench only: switch the bookkeeping off for a baseline
            real = capacity.record_use
            job_id = 10**6
            try:
                for rep in range(repeat):
                    for name in ("off", "on") if rep % 2 == 0 else ("on", "off"):
                        # The swap is the point: the same tier with its recency bookkeeping off.
                        capacity.record_use = real if name == "on" else _no_use  # type: ignore[method-assign]
                        for s in range(samples):
                            job_id += 1
                            slot = np.array([s % JOB_BLOCKS], dtype=np.int64)
                            job = JobMetadata(job_id, [_key(s % n)], slot, True, _CTX)
                            t0 = time.perf_counter()
                            tier.submit_load(job)
                            while not tier.get_finished():
                                pass
                            lat[name].append(time.perf_counter() - t0)
            finally:
                capacity.record_use = real  # type: ignore[method-assign]
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    p50 = {k: statistics.median(v) * 1e6 for k, v in lat.items()}
    return {
        "load_p50_us_recency_off": p50["off"],
        "load_p50_us_recency_on": p50["on"],
        "ratio": p50["on"] / p50["off"],
        "samples_each": len(lat["off"]),
        "block_size": row,
    }


def _no_use(paths: list[str]) -> None:
    return None


#: Room left on the file system beyond the unbudgeted run's files.
_SPACE_MARGIN = 64 * MiB
#: What each steady run stores while it is timed, in budgets.
_STEADY_STORED_BUDGETS = 2
#: What the unbudgeted steady run's root holds at its end, in budgets: the budget stored
#: before the timing and what it stores timed.
_UNBUDGETED_HOLDS = 1 + _STEADY_STORED_BUDGETS


def check_settings(config: BenchConfig) -> None:
    """Refuse what the capacity runs cannot honour: they measure one tier, so they cannot run
    psync and io_uring side by side; and a budget must hold two of their store jobs of the
    largest block size (a full cache makes room for one while the other waits: a job larger
    than the whole budget is refused every time it is offered)."""
    assert config.max_bytes is not None
    if config.compare_io_engines:
        raise BenchError(
            "--max-bytes measures one tier and cannot compare io_engines: drop "
            "--compare-io-engines, or give --io-engine psync|io_uring|auto for both sections"
        )
    largest = max(config.block_sizes)
    job = JOB_BLOCKS * block_file_bytes(largest)
    if config.max_bytes < 2 * job:
        raise BenchError(
            f"--max-bytes {format_size(config.max_bytes)} is too small for the capacity runs' "
            f"store jobs of {JOB_BLOCKS} blocks of {format_size(largest)} "
            f"({format_size(job)} each, with their headers): give at least {format_size(2 * job)}"
        )


def check_room(config: BenchConfig, free_bytes: int) -> None:
    """Refuse a --max-bytes the root cannot hold three times over (the unbudgeted steady run
    keeps all it stores: max_bytes before the timing, then 2 x max_bytes, in files that each
    add a header)."""
    assert config.max_bytes is not None
    per_payload = max(block_file_bytes(row) / row for row in config.block_sizes)
    need = int(_UNBUDGETED_HOLDS * config.max_bytes * per_payload) + _SPACE_MARGIN
    if need > free_bytes:
        raise BenchError(
            f"--max-bytes {format_size(config.max_bytes)} needs {format_size(need)} free on "
            f"the root file system (the run without a budget stores three times the budget), "
            f"{format_size(free_bytes)} are free; choose a smaller --max-bytes"
        )


def run_capacity(config: BenchConfig, scratch: Path, stream: TextIO | None = None) -> dict:
    """The capacity section of `kvtier bench --max-bytes`: steady state, the caller's
    ``submit_store`` latency, then recency."""
    assert config.max_bytes is not None
    budget, repeat, rows = config.max_bytes, config.repeat, config.block_sizes
    submit_row, submit_blocks, submit_jobs = submit_plan(config)
    settings = TierSettings.of(config)
    progress = Progress(
        2 * len(rows) * repeat + 2 * repeat + 1,
        enabled=config.progress,
        stream=stream if stream is not None else sys.stderr,
    )
    threads = (config.read_threads, config.write_threads)
    try:
        steady_results = steady(
            scratch,
            rows,
            budget,
            _STEADY_STORED_BUDGETS * budget,
            repeat,
            threads=threads,
            settings=settings,
            on_run=lambda label: progress.step(f"capacity: {label}"),
            on_done=progress.advance,
        )
        submit = submit_cost(
            scratch,
            submit_row,
            budget,
            submit_jobs,
            repeat,
            blocks_per_job=submit_blocks,
            inflight=INFLIGHT_JOBS,
            threads=threads,
            settings=settings,
            on_run=lambda label: progress.step(f"capacity: {label}"),
            on_done=progress.advance,
        )
        progress.step("capacity: recency bookkeeping on load latency")
        # Single loads are quick: ten times the latency phase's samples, as many each way.
        samples = max(1, 10 * config.latency_samples // repeat)
        recency = recency_cost(scratch, samples, repeat, settings)
        progress.advance()
    finally:
        progress.close()
    first_run = next(iter(steady_results.values()))["runs"]["full_cache"][0]
    return {
        "max_bytes": budget,
        "tier": {**first_run["tier"], "primary": settings.primary},
        "stored_bytes_per_run": _STEADY_STORED_BUDGETS * budget,
        "inflight_jobs": INFLIGHT_JOBS,
        "blocks_per_job": JOB_BLOCKS,
        "steady": steady_results,
        "submit": submit,
        "recency": recency,
    }


def submit_plan(config: BenchConfig) -> tuple[int, int, int]:
    """The block size, blocks per job and number of jobs of each ``submit_store`` latency
    run: the smallest block size, the bench's ``--blocks-per-job`` (fewer where two jobs
    would not fit the budget, so a full cache can make room for one while the other waits),
    and jobs for ``max_bytes``: with the ``max_bytes`` stored before them, the run without a
    budget holds ``2 x max_bytes`` of files, within what check_room asks for (the steady
    run without one holds three)."""
    assert config.max_bytes is not None
    row = min(config.block_sizes)
    per_block = block_file_bytes(row)
    blocks = max(1, min(config.blocks_per_job, config.max_bytes // 2 // per_block))
    return row, blocks, max(1, config.max_bytes // (blocks * per_block))


def _f(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def render_capacity(
    capacity: dict, table: Callable[[list[str], list[list[str]]], str]
) -> list[str]:
    """The report's lines for a capacity section (also from a saved --json result), its
    table drawn by ``table(header, rows)``."""
    lines = [
        f"Capacity: a full cache (max_bytes {format_size(capacity['max_bytes'])}; each run "
        f"stores {format_size(capacity['stored_bytes_per_run'])} of new blocks, every store "
        "makes room) next to no budget",
    ]
    tier = capacity.get("tier")  # absent from results saved before it was recorded
    if tier is not None:
        lines.append(
            f"  tiers: io_engine {tier['io_engine']}, checksum {tier['checksum']}, io_timeout_s "
            f"{tier['io_timeout_s']:g}, max_stores_in_flight_while_loading "
            f"{tier['max_stores_in_flight_while_loading']}, primary memory {tier['primary']}"
        )
    header = [
        "block",
        "no budget GB/s",
        "full cache GB/s",
        "ratio",
        "eviction CPU s/GiB",
        "stores recycled",
    ]
    rows = []
    for entry in capacity["steady"].values():
        low, high = entry["ratio_spread"]
        rows.append(
            [
                entry["label"],
                _f(entry["store_gbps_no_budget"], "{:.2f}"),
                _f(entry["store_gbps_full_cache"], "{:.2f}"),
                f"{entry['ratio']:.2f} ({low:.2f}-{high:.2f})",
                _f(entry["eviction_cpu_s_per_gib"], "{:.3f}"),
                # Absent from results saved before recycling existed.
                _f(entry.get("recycled_share"), "{:.0%}"),
            ]
        )
    lines.append(table(header, rows))
    refused = {e["label"]: e["refused_jobs"] for e in capacity["steady"].values()}
    if any(sum(v) for v in refused.values()):
        lines.append(
            "  store jobs refused for lack of room (ENOSPC, offered again 1 ms later), per run: "
            + "; ".join(f"{k}: {v}" for k, v in refused.items())
        )
    submit = capacity.get("submit")  # absent from results saved before it was measured
    if submit is not None:
        lines.append(render_submit(submit))
    rec = capacity["recency"]
    lines.append(
        f"  recency bookkeeping on one-block load p50: {rec['load_p50_us_recency_on']:.0f} us "
        f"with, {rec['load_p50_us_recency_off']:.0f} us without ({rec['ratio']:.2f}x, "
        f"{rec['samples_each']} loads each)"
    )
    missed = [e["label"] for e in capacity["steady"].values() if e["ratio"] < STORE_RATIO_TARGET]
    target = f"  target: full cache >= {STORE_RATIO_TARGET}x, "
    if submit is not None:
        target += f"submit_store p99 <= {SUBMIT_P99_TARGET}x, "
        if submit["p99_ratio"] > SUBMIT_P99_TARGET:
            missed.append("submit_store p99")
    target += f"recency <= {RECENCY_P50_TARGET}x: "
    if rec["ratio"] > RECENCY_P50_TARGET:
        missed.append("recency")
    lines.append(target + ("met" if not missed else "missed (" + ", ".join(missed) + ")"))
    return lines


def render_submit(submit: dict) -> str:
    """The report's line for submit_cost()'s result."""
    low, high = submit["p99_ratio_spread"]
    failed = sum(submit["failed_jobs"].values())
    return (
        f"  submit_store on the caller's thread, full cache / no budget: p99 "
        f"{submit['budget']['p99_us']:.0f} / {submit['none']['p99_us']:.0f} us "
        f"({submit['p99_ratio']:.2f}x; runs {low:.2f}-{high:.2f}x), p50 "
        f"{submit['budget']['p50_us']:.0f} / {submit['none']['p50_us']:.0f} us "
        f"({submit['submits_each']} calls each, {submit['blocks_per_job']} blocks of "
        f"{format_size(submit['block_size'])} per job, {submit['inflight_jobs']} jobs in flight"
        + (f"; {failed} store jobs failed" if failed else "")
        + ")"
    )


__all__ = [
    "TierSettings",
    "check_room",
    "check_settings",
    "recency_cost",
    "render_capacity",
    "render_submit",
    "run_capacity",
    "steady",
    "store_run",
    "submit_cost",
    "submit_latencies",
    "submit_plan",
]

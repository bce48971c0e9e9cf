"""Orchestrates one `kvtier bench` run: plan, measure side by side, aggregate."""

from __future__ import annotations

import logging
import math
import shutil
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TypedDict

import kvtier
from kvtier import _core
from kvtier.bench.ceiling import (
    CEILINGS,
    Ceiling,
    fio_available,
    fio_job_size,
    run_fio,
    run_fio_load,
    write_load_layout,
)
from kvtier.bench.config import MIN_BLOCKS, NOISY_RATIO, BenchConfig, MiB
from kvtier.bench.errors import BenchError
from kvtier.bench.interference import measure_interference
from kvtier.bench.latency import hot_set_size, measure_latency
from kvtier.bench.machine import describe_machine
from kvtier.bench.primary import check_layout
from kvtier.bench.progress import Progress, Step
from kvtier.bench.scratch import check_root, make_scratch
from kvtier.bench.throughput import measure_throughput
from kvtier.bench.workload import (
    DriverFactory,
    PrimaryMemory,
    TierDriver,
    kvtier_factory,
)
from kvtier.tiering.fs.capacity import format_size
from kvtier.tiering.fs.engine import io_uring_refusal

THROUGHPUT = "store/load throughput"
INTERFERENCE = "scheduler loop vs. streaming stores"
LATENCY = "load latency idle and under a store flood"

_HEADER = 4096  # bytes of header per kvtier block file
_SPACE_MARGIN = 64 * MiB
_FREE_FRACTION = 0.8  # never plan to use more than this share of the free space
_MEMORY_FRACTION = 0.5  # nor more than this share of available memory for primary memory
#: Each step's share of the progress bar, in units of one run's volume (what it stores, loads
#: and removes). The time left is estimated per kind of step, from the steps that ran
#: (kvtier.bench.progress), not from these.
_STEP_WEIGHTS = {
    "throughput": 4.0, "interference": 2.0, "latency": 2.0, "fio": 2.0, "fio_load": 1.0,
}  # fmt: skip
_MEASURES = (("throughput", THROUGHPUT), ("interference", INTERFERENCE), ("latency", LATENCY))


def _available_memory() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _peak_disk_bytes(total: int, block_size: int, threads: int, run_fio: bool) -> int:
    """Most bytes on disk at once: one phase's files (phases clean up after themselves)."""
    n = total // block_size
    tier = n * (block_size + _HEADER) + hot_set_size(n) * (block_size + _HEADER)
    fio = threads * fio_job_size(total, block_size, threads) if run_fio else 0
    return max(tier, fio) + _SPACE_MARGIN


def plan_total(config: BenchConfig, free_bytes: int, memory_bytes: int | None) -> int:
    """Bytes per block size over all runs: ``config.total_bytes`` if it fits, else the default
    bounded. Each of the ``config.repeat`` runs moves an equal share (disk and memory hold one
    run's share at a time)."""
    largest = max(config.block_sizes)
    minimum = MIN_BLOCKS * largest * config.repeat

    def fits(total: int) -> bool:
        per_run = total // config.repeat
        peak = max(
            _peak_disk_bytes(per_run, bs, config.threads, config.run_fio)
            for bs in config.block_sizes
        )
        memory_ok = memory_bytes is None or per_run <= memory_bytes * _MEMORY_FRACTION
        return peak <= free_bytes * _FREE_FRACTION and memory_ok

    if config.total_bytes is not None:
        if config.total_bytes < minimum:
            raise BenchError(
                f"--total {format_size(config.total_bytes)} is too small for {config.repeat} "
                f"run(s): each run needs at least {MIN_BLOCKS} blocks of the largest size, "
                f"{format_size(minimum)} in all; raise --total or lower --repeat"
            )
        if not fits(config.total_bytes):
            raise BenchError(
                f"too little free space or memory for --total "
                f"{format_size(config.total_bytes)}: {format_size(free_bytes)} free on the "
                "root file system; choose a smaller --total or another --root"
            )
        return config.total_bytes

    from kvtier.bench.config import DEFAULT_TOTAL

    total = DEFAULT_TOTAL
    while total >= minimum and not fits(total):
        total //= 2
    if total < minimum:
        raise BenchError(
            f"too little free space: {format_size(free_bytes)} free on the root file system, "
            f"{format_size(minimum)} per block size needed at least; free some space or "
            "choose another --root"
        )
    return total - total % (largest * config.repeat)


def _median(values: list[float]) -> float:
    return float(statistics.median(values))


def summarize_runs(runs: list[dict], keys: tuple[str, ...]) -> dict:
    """Median of each figure over the runs, its ``spread`` [min, max], the figures whose spread
    is too wide to trust (``noisy``: max/min over NOISY_RATIO), and the runs themselves."""
    out: dict = {}
    spread: dict[str, list[float]] = {}
    noisy: list[str] = []
    for k in keys:
        values = [r[k] for r in runs if k in r]
        if not values:
            continue
        out[k] = _median(values)
        low, high = min(values), max(values)
        spread[k] = [low, high]
        if len(values) > 1 and (low <= 0 or high / low > NOISY_RATIO):
            noisy.append(k)
    out["spread"] = spread
    out["noisy"] = noisy
    out["runs"] = runs
    return out


def _aggregate_latency(runs: list[dict]) -> dict:
    out: dict = {"blocks_per_load": runs[0]["blocks_per_load"], "hot_blocks": runs[0]["hot_blocks"]}
    for phase in ("idle", "flood"):
        valid = [r[phase] for r in runs if r[phase].get("n")]
        summary: dict = {"n": sum(r[phase]["n"] for r in runs)}
        for p in ("p50_ms", "p95_ms", "p99_ms"):
            if valid:
                summary[p] = _median([v[p] for v in valid])
        summary["samples_ms"] = [s for r in runs for s in r[phase].get("samples_ms", [])]
        out[phase] = summary
    for key in ("p95_ratio", "flood_store_gbps"):
        values = [r[key] for r in runs if key in r]
        if values:
            out[key] = _median(values)
    # Per-run percentiles stay; the samples themselves are kept once, above (all runs).
    out["runs"] = [
        {
            k: (
                {kk: vv for kk, vv in v.items() if kk != "samples_ms"} if isinstance(v, dict) else v
            )
            for k, v in r.items()
        }
        for r in runs
    ]
    return out


class _Phase:
    """One tier instance on a fresh directory for a sequence of measurements; always cleaned up.

    The measurements share the tier and the keys (each removes its files when done, keeping
    the directories), so only the first store pass pays for creating the directory tree.
    """

    def __init__(self, scratch: Path):
        self._scratch = scratch
        self._count = 0

    def run(
        self,
        factory: DriverFactory,
        primary: PrimaryMemory,
        measures: list[tuple[str, Callable[[TierDriver], dict]]],
        progress: Progress,
        label: str,
    ) -> tuple[dict[str, dict], str]:
        self._count += 1
        directory = self._scratch / f"phase-{self._count:03d}"
        directory.mkdir()
        driver = None
        results: dict[str, dict] = {}
        try:
            driver = factory(directory, primary)
            for what, measure in measures:
                progress.step(f"{label}: {what}")
                results[what] = measure(driver)
                progress.advance()
            return results, driver.cache_bypass
        finally:
            if driver is not None:
                driver.close()
            shutil.rmtree(directory, ignore_errors=True)


def run_bench(config: BenchConfig, *, stream=None) -> dict:
    """Run every phase and return the results (see docs/PERFORMANCE.md for their meaning)."""
    stream = stream if stream is not None else sys.stderr
    check_layout(config.primary)  # before a scratch directory is made
    shown = config.root if config.root is not None else Path(".")
    root = check_root(shown, create=config.create_root)
    scratch = make_scratch(root, shown)
    try:
        return _run(config, root, scratch, stream)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _run(config: BenchConfig, root: Path, scratch: Path, stream) -> dict:
    free = shutil.disk_usage(scratch).free
    total = plan_total(config, free, _available_memory())
    if config.max_bytes is not None:  # refused before the other phases have run
        from kvtier.bench.capacity import check_room, check_settings

        check_settings(config)
        check_room(config, free)
    per_run = total // config.repeat
    per_run -= per_run % max(config.block_sizes)  # whole blocks of every size in each run
    # The other budgets are split over the runs too, so the run count changes the spread
    # shown, not the time taken.
    samples_per_run = math.ceil(config.latency_samples / config.repeat)
    loop_seconds_per_run = config.loop_seconds / config.repeat

    tiers: dict[str, DriverFactory] = {}
    peers: dict[str, dict] = {}
    notes: list[str] = []
    io_engines = _kvtier_tiers(config, scratch, per_run, tiers, notes)
    if "lmcache" in config.peers:
        _lmcache_tiers(config, scratch, tiers, peers, notes, stream)
    if "vllm" in config.peers:
        from kvtier.bench.peer_vllm import vllm_factory, vllm_status

        if config.progress:
            print("kvtier bench: importing vLLM for --peer vllm ...", file=stream, flush=True)
        status = vllm_status()
        peers["vllm"] = status
        if status["available"]:
            tiers["vllm"] = vllm_factory(config.read_threads, config.write_threads)
        else:
            notes.append(f"--peer vllm: {status['reason']}; skipping the vLLM peer")
            peers["vllm"]["skipped"] = status["reason"]

    fio_path = fio_available() if config.run_fio else None
    fio_info: dict = {}
    if not config.run_fio:
        fio_info["skipped"] = "disabled with --no-fio"
    elif fio_path is None:
        # Said once, in the report's "Ceiling" line.
        fio_info["skipped"] = "fio is not installed (e.g. apt-get install fio)"
    direct = _core.probe_o_direct(str(scratch)) == ""

    ceilings = config.ceilings if config.ceilings is not None else CEILINGS
    progress = Progress(
        step_plan(config, list(tiers), ceilings if fio_path else ()),
        enabled=config.progress,
        stream=stream,
    )
    try:
        for note in notes:
            progress.message(note)
        if not direct:
            progress.message(
                f"O_DIRECT is not supported on {root} ({_core.probe_o_direct(str(scratch))}); "
                "loads read files dropped from the page cache with posix_fadvise(DONTNEED)"
            )
        plan = _Plan(
            root=root,
            scratch=scratch,
            tiers=tiers,
            peers=peers,
            notes=notes,
            fio_info=fio_info,
            fio_path=fio_path,
            direct=direct,
            per_run=per_run,
            samples_per_run=samples_per_run,
            loop_seconds_per_run=loop_seconds_per_run,
            io_engines=io_engines,
            ceilings=ceilings,
        )
        # The tier's warnings (io_engine "auto" falling back, once) join the progress lines
        # instead of cutting into the live line.
        relay = _ToProgress(progress) if config.progress else None
        if relay is not None:
            logging.getLogger("kvtier").addHandler(relay)
        try:
            results = _measure(config, plan, progress)
        finally:
            if relay is not None:
                logging.getLogger("kvtier").removeHandler(relay)
    finally:
        progress.close()  # also stops its ticker thread on an error or Ctrl-C
    if "sglang" in config.peers:
        # Its own phase: SGLang's backends are driven through SGLang's host pools, not tiers.
        from kvtier.bench.peer_sglang import run_sglang_peer

        threads = (config.read_threads, config.write_threads)
        results["sglang"] = run_sglang_peer(
            scratch, config.block_sizes, plan.per_run, threads, stream, config.repeat
        )
    if config.max_bytes is not None:
        from kvtier.bench.capacity import run_capacity

        results["capacity"] = run_capacity(config, scratch, stream)
    return results


class _ToProgress(logging.Handler):
    """Shows kvtier's warnings as progress messages while the bench runs."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(logging.WARNING)
        self._progress = progress

    def emit(self, record: logging.LogRecord) -> None:
        self._progress.message(record.getMessage())


@dataclass(frozen=True)
class _Plan:
    """What `_run` decided before measuring: where, which tiers, how much per run."""

    root: Path
    scratch: Path
    tiers: dict[str, DriverFactory]
    peers: dict[str, dict]
    notes: list[str]
    fio_info: dict
    fio_path: str | None
    direct: bool
    per_run: int
    samples_per_run: int
    loop_seconds_per_run: float
    #: Per kvtier tier: the io_engine asked for, the one that ran and why "auto" fell back (or
    #: why io_uring was unavailable to --compare-io-engines).
    io_engines: dict[str, dict]
    #: The fio ceilings to run (each block size, each run).
    ceilings: tuple[Ceiling, ...] = CEILINGS


def tier_order(tiers: list[str], rep: int) -> list[str]:
    """The tiers in the order run ``rep`` measures them: alternating, so that no tier always
    runs first (on a disk whose cache warms up, or a machine that gets busier)."""
    return list(tiers) if rep % 2 == 0 else list(reversed(tiers))


def step_plan(
    config: BenchConfig, tiers: list[str], ceilings: tuple[Ceiling, ...] | list[Ceiling]
) -> list[Step]:
    """Every step `_measure` runs, in its order, with the kind the progress ETA estimates
    it by: (measurement, tier or ceiling, block size)."""
    plan: list[Step] = []
    loads = [c for c in ceilings if c.load]
    for block_size in config.block_sizes:
        label = format_size(block_size)
        for rep in range(config.repeat):
            for name in tier_order(tiers, rep):
                for kind, _ in _MEASURES:
                    plan.append(Step((kind, name, label), _STEP_WEIGHTS[kind]))
            for ceiling in ceilings:
                if not ceiling.load:
                    plan.append(Step(("fio", ceiling.key, label), _STEP_WEIGHTS["fio"]))
            # Reads only: estimated from other load ceilings, not from a write and a read.
            if loads:
                plan.append(Step(("fio load", "layout", label), _STEP_WEIGHTS["fio_load"]))
            for ceiling in loads:
                plan.append(Step(("fio load", ceiling.key, label), _STEP_WEIGHTS["fio_load"]))
    return plan


def _kvtier_tiers(
    config: BenchConfig, scratch: Path, per_run: int, tiers: dict[str, DriverFactory], notes: list
) -> dict[str, dict]:
    """Adds kvtier's tier, or with --compare-io-engines one per engine ("kvtier-psync",
    "kvtier-io_uring"), to ``tiers``; returns what each asked for and (once run) what ran.

    io_uring refused by the kernel ends the run for --io-engine io_uring (BenchError) and is
    reported as unavailable for --compare-io-engines."""
    compare = config.compare_io_engines
    engines = ("psync", "io_uring") if compare else (config.io_engine,)
    refusal = ""
    if "io_uring" in engines:
        probe = scratch / "io-uring-probe"
        refusal = io_uring_refusal(probe)
        shutil.rmtree(probe, ignore_errors=True)
    io_engines: dict[str, dict] = {}
    for engine in engines:
        name = f"kvtier-{engine}" if compare else "kvtier"
        if engine == "io_uring" and refusal:
            if not compare:
                raise BenchError(
                    f"--io-engine io_uring: {refusal}; choose --io-engine auto (io_uring where "
                    "the kernel allows it, otherwise psync) or psync"
                )
            io_engines[name] = {"requested": engine, "unavailable": refusal}
            notes.append(f"--compare-io-engines: io_uring is unavailable ({refusal}); psync ran")
            continue
        io_engines[name] = {"requested": engine}
        tiers[name] = kvtier_factory(
            config.read_threads,
            config.write_threads,
            max_queued_store_jobs=max(
                1024, per_run // min(config.block_sizes) // config.blocks_per_job + 16
            ),
            io_engine=engine,
            checksum=config.checksum,
            io_timeout_s=config.io_timeout_s,
            max_stores_in_flight_while_loading=config.max_stores_in_flight_while_loading,
            ran=io_engines[name],
        )
    return io_engines


def _run_load_ceilings(
    config: BenchConfig,
    plan: _Plan,
    progress: Progress,
    block_size: int,
    rep: int,
    fio_runs: dict[str, list[dict]],
    fio_skipped: dict[str, str],
) -> dict | None:
    """The load ceilings of one run: fio psync writes one file per job (the layout), then
    each load ceiling reads them; the layout's figures, or None without load ceilings.

    A load ceiling fio or the kernel refuses (no libaio, io_uring blocked) is skipped with
    its reason, as the io_uring ceiling is; the others still run."""
    loads = [c for c in plan.ceilings if c.load]
    if not loads:
        return None
    label, run = format_size(block_size), f"(run {rep + 1}/{config.repeat})"
    directory = plan.scratch / f"fio-loads-{block_size}-{rep}"
    layout = None
    try:
        progress.step(f"{label} fio layout for the load ceilings {run}")
        try:
            layout = write_load_layout(
                directory, block_size=block_size, total_bytes=plan.per_run,
                numjobs=config.threads, direct=plan.direct,
            )  # fmt: skip
        except BenchError as exc:
            for ceiling in loads:
                fio_skipped.setdefault(ceiling.key, f"the layout could not be written: {exc}")
        progress.advance()
        for ceiling in loads:
            progress.step(f"{label} {ceiling.label} {run}")
            if layout is not None and ceiling.key not in fio_skipped:
                try:
                    fio_runs[ceiling.key].append(
                        run_fio_load(
                            directory,
                            block_size=block_size,
                            size_per_job=layout["size_per_job"],
                            numjobs=config.threads,
                            direct=plan.direct,
                            ceiling=ceiling,
                        )  # fmt: skip
                    )
                except BenchError as exc:
                    fio_skipped[ceiling.key] = str(exc)
                    progress.message(f"{ceiling.label} skipped: {exc}")
            progress.advance()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return layout


def _lmcache_tiers(
    config: BenchConfig,
    scratch: Path,
    tiers: dict[str, DriverFactory],
    peers: dict[str, dict],
    notes: list[str],
    stream,
) -> None:
    """Adds LMCache's backends (kvtier.bench.peer_lmcache.VARIANTS) to ``tiers``; without
    LMCache in this Python, the run ends before measuring (BenchError)."""
    from kvtier.bench.peer_lmcache import VARIANTS, lmcache_factory, lmcache_status

    if config.progress:
        print("kvtier bench: importing LMCache for --peer lmcache ...", file=stream, flush=True)
    status = lmcache_status()
    if not status["available"]:
        raise BenchError(f"--peer lmcache: {status['reason']}")
    direct = _core.probe_o_direct(str(scratch)) == ""
    # LMCache gives one count to both of its pools (puts, reads); kvtier's and vLLM's tiers
    # can put every worker on one direction, so each LMCache pool gets them all.
    threads = config.read_threads + config.write_threads
    ran = []
    for variant in VARIANTS:
        if variant == "lmcache-disk-odirect" and not direct:
            notes.append(
                "--peer lmcache: O_DIRECT does not work on this file system, so LMCache's "
                "LocalDiskBackend ran buffered only (its use_odirect puts would fail, and "
                "LMCache drops that error)"
            )
            continue
        tiers[variant] = lmcache_factory(variant, threads, direct)
        ran.append(variant)
    peers["lmcache"] = {**status, "backends": ran, "threads": threads}


class _Workload(TypedDict):
    """The keywords every measurement takes: the rows it moves, and how it keys and batches
    them."""

    primary: PrimaryMemory
    blocks_per_job: int
    key_prefix: bytes


def _measure(config: BenchConfig, plan: _Plan, progress: Progress) -> dict:
    root, scratch, tiers, peers, notes = plan.root, plan.scratch, plan.tiers, plan.peers, plan.notes
    fio_info, fio_path, direct, per_run = plan.fio_info, plan.fio_path, plan.direct, plan.per_run
    machine = describe_machine(scratch)
    machine["filesystem"]["root"] = str(root)
    phase = _Phase(scratch)
    started = time.time()
    sizes: list[dict] = []
    cache_bypass: dict[str, str] = {}
    fio_skipped: dict[str, str] = {}  # ceilings fio could not run here, and why

    for block_size in config.block_sizes:
        n = per_run // block_size
        primary = PrimaryMemory(n, block_size, config.primary)
        placed = primary.describe()
        label = format_size(block_size)
        try:
            primary.fill(seed=block_size)
            per_tier: dict[str, dict[str, list[dict]]] = {
                name: {"throughput": [], "interference": [], "latency": []} for name in tiers
            }
            fio_runs: dict[str, list[dict]] = {c.key: [] for c in plan.ceilings}
            layouts: list[dict] = []
            for rep in range(config.repeat):
                for name in tier_order(list(tiers), rep):
                    prefix = f"{name}-{block_size}-{rep}".encode()
                    common = _Workload(
                        primary=primary, blocks_per_job=config.blocks_per_job, key_prefix=prefix
                    )
                    measured, bypass = phase.run(
                        tiers[name],
                        primary,
                        [
                            (THROUGHPUT, partial(measure_throughput, **common)),
                            (
                                INTERFERENCE,
                                partial(
                                    measure_interference,
                                    idle_seconds=plan.loop_seconds_per_run,
                                    **common,
                                ),
                            ),
                            (
                                LATENCY,
                                partial(measure_latency, samples=plan.samples_per_run, **common),
                            ),
                        ],
                        progress,
                        f"{label} {name} (run {rep + 1}/{config.repeat})",
                    )
                    cache_bypass[name] = bypass
                    per_tier[name]["throughput"].append(measured[THROUGHPUT])
                    per_tier[name]["interference"].append(measured[INTERFERENCE])
                    per_tier[name]["latency"].append(measured[LATENCY])

                basic = [c for c in plan.ceilings if not c.load]
                for ceiling in basic if fio_path else ():
                    progress.step(f"{label} {ceiling.label} (run {rep + 1}/{config.repeat})")
                    if ceiling.key not in fio_skipped:
                        try:
                            fio_runs[ceiling.key].append(
                                run_fio(
                                    scratch / f"{ceiling.key}-{block_size}-{rep}",
                                    block_size=block_size,
                                    total_bytes=per_run,
                                    numjobs=config.threads,
                                    direct=direct,
                                    ceiling=ceiling,
                                )
                            )
                        except BenchError as exc:
                            if ceiling.key == "fio":  # the ceiling every ratio is against
                                raise
                            # fio without io_uring (old fio, a kernel or seccomp refusing it):
                            # the other ceilings still stand.
                            fio_skipped[ceiling.key] = str(exc)
                            progress.message(f"{ceiling.label} skipped: {exc}")
                    progress.advance()
                if fio_path:
                    layout = _run_load_ceilings(
                        config, plan, progress, block_size, rep, fio_runs, fio_skipped
                    )
                    if layout is not None:
                        layouts.append(layout)
        finally:
            primary.close()

        entry: dict = {
            "block_size": block_size,
            "label": label,
            "blocks": n,
            "bytes": n * block_size * config.repeat,
            "bytes_per_run": n * block_size,
            "primary": placed,
            "tiers": {},
        }
        for name, phases in per_tier.items():
            entry["tiers"][name] = {
                "throughput": summarize_runs(
                    phases["throughput"],
                    (
                        "store_gbps",
                        "load_gbps",
                        "store_cpu_s_per_gib",
                        "load_cpu_s_per_gib",
                        "first_store_gbps",
                        "first_store_cpu_s_per_gib",
                        "first_load_gbps",
                        "first_load_cpu_s_per_gib",
                    ),
                ),
                "interference": summarize_runs(
                    phases["interference"], ("idle_iter_per_s", "busy_iter_per_s", "ratio")
                ),
                "latency": _aggregate_latency(phases["latency"]),
            }
        loads: dict[str, dict] = {}
        for ceiling_key, runs in fio_runs.items():
            if not runs:
                continue
            if runs[0].get("iodepth") is not None:  # a load ceiling: reads only
                summary = summarize_runs(runs, ("read_gbps", "read_cpu_s_per_gib"))
                for key in ("read_command", "numjobs", "size_per_job", "direct", "ioengine"):
                    summary[key] = runs[0][key]
                for key in ("iodepth", "request_bytes", "hugetlb"):
                    summary[key] = runs[0].get(key)
                loads[ceiling_key] = summary
                continue
            fio = summarize_runs(
                runs, ("write_gbps", "read_gbps", "write_cpu_s_per_gib", "read_cpu_s_per_gib")
            )
            for key in ("write_command", "read_command", "numjobs", "size_per_job", "direct"):
                fio[key] = runs[0][key]  # the same in every run
            for key in ("ioengine", "file_per_block"):
                if key in runs[0]:
                    fio[key] = runs[0][key]
            entry[ceiling_key] = fio
        if loads:
            entry["fio_loads"] = loads
            # The one the report's table shows: the highest median read.
            entry["fio_load_best"] = max(loads, key=lambda k: loads[k]["read_gbps"])
            entry["fio_load_layout"] = {
                "write_command": layouts[0]["write_command"],
                "size_per_job": layouts[0]["size_per_job"],
                "write_gbps": [r["write_gbps"] for r in layouts],
            }
        if "fio" in entry:
            fio = entry["fio"]
            for t in entry["tiers"].values():
                t["throughput"]["store_vs_fio"] = t["throughput"]["store_gbps"] / fio["write_gbps"]
                t["throughput"]["load_vs_fio"] = t["throughput"]["load_gbps"] / fio["read_gbps"]
        sizes.append(entry)

    results = {
        "kvtier_version": kvtier.__version__,
        "started_unix": started,
        "duration_s": time.time() - started,
        "machine": machine,
        "config": {
            "root": str(root),
            "block_sizes": list(config.block_sizes),
            "bytes_per_block_size": per_run * config.repeat,
            "bytes_per_run": per_run,
            "blocks_per_job": config.blocks_per_job,
            "read_threads": config.read_threads,
            "write_threads": config.write_threads,
            "repeat": config.repeat,
            "latency_samples": config.latency_samples,
            "loop_seconds": config.loop_seconds,
            "io_engine": config.io_engine,
            "compare_io_engines": config.compare_io_engines,
            "checksum": config.checksum,
            "io_timeout_s": config.io_timeout_s,
            "max_stores_in_flight_while_loading": config.max_stores_in_flight_while_loading,
            "primary": config.primary,
            "statistic": (
                f"median of {config.repeat} runs, spread = [min, max], noisy when max/min > "
                f"{NOISY_RATIO}"
                if config.repeat > 1
                else "single run"
            ),
            "noisy_ratio": NOISY_RATIO,
        },
        "cache_bypass": cache_bypass,
        "peers": peers,
        "fio": fio_info
        or {
            "found": fio_path,
            "direct": direct,
            "skipped_ceilings": fio_skipped,
            "ceilings": [c.key for c in plan.ceilings],
        },
        "io_engines": plan.io_engines,
        "sizes": sizes,
        "notes": notes,
    }
    return results

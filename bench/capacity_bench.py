#!/usr/bin/env python3
"""Capacity measurements (docs/PERFORMANCE.md, "Capacity"): never part of the test run.

    python bench/capacity_bench.py steady  [--root DIR] [--budget 256M] [--total 768M] [--repeat 3]
    python bench/capacity_bench.py recency [--root DIR] [--samples 2000] [--repeat 3]
    python bench/capacity_bench.py evict   [--root DIR] [--total 1G]
    python bench/capacity_bench.py million [--root DIR] [--files 1000000] [--budget-fraction 0.5]

steady:  store throughput with a full cache (every store makes room) against the same run
         without a budget, at 256 KiB and 2 MiB blocks, alternating run by run; CPU per GiB
         evicted = extra process CPU (all threads) of the budgeted run / GiB it evicted.
evict:   process CPU and wall seconds per GiB to survey and evict real block files.
recency: p50 latency of one-block loads with the tier's recency bookkeeping against the
         same tier with it switched off (record_use replaced by a no-op), alternating.
million: makes N small block files (sparse, 8 KiB each) with make_block_tree, then times a
         tier's constructor on that root without a ledger, the background scan until the
         ledger is complete, eviction down to the budget, and `kvtier du`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes, format_size, parse_size
from kvtier.tiering.fs.capacity.evictor import evict
from kvtier.tiering.fs.capacity.ledger import UsageLedger
from kvtier.tiering.fs.capacity.survey import survey
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="bench/capacity", dtype="float16")
CTX = ReqContext("bench")
JOB_BLOCKS = 8


@contextmanager
def scratch(root: Path) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvtier-capacity-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def collect(tier: FileSystemTierManager, sizes: dict[int, int]) -> tuple[int, int]:
    """Failed jobs and bytes of succeeded ones, among jobs finished so far."""
    failed = stored = 0
    for r in tier.get_finished():
        if r.success:
            stored += sizes.pop(r.job_id)
        else:
            failed += 1
            sizes.pop(r.job_id)
    return failed, stored


def store_run(
    root: Path, row: int, total: int, budget: int | None, first: int, inflight: int = 8
) -> dict:
    rows = np.random.default_rng(0).integers(0, 256, (64, row), dtype=np.uint8)
    tier = FileSystemTierManager(
        SPEC, memoryview(rows), "fs", root_dir=str(root), max_bytes=budget, min_free_fraction=0
    )
    try:
        n_blocks = total // row
        if budget is not None:  # fill to the budget first: every measured store makes room
            fill = budget // block_file_bytes(row)
            for j in range(0, fill, JOB_BLOCKS):
                keys = [key(first - 1 - i) for i in range(j, min(fill, j + JOB_BLOCKS))]
                ids = np.arange(len(keys), dtype=np.int64) % 64
                tier.submit_store(JobMetadata(j, keys, ids, False, CTX))
            tier.drain_jobs()
            tier.get_finished()
            # A cache that has been full for a while: the evictor has brought it under its
            # high watermark (it starts from the ledger at the next tick).
            high = tier._capacity.policy.high_bytes or 0
            while tier.stats()["used_bytes"] > high:
                time.sleep(0.05)
        evicted0 = tier.stats()["evicted_bytes"]
        cpu0, t0 = time.process_time(), time.perf_counter()
        sizes: dict[int, int] = {}
        failed = stored = 0
        j = 0
        # Until `total` bytes are stored: a refused store is a job the engine offers again
        # later (new blocks keep coming), so the run measures how fast the cache takes them.
        while stored + sum(sizes.values()) < n_blocks * row:
            keys = [key(first + i) for i in range(j, j + JOB_BLOCKS)]
            j += JOB_BLOCKS
            ids = np.arange(len(keys), dtype=np.int64) % 64
            sizes[10**9 + j] = len(keys) * row
            tier.submit_store(JobMetadata(10**9 + j, keys, ids, False, CTX))
            if len(sizes) >= inflight:  # an engine's stores in flight are bounded too
                tier.drain_jobs()
                f, b = collect(tier, sizes)
                failed, stored = failed + f, stored + b
                if f:
                    time.sleep(0.001)
        tier.drain_jobs()
        f, b = collect(tier, sizes)
        failed, stored = failed + f, stored + b
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
        stats = tier.stats()
        return {
            "gbps": stored / wall / 1e9,
            "cpu_s": cpu,
            "failed_jobs": failed,
            "evicted_bytes": stats["evicted_bytes"] - evicted0,
            "used_bytes": stats["used_bytes"],
        }
    finally:
        tier.shutdown()


def steady(args: argparse.Namespace) -> dict:
    out: dict = {}
    for row in (256 << 10, 2 << 20):
        runs: dict[str, list[dict]] = {"no budget": [], "budget": []}
        for rep in range(args.repeat):
            for name, budget in (("no budget", None), ("budget", args.budget)):
                with scratch(args.root) as root:
                    runs[name].append(
                        store_run(root, row, args.total, budget, 10**6 * (rep + 1), args.inflight)
                    )
        base = statistics.median(r["gbps"] for r in runs["no budget"])
        full = statistics.median(r["gbps"] for r in runs["budget"])
        extra_cpu = statistics.median(
            b["cpu_s"] - a["cpu_s"] for a, b in zip(runs["no budget"], runs["budget"])
        )
        evicted = statistics.median(r["evicted_bytes"] for r in runs["budget"])
        out[format_size(row)] = {
            "store_gbps_no_budget": round(base, 3),
            "store_gbps_full_cache": round(full, 3),
            "ratio": round(full / base, 3),
            "evicted_gib_per_run": round(evicted / 2**30, 3),
            "eviction_cpu_s_per_gib": round(extra_cpu / (evicted / 2**30), 3) if evicted else None,
            "failed_jobs_full_cache": [r["failed_jobs"] for r in runs["budget"]],
            "runs": runs,
        }
        print(json.dumps({k: v for k, v in out[format_size(row)].items() if k != "runs"}))
    return out


def evict_cost(args: argparse.Namespace) -> dict:
    """Process CPU seconds (all threads) and wall seconds per GiB to survey and evict real
    block files (written with data, so unlink frees extents as it would in a cache)."""
    out = {}
    for row in (256 << 10, 2 << 20):
        with scratch(args.root) as root:
            n = args.total // row
            data = os.urandom(block_file_bytes(row))
            for i in range(n):
                d = root / "ns" / "rank-0" / f"{i & 0xFF:02x}"
                d.mkdir(parents=True, exist_ok=True)
                (d / f"{i:072x}.kvb").write_bytes(data)
            os.sync()
            cpu0, t0 = time.process_time(), time.perf_counter()
            found = survey(str(root), 1 << 62)
            done = evict(found.candidates, 1 << 62)
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        gib = done.bytes / 2**30
        out[format_size(row)] = {
            "files": len(done.paths),
            "gib": round(gib, 3),
            "cpu_s_per_gib": round(cpu / gib, 3),
            "wall_s_per_gib": round(wall / gib, 3),
        }
        print(json.dumps({format_size(row): out[format_size(row)]}))
    return out


def recency(args: argparse.Namespace) -> dict:
    row = 256 << 10
    with scratch(args.root) as root:
        rows = np.random.default_rng(0).integers(0, 256, (8, row), dtype=np.uint8)
        tier = FileSystemTierManager(SPEC, memoryview(rows), "fs", root_dir=str(root))
        try:
            n = 256
            for j in range(0, n, JOB_BLOCKS):
                keys = [key(i) for i in range(j, j + JOB_BLOCKS)]
                tier.submit_store(JobMetadata(j, keys, np.arange(8, dtype=np.int64), False, CTX))
            tier.drain_jobs()
            tier.get_finished()
            capacity = tier._capacity  # bench only: switch the bookkeeping off for a baseline
            real = capacity.record_use
            lat: dict[str, list[float]] = {"recency": [], "off": []}
            job_id = 10**6
            for _ in range(args.repeat):
                for name in ("off", "recency"):
                    capacity.record_use = real if name == "recency" else (lambda paths: None)
                    for s in range(args.samples):
                        job_id += 1
                        t0 = time.perf_counter()
                        job = JobMetadata(job_id, [key(s % n)], np.array([s % 8]), True, CTX)
                        tier.submit_load(job)
                        while not tier.get_finished():
                            pass
                        lat[name].append(time.perf_counter() - t0)
            capacity.record_use = real
        finally:
            tier.shutdown()
    p50 = {k: statistics.median(v) * 1e6 for k, v in lat.items()}
    result = {
        "load_p50_us_recency_off": round(p50["off"], 1),
        "load_p50_us_recency_on": round(p50["recency"], 1),
        "ratio": round(p50["recency"] / p50["off"], 3),
        "samples_each": len(lat["off"]),
    }
    print(json.dumps(result))
    return result


def make_block_tree(root: Path, n: int, size: int = 8192) -> None:
    """``n`` sparse block files of ``size`` bytes in one namespace, 256 x 256 fan-out."""
    rank = root / "generated-0123456789abcdef0123456789abcdef" / "rank-0"
    made: set[str] = set()
    for i in range(n):
        name = f"{i:064x}00000000"
        d = f"{i & 0xFF:02x}/{(i >> 8) & 0xFF:02x}"
        if d not in made:
            (rank / d).mkdir(parents=True, exist_ok=True)
            made.add(d)
        fd = os.open(f"{rank}/{d}/{name}.kvb", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.ftruncate(fd, size)
        os.close(fd)


def million(args: argparse.Namespace) -> dict:
    size = 8192
    with scratch(args.root) as root:
        t0 = time.perf_counter()
        make_block_tree(root, args.files, size)
        made = time.perf_counter() - t0
        print(f"made {args.files} files in {made:.1f} s", file=sys.stderr)
        t0 = time.perf_counter()
        du = subprocess.run(
            [sys.executable, "-m", "kvtier", "du", str(root), "--json"],
            capture_output=True,
            text=True,
            check=True,
        )
        du_s = time.perf_counter() - t0
        assert json.loads(du.stdout)["blocks"] == args.files
        budget = int(args.files * size * args.budget_fraction)
        rows = np.zeros((1, 4096), dtype=np.uint8)
        t0 = time.perf_counter()
        tier = FileSystemTierManager(
            SPEC,
            memoryview(rows),
            "fs",
            root_dir=str(root),
            max_bytes=budget,
            min_free_fraction=0,
        )
        constructed = time.perf_counter() - t0
        ledger = UsageLedger(str(root))
        while not ledger.read().complete:
            time.sleep(0.05)
        counted = time.perf_counter() - t0
        while ledger.read().used > budget:
            time.sleep(0.05)
        within = time.perf_counter() - t0
        evicted = tier.stats()["evicted_blocks"]
        tier.shutdown()
    result = {
        "files": args.files,
        "make_tree_s": round(made, 1),
        "kvtier_du_s": round(du_s, 2),
        "tier_constructor_s": round(constructed, 3),
        "ledger_complete_after_s": round(counted, 2),
        "within_budget_after_s": round(within, 2),
        "evicted_blocks": evicted,
        "budget": format_size(budget),
    }
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("steady", "recency", "evict", "million"):
        p = sub.add_parser(name)
        p.add_argument("--root", type=Path, default=Path("."))
        p.add_argument("--json", type=Path)
        if name == "steady":
            p.add_argument("--budget", type=parse_size, default=256 << 20)
            p.add_argument("--total", type=parse_size, default=768 << 20)
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument("--inflight", type=int, default=8, help="store jobs in flight")
        if name == "recency":
            p.add_argument("--samples", type=int, default=2000)
            p.add_argument("--repeat", type=int, default=3)
        if name == "evict":
            p.add_argument("--total", type=parse_size, default=1 << 30)
        if name == "million":
            p.add_argument("--files", type=int, default=1_000_000)
            p.add_argument("--budget-fraction", type=float, default=0.5)
    args = parser.parse_args()
    commands = {"steady": steady, "recency": recency, "evict": evict_cost, "million": million}
    result = commands[args.what](args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

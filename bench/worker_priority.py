#!/usr/bin/env python3
"""How the I/O workers' CPU priority (the `worker_nice` option) protects the scheduler loop.

On a host with few cores, kvtier's native workers (16 + 16 by default) spend most of their
CPU time in the kernel creating, writing and renaming block files; the Linux scheduler shares
the cores among all runnable threads, so at equal priority the engine's Python scheduler
thread gets a small slice. This script runs `kvtier bench`'s throughput, interference and
latency measurements through the public `fs` tier once per `worker_nice` value per repetition,
rotating the order, and prints medians. It is evidence for docs/PERFORMANCE.md.

    python bench/worker_priority.py [--root DIR] [--sizes 256K,2M] [--total 1G] [--repeat 3]
                                    [--nice 0,10,19]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from kvtier.bench.config import parse_block_sizes, parse_size
from kvtier.bench.interference import measure_interference
from kvtier.bench.latency import measure_latency
from kvtier.bench.throughput import measure_throughput
from kvtier.bench.workload import KvtierDriver, PrimaryMemory
from kvtier.tiering.fs.capacity import format_size


def one_run(root: Path, primary: PrimaryMemory, nice: int, args) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=root))
    driver = KvtierDriver(
        directory,
        primary,
        read_threads=args.read_threads,
        write_threads=args.write_threads,
        max_queued_store_jobs=1 << 20,
        worker_nice=nice,
    )
    try:
        common = {"blocks_per_job": 8, "key_prefix": b"prio"}
        tp = measure_throughput(driver, primary, **common)
        it = measure_interference(driver, primary, idle_seconds=1.0, **common)
        lat = measure_latency(driver, primary, samples=args.latency_samples, **common)
    finally:
        driver.close()
        shutil.rmtree(directory, ignore_errors=True)
    return {
        "store_gbps": tp["store_gbps"],
        "load_gbps": tp["load_gbps"],
        "loop_kept": it["ratio"],
        "idle_p95_ms": lat["idle"]["p95_ms"],
        "flood_p95_ms": lat["flood"]["p95_ms"],
        "p95_ratio": lat["p95_ratio"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--sizes", default="256K,2M")
    parser.add_argument("--total", default="1G")
    parser.add_argument("--read-threads", type=int, default=16)
    parser.add_argument("--write-threads", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument("--nice", default="0,10,19", help="worker_nice values to compare")
    args = parser.parse_args()
    total = parse_size(args.total)
    keys = ("store_gbps", "load_gbps", "loop_kept", "idle_p95_ms", "flood_p95_ms", "p95_ratio")
    print(
        f"{args.read_threads}+{args.write_threads} threads, {format_size(total)} per size, "
        f"median of {args.repeat} runs (worker_nice {args.nice}, order rotating)"
    )
    nices = [int(n) for n in args.nice.split(",")]
    print(f"{'block':>8} {'nice':>4} " + " ".join(f"{k:>12}" for k in keys))
    for bs in parse_block_sizes(args.sizes):
        primary = PrimaryMemory(total // bs, bs)
        primary.fill(seed=bs)
        runs: dict[int, list[dict]] = {n: [] for n in nices}
        try:
            for rep in range(args.repeat):
                for nice in nices[rep % len(nices) :] + nices[: rep % len(nices)]:
                    runs[nice].append(one_run(args.root, primary, nice, args))
        finally:
            primary.close()
        for nice, results in runs.items():
            cells = [statistics.median(r[k] for r in results) for k in keys]
            print(f"{format_size(bs):>8} {nice:>4} " + " ".join(f"{c:12.2f}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())

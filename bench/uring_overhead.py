#!/usr/bin/env python3
"""psync against io_uring, side by side: throughput, CPU, context switches, io-wq threads.

    python bench/uring_overhead.py [--root DIR] [--size 256K] [--total 512M] [--repeat 5]
                                   [--threads 2,2] [--checksum none] [--durability none]
                                   [--o-direct auto|on|off]

Stores (new files) then loads `--total` bytes of `--size` blocks, 8 per job, through
``kvtier._core.Engine`` directly, once with each io engine per run; the two engines alternate
(the order flips every run) so that a noisy neighbour hits both alike. Every block directory
exists before the measured stores (a one-off cost), the main thread waits in ``drain()`` (no
polling), and files are removed between runs. Per direction and engine it prints the medians
over the runs of:

- GB/s (1e9 B/s) and process CPU seconds (all threads, io-wq workers included) per GiB;
- context switches per block (``getrusage``: voluntary + involuntary, all threads);
- io-wq threads: the most ``iou-wrk-*`` threads seen in ``/proc/self/task`` while the
  direction ran (a sampler thread looks every millisecond), 0 when nothing was punted.

and the ratios io_uring / psync. Never part of the test run; see docs/PERFORMANCE.md section 9.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from kvtier import _core
from kvtier.bench.config import GiB, parse_size
from kvtier.bench.workload import PrimaryMemory
from kvtier.tiering.fs.capacity import format_size

BLOCKS_PER_JOB = 8
DIRECTORIES = 64
ENGINES = ("psync", "io_uring")


class WorkerCount:
    """The most io-wq worker threads (``iou-wrk-*``) of this process seen while running."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.001):
            n = 0
            for task in os.listdir("/proc/self/task"):
                try:
                    with open(f"/proc/self/task/{task}/comm") as f:
                        n += f.read().startswith("iou-wrk")
                except OSError:  # the thread exited between listdir and open
                    pass
            self.peak = max(self.peak, n)

    def __enter__(self) -> WorkerCount:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def switches() -> int:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_nvcsw + r.ru_nivcsw


def timed(engine: _core.Engine, submit, jobs: list, n_blocks: int) -> dict:
    """Submits every job, waits for all; the figures for one direction."""
    with WorkerCount() as workers:
        csw0, cpu0, t0 = switches(), time.process_time(), time.perf_counter()
        for job_id, blocks in jobs:
            submit(job_id, blocks)
        engine.drain()
        t1, cpu1, csw1 = time.perf_counter(), time.process_time(), switches()
    failed = [c.error for c in engine.pop_completions() if not c.success]
    if failed:
        raise RuntimeError(f"{len(failed)} job(s) failed; first: {failed[0]}")
    return {
        "seconds": t1 - t0,
        "cpu": cpu1 - cpu0,
        # The sampler's own wake-ups (about one per millisecond) are not the engine's.
        "switches": max(0, (csw1 - csw0) - round((t1 - t0) * 1000)) / n_blocks,
        "iowq": workers.peak,
    }


def run_once(directory: Path, primary: PrimaryMemory, io_engine: str, args) -> dict:
    directory.mkdir()
    reads, writes = args.threads
    engine = _core.Engine(
        str(directory),
        n_read_threads=reads,
        n_write_threads=writes,
        o_direct={"auto": "auto", "on": True, "off": False}[args.o_direct],
        checksum=args.checksum,
        durability=args.durability,
        io_engine=io_engine,
    )
    try:
        if engine.io_engine != io_engine:
            raise RuntimeError(f"asked for {io_engine}, the engine runs {engine.io_engine}")
        n, bs = primary.n_blocks, primary.block_size
        base = _core.buffer_address(primary.view, True)
        warm = [(f"{directory}/{d:02x}/warm", b"w", base, 4096) for d in range(DIRECTORIES)]
        engine.submit_store(0, warm)
        engine.drain()
        if not all(c.success for c in engine.pop_completions()):
            raise RuntimeError("creating the block directories failed")
        blocks = [
            (f"{directory}/{i % DIRECTORIES:02x}/{i}.kvb", b"k%d" % i, base + i * bs, bs)
            for i in range(n)
        ]
        stores = [
            (1 + j, blocks[s : s + BLOCKS_PER_JOB])
            for j, s in enumerate(range(0, n, BLOCKS_PER_JOB))
        ]
        loads = [(100_000 + j, b) for j, b in stores]
        store = timed(engine, engine.submit_store, stores, n)
        load = timed(engine, engine.submit_load, loads, n)
    finally:
        engine.shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    gib = n * bs / GiB
    return {
        direction: {
            "gbps": n * bs / r["seconds"] / 1e9,
            "cpu_s_per_gib": r["cpu"] / gib,
            "switches_per_block": r["switches"],
            "iowq_threads": r["iowq"],
        }
        for direction, r in (("store", store), ("load", load))
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--size", default="256K")
    parser.add_argument("--total", default="512M", help="bytes per run and engine")
    parser.add_argument("--repeat", type=int, default=5, help="runs; medians shown")
    parser.add_argument("--threads", default="2,2", help="read,write threads (default 2,2)")
    parser.add_argument("--checksum", default="none", choices=["none", "crc32c"])
    parser.add_argument("--durability", default="none", choices=["none", "data", "full"])
    parser.add_argument("--o-direct", default="auto", choices=["auto", "on", "off"])
    args = parser.parse_args()
    args.threads = tuple(int(t) for t in args.threads.split(","))
    bs, total = parse_size(args.size), parse_size(args.total)
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-uring-", dir=args.root))
    primary = PrimaryMemory(total // bs, bs)
    primary.fill(seed=bs)
    runs: dict[str, list[dict]] = {e: [] for e in ENGINES}
    try:
        for rep in range(args.repeat):
            order = ENGINES if rep % 2 == 0 else ENGINES[::-1]
            for io_engine in order:
                runs[io_engine].append(
                    run_once(scratch / f"{io_engine}-{rep}", primary, io_engine, args)
                )
    except (RuntimeError, OSError) as exc:
        print(f"uring_overhead: error: {exc}", file=sys.stderr)
        return 2
    finally:
        primary.close()
        shutil.rmtree(scratch, ignore_errors=True)

    print(
        f"root {args.root.resolve()}, {format_size(bs)} blocks, {format_size(total)} per run, "
        f"{args.threads[0]}+{args.threads[1]} threads, checksum {args.checksum}, durability "
        f"{args.durability}, o_direct {args.o_direct}, median of {args.repeat} alternating runs"
    )
    keys = ("gbps", "cpu_s_per_gib", "switches_per_block", "iowq_threads")
    heads = ("GB/s", "CPU s/GiB", "csw/block", "io-wq thr")
    print(f"{'direction':>9} {'engine':>9} " + " ".join(f"{h:>10}" for h in heads))
    for direction in ("store", "load"):
        med = {
            e: {k: statistics.median(r[direction][k] for r in runs[e]) for k in keys}
            for e in ENGINES
        }
        for e in ENGINES:
            print(f"{direction:>9} {e:>9} " + " ".join(f"{med[e][k]:10.3f}" for k in keys))
        # psync has no io-wq threads: no ratio for that column.
        ratio = [f"{med['io_uring'][k] / med['psync'][k]:10.2f}x" for k in keys[:-1]]
        print(f"{direction:>9} {'ratio':>9} " + " ".join(ratio))
    return 0


if __name__ == "__main__":
    sys.exit(main())

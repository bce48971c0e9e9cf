#!/usr/bin/env python3
"""First benchmark: the native engine alone, next to fio on the same directory.

Stores then loads 1 GiB (per block size) of 256 KiB and 2 MiB blocks with O_DIRECT through
``kvtier._core.Engine`` directly (no tier layer, no Python per block beyond building the job
lists), and prints GB/s and process CPU seconds per GiB for each direction, next to
``fio --ioengine=psync --direct=1 --bs=<block size> --numjobs=<threads>`` on the same
directory. ``kvtier bench`` measures the public tier on top of this; see bench/README.md.

    python bench/engine_throughput.py [--root DIR] [--sizes 256K,2M] [--total 1G] [--repeat 3]
                                      [--layout contiguous|segments|staged]
                                      [--io-engines psync,io_uring]

``--io-engines`` runs the engine once per listed I/O engine in every run (alternating, same
memory and directory), one row each: a same-run A/B of psync against io_uring.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from kvtier import _core
from kvtier.bench.ceiling import fio_available, run_fio
from kvtier.bench.config import GiB, parse_block_sizes, parse_size
from kvtier.bench.errors import BenchError
from kvtier.bench.workload import PrimaryMemory
from kvtier.tiering.fs.capacity import format_size

POLL_S = 0.001


def _run_direction(engine, submit, jobs) -> tuple[float, float]:
    """Submit every job, poll until all are reported; wall seconds and CPU seconds."""
    cpu0, t0 = time.process_time(), time.perf_counter()
    for job_id, blocks in jobs:
        submit(job_id, blocks)
    pending = {job_id for job_id, _ in jobs}
    failures = []
    while pending:
        done = engine.pop_completions()
        if not done:
            time.sleep(POLL_S)
        for c in done:
            pending.discard(c.job_id)
            if not c.success:
                failures.append(c.error)
    t1, cpu1 = time.perf_counter(), time.process_time()
    if failures:
        raise BenchError(f"{len(failures)} job(s) failed; first: {failures[0]}")
    return t1 - t0, cpu1 - cpu0


def measure(root: Path, primary: PrimaryMemory, args, rep: int, io_engine: str) -> dict:
    directory = root / f"engine-{primary.block_size}-{rep}-{io_engine}"
    directory.mkdir()
    engine = _core.Engine(
        str(directory),
        n_read_threads=args.read_threads,
        n_write_threads=args.write_threads,
        o_direct=True,
        io_engine=io_engine,
    )
    try:
        n, bs = primary.n_blocks, primary.block_size
        base = _core.buffer_address(primary.view, True)
        # staged: each block 64 bytes into its row (unaligned under O_DIRECT, so it moves
        # through a staging buffer) and a page short of it (the whole file then fits one
        # default 2 MiB staging buffer, which io_uring reads and writes as a fixed buffer).
        offset, length = (64, bs - 4096) if args.layout == "staged" else (0, bs)
        blocks = [
            (f"{directory}/{i % 64:02x}/{i}.blk", b"k%d" % i, base + i * bs + offset, length)
            for i in range(n)
        ]
        per = args.blocks_per_job
        stores = [(1 + j, blocks[s : s + per]) for j, s in enumerate(range(0, n, per))]
        loads = [(100_000 + j, b) for j, b in stores]
        store, load = engine.submit_store, engine.submit_load
        if args.layout == "segments":
            # Layer-first, as an engine's KV cache: layer r of every block in one region.
            layers = 16
            part = bs // layers
            layout = _core.BlockLayout(
                [(base + r * n * part, part, n, [(0, part)], False) for r in range(layers)]
            )

            def by_index(direction):
                def submit(job_id, job_blocks):
                    ids = [int(b[0].rsplit("/", 1)[1][:-4]) for b in job_blocks]
                    paths, keys = [b[0] for b in job_blocks], [b[1] for b in job_blocks]
                    engine.submit_blocks(job_id, direction, paths, keys, ids, layout)

                return submit

            store, load = by_index(_core.Direction.STORE), by_index(_core.Direction.LOAD)
        store_s, store_cpu = _run_direction(engine, store, stores)
        load_s, load_cpu = _run_direction(engine, load, loads)
    finally:
        engine.shutdown()
        shutil.rmtree(directory, ignore_errors=True)
    moved = n * length
    gib = moved / GiB
    return {
        "store_gbps": moved / store_s / 1e9,
        "load_gbps": moved / load_s / 1e9,
        "store_cpu_s_per_gib": store_cpu / gib,
        "load_cpu_s_per_gib": load_cpu / gib,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path.cwd())
    parser.add_argument("--sizes", default="256K,2M")
    parser.add_argument("--total", default="1G", help="bytes per block size (default 1G)")
    parser.add_argument("--read-threads", type=int, default=16)
    parser.add_argument("--write-threads", type=int, default=16)
    parser.add_argument("--blocks-per-job", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3, help="runs per size; medians shown")
    parser.add_argument("--no-fio", action="store_true")
    parser.add_argument(
        "--layout",
        default="contiguous",
        choices=["contiguous", "segments", "staged"],
        help="segments: each block as 16 host-memory layers through a BlockLayout; staged: "
        "unaligned contiguous blocks, which O_DIRECT moves through staging buffers",
    )
    parser.add_argument(
        "--io-engines",
        default="auto",
        help="comma-separated io_engine values, each run once per run (default auto)",
    )
    args = parser.parse_args()
    try:
        sizes = parse_block_sizes(args.sizes)
        total = parse_size(args.total)
        if _core.probe_o_direct(str(args.root)):
            raise BenchError(
                f"O_DIRECT is not supported on {args.root}: {_core.probe_o_direct(str(args.root))}"
            )
        scratch = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=args.root))
    except (BenchError, OSError) as exc:
        print(f"engine_throughput: error: {exc}", file=sys.stderr)
        return 2
    threads = args.read_threads + args.write_threads
    io_engines = [e.strip() for e in args.io_engines.split(",") if e.strip()]
    print(
        f"root {args.root.resolve()}, {format_size(total)} per size, {args.blocks_per_job} "
        f"blocks per job, {args.read_threads}+{args.write_threads} threads, O_DIRECT, "
        f"median of {args.repeat} run(s); GB/s = 1e9 B/s, CPU = process CPU s per GiB"
    )
    print(
        f"{'block':>8} {'who':>8} {'write GB/s':>10} {'read GB/s':>10} "
        f"{'write CPU':>9} {'read CPU':>9}"
    )
    commands = []
    try:
        for bs in sizes:
            primary = PrimaryMemory(total // bs, bs)
            primary.fill(seed=bs)
            engine_runs = {e: [] for e in io_engines}
            fio_runs = []
            try:
                for rep in range(args.repeat):  # engines and fio alternate: side by side
                    for io_engine in io_engines:
                        engine_runs[io_engine].append(
                            measure(scratch, primary, args, rep, io_engine)
                        )
                    if not args.no_fio and fio_available():
                        fio_runs.append(
                            run_fio(
                                scratch / f"fio-{bs}-{rep}",
                                block_size=bs,
                                total_bytes=total,
                                numjobs=threads,
                                direct=True,
                            )
                        )
            finally:
                primary.close()

            def med(runs, key):
                return statistics.median(r[key] for r in runs)

            for io_engine, runs in engine_runs.items():
                who = "engine" if io_engine == "auto" else io_engine
                print(
                    f"{format_size(bs):>8} {who:>8} {med(runs, 'store_gbps'):10.2f} "
                    f"{med(runs, 'load_gbps'):10.2f} "
                    f"{med(runs, 'store_cpu_s_per_gib'):9.3f} "
                    f"{med(runs, 'load_cpu_s_per_gib'):9.3f}"
                )
            if fio_runs:
                w, r = med(fio_runs, "write_gbps"), med(fio_runs, "read_gbps")
                print(
                    f"{format_size(bs):>8} {'fio':>8} {w:10.2f} {r:10.2f} "
                    f"{med(fio_runs, 'write_cpu_s_per_gib'):9.3f} "
                    f"{med(fio_runs, 'read_cpu_s_per_gib'):9.3f}"
                )
                for io_engine, runs in engine_runs.items():
                    who = "engine" if io_engine == "auto" else io_engine
                    print(
                        f"{'':>8} {who:>8} {med(runs, 'store_gbps') / w:10.0%} "
                        f"{med(runs, 'load_gbps') / r:10.0%}  of fio"
                    )
                commands += [fio_runs[0]["write_command"], fio_runs[0]["read_command"]]
    except BenchError as exc:
        print(f"engine_throughput: error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if commands:
        print("fio commands:")
        for cmd in commands:
            print(f"  {cmd}")
    elif not args.no_fio:
        print("fio not found: ceiling skipped (apt-get install fio)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

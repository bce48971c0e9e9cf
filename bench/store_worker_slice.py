#!/usr/bin/env python3
"""Load latency under a store flood for several EEVDF slices of the store workers.

The engine asks for a long slice for its store workers (worker.cpp, kStoreWorkerSliceNs) so
that a waking caller or load worker preempts them at once instead of waiting for the running
one's slice to end (docs/PERFORMANCE.md section 18). This script measures that choice: per
repetition and slice (rotating the order), it starts the public `fs` tier, sets the slice of
every `kvtier-store` thread from outside with sched_setattr(2) (`engine`: leave the engine's
own; 0: the kernel's default, as before the engine asked for one),
and runs `kvtier bench`'s load-latency measurement (4-block loads idle, then under a flood).
Needs Linux 6.12 or later (custom slices). Evidence for docs/PERFORMANCE.md.

    python bench/store_worker_slice.py [--root /dev/shm] [--size 256K] [--slices-ms 0,5,engine]
                                       [--repeat 3] [--samples 300]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import statistics
import struct
import sys
import tempfile
from pathlib import Path

from kvtier.bench.config import parse_size
from kvtier.bench.latency import measure_latency
from kvtier.bench.primary import DEFAULT_PRIMARY_LAYOUT
from kvtier.bench.workload import KvtierDriver, PrimaryMemory

_SYS_SCHED_GETATTR = 315  # x86_64
_SYS_SCHED_SETATTR = 314
_ATTR = struct.Struct("IIqiIQQQ")  # struct sched_attr, first version (48 bytes)


def _set_slice(tid: int, slice_ns: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    buf = ctypes.create_string_buffer(_ATTR.size)
    if libc.syscall(_SYS_SCHED_GETATTR, tid, buf, _ATTR.size, 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_getattr")
    fields = list(_ATTR.unpack(buf.raw))
    fields[0], fields[5] = _ATTR.size, slice_ns  # size; sched_runtime (the slice)
    buf = ctypes.create_string_buffer(_ATTR.pack(*fields))
    if libc.syscall(_SYS_SCHED_SETATTR, tid, buf, 0) != 0:
        raise OSError(ctypes.get_errno(), "sched_setattr")


def _store_threads() -> list[int]:
    tids = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            if f.read().strip() == "kvtier-store":
                tids.append(int(tid))
    return tids


def one_run(root: Path, primary: PrimaryMemory, slice_ms: float | None, args) -> dict:
    directory = Path(tempfile.mkdtemp(prefix="kvtier-slice-", dir=root))
    driver = KvtierDriver(
        directory,
        primary,
        read_threads=args.threads,
        write_threads=args.threads,
        max_queued_store_jobs=1 << 20,
    )
    try:
        if slice_ms is not None:
            for tid in _store_threads():
                _set_slice(tid, int(slice_ms * 1e6))
        return measure_latency(
            driver, primary, blocks_per_job=16, key_prefix=b"slice", samples=args.samples
        )
    finally:
        driver.close()
        shutil.rmtree(directory, ignore_errors=True)


def _label(slice_ms: float | None) -> str:
    if slice_ms is None:
        return "engine's"
    return f"{slice_ms:g} ms" if slice_ms else "kernel default"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=Path("/dev/shm"))
    parser.add_argument("--size", type=parse_size, default=parse_size("256K"))
    parser.add_argument("--total", type=parse_size, default=parse_size("256M"))
    parser.add_argument("--threads", type=int, default=4, help="read and write threads each")
    parser.add_argument(
        "--slices-ms",
        default="0,5,10,engine,50",
        help="comma-separated; 0: the kernel's default; engine: the engine's own (20)",
    )
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    if os.uname().machine != "x86_64":
        parser.error("the sched_getattr/sched_setattr numbers here are x86_64's")
    slices = [None if s == "engine" else float(s) for s in args.slices_ms.split(",")]
    primary = PrimaryMemory(args.total // args.size, args.size, DEFAULT_PRIMARY_LAYOUT)
    primary.fill(seed=1)
    results: dict[float | None, list[dict]] = {s: [] for s in slices}
    for rep in range(args.repeat):
        for slice_ms in slices[rep % len(slices) :] + slices[: rep % len(slices)]:
            r = one_run(args.root, primary, slice_ms, args)
            results[slice_ms].append(r)
            print(
                f"run {rep + 1} slice {_label(slice_ms)}: load p95 idle {r['idle']['p95_ms']:.2f} "
                f"flood {r['flood']['p95_ms']:.2f} ms ({r['p95_ratio']:.2f}x)",
                flush=True,
            )
    print("slice | load p95 idle ms | under the flood ms | flood/idle (median of runs)")
    for slice_ms, runs in results.items():
        idle = statistics.median(r["idle"]["p95_ms"] for r in runs)
        flood = statistics.median(r["flood"]["p95_ms"] for r in runs)
        ratio = statistics.median(r["p95_ratio"] for r in runs)
        print(f"{_label(slice_ms)} | {idle:.2f} | {flood:.2f} | {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

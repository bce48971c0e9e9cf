#!/usr/bin/env python3
"""Staged O_DIRECT loads: block files read through the engine's staging buffers.

    python bench/staged_load_speed.py --root /tmp [--size 2M] [--blocks 128] [--repeat 5]
        [--io-engine psync] [--threads 4] [--against DIR] [--json out.json]

Stores `--blocks` blocks of `--size` bytes with O_DIRECT from host memory that is *not*
page-aligned (64 bytes past a page), so every block moves through a staging buffer of the
engine (csrc/src/io/block_file.cpp, staged_segments), then loads them back into unaligned
memory, and reports GB/s of the loads (and of the stores) over wall-clock time, and the
process's CPU seconds per GiB loaded. Each run is a fresh process with a fresh engine, whose
staging buffers are therefore allocated anew.

`--against DIR` alternates the runs with those of another build of kvtier (the `kvtier`
package under DIR, e.g. a copy of an earlier install's site-packages/kvtier), to compare two
builds on the same disk at the same time: medians and ranges of `--repeat` runs each.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

MIB = 1 << 20


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def wait_for(engine: object, count: int) -> None:
    done = 0
    while done < count:
        for c in engine.pop_completions():  # type: ignore[attr-defined]
            if not c.success:
                raise SystemExit(f"a block failed: {c.error}")
            done += 1
        if done < count:
            time.sleep(0.0005)


def run_once(args: argparse.Namespace) -> dict:
    """One run in this process: store, then load, every block."""
    from kvtier import _core

    size, n = args.size, args.blocks
    scratch = tempfile.mkdtemp(prefix="kvtier-staged-", dir=args.root)
    try:
        engine = _core.Engine(
            scratch,
            n_read_threads=args.threads,
            n_write_threads=args.threads,
            o_direct=True,
            io_engine=args.io_engine,
        )
        if not engine.direct_io:
            raise SystemExit(f"O_DIRECT refused on {args.root}: {engine.o_direct_fallback_reason}")
        # 64 bytes past a page: O_DIRECT cannot read into this memory in place.
        src_owner = np.random.default_rng(7).integers(0, 256, n * size + 8192, dtype=np.uint8)
        dst_owner = np.ones(n * size + 8192, dtype=np.uint8)
        src = src_owner[64 - src_owner.ctypes.data % 4096 + 4096 :][: n * size]
        dst = dst_owner[64 - dst_owner.ctypes.data % 4096 + 4096 :][: n * size]
        assert src.ctypes.data % 4096 == 64 and dst.ctypes.data % 4096 == 64
        paths = [os.path.join(scratch, f"{b % 16:02x}", f"blk{b}.kvb") for b in range(n)]
        keys = [f"key-{b}".encode() for b in range(n)]

        def blocks(buf: np.ndarray, first: int, count: int) -> list[tuple[str, bytes, int, int]]:
            base = buf.ctypes.data
            return [(paths[b], keys[b], base + b * size, size) for b in range(first, first + count)]

        per_job = args.blocks_per_job
        jobs = [(first, min(per_job, n - first)) for first in range(0, n, per_job)]
        start = time.perf_counter()
        for i, (first, count) in enumerate(jobs):
            engine.submit_store(i, blocks(src, first, count))
        wait_for(engine, len(jobs))
        store_s = time.perf_counter() - start
        cpu0 = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        for i, (first, count) in enumerate(jobs):
            engine.submit_load(1000 + i, blocks(dst, first, count))
        wait_for(engine, len(jobs))
        load_s = time.perf_counter() - start
        cpu1 = resource.getrusage(resource.RUSAGE_SELF)
        engine.shutdown()
        if not np.array_equal(src, dst):
            raise SystemExit("the loaded bytes differ from the stored ones")
        cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
        total = n * size
        return {
            "load_gbps": total / load_s / 1e9,
            "store_gbps": total / store_s / 1e9,
            "load_cpu_s_per_gib": cpu / (total / (1 << 30)),
            "io_engine": engine.io_engine,
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def child(args: argparse.Namespace, pythonpath: str | None) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child"]
    command += ["--root", args.root, "--size", str(args.size), "--blocks", str(args.blocks)]
    command += ["--io-engine", args.io_engine, "--threads", str(args.threads)]
    command += ["--blocks-per-job", str(args.blocks_per_job)]
    env = dict(os.environ)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"a run failed:\n{done.stderr}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=tempfile.gettempdir(), help="directory to use")
    parser.add_argument("--size", type=parse_size, default=2 * MIB, help="block bytes")
    parser.add_argument("--blocks", type=int, default=128, help="blocks per run")
    parser.add_argument("--blocks-per-job", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=5, help="runs per build")
    parser.add_argument("--io-engine", default="psync", choices=("psync", "io_uring", "auto"))
    parser.add_argument("--threads", type=int, default=4, help="read and write threads each")
    parser.add_argument("--against", help="a directory holding another build's kvtier package")
    parser.add_argument("--json", help="also write the runs here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_once(args)))
        return
    builds: dict[str, str | None] = {"this": None}
    if args.against:
        builds["against"] = args.against
    runs: dict[str, list[dict]] = {name: [] for name in builds}
    for _ in range(args.repeat):
        for name, path in builds.items():
            runs[name].append(child(args, path))
    print(
        f"staged O_DIRECT, {args.blocks} x {args.size >> 10} KiB, {args.io_engine}, "
        f"{args.threads} + {args.threads} threads, load average {os.getloadavg()[0]:.1f}; "
        f"median (min-max) of {args.repeat} alternating runs"
    )
    for name, results in runs.items():
        cells = []
        for field in ("load_gbps", "store_gbps", "load_cpu_s_per_gib"):
            values = [r[field] for r in results]
            cells.append(
                f"{field} {statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"
            )
        label = name if builds[name] is None else f"{name} ({builds[name]})"
        print(f"  {label}: " + ", ".join(cells))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"args": vars(args), "runs": runs}, out, indent=2)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""CRC32C throughput of kvtier's checksum per implementation, block size and cache state.

    taskset -c 1 python bench/crc32c_speed.py [--impl all] [--sizes 4K,256K,2M]
        [--copy-sizes 256K,2M] [--repeat 21] [--pool 512M] [--json out.json]

For each implementation the CPU runs (`avx512-vpclmul`, `avx2-vpclmul`, `sse42` and `table` on
x86-64, `armv8-pmull`, `armv8-crc` and `table` on aarch64; each in a child process with
KVTIER_CRC32C_IMPL set, since the library reads it once) and each block size, two figures:

- in cache: one block, checksummed over and over (the kernel's own speed; a block that was
  just read or copied is in cache like this);
- out of cache: every block of a `--pool` buffer far larger than the last-level cache, in
  order (memory bandwidth counts).

Then the copy lines, on the implementation chosen automatically (or `--copy-impl`), for each
`--copy-sizes` block size, hot and out of cache as above (out of cache: a `--pool` source
copied into a second buffer as large): the copy alone (`memcpy`), the CRC alone (`crc`), a
`memcpy` then the CRC of the copy (`memcpy+crc`), the fused `crc32c_copy` (`fused`) and
`crc32c_copy_uncached` (`fused-uncached`: the fused copy with non-temporal stores, what the
engine copies a load out of its own buffer with). Their repetitions alternate (one run of
each in turn), so a change in the machine's load moves all five alike. GB/s counts the bytes
copied (or checksummed) once.

The blocks are timed in a C++ loop (`_core._crc32c_chunks`, `_core._crc32c_copy_chunks`),
not one Python call each. Each
figure is the median GB/s (10^9 bytes per second of the thread's CPU time, so time the CPU
spent on other processes does not count; the JSON also has wall-clock figures) of `--repeat`
runs of at least `--min-seconds`, with the spread (lowest-highest). Pin it to one CPU with
taskset: the children inherit the affinity, and the figure is per core.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import numpy as np
from kvtier.tiering.fs.capacity.sizes import parse_size

# kvtier::crc32c_implementation()'s names for this architecture, fastest first.
IMPLEMENTATIONS = {
    "x86_64": ("avx512-vpclmul", "avx2-vpclmul", "sse42", "table"),
    "aarch64": ("armv8-pmull", "armv8-crc", "table"),
}.get(platform.machine(), ("table",))


def summary(cpu_rates: list[float], wall_rates: list[float], bytes_per_run: int) -> dict:
    return {
        "median_gbps": statistics.median(cpu_rates),
        "min_gbps": min(cpu_rates),
        "max_gbps": max(cpu_rates),
        "wall_median_gbps": statistics.median(wall_rates),
        "runs": len(cpu_rates),
        "bytes_per_run": bytes_per_run,
    }


def time_runs(data: np.ndarray, chunk: int, passes: int, repeat: int) -> dict:
    """GB/s per run, over the thread's CPU time (the figure) and over wall-clock time."""
    from kvtier import _core

    cpu_rates, wall_rates = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.thread_time()
        _core._crc32c_chunks(data, chunk, passes)
        cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
        cpu_rates.append(data.size * passes / max(cpu, 1e-9) / 1e9)
        wall_rates.append(data.size * passes / wall / 1e9)
    return summary(cpu_rates, wall_rates, data.size * passes)


def measure(impl: str, sizes: list[int], pool_bytes: int, repeat: int, min_seconds: float) -> dict:
    """Runs in the child, whose KVTIER_CRC32C_IMPL names `impl`."""
    from kvtier import _core

    running = _core.crc32c_implementation()
    if running != impl:
        return {"implementation": impl, "skipped": f"this CPU does not run it (got {running})"}
    rng = np.random.default_rng(0)
    pool = rng.integers(0, 256, pool_bytes, dtype=np.uint8)
    # The loop's result is the XOR of the blocks' CRCs: check it once against single calls.
    sample = pool[: 3 * sizes[0] + 5]
    want = 0
    for at in range(0, sample.size, sizes[0]):
        want ^= _core.crc32c(sample[at : at + sizes[0]])
    assert _core._crc32c_chunks(sample, sizes[0]) == want, "benchmark loop disagrees"
    results: dict = {"implementation": impl, "in_cache": {}, "out_of_cache": {}}
    for size in sizes:
        block = np.ascontiguousarray(pool[:size])
        # Enough passes over the one block for a run of at least min_seconds.
        probe = max(1, int(64e6 // size))
        start = time.perf_counter()
        _core._crc32c_chunks(block, size, probe)
        per_pass = (time.perf_counter() - start) / probe  # wall time: runs of real length
        passes = max(1, int(min_seconds / max(per_pass, 1e-9)))
        results["in_cache"][size] = time_runs(block, size, passes, repeat)
        pool_passes = max(1, int(min_seconds / max(per_pass * pool_bytes / size, 1e-9)))
        results["out_of_cache"][size] = time_runs(pool, size, pool_passes, repeat)
    return results


COPY_MODES = ("memcpy", "crc", "memcpy+crc", "fused", "fused-uncached")


def time_copy_modes(dst: np.ndarray, src: np.ndarray, chunk: int, passes: int, repeat: int) -> dict:
    """GB/s per mode; the modes take turns within each repetition."""
    from kvtier import _core

    cpu_rates: dict[str, list[float]] = {m: [] for m in COPY_MODES}
    wall_rates: dict[str, list[float]] = {m: [] for m in COPY_MODES}
    for _ in range(repeat):
        for mode in COPY_MODES:
            wall, cpu = time.perf_counter(), time.thread_time()
            _core._crc32c_copy_chunks(dst, src, chunk, passes, mode)
            cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
            cpu_rates[mode].append(src.size * passes / max(cpu, 1e-9) / 1e9)
            wall_rates[mode].append(src.size * passes / wall / 1e9)
    return {m: summary(cpu_rates[m], wall_rates[m], src.size * passes) for m in COPY_MODES}


def measure_copy(
    impl: str, sizes: list[int], pool_bytes: int, repeat: int, min_seconds: float
) -> dict:
    """Runs in the child, whose KVTIER_CRC32C_IMPL names `impl` ('auto': the automatic one)."""
    from kvtier import _core

    running = _core.crc32c_implementation()
    if impl != "auto" and running != impl:
        return {"implementation": impl, "skipped": f"this CPU does not run it (got {running})"}
    rng = np.random.default_rng(1)
    src_pool = rng.integers(0, 256, pool_bytes, dtype=np.uint8)
    dst_pool = np.ones_like(src_pool)  # written once here, so no run pays its page faults
    # The fused result must be the CRC of the copy, and the copy exact.
    src_sample, dst_sample = src_pool[: 5 * sizes[0] + 3], dst_pool[: 5 * sizes[0] + 3]
    want = _core._crc32c_chunks(src_sample, sizes[0])
    assert _core._crc32c_copy_chunks(dst_sample, src_sample, sizes[0]) == want
    assert np.array_equal(dst_sample, src_sample), "the fused loop did not copy exactly"
    dst_sample[:] = 0
    assert _core._crc32c_copy_chunks(dst_sample, src_sample, sizes[0], 1, "fused-uncached") == want
    assert np.array_equal(dst_sample, src_sample), "the uncached loop did not copy exactly"
    results: dict = {"implementation": running, "in_cache": {}, "out_of_cache": {}}
    for size in sizes:
        src = np.ascontiguousarray(src_pool[:size])
        dst = np.ascontiguousarray(dst_pool[:size])
        probe = max(1, int(64e6 // size))
        start = time.perf_counter()
        _core._crc32c_copy_chunks(dst, src, size, probe, "memcpy+crc")
        per_pass = (time.perf_counter() - start) / probe
        passes = max(1, int(min_seconds / max(per_pass, 1e-9)))
        results["in_cache"][size] = time_copy_modes(dst, src, size, passes, repeat)
        pool_passes = max(1, int(min_seconds / max(per_pass * pool_bytes / size, 1e-9)))
        results["out_of_cache"][size] = time_copy_modes(
            dst_pool, src_pool, size, pool_passes, repeat
        )
    return results


def run_child(impl: str, args: argparse.Namespace, copy: bool = False) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", impl]
    command += ["--sizes", args.copy_sizes if copy else args.sizes]
    command += ["--pool", str(args.pool), "--repeat", str(args.repeat)]
    command += ["--min-seconds", str(args.min_seconds)]
    if copy:
        command.append("--child-copy")
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_CRC32C_IMPL"}
    if impl != "auto":
        env["KVTIER_CRC32C_IMPL"] = impl
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"measuring {impl} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def print_copy(result: dict, sizes: list[int], args: argparse.Namespace) -> None:
    if "skipped" in result:
        print(f"copy lines ({result['implementation']}) skipped: {result['skipped']}")
        return
    print(
        f"\ncopy and CRC32C on {result['implementation']}: median GB/s per CPU-second of "
        f"{args.repeat} alternating runs (lowest-highest); out of cache: a {args.pool >> 20} MiB "
        f"buffer copied block by block into another"
    )
    print(
        f"{'':<16}"
        + "".join(
            f"{f'{s >> 10} KiB in cache':>22}{f'{s >> 10} KiB out of cache':>22}" for s in sizes
        )
    )
    for mode in COPY_MODES:
        row = f"{mode:<16}"
        for size in sizes:
            for where in ("in_cache", "out_of_cache"):
                s = result[where][str(size)][mode]
                cell = f"{s['median_gbps']:.1f} ({s['min_gbps']:.1f}-{s['max_gbps']:.1f})"
                row += f"{cell:>22}"
        print(row, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--impl", default="all", help="comma-separated names, 'all', or '' (copy lines only)"
    )
    parser.add_argument("--sizes", default="4K,256K,2M", help="block sizes (comma-separated)")
    parser.add_argument(
        "--pool", type=parse_size, default=512 << 20, help="out-of-cache buffer bytes"
    )
    parser.add_argument("--repeat", type=int, default=21, help="timed runs per figure")
    parser.add_argument("--min-seconds", type=float, default=0.02, help="length of one run")
    parser.add_argument(
        "--copy-sizes",
        default="256K,2M",
        help="block sizes of the copy lines (comma-separated; empty: none)",
    )
    parser.add_argument(
        "--copy-impl", default="auto", help="the implementation of the copy lines (default: auto)"
    )
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--child-copy", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.child:
        run = measure_copy if args.child_copy else measure
        print(json.dumps(run(args.child, sizes, args.pool, args.repeat, args.min_seconds)))
        return

    from kvtier import _core

    names = IMPLEMENTATIONS if args.impl == "all" else tuple(n for n in args.impl.split(",") if n)
    affinity = sorted(os.sched_getaffinity(0))
    print(
        f"crc32c: automatic choice {_core.crc32c_implementation()}; CPUs allowed {affinity}"
        f"{'' if len(affinity) == 1 else ' (pin to one with taskset -c N for a per-core figure)'}"
    )
    print(
        f"median GB/s per CPU-second of {args.repeat} runs (lowest-highest); out of cache: "
        f"a {args.pool >> 20} MiB buffer block by block"
    )
    header = f"{'implementation':<16}" + "".join(
        f"{f'{s >> 10} KiB in cache':>22}{f'{s >> 10} KiB out of cache':>22}" for s in sizes
    )
    print(header)
    report: dict = {"affinity": affinity, "automatic": _core.crc32c_implementation(), "results": []}
    for name in names:
        result = run_child(name, args)
        report["results"].append(result)
        if "skipped" in result:
            print(f"{name:<16}skipped: {result['skipped']}")
            continue
        row = f"{name:<16}"
        for size in sizes:
            for where in ("in_cache", "out_of_cache"):
                s = result[where][str(size)]
                cell = f"{s['median_gbps']:.1f} ({s['min_gbps']:.1f}-{s['max_gbps']:.1f})"
                row += f"{cell:>22}"
        print(row, flush=True)
    copy_sizes = [parse_size(s) for s in args.copy_sizes.split(",") if s]
    if copy_sizes:
        copied = run_child(args.copy_impl, args, copy=True)
        report["copy"] = copied
        print_copy(copied, copy_sizes, args)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(report, out, indent=2)


if __name__ == "__main__":
    main()

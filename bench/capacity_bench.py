#!/usr/bin/env python3
"""Capacity measurements (docs/PERFORMANCE.md, "Capacity"): never part of the test run.

    python bench/capacity_bench.py steady  [--root DIR] [--budget 256M] [--total 768M] [--repeat 3]
                                           [--leaf-dirs]
    python bench/capacity_bench.py recency [--root DIR] [--samples 2000] [--repeat 3]
    python bench/capacity_bench.py evict   [--root DIR] [--total 1G]
    python bench/capacity_bench.py million [--root DIR] [--files 1000000] [--budget-fraction 0.5]
    python bench/capacity_bench.py submit  [--root DIR] [--budget 64M] [--jobs 4000] [--repeat 3]
                                           [--inflight 64] [--blocks-per-job 1] [--threads N]
    python bench/capacity_bench.py gcpause [--root DIR] [--files 262144] [--keys 1048576]
    python bench/capacity_bench.py churn   [--root DIR] [--files 2000] [--repeat 3] [--pause 0]

steady:  store throughput with a full cache (every store makes room) against the same run
         without a budget (which stores --budget first, untimed, and keeps it: as warm, as
         many files; since section 39), at 256 KiB and 2 MiB blocks, alternating run by run;
         CPU per GiB evicted = thread CPU of the tier's eviction passes / GiB they evicted.
         Each run has a fresh root; --leaf-dirs gives it the 65,536 leaf directories a cache
         that has run a while has (every walk of the root passes them).
evict:   process CPU and wall seconds per GiB to survey and evict real block files.
recency: p50 latency of one-block loads with the tier's recency bookkeeping against the
         same tier with it switched off (record_use replaced by a no-op), alternating.
submit:  p50/p99 of submit_store() calls (the caller's thread only) with a full budget
         against the same tier without one, alternating run by run; --blocks-per-job
         blocks of 256 KiB per job (default 1), at most --inflight jobs in flight. Both
         runs' tiers store --budget first, untimed (since section 38; before, only the
         budgeted run's root was filled, by another tier, and the budgeted run went first).
steady, submit and recency are kvtier.bench.capacity, which `kvtier bench --max-bytes` runs
too.
gcpause: the full garbage collection a process pays (GIL held) while it keeps a survey's
         candidates, as a tier does between passes: makes N empty block files, surveys
         them, then times gc.collect() with the candidates held and after they are dropped,
         then with a lookup cache of --keys known blocks.
churn:   what the file system itself charges per block, one thread, no kvtier: storing a new
         file (create, write, rename), reusing an evicted one in place (rename it aside,
         overwrite it with another block, rename it in) and evicting one (unlink). Wall and
         process CPU seconds per GiB of file, O_DIRECT where kvtier's probe finds it works, at
         256 KiB and 2 MiB, an untimed sync before each step. store / (store + unlink) is what
         a full cache that evicts by unlinking reaches over no budget where stores and unlinks
         cannot overlap (both on a saturated CPU, or both waiting for one device). --pause
         between rounds: on ext4 without a journal a round's creates pay for the deletes of
         the minute before (docs/PERFORMANCE.md section 6).
million: makes N small block files (sparse, 8 KiB each) with make_block_tree, then times a
         tier's constructor on that root without a ledger, the background scan until the
         ledger is complete, eviction down to the budget, and `kvtier du`.
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import random
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
from kvtier import _core
from kvtier.bench import capacity
from kvtier.tiering.fs.capacity import block_file_bytes, format_size, parse_size
from kvtier.tiering.fs.capacity.evictor import evict
from kvtier.tiering.fs.capacity.ledger import UsageLedger
from kvtier.tiering.fs.capacity.survey import survey
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="bench/capacity", dtype="float16")


@contextmanager
def scratch(root: Path) -> Iterator[Path]:
    """A fresh directory below ``root`` (which must exist), removed afterwards."""
    if not root.is_dir():
        raise SystemExit(f"capacity_bench: --root {root} is not a directory (create it first)")
    path = Path(tempfile.mkdtemp(prefix="kvtier-capacity-", dir=root))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def steady(args: argparse.Namespace) -> dict:
    rows = (256 << 10, 2 << 20)
    with scratch(args.root) as root:
        out = capacity.steady(
            root,
            rows,
            args.budget,
            args.total,
            args.repeat,
            inflight=args.inflight,
            threads=(args.threads, args.threads),
            leaf_dirs=args.leaf_dirs,
        )
    for entry in out.values():
        print(json.dumps({k: v for k, v in entry.items() if k != "runs"}))
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


CHURN_STEPS = ("store", "reuse", "unlink")


def churn_bytes(size: int, which: int) -> bytes:
    """The bytes "store" (0) and "reuse" (1) write: fixed, so that a test can check them."""
    return random.Random(which).randbytes(size)


def _churn_once(
    directory: Path, row: int, files: int, steps: tuple[str, ...] = CHURN_STEPS
) -> dict:
    """Run ``steps`` (in CHURN_STEPS' order) over ``files`` block files of a ``row``-byte
    payload in ``directory``: "store" makes 0.kvb.. holding churn_bytes(size, 0); "reuse"
    turns each into files+i.kvb in place, holding churn_bytes(size, 1); "unlink" removes
    those. Seconds per GiB of file."""
    size = block_file_bytes(row)
    # Page-aligned buffers, as O_DIRECT needs; a reused file gets another block's bytes.
    block, other = mmap.mmap(-1, size), mmap.mmap(-1, size)
    block.write(churn_bytes(size, 0))
    other.write(churn_bytes(size, 1))
    # kvtier's own probe (an aligned write, the created file removed whatever happens): a
    # file system without O_DIRECT is measured buffered, as kvtier falls back.
    direct = getattr(os, "O_DIRECT", 0) if _core.probe_o_direct(str(directory)) == "" else 0
    dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)

    def write(name: str, flags: int, data: mmap.mmap) -> None:
        fd = os.open(name, os.O_WRONLY | flags | direct, 0o644, dir_fd=dfd)
        try:
            if os.pwrite(fd, data, 0) != size:
                raise OSError(f"churn: short write to {name} in {directory}")
        finally:
            os.close(fd)

    def store(i: int) -> None:
        write(f"{i}.tmp", os.O_CREAT | os.O_EXCL, block)
        os.rename(f"{i}.tmp", f"{i}.kvb", src_dir_fd=dfd, dst_dir_fd=dfd)

    def reuse(i: int) -> None:
        os.rename(f"{i}.kvb", f"{i}.tmp", src_dir_fd=dfd, dst_dir_fd=dfd)
        write(f"{i}.tmp", 0, other)
        os.rename(f"{i}.tmp", f"{files + i}.kvb", src_dir_fd=dfd, dst_dir_fd=dfd)

    def unlink(i: int) -> None:
        os.unlink(f"{files + i}.kvb", dir_fd=dfd)

    gib = files * size / 2**30
    out: dict = {"o_direct": bool(direct)}
    step_of = {"store": store, "reuse": reuse, "unlink": unlink}
    try:
        for name in (n for n in CHURN_STEPS if n in steps):
            step = step_of[name]
            # Untimed: the last step's writeback (none with O_DIRECT but metadata) is not
            # charged to this one.
            os.sync()
            cpu0, t0 = time.process_time(), time.perf_counter()
            for i in range(files):
                step(i)
            out[f"{name}_wall_s_per_gib"] = (time.perf_counter() - t0) / gib
            out[f"{name}_cpu_s_per_gib"] = (time.process_time() - cpu0) / gib
    finally:
        os.close(dfd)
        block.close()
        other.close()
    return out


def churn(args: argparse.Namespace) -> dict:
    """Per block size, the median of ``repeat`` rounds of _churn_once, what a full cache that
    evicts by unlinking could reach over no budget if its stores and unlinks did not overlap
    (wall and CPU), and how much cheaper reuse is than a new file."""
    out: dict = {
        "root": str(args.root),
        "files": args.files,
        "repeat": args.repeat,
        "pause_s": args.pause,
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    first_round = True
    for row in (256 << 10, 2 << 20):
        rounds = []
        for _ in range(args.repeat):
            if not first_round:
                time.sleep(args.pause)
            first_round = False
            with scratch(args.root) as root:
                rounds.append(_churn_once(root, row, args.files))
        med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0] if k != "o_direct"}
        for kind in ("wall", "cpu"):
            store, unlink = med[f"store_{kind}_s_per_gib"], med[f"unlink_{kind}_s_per_gib"]
            reuse = med[f"reuse_{kind}_s_per_gib"]
            med[f"unlink_bound_{kind}"] = store / (store + unlink)
            med[f"store_over_reuse_{kind}"] = store / reuse
        entry = {k: round(v, 3) for k, v in med.items()}
        entry["o_direct"] = all(r["o_direct"] for r in rounds)
        out[format_size(row)] = entry
        print(json.dumps({format_size(row): entry}))
    return out


def recency(args: argparse.Namespace) -> dict:
    with scratch(args.root) as root:
        result = capacity.recency_cost(root, args.samples, args.repeat)
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


def gc_pause(args: argparse.Namespace) -> dict:
    import gc

    def collect_ms() -> float:
        times = []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            gc.collect()
            times.append((time.perf_counter() - t0) * 1e3)
        return round(float(np.median(times)), 2)

    with scratch(args.root) as root:
        make_block_tree(root, args.files, 0)
        found = survey(str(root), 1 << 62)
        held = collect_ms()
        n = len(found.candidates)
        del found
        result = {"candidates": n, "collect_ms_held": held, "collect_ms_dropped": collect_ms()}
    # The other thing a tier keeps that grows with the cache: its lookup cache of known blocks.
    from kvtier.tiering.base import make_offload_key
    from kvtier.tiering.fs.lookup import LookupCache

    cache = LookupCache(lambda key: "", False, "gcpause")
    cache.mark_present(make_offload_key(i.to_bytes(32, "big"), 0) for i in range(args.keys))
    result.update(lookup_keys=args.keys, collect_ms_lookup_cache=collect_ms())
    cache.close()
    print(json.dumps(result))
    return result


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


def submit_latency(args: argparse.Namespace) -> dict:
    if not 1 <= args.blocks_per_job <= 64:
        raise SystemExit(f"--blocks-per-job must be 1 to 64, got {args.blocks_per_job}")
    row = 256 << 10
    job_bytes = args.blocks_per_job * block_file_bytes(row)
    if job_bytes > args.budget // 2:  # a full cache must make room for one job at a time
        raise SystemExit(
            f"--budget {format_size(args.budget)} is too small for jobs of "
            f"{args.blocks_per_job} blocks ({format_size(job_bytes)} each): give at least "
            f"{format_size(2 * job_bytes)}"
        )
    with scratch(args.root) as root:
        result = capacity.submit_cost(
            root,
            row,
            args.budget,
            args.jobs,
            args.repeat,
            blocks_per_job=args.blocks_per_job,
            inflight=args.inflight,
            threads=None if args.threads is None else (args.threads, args.threads),
        )
    print(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="what", required=True)
    for name in ("steady", "recency", "evict", "million", "submit", "gcpause", "churn"):
        p = sub.add_parser(name)
        p.add_argument("--root", type=Path, default=Path("."))
        p.add_argument("--json", type=Path)
        if name == "steady":
            p.add_argument("--budget", type=parse_size, default=256 << 20)
            p.add_argument("--total", type=parse_size, default=768 << 20)
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument("--inflight", type=int, default=8, help="store jobs in flight")
            p.add_argument(
                "--threads",
                type=int,
                default=16,
                help="the tier's read and write threads (fewer than the CPUs leaves eviction "
                "a CPU of its own)",
            )
            p.add_argument(
                "--leaf-dirs",
                action="store_true",
                help="make the namespace's 65,536 leaf directories before each run, as a "
                "cache that has run a while has them",
            )
        if name == "recency":
            p.add_argument("--samples", type=int, default=2000)
            p.add_argument("--repeat", type=int, default=3)
        if name == "evict":
            p.add_argument("--total", type=parse_size, default=1 << 30)
        if name == "submit":
            p.add_argument("--budget", type=parse_size, default=64 << 20)
            p.add_argument("--jobs", type=int, default=4000)
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument("--inflight", type=int, default=64, help="store jobs in flight")
            p.add_argument(
                "--blocks-per-job", type=int, default=1, help="blocks per store job (1 to 64)"
            )
            p.add_argument(
                "--threads",
                type=int,
                default=None,
                help="the tier's read and write threads (default: the tier's own)",
            )
        if name == "gcpause":
            p.add_argument("--files", type=int, default=1 << 18)
            p.add_argument("--keys", type=int, default=1 << 20, help="lookup cache keys")
            p.add_argument("--repeat", type=int, default=5)
        if name == "churn":
            p.add_argument("--files", type=int, default=2000, help="blocks per step")
            p.add_argument("--repeat", type=int, default=3)
            p.add_argument(
                "--pause",
                type=float,
                default=0.0,
                help="seconds between rounds (ext4 without a journal: over 60, so that a "
                "round's creates do not pay for the last round's deletes)",
            )
        if name == "million":
            p.add_argument("--files", type=int, default=1_000_000)
            p.add_argument("--budget-fraction", type=float, default=0.5)
    args = parser.parse_args()
    commands = {
        "steady": steady,
        "recency": recency,
        "evict": evict_cost,
        "million": million,
        "submit": submit_latency,
        "gcpause": gc_pause,
        "churn": churn,
    }
    result = commands[args.what](args)
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()

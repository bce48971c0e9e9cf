#!/usr/bin/env python3
"""How often a submit finds the engine's scheduler busy (docs/PERFORMANCE.md section 19).

One ``kvtier._core.Engine`` per thread count, on ``--root``: the caller stores ``--jobs`` jobs
of ``--blocks-per-job`` blocks as fast as it can submit them (the pattern of ``kvtier bench``'s
loop measurement), then loads them back in jobs of 4 blocks, one at a time, while a second
flood of stores runs (its latency measurement). Each phase prints the engine's
``intake_submits`` (jobs whose submit left them to the intake thread instead of waiting for
the scheduler's mutex) against the jobs it submitted.

    python bench/intake_submits.py --root /dev/shm --threads 4,16 --size 256K --repeat 3
"""

from __future__ import annotations

import argparse
import ctypes
import shutil
import tempfile
import time
from pathlib import Path

from kvtier import _core
from kvtier.bench.config import parse_size


def _wait(engine: _core.Engine, pending: set[int], until_done: set[int]) -> None:
    """Pops completions (dropping them from ``pending``) until none of ``until_done`` is
    pending."""
    while pending & until_done:
        for c in engine.pop_completions():
            if not c.success:
                raise RuntimeError(f"job {c.job_id} failed: {c.error}")
            pending.discard(c.job_id)
        time.sleep(0.0001)


def _phase(
    threads: int, root: Path, size: int, jobs: int, per_job: int
) -> tuple[int, int, int, int]:
    engine = _core.Engine(str(root), n_read_threads=threads, n_write_threads=threads)
    data = ctypes.create_string_buffer(b"\x5a" * size)
    back = ctypes.create_string_buffer(size * 4)
    try:
        # The flood: every store job submitted at once.
        ids: set[int] = set()
        for j in range(jobs):
            blocks = [
                (str(root / f"a{j}-{b}"), b"k%d" % b, ctypes.addressof(data), size)
                for b in range(per_job)
            ]
            engine.submit_store(j, blocks)
            ids.add(j)
        _wait(engine, ids, set(ids))
        flood = engine.stats()["intake_submits"]
        # Loads of 4 blocks one at a time, under a second flood of stores.
        for j in range(jobs):
            blocks = [
                (str(root / f"b{j}-{b}"), b"k%d" % b, ctypes.addressof(data), size)
                for b in range(per_job)
            ]
            engine.submit_store(jobs + j, blocks)
            ids.add(jobs + j)
        loads = 0
        for j in range(jobs):
            blocks = [
                (str(root / f"a{j}-{b}"), b"k%d" % b, ctypes.addressof(back) + b * size, size)
                for b in range(4)
            ]
            engine.submit_load(2 * jobs + j, blocks)
            ids.add(2 * jobs + j)
            loads += 1
            _wait(engine, ids, {2 * jobs + j})
        _wait(engine, ids, set(ids))
        during = engine.stats()["intake_submits"] - flood
        return flood, jobs, during, jobs + loads
    finally:
        engine.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default="/dev/shm")
    parser.add_argument("--threads", default="4,16", help="read = write threads, comma-separated")
    parser.add_argument("--size", default="256K")
    parser.add_argument("--jobs", type=int, default=64)
    parser.add_argument("--blocks-per-job", type=int, default=16)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    size = parse_size(args.size)
    print("threads run | flood: deferred/submits | loads under a flood: deferred/submits")
    for threads in (int(t) for t in args.threads.split(",")):
        for run in range(args.repeat):
            root = Path(tempfile.mkdtemp(prefix="kvtier-intake-", dir=args.root))
            try:
                a, n, b, m = _phase(threads, root, size, args.jobs, args.blocks_per_job)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            print(f"{threads}+{threads} {run + 1} | {a}/{n} | {b}/{m}")


if __name__ == "__main__":
    main()

"""Where the slowest submit_store() calls of a tier with a full budget spend their time.

    python bench/submit_steps.py [--root /dev/shm] [--budget 64M] [--jobs 8000] [--inflight 8]
                                 [--slowest 80]

Fills a budget of 256 KiB blocks (so that every later store makes room), then times each
submit_store() of one-block jobs on the caller's thread and, inside it, the tier's steps
(the job's checks, the block paths, the budget's admission, the engine's submit), by
wrapping those methods of this one tier instance. Prints p50/p99 and, summed over the
slowest calls, the time per step; "other" is what no step covers (the tier's lock, the GIL
between steps). docs/PERFORMANCE.md section 23 used it to find the GIL taken back after the
engine's submit. Never part of the test run.
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from kvtier.tiering.base import JobMetadata, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes, parse_size
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="bench/submit-steps", dtype="float16")
ROW = 256 << 10
ROWS = 8


def _wrap(obj: Any, name: str, steps: dict[str, float]) -> None:
    """Adds the seconds each call of obj.name takes to steps[name]."""
    inner: Callable[..., Any] = getattr(obj, name)

    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            steps[name] = steps.get(name, 0.0) + time.perf_counter() - started

    setattr(obj, name, timed)


def _job(j: int) -> JobMetadata:
    return JobMetadata(j, [make_offload_key(j.to_bytes(32, "big"), 0)], np.array([j % ROWS]),
                       False, None)  # fmt: skip


Calls = list[tuple[float, dict[str, float]]]  # each call's seconds, and its steps'


def _store_all(
    tier: FileSystemTierManager, first: int, jobs: int, inflight: int,
    steps: dict[str, float] | None = None,
) -> Calls:  # fmt: skip
    calls, pending = [], 0
    for j in range(first, first + jobs):
        while pending >= inflight:
            pending -= len(tier.get_finished())
            time.sleep(0.0001)
        if steps is not None:
            steps.clear()
        started = time.perf_counter()
        tier.submit_store(_job(j))
        calls.append((time.perf_counter() - started, dict(steps or {})))
        pending += 1
    tier.drain_jobs()
    tier.get_finished()
    return calls


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("/dev/shm"))
    p.add_argument("--budget", type=parse_size, default=64 << 20)
    p.add_argument("--jobs", type=int, default=8000)
    p.add_argument("--inflight", type=int, default=8, help="store jobs in flight")
    p.add_argument("--slowest", type=int, default=80, help="calls summed per step")
    args = p.parse_args()
    if not args.root.is_dir():
        sys.exit(f"submit_steps: --root {args.root} is not a directory (create it first)")
    root = Path(tempfile.mkdtemp(prefix="kvtier-submit-steps-", dir=args.root))
    buf = np.random.default_rng(0).integers(0, 256, (ROWS, ROW), dtype=np.uint8)
    tier = FileSystemTierManager(SPEC, memoryview(buf), "fs", root_dir=str(root),
                                 min_free_fraction=0, max_bytes=args.budget,
                                 max_queued_store_jobs=4 * args.inflight)  # fmt: skip
    try:
        fill = args.budget // block_file_bytes(ROW)
        _store_all(tier, 0, fill, 8)  # a full cache: every store below makes room
        steps: dict[str, float] = {}
        for name in ("_check_job", "_blocks", "_admitted"):
            _wrap(tier, name, steps)
        _wrap(tier._capacity, "admit", steps)
        calls = _store_all(tier, fill, args.jobs, args.inflight, steps)
    finally:
        tier.shutdown()
        shutil.rmtree(root, ignore_errors=True)
    seconds = np.array([c[0] for c in calls])
    p50, p99 = np.quantile(seconds, [0.5, 0.99]) * 1e6
    print(f"submit_store: p50 {p50:.1f} us, p99 {p99:.1f} us ({len(calls)} calls)")
    slowest = sorted(calls, key=lambda c: -c[0])[: args.slowest]
    total: collections.Counter[str] = collections.Counter()
    for took, parts in slowest:
        total.update(parts)
        total["other"] += took - sum(parts.values())
    print(
        f"the slowest {len(slowest)} calls, us per step (_admitted includes the engine's submit):"
    )
    for name, s in total.most_common():
        print(f"  {name:12s} {s * 1e6:10.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

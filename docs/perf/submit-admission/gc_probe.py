"""What the slowest submit_store() calls of `capacity_bench.py submit` do (section 33).

    python docs/perf/submit-admission/gc_probe.py [--root /dev/shm] [--inflight 64]

Runs the bench's submit measurement (a full 64 MiB budget of 256 KiB blocks, 4,000 one-block
stores) twice each way, budget and none, and prints for each run: the p50 and p99 of the
calls, how many of the slowest 1% ran a young collection of the garbage collector on the
caller's thread, how many collections that thread ran in all, the collector's count of new
objects each call left behind (median), and how many stores waited for budget (deferred).
"""

from __future__ import annotations

import argparse
import gc
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
import capacity_bench as cb  # noqa: E402

from kvtier.tiering.base import JobMetadata, make_offload_key  # noqa: E402
from kvtier.tiering.fs.capacity import controller  # noqa: E402

answers: list[str] = []
collections = [0]
_admit = controller.CapacityController.admit


def admit(self, n, then=None, paths=(), spares=None):  # type: ignore[no-untyped-def]
    answer = _admit(self, n, then, paths, spares)
    answers.append("deferred" if answer is controller.DEFERRED else "admitted")
    return answer


def on_gc(phase: str, info: dict) -> None:
    if phase == "start" and threading.current_thread() is threading.main_thread():
        collections[0] += 1


def run(root: Path, row: int, jobs: int, inflight: int, budget: int | None) -> list:
    rows = 8
    buf = np.random.default_rng(0).integers(0, 256, (rows, row), dtype=np.uint8)
    options = {"min_free_fraction": 0, "max_queued_store_jobs": 4 * inflight}
    if budget is not None:
        options["max_bytes"] = budget
    tier = cb.FileSystemTierManager(cb.SPEC, memoryview(buf), "fs", root_dir=str(root), **options)
    calls, pending = [], 0
    try:
        for j in range(jobs):
            while pending >= inflight:
                pending -= len(tier.get_finished())
                time.sleep(0.0001)
            keys = [make_offload_key(j.to_bytes(32, "big"), 0)]
            job = JobMetadata(j, keys, np.array([j % rows]), False, None)
            answers.clear()
            ran, count = collections[0], gc.get_count()[0]
            started = time.perf_counter()
            tier.submit_store(job)
            took = time.perf_counter() - started
            calls.append((took, collections[0] - ran, gc.get_count()[0] - count, tuple(answers)))
            pending += 1
        tier.drain_jobs()
    finally:
        tier.shutdown()
    return calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--root", default="/dev/shm")
    p.add_argument("--inflight", type=int, default=64)
    args = p.parse_args()
    controller.CapacityController.admit = admit  # type: ignore[method-assign]
    gc.callbacks.append(on_gc)
    row, budget = 256 << 10, 64 << 20
    for kind in ("budget", "none", "budget", "none"):
        with tempfile.TemporaryDirectory(dir=args.root) as d:
            b = budget if kind == "budget" else None
            if b is not None:  # a full cache: every store makes room
                run(Path(d), row, b // cb.block_file_bytes(row), 8, b)
            calls = run(Path(d), row, 4000, args.inflight, b)
        took = np.array([c[0] for c in calls])
        p99 = np.quantile(took, 0.99)
        slow = [c for c in calls if c[0] >= p99]
        print(
            f"{kind}: p50 {np.median(took) * 1e6:.1f} us, p99 {p99 * 1e6:.1f} us; "
            f"slowest 1% with a collection: {sum(c[1] > 0 for c in slow)} of {len(slow)}; "
            f"collections on the caller's thread: {sum(c[1] for c in calls)}; "
            f"new objects per call: {np.median([c[2] for c in calls if c[1] == 0]):.0f}; "
            f"{dict(Counter(a for c in calls for a in c[3]))}"
        )


if __name__ == "__main__":
    main()

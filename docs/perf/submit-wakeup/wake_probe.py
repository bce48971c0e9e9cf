"""Where the slowest submit_store() calls of `capacity_bench.py submit` spend their time
(section 35).

    python docs/perf/submit-wakeup/wake_probe.py [--root /dev/shm] [--blocks-per-job 16]

Fills a budget (1 GiB for jobs of several blocks, 64 MiB for one-block jobs, as the bench's
runs; since the bench moved to kvtier.bench.capacity, on the measured tier itself), then times
1,000 (or 4,000 one-block) stores three times. For each run it prints the p99 of the calls
and, for the slowest 1%, the median time spent in admission (`CapacityController.admit`) and
in its wake-up of the capacity thread (`_poke`), the longest admission, and how many of all
the calls found the thread asleep and woke it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvtier.bench import capacity
from kvtier.tiering.fs import manager
from kvtier.tiering.fs.capacity import controller

Controller = controller.CapacityController
ROW = 256 << 10


def _timed(record: dict[str, float], name: str, method):
    def call(self, *args, **kwargs):
        started = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            record[name] = record.get(name, 0.0) + time.perf_counter() - started

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/dev/shm")
    parser.add_argument("--blocks-per-job", type=int, default=16)
    parser.add_argument("--inflight", type=int, default=64)
    args = parser.parse_args()
    per_job = args.blocks_per_job
    budget = (1 << 30) if per_job > 1 else (64 << 20)
    jobs = 1000 if per_job > 1 else 4000

    call: dict[str, float] = {}
    woken = [0]
    Controller.admit = _timed(call, "admit", Controller.admit)
    poke = Controller._poke

    # Before this section's change every request not already pending woke the thread; since,
    # only one that finds it asleep (the build has _sleep) does.
    idle_only = hasattr(Controller, "_sleep")

    def counting_poke(self) -> None:
        woken[0] += not self._poked and not (idle_only and self._busy)
        poke(self)

    Controller._poke = _timed(call, "poke", counting_poke)
    submit = manager.FileSystemTierManager.submit_store
    calls: list[tuple[float, float, float]] = []

    def timed_submit(self, job) -> None:
        call.clear()
        started = time.perf_counter()
        submit(self, job)
        calls.append((time.perf_counter() - started, call.get("admit", 0.0), call.get("poke", 0.0)))

    manager.FileSystemTierManager.submit_store = timed_submit
    fill = capacity._fill

    def fill_then_count(*a, **k) -> None:  # the filling stores are not counted
        fill(*a, **k)
        calls.clear()
        woken[0] = 0

    capacity._fill = fill_then_count
    for run in range(3):
        with tempfile.TemporaryDirectory(dir=args.root) as d:
            capacity.submit_latencies(
                Path(d), ROW, jobs, budget, blocks_per_job=per_job, inflight=args.inflight
            )
        calls.sort(reverse=True)
        n = len(calls) // 100
        slow = calls[:n]
        us = 1e6
        print(
            f"run {run}: p99 {calls[n][0] * us:.0f} us; slowest {n}: "
            f"admission {statistics.median(c[1] for c in slow) * us:.0f} us, "
            f"of it the wake-up {statistics.median(c[2] for c in slow) * us:.0f} us (medians), "
            f"longest admission {max(c[1] for c in slow) * us:.0f} us; "
            f"calls that woke the thread: {woken[0]} of {len(calls)}",
            flush=True,
        )


if __name__ == "__main__":
    main()

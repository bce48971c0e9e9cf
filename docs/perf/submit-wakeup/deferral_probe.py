"""How many stores of `capacity_bench.py submit` wait for room, and the eviction passes that
make it (section 35).

    python docs/perf/submit-wakeup/deferral_probe.py [--root /dev/shm] [--inflight 8]
        [--blocks-per-job 1]

Fills the bench's budget (64 MiB for one-block jobs, 1 GiB otherwise; since the bench moved
to kvtier.bench.capacity, on the measured tier itself), stores 4,000 (or 1,000)
jobs, and prints how many admissions answered DEFERRED, how many passes ran, their median
duration, and the median count of kept files before and after a pass.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from kvtier.bench import capacity
from kvtier.tiering.fs.capacity import controller

Controller = controller.CapacityController
ROW = 256 << 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default="/dev/shm")
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--blocks-per-job", type=int, default=1)
    args = parser.parse_args()
    per_job = args.blocks_per_job
    budget = (64 << 20) if per_job == 1 else (1 << 30)
    answers: Counter[str] = Counter()
    passes: list[tuple[float, int, int]] = []
    admit, locked_pass = Controller.admit, Controller._locked_pass

    def counting_admit(self, *a, **k):
        answer = admit(self, *a, **k)
        answers["deferred" if answer is controller.DEFERRED else "at once"] += 1
        return answer

    def timed_pass(self) -> None:
        started, kept = time.perf_counter(), len(self._spares)
        locked_pass(self)
        passes.append((time.perf_counter() - started, kept, len(self._spares)))

    Controller.admit, Controller._locked_pass = counting_admit, timed_pass
    fill = capacity._fill

    def fill_then_count(*a, **k) -> None:  # the filling stores are not counted
        fill(*a, **k)
        answers.clear()
        passes.clear()

    capacity._fill = fill_then_count
    with tempfile.TemporaryDirectory(dir=args.root) as d:
        jobs = 4000 if per_job == 1 else 1000
        capacity.submit_latencies(
            Path(d), ROW, jobs, budget, blocks_per_job=per_job, inflight=args.inflight
        )
    print(
        f"in flight {args.inflight}, {per_job} block(s) per job: {dict(answers)}; "
        f"{len(passes)} passes, median {statistics.median(p[0] for p in passes) * 1e3:.2f} ms; "
        f"kept files before/after a pass (medians) {statistics.median(p[1] for p in passes)}/"
        f"{statistics.median(p[2] for p in passes)}"
    )


if __name__ == "__main__":
    main()

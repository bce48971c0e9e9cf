"""A full cache that recycles, with store jobs in flight for more than its whole budget
(section 38): kvtier.bench.capacity.store_run (8-block jobs, 8 in flight) into a budget of a
few jobs, on /dev/shm. Prints GB/s, the jobs refused (ENOSPC after STORE_WAIT_SECONDS), the
stores that took a kept file, and the wall time.

    python docs/perf/recycle-waiting/whole_budget_probe.py ROW BUDGET [ROOT]
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path

from kvtier.bench import capacity

logging.basicConfig(level=logging.CRITICAL)  # the refusals are counted, not logged
row, budget = int(sys.argv[1]), int(sys.argv[2])
with tempfile.TemporaryDirectory(dir=sys.argv[3] if len(sys.argv) > 3 else "/dev/shm") as d:
    started = time.perf_counter()
    run = capacity.store_run(Path(d), row, 2 * budget, budget, 10**9)
    print(
        f"row {row >> 10} KiB, budget {budget >> 20} MiB: {run['gbps']:.3f} GB/s, "
        f"{run['refused_jobs']} jobs refused, {run['recycled_blocks']} stores took a kept file, "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )

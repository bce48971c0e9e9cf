#!/usr/bin/env python3
"""`submit_store` p99 with a full budget against none, with the caller's thread on a CPU of
its own or not (docs/PERFORMANCE.md section 39, issue 18).

Runs kvtier.bench.capacity.submit_latencies as `kvtier bench --max-bytes` does (8 blocks of
256 KiB per job, 8 jobs in flight, both tiers storing the budget first), ``--repeat`` pairs,
budget first in each pair. With ``--split``, the tier is created while the calling thread is
bound to the second of the CPUs this process may use, so that every thread it starts (I/O
workers, the capacity thread and, later, the eviction threads it starts) inherits it; the
caller then binds itself to the first for the timed calls. Prints the p99 of all calls of
each kind, their ratio, each pair's own ratio, and where in the run the budgeted calls slower
than the unbudgeted p99 fell (8 bins). The unbudgeted run keeps what it stores: the budget
and then ``--jobs`` x 2 MiB (about 8.4 GB for 4,000 jobs) must fit on ``--root``.

    python docs/perf/submit-p99-cpu/split_probe.py --root /dev/shm --jobs 4000 [--split]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

import kvtier.bench.capacity as capacity
import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("/dev/shm"))
    p.add_argument("--budget-mib", type=int, default=512)
    p.add_argument("--jobs", type=int, default=4000)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--split", action="store_true")
    args = p.parse_args()
    if args.split:
        everything = os.sched_getaffinity(0)
        if len(everything) < 2:
            raise SystemExit("--split needs two CPUs")
        caller_cpu, tier_cpu = sorted(everything)[:2]
        make_tier = capacity._tier

        @contextlib.contextmanager
        def tier_on_its_own_cpu(*a, **k):
            os.sched_setaffinity(0, {tier_cpu})
            try:
                with make_tier(*a, **k) as tier:
                    os.sched_setaffinity(0, {caller_cpu})
                    yield tier
            finally:
                os.sched_setaffinity(0, everything)

        capacity._tier = tier_on_its_own_cpu
    budget = args.budget_mib << 20
    runs: dict[str, list[np.ndarray]] = {"budget": [], "none": []}
    for rep in range(args.repeat):
        for name, limit in (("budget", budget), ("none", None)):
            directory = Path(tempfile.mkdtemp(dir=args.root))
            try:
                with capacity._quiet_refusals():
                    out = capacity.submit_latencies(
                        directory, 256 << 10, args.jobs, limit, blocks_per_job=8, inflight=8,
                        first=10**9 * (rep + 1), before=budget,
                    )  # fmt: skip
            finally:
                shutil.rmtree(directory, ignore_errors=True)
            runs[name].append(np.array(out["seconds"]) * 1e6)
    b, n = np.array(runs["budget"]), np.array(runs["none"])
    p99b, p99n = np.quantile(b, 0.99), np.quantile(n, 0.99)
    pairs = [np.quantile(x, 0.99) / np.quantile(y, 0.99) for x, y in zip(b, n)]
    slow = np.nonzero(b > p99n)[1]
    print(
        f"{'split' if args.split else 'shared'}: p99 budget {p99b:.0f} us, none {p99n:.0f} us, "
        f"ratio {p99b / p99n:.2f} (pairs {', '.join(f'{r:.2f}' for r in pairs)}); "
        f"p50 {np.median(b):.0f} / {np.median(n):.0f} us; {b.size} calls each; budgeted calls "
        f"over the unbudgeted p99 by eighth of the run: "
        f"{np.histogram(slow, bins=8, range=(0, args.jobs))[0].tolist()}"
    )


if __name__ == "__main__":
    main()

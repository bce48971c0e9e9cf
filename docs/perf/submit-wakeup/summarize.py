"""Medians of section 35's alternating runs: python summarize.py set1 [set2 ...]

Files are KIND-BUILD-N.txt: "old" is main at dbd5aee, "new" this change (in sets 1 and 2,
the bell alone); set 5 has "room" (this change) and "half" (a variant that also woke the
thread at half of the kept files).
"""

import glob
import json
import statistics
import sys


def last_json(path: str) -> dict:
    return json.loads(open(path).read().strip().splitlines()[-1])


for folder in sys.argv[1:]:
    for kind in ("s16", "s64", "s8"):
        for build in ("old", "new", "room", "half"):
            runs = [last_json(f) for f in sorted(glob.glob(f"{folder}/{kind}-{build}-*.txt"))]
            if not runs:
                continue
            ratios = [r["p99_ratio"] for r in runs]
            p99 = [r["budget"]["p99_us"] for r in runs]
            print(
                f"{folder} {kind} {build}: p99 ratio median {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}); budgeted p99 median "
                f"{statistics.median(p99):.1f} us; p50 budget/none "
                f"{statistics.median(r['budget']['p50_us'] for r in runs):.1f}/"
                f"{statistics.median(r['none']['p50_us'] for r in runs):.1f} us"
            )

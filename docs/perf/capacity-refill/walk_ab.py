"""The walk alone (docs/PERFORMANCE.md section 27): the Python survey of 1f66b0a against the
native one, on the same tree, alternating; CPU and wall seconds per call. The old walk is
loaded from copies next to this script, made with
    git show 1f66b0a:python/kvtier/tiering/fs/capacity/scanner.py > old_scanner.py
    git show 1f66b0a:python/kvtier/tiering/fs/capacity/survey.py | \
        sed 's/from kvtier.tiering.fs.capacity.scanner import/from old_scanner import/' > old_survey.py
Run from the repository root: python docs/perf/capacity-refill/walk_ab.py ROOT NFILES
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, "bench")
from pathlib import Path

import old_survey
from capacity_bench import make_block_tree
from kvtier.tiering.fs.capacity.survey import survey

root = Path(sys.argv[1])
n = int(sys.argv[2])
if not root.exists():
    t = time.perf_counter()
    make_block_tree(root, n)
    print(f"made {n} files in {time.perf_counter() - t:.1f} s")
res = {"python": [], "native": []}
for r in range(3):
    for name, f in (
        (("python", old_survey.survey), ("native", survey))
        if r % 2 == 0
        else (("native", survey), ("python", old_survey.survey))
    ):
        c, w = time.process_time(), time.perf_counter()
        s = f(str(root), 1 << 62)
        res[name].append((time.process_time() - c, time.perf_counter() - w))
        print(
            f"{name}: {s.blocks} blocks, {len(s.candidates)} candidates, cpu {res[name][-1][0]:.2f} s wall {res[name][-1][1]:.2f} s",
            flush=True,
        )
for k, v in res.items():
    print(
        f"{k} median cpu {statistics.median(x[0] for x in v):.2f} s, wall {statistics.median(x[1] for x in v):.2f} s"
    )

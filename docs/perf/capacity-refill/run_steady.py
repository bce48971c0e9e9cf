"""One build's steady measurement (docs/PERFORMANCE.md section 27), with the same harness for
every build: python/kvtier/bench/capacity.py of commit 5d99743 copied next to this script as
capacity_harness.py (the build before it has no leaf_dirs). Run with PYTHONPATH=<a build>
(and AB_DIR=<a directory> for a scratch root elsewhere than /dev/shm):
    python run_steady.py OUT.json leaf|fresh
"""

import json
import os
import shutil
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pathlib import Path

import capacity_harness as H

out, leaf = sys.argv[1], sys.argv[2] == "leaf"
root = Path(tempfile.mkdtemp(prefix="ab-", dir=os.environ.get("AB_DIR", "/dev/shm")))
try:
    res = H.steady(root, (256 << 10, 2 << 20), 256 << 20, 768 << 20, 2, leaf_dirs=leaf)
finally:
    shutil.rmtree(root, ignore_errors=True)
json.dump(res, open(out, "w"))
for v in res.values():
    print(
        v["label"],
        "ratio %.3f full %.2f none %.2f evictcpu %.3f"
        % (
            v["ratio"],
            v["store_gbps_full_cache"],
            v["store_gbps_no_budget"],
            v["eviction_cpu_s_per_gib"],
        ),
    )

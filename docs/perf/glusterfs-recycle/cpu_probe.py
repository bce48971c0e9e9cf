"""Where a full cache's time goes on GlusterFS: the whole machine's CPU, and the GlusterFS
daemons' own, while one tier stores without a budget and then into a full cache.

    python docs/perf/glusterfs-recycle/cpu_probe.py ROOT ROW BUDGET TOTAL PAIRS

ROOT is a directory on the mount (after `.ci/glusterfs.sh up`: /tmp/kvtier-gluster/hostA);
ROW, BUDGET and TOTAL are bytes. Each pair runs kvtier.bench.capacity.store_run without a
budget, then with BUDGET (its fill of BUDGET bytes included in the window: the counters are
read around the whole call), and prints GB/s (of the timed stores alone), how busy the
machine's CPUs were (/proc/stat), this process's CPU, and the CPU seconds of every process
whose name contains "gluster" (the brick's glusterfsd, the FUSE clients' glusterfs).
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from kvtier.bench import capacity


def cpu_jiffies() -> tuple[int, int]:
    """(all, idle) jiffies of the machine since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def gluster_jiffies() -> dict[str, int]:
    """User + system jiffies of each GlusterFS process, by "name:pid"."""
    out = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            if "gluster" in name:
                stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                out[f"{name}:{pid}"] = int(stat[11]) + int(stat[12])
        except OSError:
            pass
    return out


def main() -> None:
    root, row, budget, total, pairs = Path(sys.argv[1]), *map(int, sys.argv[2:6])
    hz = os.sysconf("SC_CLK_TCK")
    for pair in range(pairs):
        for name, limit in (("no budget", None), ("full cache", budget)):
            directory = Path(tempfile.mkdtemp(dir=root))
            all0, idle0 = cpu_jiffies()
            gl0, cpu0, wall0 = gluster_jiffies(), time.process_time(), time.perf_counter()
            run = capacity.store_run(directory, row, total, limit, 10**9 * (pair + 1))
            all1, idle1 = cpu_jiffies()
            gl1, cpu1, wall1 = gluster_jiffies(), time.process_time(), time.perf_counter()
            shutil.rmtree(directory, ignore_errors=True)
            daemons = {k: (gl1[k] - v) / hz for k, v in gl0.items() if k in gl1}
            busy = 100 * (1 - (idle1 - idle0) / (all1 - all0))
            print(
                f"{name:10s} {row >> 10} KiB: {run['gbps']:.3f} GB/s; "
                f"window {wall1 - wall0:.1f} s, CPUs busy {busy:.0f}%, "
                f"this process {cpu1 - cpu0:.1f} s, GlusterFS "
                + ", ".join(f"{k} {v:.1f} s" for k, v in sorted(daemons.items()) if v > 0),
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Section 36: ext4 loads under one build, for alternating processes of two builds.

    BS=2097152 N=160 LAYOUT=thp python ab_load.py /tmp store   # once, any build
    python ab_load.py /tmp load     # per process; TO= io_timeout_s (10), ENG= io_engine, T= threads

Loads the N blocks 4 times with kvtier._core.Engine (4 + 4 workers, O_DIRECT) and prints the
GB/s and process CPU s/GiB of the last three passes, sorted.
"""
import sys, os, shutil
from pathlib import Path
from kvtier import _core
from kvtier.bench.workload import PrimaryMemory
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from engine_throughput import _run_direction
root = Path(sys.argv[1]); bs = int(os.environ.get("BS", 2 << 20)); n = int(os.environ.get("N", 96)); total = n * bs
pm = PrimaryMemory(n, bs, os.environ.get("LAYOUT", "thp")); pm.fill(1)
d = root / "abload"
base = _core.buffer_address(pm.view, True)
blocks = [(f"{d}/{i % 64:02x}/{i}.blk", b"k%d" % i, base + i * bs, bs) for i in range(n)]
jobs = [(1 + j, blocks[s:s + 16]) for j, s in enumerate(range(0, n, 16))]
if sys.argv[2] == "store":
    shutil.rmtree(d, ignore_errors=True); d.mkdir()
    e = _core.Engine(str(d), n_read_threads=4, n_write_threads=4, o_direct=True)
    _run_direction(e, e.submit_store, jobs); e.shutdown(); os.system("sync"); sys.exit()
jid = 1000
res = []
e = _core.Engine(str(d), n_read_threads=int(os.environ.get("T", 4)), n_write_threads=4, o_direct=True, io_timeout_s=float(os.environ.get("TO", 10)), io_engine=os.environ.get("ENG", "auto"))
for p in range(4):
    lj = [(jid + k, b) for k, (_, b) in enumerate(jobs)]; jid += len(lj)
    s, c = _run_direction(e, e.submit_load, lj)
    if p: res.append((total / s / 1e9, c / (total / 2**30)))
e.shutdown()
res.sort()
print(f"GB/s {' '.join(f'{g:.2f}' for g,_ in res)}  CPU s/GiB {' '.join(f'{c:.3f}' for _,c in sorted(res, key=lambda r: r[1]))}")

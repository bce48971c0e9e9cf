"""Section 36: the deadline's copy-out with crc32c_copy and with crc32c_copy_uncached, paired
in one process.

    git apply toggle.patch && pip install -e .    # a build whose copy-out reads KVTIER_CACHED
    python uncached_ab.py /tmp 2048 thp 4 256     # ROOT, block KiB, layout, threads, MiB

Stores TOTAL MiB of blocks through kvtier._core.Engine (tier defaults: the deadline on), then
loads them 18 times, KVTIER_CACHED=1 (crc32c_copy) and 0 (crc32c_copy_uncached) alternating;
prints the median GB/s and process CPU s/GiB of each, the first pair left out.
"""
import sys, os, shutil, statistics
from pathlib import Path
from kvtier import _core
from kvtier.bench.workload import PrimaryMemory
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from engine_throughput import _run_direction
root = Path(sys.argv[1]); bs = int(sys.argv[2]) << 10; layout = sys.argv[3]; threads = int(sys.argv[4])
total = int(sys.argv[5]) << 20; n = total // bs
pm = PrimaryMemory(n, bs, layout); pm.fill(1)
base = _core.buffer_address(pm.view, True)
d = root / "uab"; shutil.rmtree(d, ignore_errors=True); d.mkdir()
blocks = [(f"{d}/{i % 64:02x}/{i}.blk", b"k%d" % i, base + i * bs, bs) for i in range(n)]
jobs = [(1 + j, blocks[s:s + 16]) for j, s in enumerate(range(0, n, 16))]
e = _core.Engine(str(d), n_read_threads=threads, n_write_threads=threads)
_run_direction(e, e.submit_store, jobs)
os.system("sync")
jid = 100000
res = {"1": [], "0": []}
for r in range(9):
    for mode in ("0", "1") if r % 2 else ("1", "0"):
        os.environ["KVTIER_CACHED"] = mode
        lj = [(jid + k, b) for k, (_, b) in enumerate(jobs)]; jid += len(lj)
        s, c = _run_direction(e, e.submit_load, lj)
        if r: res[mode].append((total / s / 1e9, c / (total / 2**30)))
e.shutdown(); shutil.rmtree(d)
for mode, v in res.items():
    print(f"{root} {bs>>10}K {layout} t{threads} {'crc32c_copy' if mode == '1' else 'crc32c_copy_uncached'}: "
          f"GB/s median {statistics.median(g for g, _ in v):.2f} ({min(g for g, _ in v):.2f}-{max(g for g, _ in v):.2f})  "
          f"CPU s/GiB median {statistics.median(c for _, c in v):.3f} ({min(c for _, c in v):.3f}-{max(c for _, c in v):.3f})", flush=True)

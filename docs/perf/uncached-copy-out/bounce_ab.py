"""Section 36, tried and not kept: loads from memory read through a bounce buffer, paired in
one process with the in-place reads.

    git apply bounce-toggle.patch && pip install -e .   # reads KVTIER_BOUNCE per load
    python bounce_ab.py 256 scattered 4                  # block KiB, layout, threads

Stores 512 MiB of blocks into /dev/shm, then loads them 16 times, KVTIER_BOUNCE=1 (each piece
read into a worker-owned buffer, then copied with its CRC by crc32c_copy_uncached) and 0 (read
in place, the CRC of each piece after it lands) alternating; the first pair left out.
"""
import sys, os, shutil, statistics
from pathlib import Path
from kvtier import _core
from kvtier.bench.workload import PrimaryMemory
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from engine_throughput import _run_direction
bs = int(sys.argv[1]) << 10; layout = sys.argv[2]; threads = int(sys.argv[3]); total = 512 << 20; n = total // bs
pm = PrimaryMemory(n, bs, layout); pm.fill(1)
base = _core.buffer_address(pm.view, True)
d = Path("/dev/shm/bab"); shutil.rmtree(d, ignore_errors=True); d.mkdir()
blocks = [(f"{d}/{i % 64:02x}/{i}.blk", b"k%d" % i, base + i * bs, bs) for i in range(n)]
jobs = [(1 + j, blocks[s:s + 16]) for j, s in enumerate(range(0, n, 16))]
e = _core.Engine(str(d), n_read_threads=threads, n_write_threads=threads)
_run_direction(e, e.submit_store, jobs)
jid = 100000
res = {"0": [], "1": []}
for r in range(8):
    for mode in ("0", "1") if r % 2 else ("1", "0"):
        os.environ["KVTIER_BOUNCE"] = mode
        lj = [(jid + k, b) for k, (_, b) in enumerate(jobs)]; jid += len(lj)
        s, c = _run_direction(e, e.submit_load, lj)
        if r: res[mode].append((total / s / 1e9, c / (total / 2**30)))
e.shutdown(); shutil.rmtree(d)
for mode, v in res.items():
    print(f"{bs>>10}K {layout} t{threads} {'bounce' if mode == '1' else 'in place'}: GB/s median {statistics.median(g for g, _ in v):.2f}  CPU s/GiB median {statistics.median(c for _, c in v):.3f}  {[round(c, 3) for _, c in v]}")

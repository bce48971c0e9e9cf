"""What the CRC32C costs a load from memory, and whether deep paths do (section 34).

    python memory_load_crc_probe.py /dev/shm 256 4     # ROOT, block KiB, threads

Stores 512 MiB of blocks from scattered 4 KiB-page memory through kvtier._core.Engine four
times: checksum crc32c and none, each with flat paths (ROOT/xx/N.blk) and with kvtier's
depth (namespace, rank, two hashed levels, a 72-character name); then loads each set five
times, alternating, and prints the median GB/s and process CPU s/GiB.
"""
import sys, time, shutil, os, statistics
from pathlib import Path
from kvtier import _core
from kvtier.bench.workload import PrimaryMemory
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from engine_throughput import _run_direction  # noqa: E402
root = Path(sys.argv[1]); bs = int(sys.argv[2]) << 10; total = 512 << 20; n = total // bs
threads = int(sys.argv[3])
pm = PrimaryMemory(n, bs, "scattered"); pm.fill(1)
base = _core.buffer_address(pm.view, True)
run = _run_direction  # submit every job, poll until reported: (wall s, CPU s)
res = {}
jid = 1
import hashlib
def deep(d, i):
    h = hashlib.blake2b(b"%d" % i, digest_size=36).hexdigest()
    return f"{d}/ns-0123456789abcdef/rank-0/{h[:2]}/{h[2:4]}/{h}.kvb"
for ck in ("crc32c", "crc32c-deep", "none", "none-deep"):
    d = root / f"tl-{ck}"; shutil.rmtree(d, ignore_errors=True); d.mkdir()
    blocks = [((deep(d, i) if ck.endswith("deep") else f"{d}/{i % 64:02x}/{i}.blk"), b"k%d" % i, base + i * bs, bs) for i in range(n)]
    jobs = [(j, blocks[s:s + 16]) for j, s in enumerate(range(0, n, 16))]
    e = _core.Engine(str(d), n_read_threads=threads, n_write_threads=threads, o_direct="auto", checksum=ck.split("-")[0])
    run(e, e.submit_store, [(jid + k, b) for k, (_, b) in enumerate(jobs)]); jid += len(jobs)
    res[ck] = (e, d, jobs)
out = {k: [] for k in res}
for r in range(5):
    for ck, (e, d, jobs) in res.items():
        lj = [(jid + k, b) for k, (_, b) in enumerate(jobs)]; jid += len(lj)
        s, c = run(e, e.submit_load, lj)
        out[ck].append((total / s / 1e9, c / (total / 2**30)))
for ck, v in out.items():
    print(f"{bs>>10}K t{threads} checksum={ck}: GB/s median {statistics.median(x[0] for x in v):.2f}; CPU s/GiB median {statistics.median(x[1] for x in v):.3f} {[round(x[1],3) for x in v]}")
for ck, (e, d, jobs) in res.items():
    e.shutdown(); shutil.rmtree(d, ignore_errors=True)

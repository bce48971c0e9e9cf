"""Section 36: how fast the CRC runs over bytes a tmpfs read has just written (in cache or not).

    taskset -c 1 python crc_after_read_probe.py

Reads a 256 MiB tmpfs file piece by piece into a 256 MiB buffer and times the CRC32C of each
piece right after its read; then the same after a numpy copy of the piece (user space), and
over a buffer nothing has touched lately (out of cache). Prints the median GB/s of 3 passes
(wall time of the CRC calls only).
"""
import os, time, numpy as np, statistics
from kvtier import _core
size = 256 << 20
path = "/dev/shm/acprobe"
src = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)
with open(path, "wb") as f: f.write(src.tobytes())
fd = os.open(path, os.O_RDONLY)
pool = np.ones(size, np.uint8)
for piece in (16 << 10, 64 << 10, 256 << 10, 1 << 20):
    r = {"crc after pread": [], "crc after memcpy": [], "crc of cold": []}
    for rep in range(3):
        t = {k: 0 for k in r}
        for off in range(0, size, piece):
            v = pool[off:off + piece]
            os.preadv(fd, [v], off)
            a = time.perf_counter_ns(); _core._crc32c_chunks(v, piece); t["crc after pread"] += time.perf_counter_ns() - a
        for off in range(0, size, piece):
            v = pool[off:off + piece]
            v[:] = src[off:off + piece]
            a = time.perf_counter_ns(); _core._crc32c_chunks(v, piece); t["crc after memcpy"] += time.perf_counter_ns() - a
        for off in range(0, size, piece):
            v = src[off:off + piece]
            a = time.perf_counter_ns(); _core._crc32c_chunks(v, piece); t["crc of cold"] += time.perf_counter_ns() - a
        for k in r: r[k].append(size / t[k])
    print(f"{piece >> 10:5} KiB pieces, CRC GB/s:", {k: round(statistics.median(v), 1) for k, v in r.items()})
os.unlink(path)

"""The fused copy into a destination out of cache from a source in cache (section 36).

    taskset -c 1 python cold_destination_probe.py

One block-sized source, copied with its CRC into every block of a 512 MiB buffer in turn
(`_core._crc32c_copy_chunks` per block, so the Python call is counted too), with
crc32c_copy ("fused") and crc32c_copy_uncached ("fused-uncached"), seven alternating runs;
prints the median GB/s of the thread's CPU time.
"""
import time, numpy as np, statistics
from kvtier import _core
pool = np.ones(512<<20, np.uint8)
for size in (16<<10, 256<<10, 2<<20):
    src = np.random.default_rng(1).integers(0,256,size,dtype=np.uint8)
    res = {m: [] for m in ("fused","fused-uncached")}
    for rep in range(7):
        for m in res:
            t=time.thread_time()
            for off in range(0, pool.size, size):
                _core._crc32c_copy_chunks(pool[off:off+size], src, size, 1, m)
            res[m].append(pool.size/(time.thread_time()-t)/1e9)
    print(size>>10, "KiB hot src, cold dst:", {m: round(statistics.median(v),1) for m,v in res.items()})

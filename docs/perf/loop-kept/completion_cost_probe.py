"""Section 37. What the scheduler pays per poll of an fs tier: idle, and for completed store
jobs (2,048 blocks of 256 KiB in 16-block jobs, collected by one get_finished once the engine
has finished them all).

    python completion_cost_probe.py
"""
import sys, time, statistics, shutil
from pathlib import Path
from kvtier.bench.workload import KvtierDriver, PrimaryMemory
pm = PrimaryMemory(64, 256 << 10, "scattered")
d = Path("/dev/shm/pollcost"); shutil.rmtree(d, ignore_errors=True); d.mkdir()
drv = KvtierDriver(d, pm, read_threads=4, write_threads=4, max_queued_store_jobs=1024)
t = time.perf_counter(); N = 20000
for _ in range(N): drv.finished()
print(f"idle get_finished via the bench driver: {(time.perf_counter()-t)/N*1e6:.2f} us per call")
tier = drv._tier
t = time.perf_counter()
for _ in range(N): tier.get_finished()
print(f"idle tier.get_finished: {(time.perf_counter()-t)/N*1e6:.2f} us per call")
drv.close(); shutil.rmtree(d)
from kvtier.bench.workload import JobIds, block_keys, make_jobs
pm = PrimaryMemory(2048, 256 << 10, "scattered"); pm.fill(1)
d.mkdir()
drv = KvtierDriver(d, pm, read_threads=4, write_threads=4, max_queued_store_jobs=1024)
ids = JobIds()
for rep in range(3):
    keys = block_keys(b"p%d" % rep, 0, 2048)
    jobs = make_jobs(ids.take(2048), keys, range(2048), 16)
    for j in jobs: drv.submit_store(j)
    time.sleep(1.0)  # every job done in the engine
    t = time.perf_counter(); got = drv.finished(); dt = time.perf_counter() - t
    print(f"one get_finished returning {len(got)} store jobs of 16 blocks: {dt*1e3:.2f} ms, {dt/len(got)*1e6:.1f} us per job")
drv.close(); shutil.rmtree(d)

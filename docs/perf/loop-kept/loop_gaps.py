"""Section 37. Where the scheduler loop loses time while the tier stores: the loop of
kvtier.bench.interference, with what it spent polling and every gap over 0.5 ms between two
of its 200-iteration chunks recorded.

    python loop_gaps.py /dev/shm 256 4 170 8    # ROOT, block KiB, threads, MiB per run, runs

One fs tier (KvtierDriver, as `kvtier bench` makes it); per run: 0.3 s idle, every block
stored in 16-block jobs while the loop spins and polls, 0.3 s idle; prints the kept ratio as
the bench computes it, the submit and poll time, the gaps, the garbage collections, and the
steal and idle time /proc/stat counted over the busy window.
"""
import sys, time, statistics, threading, gc
from pathlib import Path
import shutil
from kvtier.bench.workload import KvtierDriver, PrimaryMemory, JobIds, block_keys, make_jobs, remove_files, POLL_INTERVAL_S

root = Path(sys.argv[1]); bs = int(sys.argv[2]) << 10; threads = int(sys.argv[3]); total = int(sys.argv[4]) << 20
n = total // bs
pm = PrimaryMemory(n, bs, "scattered"); pm.fill(1)
d = root / "gaps"; shutil.rmtree(d, ignore_errors=True); d.mkdir()
drv = KvtierDriver(d, pm, read_threads=threads, write_threads=threads, max_queued_store_jobs=1024)
gc_events = []
def cb(phase, info):
    gc_events.append((time.perf_counter(), phase, info.get("generation")))
gc.callbacks.append(cb)

def loop(seconds, pending):
    it = 0; x = 1; gaps = []; polls = 0; poll_s = 0.0
    start = last = time.perf_counter(); next_poll = start + POLL_INTERVAL_S
    while True:
        for _ in range(200):
            x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        it += 200
        now = time.perf_counter()
        if now - last > 0.0005: gaps.append((now - last, now))
        if now >= next_poll:
            a = time.perf_counter()
            for r in drv.finished():
                if pending is not None: pending.discard(r.job_id)
            b = time.perf_counter(); poll_s += b - a; polls += 1
            next_poll = b + POLL_INTERVAL_S
            now = b
            if pending is not None and not pending: break
        last = now
        if pending is None and now - start >= seconds: break
    return it, now - start, gaps, polls, poll_s

ids = JobIds()
for rep in range(int(sys.argv[5]) if len(sys.argv) > 5 else 5):
    it0, s0, _, _, _ = loop(0.3, None)
    keys = block_keys(b"g%d" % rep, 0, n)
    jobs = make_jobs(ids.take(n), keys, range(n), 16)
    gc_events.clear()
    st0 = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    t0 = time.perf_counter()
    for j in jobs: drv.submit_store(j)
    sub = time.perf_counter() - t0
    it, s, gaps, polls, poll_s = loop(0.0, {j.job_id for j in jobs})
    busy = sub + s
    st1 = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    steal_ms = (st1[7] - st0[7]) * 10; idle_ms = (st1[3] - st0[3]) * 10
    it1, s1, _, _, _ = loop(0.3, None)
    idle = (it0 + it1) / (s0 + s1)
    lost_gaps = sum(g for g, _ in gaps)
    print(f"ratio {it / busy / idle:.3f} busy {busy*1e3:.1f} ms submit {sub*1e3:.1f} ms polls {polls} poll {poll_s*1e3:.1f} ms "
          f"gaps>0.5ms {len(gaps)} sum {lost_gaps*1e3:.1f} ms max {max((g for g,_ in gaps), default=0)*1e3:.2f} ms gc {len(gc_events)//2} steal {steal_ms} ms idle {idle_ms} ms", flush=True)
    remove_files(drv.file_paths(keys))
drv.close(); shutil.rmtree(d)

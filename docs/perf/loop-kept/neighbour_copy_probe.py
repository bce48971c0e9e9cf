"""Section 37. The scheduler loop of kvtier.bench.interference on CPU 0, alone and beside a
copy loop on CPU 1: copies of 256 MiB (memory), 8 MiB (the shared L3) and 256 KiB (CPU 1's
own L2).

    python neighbour_copy_probe.py     # 4 alternating rounds; prints the medians
"""
import time, subprocess, sys, os, statistics
def rate(sec=0.5):
    x=1; it=0; t=time.perf_counter()
    while time.perf_counter()-t < sec:
        for _ in range(200): x=(x*1103515245+12345)&0x7FFFFFFF
        it+=200
    return it/sec
os.sched_setaffinity(0,{0})
rate(1.0)
copier = "import numpy as np,sys\nn=int(sys.argv[1])\na=np.ones(n,np.uint8);b=np.empty_like(a)\nwhile True: b[:]=a"
cases = [("alone", None)] + [(f"copy {label} on CPU 1", ["taskset","-c","1", sys.executable, "-c", copier, str(n)]) for label, n in (("256 MiB", 256<<20), ("8 MiB", 8<<20), ("256 KiB", 256<<10))]
res = {name: [] for name, _ in cases}
for rnd in range(4):
    for name, cmd in cases:
        p = subprocess.Popen(cmd) if cmd else None
        time.sleep(0.3)
        res[name].append(statistics.median(rate() for _ in range(3)))
        if p: p.kill(); p.wait()
base = statistics.median(res["alone"])
for name, v in res.items():
    print(f"{name:22} {statistics.median(v)/1e6:.2f} M it/s  ({statistics.median(v)/base:.2f} of alone)  {[round(x/1e6,2) for x in v]}")

"""A tier's first load pass against its second, under a deadline and without (section 34).

    python first_load_probe.py /tmp        # as root: sysctl vm.nr_overcommit_hugepages=128

Stores 51 blocks of 2 MiB from transparent-huge-page memory into ROOT through
kvtier._core.Engine (4 + 4 workers, O_DIRECT), then, alternating, three engines with
io_timeout_s 10 (the deadline: loads are read into the worker's own buffer and copied out)
and three with io_timeout_s 0 (read straight into the rows), each loading all blocks twice.
Prints GB/s and process CPU s/GiB of each pass.
"""
import sys, time, shutil, os, statistics
from pathlib import Path
from kvtier import _core
from kvtier.bench.workload import PrimaryMemory
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from engine_throughput import _run_direction  # noqa: E402
root = Path(sys.argv[1]); bs = 2 << 20; n = 51; total = n * bs
threads = 4
pm = PrimaryMemory(n, bs, "thp"); pm.fill(1)
d = root / "thpload2"; shutil.rmtree(d, ignore_errors=True); d.mkdir()
base = _core.buffer_address(pm.view, True)
blocks = [(f"{d}/{i % 64:02x}/{i}.blk", b"k%d" % i, base + i * bs, bs) for i in range(n)]
jobs = [(1 + j, blocks[s:s + 16]) for j, s in enumerate(range(0, n, 16))]
run = _run_direction  # submit every job, poll until reported: (wall s, CPU s)
e = _core.Engine(str(d), n_read_threads=threads, n_write_threads=threads, o_direct=True)
run(e, e.submit_store, jobs); e.shutdown()
os.system("sync")
jid = 1000
for to in (10.0, 0.0, 10.0, 0.0, 10.0, 0.0):
    e = _core.Engine(str(d), n_read_threads=threads, n_write_threads=threads, o_direct=True, io_timeout_s=to)
    out = []
    for p in range(2):
        lj = [(jid + k, b) for k, (_, b) in enumerate(jobs)]; jid += len(lj)
        s, c = run(e, e.submit_load, lj)
        out.append(f"{total / s / 1e9:.2f} GB/s {c / (total / 2**30):.3f} s/GiB")
    e.shutdown()
    print(f"io_timeout_s={to}: first pass {out[0]}; second pass {out[1]}")
shutil.rmtree(d, ignore_errors=True)

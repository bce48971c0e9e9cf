#!/usr/bin/env python3
"""Where a load worker's time goes between one read and its next (docs/PERFORMANCE.md
section 39, issue 23): for each tier given, store 128 blocks of 2 MiB from huge-page memory
into a fresh directory on ``--root``, then load them back (16 blocks per job, all submitted at
once) while ``perf record -a`` records the block layer's request issues and completions, the
scheduler's wake-ups and switches and every system call's exit. For each read request the
script follows the thread that issued it from the request's completion to that thread's next
read request:

    complete->wakeup      the completion to the scheduler waking the thread
    wakeup->running       the wake-up to the thread running (waiting for a CPU), by the role
                          of the woken thread (kvtier: load / store-first workers)
    running->sys_exit     running to the read's system call returning
    exit->issue           the system call's return to the next read request's issue (the
                          thread's own per-block work: copy-out, CRC, close, open)
    total                 the completion to the next issue

and which threads were running when the woken ones got a CPU (the task switched out at that
moment, summed over the run). Times are medians / means in ms; perf adds its own cost to
every event, to both tiers alike. Needs root, perf and the vLLM native environment
(bench/side_by_side.sh's VLLM_NATIVE_VENV) for the ``vllm`` tier:

    .venv-vllm-native/bin/python docs/perf/load-wakeups/wakeup_probe.py --root /tmp \\
        --repeat 2 k=kvtier:psync vllm=vllm

A tier is bench/disk_load_trace.py's LABEL=KIND[:ENGINE][,KEY=VALUE...].
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location("disk_load_trace", REPO / "bench/disk_load_trace.py")
dlt = importlib.util.module_from_spec(_spec)
sys.modules["disk_load_trace"] = dlt
_spec.loader.exec_module(dlt)

from kvtier.bench.primary import PrimaryMemory  # noqa: E402
from kvtier.bench.workload import JobIds, block_keys, make_jobs, wait_for  # noqa: E402

EVENTS = ",".join(
    [
        "block:block_rq_issue",
        "block:block_rq_complete",
        "sched:sched_wakeup",
        "sched:sched_switch",
        "raw_syscalls:sys_exit",
    ]
)
LINE = re.compile(r"\s*(.+?)\s+(\d+)\s+\[\d+\]\s+(\d+\.\d+):\s+(\S+):\s*(.*)")
ISSUE = re.compile(r" R\S* \d+ \(\) (\d+) \+")
COMPLETE = re.compile(r" R\S* \(\) (\d+) \+")


def role(comm: str) -> str:
    if comm.startswith("kvtier-load"):
        return "load worker"
    if comm.startswith("kvtier-store"):
        return "store-first worker"
    return "worker"


def analyse(script: str) -> tuple[dict[str, list[float]], collections.Counter]:
    """Stage durations (seconds) per request, and the switched-out tasks' waiting time."""
    names: dict[int, str] = {}
    owner: dict[int, int] = {}  # sector -> issuing thread
    pending: dict[int, dict[str, float]] = {}  # thread -> stage times since its completion
    stages: dict[str, list[float]] = collections.defaultdict(list)
    behind: collections.Counter = collections.Counter()
    for line in script.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        comm, tid_text, ts_text, event, rest = m.groups()
        tid, ts = int(tid_text), float(ts_text)
        names.setdefault(tid, comm)
        if event == "block:block_rq_issue":
            mm = ISSUE.search(rest)
            if not mm:
                continue
            owner[int(mm.group(1))] = tid
            seen = pending.get(tid)
            if seen is not None and "exit" in seen:
                del pending[tid]
                stages["exit->issue"].append(ts - seen["exit"])
                stages["total"].append(ts - seen["complete"])
        elif event == "block:block_rq_complete":
            mm = COMPLETE.search(rest)
            if mm and int(mm.group(1)) in owner:
                pending[owner.pop(int(mm.group(1)))] = {"complete": ts}
        elif event == "sched:sched_wakeup":
            mm = re.search(r"pid=(\d+)", rest)
            woken = int(mm.group(1)) if mm else -1
            seen = pending.get(woken)
            if seen is not None and "wakeup" not in seen:
                seen["wakeup"] = ts
                stages["complete->wakeup"].append(ts - seen["complete"])
        elif event == "sched:sched_switch":
            mm = re.search(r"prev_comm=(.+?) prev_pid=.*next_pid=(\d+)", rest)
            if not mm:
                continue
            nxt = int(mm.group(2))
            seen = pending.get(nxt)
            if seen is not None and "wakeup" in seen and "running" not in seen:
                seen["running"] = ts
                waited = ts - seen["wakeup"]
                stages[f"wakeup->running ({role(names.get(nxt, ''))})"].append(waited)
                behind[re.sub(r"[-/]\d+$", "", mm.group(1))] += waited
        elif event == "raw_syscalls:sys_exit":
            seen = pending.get(tid)
            if seen is not None and "running" in seen and "exit" not in seen:
                seen["exit"] = ts
                stages["running->sys_exit"].append(ts - seen["running"])
    return stages, behind


def one(label: str, tier: str, primary: PrimaryMemory, root: Path, rep: int) -> None:
    spec = dlt.parse_tier(f"{label}={tier}")
    directory = Path(tempfile.mkdtemp(dir=root))
    driver = dlt.make_driver(spec, directory, primary, 4)
    # perf's own file in memory: written to the measured disk, it would share the device.
    data = Path(tempfile.mkdtemp(dir="/dev/shm")) / "perf.data"
    try:
        n = primary.n_blocks
        keys = block_keys(f"{label}-{rep}".encode(), 0, n)
        ids = JobIds()
        stores = make_jobs(ids.take(n), keys, range(n), 16)
        for job in stores:
            driver.submit_store(job)
        wait_for(driver, {j.job_id for j in stores}, "store")
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-a", "-e", EVENTS, "-o", str(data)],
            stderr=subprocess.PIPE,
            text=True,
        )
        time.sleep(1.0)  # perf is recording
        if perf.poll() is not None:
            raise SystemExit(f"wakeup_probe: perf record failed: {perf.stderr.read().strip()}")
        loads = make_jobs(ids.take(n), keys, range(n), 16)
        began = time.perf_counter()
        for job in loads:
            driver.submit_load(job)
        wait_for(driver, {j.job_id for j in loads}, "load")
        gbps = n * primary.block_size / (time.perf_counter() - began) / 1e9
        time.sleep(0.1)
        perf.send_signal(signal.SIGINT)
        perf.communicate()
        script = subprocess.run(
            ["perf", "script", "-i", str(data), "-F", "comm,tid,cpu,time,event,trace"],
            capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip
    finally:
        driver.close()
        shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(data.parent, ignore_errors=True)
    stages, behind = analyse(script)
    print(f"{label} run {rep}: load {gbps:.2f} GB/s (under perf)")
    for name in sorted(stages):
        values = stages[name]
        print(
            f"  {name:36s} {statistics.median(values) * 1e3:6.3f} / "
            f"{statistics.mean(values) * 1e3:6.3f} ms  (n {len(values)})"
        )
    waits = ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in behind.most_common(5))
    print(f"  woken workers got a CPU when these switched out: {waits}", flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path("/tmp"))
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("tiers", nargs="+", metavar="LABEL=KIND[:ENGINE][,KEY=VALUE...]")
    args = p.parse_args()
    if os.geteuid() != 0:
        print("wakeup_probe: needs root (perf record -a)", file=sys.stderr)
        return 2
    primary = PrimaryMemory(128, 2 << 20, "thp")
    primary.fill(seed=1)
    try:
        for rep in range(args.repeat):
            for tier in args.tiers:
                label, text = tier.split("=", 1)
                one(label, text, primary, args.root, rep)
    finally:
        primary.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

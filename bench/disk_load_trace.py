#!/usr/bin/env python3
"""Loads from a real disk, side by side, with what the block layer saw (issue #23).

Stores ``--blocks`` blocks of ``--size`` through each tier given with ``--tier`` (kvtier's
`fs` tier on either I/O engine, vLLM's `fs` tier on whatever I/O path it has), then loads
them back in jobs of ``--blocks-per-job``, all jobs submitted at once and polled, and
prints load GB/s per tier: the median of ``--repeat`` runs with its min-max, the tiers
alternating within each run (the order rotates from run to run), then each tier's ratios to
the last tier given, run by run (the disk drifts between runs more than within one). Each run
stores fresh files into a fresh directory, so each tier reads blocks it has just written, as
in ``kvtier bench``.

    python bench/disk_load_trace.py --root DIR [--size 2M] [--blocks 128] [--threads 4]
        [--blocks-per-job 16] [--repeat 5] [--tier SPEC ...] [--trace] [--strace DIR]
        [--json FILE]

A tier SPEC is ``LABEL=KIND[:ENGINE][,KEY=VALUE...]``: KIND ``kvtier`` (ENGINE ``psync`` or
``io_uring``) or ``vllm``; a lower-case KEY is a tier option (``checksum=none``,
``worker_nice=0``, ``n_read_threads=16``), an upper-case KEY an environment variable set
while that tier's engine is created (prototype switches read at engine creation). Default:
``kvtier-psync=kvtier:psync``, ``kvtier-uring=kvtier:io_uring``, ``vllm=vllm``.
``--threads`` is the read and the write thread count of every tier.

``--trace`` records the block layer's events (tracefs: bio queued, split, merged, request
issued, completed) on the root's disk during every load, keeps the requests whose sectors
belong to bios this process queued, and prints per tier: requests per block, request sizes,
splits and merges, device queue depth over time (this process's requests, and all of the
disk's), and request service times. Needs root and tracefs (mounted at
/sys/kernel/tracing or /sys/kernel/debug/tracing); it uses a tracing instance of its own,
removed afterwards. ``--strace DIR`` attaches ``strace -f -T -tt`` to this process for the
first run's load of each tier and writes one file per tier into DIR. The load average is
printed with every run: the disk and the CPUs are shared, so compare tiers only within a run.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.bench.config import parse_size
from kvtier.bench.errors import BenchError
from kvtier.bench.primary import PRIMARY_LAYOUTS, PrimaryMemory
from kvtier.bench.workload import (
    JobIds,
    KvtierDriver,
    TierDriver,
    block_keys,
    make_jobs,
    remove_files,
    wait_for,
)
from kvtier.tiering.base import JobMetadata, ReqContext
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.capacity import format_size
from kvtier.tiering.spec import OffloadingSpec

DEFAULT_TIERS = ("kvtier-psync=kvtier:psync", "kvtier-uring=kvtier:io_uring", "vllm=vllm")
SECTOR = 512
TRACE_EVENTS = (
    "block_bio_queue",
    "block_split",
    "block_bio_backmerge",
    "block_bio_frontmerge",
    "block_rq_merge",
    "block_rq_issue",
    "block_rq_requeue",
    "block_rq_complete",
)


@dataclass
class TierSpec:
    label: str
    kind: str  # "kvtier" or "vllm"
    engine: str = "psync"
    options: dict[str, object] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


def parse_tier(text: str) -> TierSpec:
    label, sep, rest = text.partition("=")
    if not sep or not label:
        raise BenchError(f"--tier {text!r}: expected LABEL=KIND[:ENGINE][,KEY=VALUE...]")
    head, *pairs = rest.split(",")
    kind, _, engine = head.partition(":")
    if kind not in ("kvtier", "vllm"):
        raise BenchError(f"--tier {text!r}: KIND must be kvtier or vllm, not {kind!r}")
    spec = TierSpec(label, kind, engine or "psync")
    if kind == "kvtier" and spec.engine not in ("psync", "io_uring", "auto"):
        raise BenchError(f"--tier {text!r}: ENGINE must be psync, io_uring or auto")
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise BenchError(f"--tier {text!r}: {pair!r} is not KEY=VALUE")
        if key.isupper():
            spec.env[key] = value
        else:
            spec.options[key] = int(value) if value.lstrip("-").isdigit() else value
    return spec


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class OptionsKvtierDriver(KvtierDriver):
    """kvtier's `fs` tier through the public factory, with any tier options."""

    def __init__(
        self,
        root: Path,
        primary: PrimaryMemory,
        threads: int,
        engine: str,
        options: dict[str, object],
    ):
        self._job_metadata = JobMetadata
        self._req = ReqContext(req_id="kvtier-disk-load-trace")
        config = {
            "type": "fs",
            "root_dir": str(root),
            "n_read_threads": threads,
            "n_write_threads": threads,
            "o_direct": "auto",
            "io_engine": engine,
            "max_queued_store_jobs": 1 << 20,
            **options,
        }
        spec = OffloadingSpec(model_name="kvtier-bench", dtype="bfloat16")
        self._tier = SecondaryTierFactory.create_secondary_tier(config, primary.view, spec)
        self.cache_bypass = "O_DIRECT" if self._tier.direct_io else "posix_fadvise(DONTNEED)"
        self.io_engine = self._tier.io_engine
        self.io_engine_fallback_reason = self._tier.io_engine_fallback_reason


def make_driver(spec: TierSpec, root: Path, primary: PrimaryMemory, threads: int) -> TierDriver:
    with environment(spec.env):
        if spec.kind == "vllm":
            from kvtier.bench.peer_vllm import VllmDriver, vllm_status

            status = vllm_status()
            if not status["available"]:
                raise BenchError(status["reason"])
            driver = VllmDriver(root, primary, read_threads=threads, write_threads=threads)
            driver.io_path = status["io_path"]  # type: ignore[attr-defined]
            return driver
        driver = OptionsKvtierDriver(root, primary, threads, spec.engine, spec.options)
        driver.io_path = driver._tier.io_engine  # type: ignore[attr-defined]
        return driver


# ---- block layer trace ---------------------------------------------------------------------


def tracefs() -> Path:
    for path in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (path / "instances").is_dir():
            return path
    raise BenchError(
        "--trace needs tracefs: mount it (mount -t tracefs none /sys/kernel/tracing, or "
        "mount -t debugfs none /sys/kernel/debug) and run as root"
    )


def disk_of(path: Path) -> tuple[int, int, str]:
    """(major, minor, sysfs name) of the whole disk holding ``path``."""
    st = os.stat(path)
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    sys_dev = Path(f"/sys/dev/block/{major}:{minor}").resolve()
    if not (sys_dev / "queue").is_dir():  # a partition: its disk is the parent
        sys_dev = sys_dev.parent
        major, minor = (int(x) for x in (sys_dev / "dev").read_text().split(":"))
    return major, minor, sys_dev.name


class BlockTrace:
    """A tracefs instance recording the block events of one disk."""

    def __init__(self, major: int, minor: int):
        self.dev = (major, minor)
        self.dir = tracefs() / "instances" / f"kvtier-disk-load-trace-{os.getpid()}"
        self.dir.mkdir()
        try:
            (self.dir / "buffer_size_kb").write_text("32768")
            (self.dir / "options" / "record-tgid").write_text("1")
            dev_t = (major << 20) | minor
            for event in TRACE_EVENTS:
                event_dir = self.dir / "events" / "block" / event
                (event_dir / "filter").write_text(f"dev == {dev_t}")
                (event_dir / "enable").write_text("1")
            (self.dir / "tracing_on").write_text("0")
        except BaseException:
            self.close()
            raise

    def start(self) -> None:
        (self.dir / "trace").write_text("")
        (self.dir / "tracing_on").write_text("1")

    def stop(self) -> str:
        (self.dir / "tracing_on").write_text("0")
        return (self.dir / "trace").read_text()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            (self.dir / "tracing_on").write_text("0")
        for event in TRACE_EVENTS:
            with contextlib.suppress(OSError):
                (self.dir / "events" / "block" / event / "enable").write_text("0")
        with contextlib.suppress(OSError):
            self.dir.rmdir()


# "  comm-tid  (  tgid) [cpu] flags  ts: event: dev rwbs ..."
_LINE = re.compile(
    r"^\s*(?P<task>.+?)-(?P<tid>\d+)\s+\(\s*(?P<tgid>[-\d]+)\)\s+\[\d+\]\s+\S+\s+"
    r"(?P<ts>[\d.]+):\s+(?P<event>\w+):\s+(?P<rest>.*)$"
)
_SECTORS = re.compile(r"(?P<sector>\d+) \+ (?P<n>\d+)")
_SPLIT = re.compile(r"^\d+,\d+ (?P<rwbs>\S+) (?P<sector>\d+) / (?P<new>\d+)")


def analyse_trace(text: str, tgid: int, op: str = "R") -> dict:
    """Figures for this process's reads (op "R") or writes ("W"): requests, sizes, splits,
    merges, queue depth."""
    my_bios: list[tuple[int, int]] = []  # (sector, sectors) of reads this process queued
    splits = merges = 0
    events: list[tuple[float, str, int, int, str, bool]] = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        event, rest = m["event"], m["rest"]
        mine = m["tgid"].lstrip("-").isdigit() and int(m["tgid"]) == tgid
        parts = rest.split()
        rwbs = parts[1] if len(parts) > 1 else ""
        if op not in rwbs:
            continue
        if event == "block_split":
            splits += mine
            continue
        s = _SECTORS.search(rest)
        if not s:
            continue
        sector, n = int(s["sector"]), int(s["n"])
        if event == "block_bio_queue":
            if mine:
                my_bios.append((sector, n))
        elif event in ("block_bio_backmerge", "block_bio_frontmerge", "block_rq_merge"):
            merges += mine
        elif event in ("block_rq_issue", "block_rq_requeue", "block_rq_complete"):
            events.append((float(m["ts"]), event, sector, n, rwbs, mine))
    my_bios.sort()
    starts = [b[0] for b in my_bios]

    def belongs(sector: int) -> bool:
        i = bisect.bisect_right(starts, sector) - 1
        return i >= 0 and sector < my_bios[i][0] + my_bios[i][1]

    issued: dict[tuple[int, int], list[float]] = {}
    sizes: Counter[int] = Counter()
    service: list[float] = []
    depth_mine = depth_all = requeues = 0
    timeline: list[tuple[float, int, int]] = []  # (ts, my depth, disk depth) after each event
    # Issue order on the disk: how often a request starts where the previous one ended.
    sequential = issued_mine = 0
    last_end: int | None = None
    for ts, event, sector, n, _rwbs, _ in sorted(events):
        is_mine = belongs(sector)
        if event == "block_rq_issue":
            issued.setdefault((sector, n), []).append(ts)
            depth_all += 1
            if is_mine:
                depth_mine += 1
                sizes[n * SECTOR // 1024] += 1
                issued_mine += 1
                sequential += last_end is not None and 0 <= sector - last_end <= 8
                last_end = sector + n
        else:
            starts_at = issued.get((sector, n))
            if not starts_at:
                continue  # issued before the trace started
            t_issue = starts_at.pop(0)
            depth_all -= 1
            if is_mine:
                depth_mine -= 1
                if event == "block_rq_requeue":  # the device refused it: issued again later
                    requeues += 1
                    sizes[n * SECTOR // 1024] -= 1
                else:
                    service.append((ts - t_issue) * 1e3)
        timeline.append((ts, depth_mine, depth_all))
    requests = sum(sizes.values())
    return {
        "bios": len(my_bios),
        "bio_kib": dict(Counter(n * SECTOR // 1024 for _, n in my_bios).most_common(6)),
        "requests": requests,
        "request_kib": dict(sizes.most_common(8)),
        "requeues": requeues,
        "sequential_fraction": round(sequential / issued_mine, 2) if issued_mine else 0.0,
        "splits": splits,
        "merges": merges,
        "depth_mine": _depth_stats(timeline, 1),
        "depth_disk": _depth_stats(timeline, 2),
        "service_ms": _percentiles(service),
    }


def _depth_stats(timeline: list[tuple[float, int, int]], column: int) -> dict:
    """Time-weighted mean and the max of a queue depth between the first and last event."""
    if len(timeline) < 2:
        return {}
    weighted = 0.0
    busy = 0.0
    for (t0, *d0), (t1, *_) in zip(timeline, timeline[1:]):
        depth = d0[column - 1]
        weighted += depth * (t1 - t0)
        busy += (t1 - t0) if depth > 0 else 0.0
    span = timeline[-1][0] - timeline[0][0]
    return {
        "mean": round(weighted / span, 2) if span > 0 else 0.0,
        "max": max(t[column] for t in timeline),
        "busy_fraction": round(busy / span, 3) if span > 0 else 0.0,
    }


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {}
    values = sorted(values)
    pick = lambda q: round(values[min(len(values) - 1, int(q * len(values)))], 3)  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "max": round(values[-1], 3), "n": len(values)}


def disk_stat(name: str) -> list[int]:
    return [int(x) for x in Path(f"/sys/block/{name}/stat").read_text().split()]


def stat_delta(before: list[int], after: list[int], seconds: float) -> dict:
    d = [a - b for a, b in zip(after, before)]
    reads, merged, sectors, ticks = d[0], d[1], d[2], d[3]
    return {
        "reads": reads,
        "read_merges": merged,
        "read_kib_per_io": round(sectors * SECTOR / 1024 / reads, 1) if reads else 0,
        "read_ms_per_io": round(ticks / reads, 3) if reads else 0,
        "avg_queue": round(d[10] / (seconds * 1e3), 2),  # time_in_queue / wall (ms)
        "writes": d[4],
    }


# ---- the runs ------------------------------------------------------------------------------


@contextlib.contextmanager
def strace_attached(out: Path | None) -> Iterator[None]:
    if out is None:
        yield
        return
    proc = subprocess.Popen(
        [
            "strace",
            "-f",
            "-T",
            "-tt",
            "-qq",
            "-o",
            str(out),
            "-p",
            str(os.getpid()),
            "-e",
            "trace=openat,openat2,read,readv,preadv,preadv2,pread64,io_uring_enter,close,"
            "fstat,newfstatat,statx",
        ],
        stderr=subprocess.DEVNULL,
    )
    time.sleep(1.0)  # attached to every thread that exists
    try:
        yield
    finally:
        proc.terminate()
        proc.wait()


def one_run(
    spec: TierSpec,
    args,
    primary: PrimaryMemory,
    scratch: Path,
    rep: int,
    trace: BlockTrace | None,
    disk: str,
    strace_out: Path | None,
) -> dict:
    root = scratch / f"{spec.label}-{rep}"
    root.mkdir()
    driver = make_driver(spec, root, primary, args.threads)
    try:
        n = primary.n_blocks
        keys = block_keys(f"{spec.label}-{rep}".encode(), 0, n)
        ids = JobIds()
        stores = make_jobs(ids.take(n), keys, range(n), args.blocks_per_job)
        t0 = time.perf_counter()
        if trace:
            trace.start()
        for job in stores:
            driver.submit_store(job)
        wait_for(driver, {j.job_id for j in stores}, "store")
        store_s = time.perf_counter() - t0
        store_text = trace.stop() if trace else ""
        loads = make_jobs(ids.take(n), keys, range(n), args.blocks_per_job)
        before = disk_stat(disk)
        with strace_attached(strace_out):
            if trace:
                trace.start()
            cpu0, t0 = time.process_time(), time.perf_counter()
            for job in loads:
                driver.submit_load(job)
            wait_for(driver, {j.job_id for j in loads}, "load")
            load_s, load_cpu = time.perf_counter() - t0, time.process_time() - cpu0
            text = trace.stop() if trace else ""
        if text and args.trace_raw:
            args.trace_raw.mkdir(parents=True, exist_ok=True)
            (args.trace_raw / f"{spec.label}-{rep}.trace").write_text(text)
        result = {
            "tier": spec.label,
            "io_path": getattr(driver, "io_path", ""),
            "run": rep,
            "load_gbps": n * primary.block_size / load_s / 1e9,
            "store_gbps": n * primary.block_size / store_s / 1e9,
            "load_cpu_s_per_gib": load_cpu / (n * primary.block_size / 2**30),
            "loadavg_1m": os.getloadavg()[0],
            "disk_stat": stat_delta(before, disk_stat(disk), load_s),
        }
        if trace:
            result["trace"] = analyse_trace(text, os.getpid())
            result["trace"]["requests_per_block"] = round(result["trace"]["requests"] / n, 2)
            result["store_trace"] = analyse_trace(store_text, os.getpid(), "W")
            result["store_trace"]["requests_per_block"] = round(
                result["store_trace"]["requests"] / n, 2
            )
        remove_files(driver.file_paths(keys))
        return result
    finally:
        driver.close()
        shutil.rmtree(root, ignore_errors=True)


def summary_line(label: str, runs: list[dict]) -> str:
    g = [r["load_gbps"] for r in runs]
    s = [r["store_gbps"] for r in runs]
    cpu = statistics.median(r["load_cpu_s_per_gib"] for r in runs)
    return (
        f"{label:<22} load {statistics.median(g):5.2f} ({min(g):.2f}-{max(g):.2f}) GB/s   "
        f"store {statistics.median(s):5.2f} ({min(s):.2f}-{max(s):.2f})   "
        f"load CPU {cpu:.2f} s/GiB   [{runs[0]['io_path']}]"
    )


def paired_line(label: str, runs: list[dict], peer: list[dict]) -> str:
    """Each run's ratio to the peer's run of the same repetition (the tiers alternate within
    a repetition, so the disk's drift between repetitions cancels): median (min-max), and
    in how many runs the ratio was above 1.0."""
    parts = []
    for what in ("load", "store"):
        ratios = [r[f"{what}_gbps"] / p[f"{what}_gbps"] for r, p in zip(runs, peer)]
        above = sum(x > 1.0 for x in ratios)
        parts.append(
            f"{what} {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}, "
            f"above 1.0 in {above}/{len(ratios)})"
        )
    return f"{label:<22} " + "   ".join(parts)


def trace_line(run: dict) -> str:
    t = run["trace"]
    dm, dd = t["depth_mine"], t["depth_disk"]
    return (
        f"    run {run['run']} {run['tier']:<20} bios {t['bios']} {t['bio_kib']}  "
        f"requests {t['requests']} ({t['requests_per_block']}/block) {t['request_kib']}  "
        f"requeues {t['requeues']} splits {t['splits']} merges {t['merges']}  "
        f"sequential {t['sequential_fraction']}  depth mine mean {dm.get('mean')} "
        f"max {dm.get('max')} busy {dm.get('busy_fraction')}  disk mean {dd.get('mean')} "
        f"max {dd.get('max')}  service ms {t['service_ms']}"
    )


def trace_command(args) -> int:
    major, minor, disk = disk_of(args.root)
    trace = BlockTrace(major, minor)
    try:
        for rep in range(args.repeat):
            before = disk_stat(disk)
            trace.start()
            t0 = time.perf_counter()
            proc = subprocess.Popen(args.command, shell=True, cwd=args.root)
            # The shell execs a simple command in place, so its pid is the command's tgid.
            proc.wait()
            seconds = time.perf_counter() - t0
            text = trace.stop()
            if args.trace_raw:
                args.trace_raw.mkdir(parents=True, exist_ok=True)
                (args.trace_raw / f"command-{rep}.trace").write_text(text)
            t = analyse_trace(text, proc.pid)
            print(
                f"  run {rep} rc {proc.returncode} {seconds:.2f} s loadavg "
                f"{os.getloadavg()[0]:.1f} {stat_delta(before, disk_stat(disk), seconds)}"
            )
            print(
                trace_line({"run": rep, "tier": "command", "trace": t | {"requests_per_block": 0}}),
                flush=True,
            )
    finally:
        trace.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--root", type=Path, default=Path.cwd())
    p.add_argument("--size", default="2M")
    p.add_argument("--blocks", type=int, default=128)
    p.add_argument("--threads", type=int, default=4)
    p.add_argument("--blocks-per-job", type=int, default=16)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--tier", action="append", dest="tiers")
    p.add_argument(
        "--primary",
        choices=PRIMARY_LAYOUTS,
        default="plain",
        help="physical layout of the primary memory (kvtier.bench.primary)",
    )
    p.add_argument("--trace", action="store_true")
    p.add_argument("--trace-raw", type=Path, help="also write each load's raw trace here")
    p.add_argument("--strace", type=Path)
    p.add_argument("--json", type=Path)
    p.add_argument(
        "--command",
        help="instead of the tiers: run this shell command (once per --repeat) under --trace "
        "and analyse its reads (its process's; run fio with --thread)",
    )
    args = p.parse_args(argv)
    if args.command:
        return trace_command(args)
    try:
        specs = [parse_tier(t) for t in (args.tiers or DEFAULT_TIERS)]
        size = parse_size(args.size)
        major, minor, disk = disk_of(args.root)
        trace = BlockTrace(major, minor) if args.trace else None
    except BenchError as exc:
        print(f"disk_load_trace: error: {exc}", file=sys.stderr)
        return 2
    if args.strace:
        args.strace.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="kvtier-disk-load-", dir=args.root))
    primary = PrimaryMemory(args.blocks, size, args.primary)
    primary.fill(1)
    runs: dict[str, list[dict]] = {s.label: [] for s in specs}
    print(
        f"{args.blocks} x {format_size(size)} blocks, {args.blocks_per_job} per job, "
        f"{args.threads} read + {args.threads} write threads, disk {disk}, root {args.root}, "
        f"primary memory {args.primary} ({primary.huge_page_bytes} bytes of "
        f"{primary.length} in huge pages)"
    )
    try:
        for rep in range(args.repeat):
            order = specs[rep % len(specs) :] + specs[: rep % len(specs)]
            for spec in order:
                out = args.strace / f"{spec.label}.strace" if args.strace and rep == 0 else None
                r = one_run(spec, args, primary, scratch, rep, trace, disk, out)
                runs[spec.label].append(r)
                print(
                    f"  run {rep} {spec.label:<20} load {r['load_gbps']:.2f} GB/s  store "
                    f"{r['store_gbps']:.2f}  loadavg {r['loadavg_1m']:.1f}  {r['disk_stat']}",
                    flush=True,
                )
                if trace:
                    print(trace_line(r), flush=True)
                    print(trace_line(r | {"trace": r["store_trace"]}).replace(" bios", " W bios"))
    except BenchError as exc:
        print(f"disk_load_trace: error: {exc}", file=sys.stderr)
        return 1
    finally:
        if trace:
            trace.close()
        shutil.rmtree(scratch, ignore_errors=True)
        primary.close()
    print("medians (min-max):")
    for spec in specs:
        print("  " + summary_line(spec.label, runs[spec.label]))
    peer = specs[-1].label
    if len(specs) > 1:
        print(f"each run against {peer}'s run of the same repetition:")
        for spec in specs[:-1]:
            print("  " + paired_line(spec.label, runs[spec.label], runs[peer]))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "args": vars(args)
                    | {"root": str(args.root), "strace": str(args.strace), "json": str(args.json)},
                    "runs": runs,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

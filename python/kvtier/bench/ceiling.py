"""The ceiling: what `fio` reaches on the same directory, block size and parallelism."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvtier import _core
from kvtier.bench.errors import BenchError

FIO_TIMEOUT_S = 900


def fio_available() -> str | None:
    """Path of the fio executable, or None."""
    return shutil.which("fio")


def fio_job_size(total_bytes: int, block_size: int, numjobs: int) -> int:
    """Bytes per fio job: the workload split over the jobs, at least one block."""
    per_job = total_bytes // numjobs
    return max(block_size, per_job - per_job % block_size)


#: Bytes of header in front of every kvtier block file's payload: a kvtier load reads the
#: block size plus this in one request. The core's constant (docs/FORMAT.md), never a copy.
BLOCK_HEADER: int = _core.HEADER_SIZE


@dataclass(frozen=True)
class Ceiling:
    """One way of running fio as a ceiling.

    A *basic* ceiling writes then reads (its own files: one stream per job, or with
    ``file_per_block`` one new file per block the way the tier writes). A *load* ceiling
    (``load``) only reads, with ``iodepth`` requests in flight per job and requests of the
    block size plus ``header`` bytes, from a layout the bench writes once per run for all
    load ceilings: the figures a load can reach on this device. With ``hugetlb`` its buffers
    are huge pages (``--iomem=mmaphuge``: physically contiguous 2 MiB pieces), which on a
    virtio disk without indirect descriptors lets the device hold several requests where
    buffers in 4 KiB pages fill its ring with one (docs/perf/disk-loads-investigation.md).
    """

    key: str  # where its figures live in a size's results ("fio" is the original ceiling)
    label: str  # its row in the report
    ioengine: str
    file_per_block: bool = False
    iodepth: int = 1
    header: int = 0
    load: bool = False
    hugetlb: bool = False


#: fio with pread/pwrite (the ceiling the fio-relative targets compare against), fio with
#: io_uring, and fio creating, writing and closing one file per block (create_on_open, one
#: open file at a time, files in order: open(O_CREAT), one pwrite, close per block, as strace
#: shows), so the per-file cost the tier pays is visible as its own line. The tier also writes
#: a tmp name and renames it; fio has no rename, so that cost stays the tier's.
BASIC_CEILINGS = (
    Ceiling("fio", "fio (ceiling)", "psync"),
    Ceiling("fio_io_uring", "fio io_uring (ceiling)", "io_uring"),
    Ceiling("fio_new_files", "fio new file per block", "psync", file_per_block=True),
)

_ENGINES = ("psync", "libaio", "io_uring")
_ASYNC_ENGINES = ("libaio", "io_uring")
_LOAD_DEPTHS = (4, 16, 32)


def load_ceiling(ioengine: str, iodepth: int, header: int = 0, hugetlb: bool = False) -> Ceiling:
    """The load ceiling reading with ``ioengine`` at ``iodepth``, block size + ``header``,
    into huge-page buffers with ``hugetlb``."""
    key = f"fio_load_{ioengine}_qd{iodepth}" + (f"_plus{header // 1024}k" if header else "")
    label = f"fio load {ioengine} qd{iodepth}" + (f" bs+{header // 1024}K" if header else "")
    if hugetlb:
        key, label = key + "_hugetlb", label + " hugetlb"
    return Ceiling(key, label, ioengine, iodepth=iodepth, header=header, load=True, hugetlb=hugetlb)


#: The pattern that won on this machine's disk (issue #23): one read per block per thread,
#: as kvtier's psync workers and vLLM issue them, into physically contiguous memory. Beside
#: the psync ceiling (4 KiB-page buffers) it shows what contiguous memory reaches. Deeper
#: queues added nothing there and need iodepth times the pages (io_uring:qd16:+4k:hugetlb at
#: 2 MiB, 32 jobs: 544 pages, 1.1 GiB), so they are left to --ceilings.
HUGE_LOAD_CEILINGS = (
    load_ceiling("psync", 1, 0, hugetlb=True),
    load_ceiling("psync", 1, BLOCK_HEADER, hugetlb=True),
)
#: What the device reaches for loads: both asynchronous engines at several depths, with
#: requests of the block size and of the block size plus kvtier's header; then the
#: huge-page lines (skipped where the kernel has no huge pages to give).
LOAD_CEILINGS = (
    tuple(
        load_ceiling(engine, depth, header)
        for engine in _ASYNC_ENGINES
        for depth in _LOAD_DEPTHS
        for header in (0, BLOCK_HEADER)
    )
    + HUGE_LOAD_CEILINGS
)
#: `kvtier bench`'s ceilings unless --ceilings says otherwise.
CEILINGS = BASIC_CEILINGS + LOAD_CEILINGS
_PRESETS = {
    "default": CEILINGS,
    "basic": BASIC_CEILINGS,
    "loads": LOAD_CEILINGS,
    "huge": HUGE_LOAD_CEILINGS,
}
CEILINGS_HELP = (
    "comma-separated: presets default (basic + loads), basic (fio psync, fio io_uring, fio "
    "new file per block; write then read), loads (reads only: libaio and io_uring at "
    "iodepth 4, 16, 32, requests of the block size and of the block size + 4 KiB, kvtier's "
    "header; and the huge preset), huge (reads into hugetlb buffers, fio --iomem=mmaphuge: "
    "psync and psync +4k; skipped unless the kernel has free huge pages, "
    "e.g. sysctl vm.nr_overcommit_hugepages=128), or load lines ENGINE:qdN[:+4k][:hugetlb] "
    "with ENGINE libaio, io_uring or psync (qd1), e.g. io_uring:qd64:+4k; fio (psync) "
    "always runs, every ratio is against it"
)


def _parse_spec(spec: str) -> Ceiling:
    parts = [p.strip().lower() for p in spec.split(":")]
    engine, options = parts[0], parts[1:]
    if engine not in _ENGINES:
        raise BenchError(
            f"invalid ceiling {spec!r}: unknown fio engine {engine!r}; expected one of "
            f"{', '.join(_ENGINES)} (or a preset: {', '.join(_PRESETS)})"
        )
    depth, header, hugetlb = 1, 0, False
    for option in options:
        if option.startswith("qd") and option[2:].isdigit() and int(option[2:]) >= 1:
            depth = int(option[2:])
        elif option in ("+4k", "+4kib"):
            header = BLOCK_HEADER
        elif option in ("hugetlb", "huge"):
            hugetlb = True
        else:
            raise BenchError(
                f"invalid ceiling {spec!r}: unknown option {option!r}; expected qdN (requests "
                "in flight per job, N >= 1), +4k (requests of the block size + 4 KiB) or "
                "hugetlb (buffers in huge pages)"
            )
    if engine == "psync" and depth > 1:
        raise BenchError(
            f"invalid ceiling {spec!r}: psync has one request in flight per job; use libaio "
            "or io_uring for qd > 1"
        )
    return load_ceiling(engine, depth, header, hugetlb)


def parse_ceilings(text: str) -> tuple[Ceiling, ...]:
    """The --ceilings list: presets and load specs, in order, duplicates dropped, with the
    psync ceiling (the one every ratio is against) first."""
    items = [p.strip() for p in text.split(",") if p.strip()]
    if not items:
        raise BenchError(f"invalid --ceilings {text!r}: expected e.g. basic,libaio:qd16:+4k")
    chosen: dict[str, Ceiling] = {BASIC_CEILINGS[0].key: BASIC_CEILINGS[0]}
    for item in items:
        preset = _PRESETS.get(item.lower())
        for ceiling in preset if preset is not None else (_parse_spec(item),):
            chosen.setdefault(ceiling.key, ceiling)
    return tuple(chosen.values())


def fio_command(
    directory: Path,
    *,
    rw: str,
    block_size: int,
    numjobs: int,
    size: int,
    direct: bool,
    ioengine: str = "psync",
    file_per_block: bool = False,
    iodepth: int = 1,
    hugepage_size: int = 0,
) -> list[str]:
    """The fio command line for one direction (``rw`` = ``write`` or ``read``); with
    ``hugepage_size`` its buffers are anonymous huge pages of that size (MAP_HUGETLB)."""
    cmd = [
        "fio",
        "--name=kvtier-ceiling",
        f"--directory={directory}",
        f"--ioengine={ioengine}",
        f"--direct={1 if direct else 0}",
        f"--bs={block_size}",
        f"--numjobs={numjobs}",
        f"--size={size}",
        f"--rw={rw}",
    ]
    if iodepth > 1:
        cmd.append(f"--iodepth={iodepth}")
    if hugepage_size:
        # Without --mmap's file, fio maps MAP_HUGETLB anonymous memory: no hugetlbfs mount.
        cmd += ["--iomem=mmaphuge", f"--hugepage-size={hugepage_size}"]
    if file_per_block:
        cmd += [
            f"--nrfiles={size // block_size}",
            f"--filesize={block_size}",
            "--openfiles=1",
            "--file_service_type=sequential",
        ]
        if rw == "write":  # created when opened for its one write, never laid out before
            cmd += ["--create_on_open=1", "--fallocate=none"]
    return [*cmd, "--group_reporting", "--output-format=json"]


def _run(cmd: list[str]) -> dict:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=FIO_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"fio did not finish within {FIO_TIMEOUT_S} s: {shlex.join(cmd)}") from exc
    if proc.returncode != 0:
        detail = (proc.stderr or proc.stdout).strip().splitlines()
        raise BenchError(
            f"fio failed (exit {proc.returncode}): {detail[-1] if detail else 'no output'}; "
            f"command: {shlex.join(cmd)}"
        )
    out = proc.stdout
    start = out.find("{")  # fio may print notes before the JSON document
    try:
        return json.loads(out[start:])
    except ValueError as exc:
        raise BenchError(f"could not parse fio's JSON output of: {shlex.join(cmd)}") from exc


def _figures(cmd: list[str], rw: str, numjobs: int) -> dict:
    """Run one fio direction; its GB/s, bytes, CPU seconds per GiB and the command."""
    report = _run(cmd)
    job = report["jobs"][0]
    stats = job[rw]
    result = {
        f"{rw}_command": shlex.join(cmd),
        f"{rw}_gbps": stats["bw_bytes"] / 1e9,
        f"{rw}_bytes": stats["io_bytes"],
    }
    # usr_cpu/sys_cpu are percentages of the jobs' summed run time (job_runtime, ms).
    job_runtime_s = job.get("job_runtime", stats.get("runtime", 0) * numjobs) / 1e3
    if job_runtime_s and stats["io_bytes"]:
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job_runtime_s
        result[f"{rw}_cpu_s_per_gib"] = cpu_s / (stats["io_bytes"] / (1 << 30))
    return result


@dataclass(frozen=True)
class HugePages:
    """The kernel's hugetlb pool as far as a new mapping can draw on it."""

    size: int  # bytes per huge page (Hugepagesize)
    free: int  # reserved pages nobody holds or has reserved (HugePages_Free - HugePages_Rsvd)
    surplus_left: int  # pages the kernel may still allocate on demand (overcommit - surplus)

    @property
    def available(self) -> int:
        return self.free + self.surplus_left


def parse_huge_pages(meminfo: str, overcommit: str) -> HugePages | None:
    """The pool from /proc/meminfo's text and /proc/sys/vm/nr_overcommit_hugepages'; None
    when meminfo has no hugetlb lines (a kernel without hugetlbfs)."""
    fields: dict[str, int] = {}
    for line in meminfo.splitlines():
        name, _, value = line.partition(":")
        parts = value.split()
        if parts and parts[0].isdigit():
            fields[name.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    needed = ("Hugepagesize", "HugePages_Free", "HugePages_Rsvd", "HugePages_Surp")
    if any(k not in fields for k in needed) or fields["Hugepagesize"] <= 0:
        return None
    try:
        limit = int(overcommit.strip() or 0)
    except ValueError:
        limit = 0
    return HugePages(
        size=fields["Hugepagesize"],
        free=max(0, fields["HugePages_Free"] - fields["HugePages_Rsvd"]),
        surplus_left=max(0, limit - fields["HugePages_Surp"]),
    )


def read_huge_pages() -> HugePages | None:
    """This kernel's hugetlb pool now (None: no hugetlb, or /proc unreadable)."""
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    try:
        overcommit = Path("/proc/sys/vm/nr_overcommit_hugepages").read_text()
    except OSError:
        overcommit = "0"
    return parse_huge_pages(meminfo, overcommit)


def hugetlb_pages_needed(request: int, iodepth: int, numjobs: int, page: int) -> int:
    """Huge pages fio maps for its buffers: per job ``request`` x ``iodepth`` bytes rounded
    up to whole pages (fio's own rounding for --iomem=mmaphuge)."""
    return numjobs * math.ceil(request * iodepth / page)


def hugetlb_refusal(pool: HugePages | None, needed: int) -> str:
    """Why fio cannot have ``needed`` huge pages now (the skip message), or ""."""
    if pool is None:
        return "this kernel has no hugetlb pages (no Hugepagesize in /proc/meminfo)"
    if pool.available >= needed:
        return ""
    mib = pool.size >> 20
    return (
        f"needs {needed} free huge pages of {mib} MiB for fio's buffers (--iomem=mmaphuge), "
        f"the kernel has {pool.free} free and may add {pool.surplus_left} "
        f"(vm.nr_overcommit_hugepages); as root, e.g. sysctl vm.nr_overcommit_hugepages="
        f"{needed} (pages taken only while fio runs, returned after)"
    )


def write_load_layout(
    directory: Path, *, block_size: int, total_bytes: int, numjobs: int, direct: bool
) -> dict:
    """The files every load ceiling reads (one per job, written by fio psync); the write's
    figures, kept in the JSON (the basic psync ceiling reports writes).

    Each job's file holds its share of the blocks, each with room for kvtier's header, so that
    requests of the block size and of the block size + header both read every block."""
    directory.mkdir(parents=True, exist_ok=True)
    blocks = fio_job_size(total_bytes, block_size, numjobs) // block_size
    request = block_size + BLOCK_HEADER
    cmd = fio_command(
        directory, rw="write", block_size=request, numjobs=numjobs, size=blocks * request,
        direct=direct,
    )  # fmt: skip
    size = blocks * request
    return {"size_per_job": size, **_figures(cmd, "write", numjobs)}


def run_fio_load(
    directory: Path, *, block_size: int, size_per_job: int, numjobs: int, direct: bool,
    ceiling: Ceiling,
) -> dict:  # fmt: skip
    """One load ceiling: a sequential read of the layout's files (each job its own file) in
    requests of the block size + ``ceiling.header``, ``ceiling.iodepth`` in flight per job."""
    request = block_size + ceiling.header
    size = size_per_job - size_per_job % request  # whole requests within the laid-out file
    if size <= 0:
        raise BenchError(
            f"each fio job's file ({size_per_job} bytes) is smaller than one request of "
            f"{request} bytes; raise --total"
        )
    hugepage_size = 0
    if ceiling.hugetlb:
        pool = read_huge_pages()
        refusal = hugetlb_refusal(
            pool,
            hugetlb_pages_needed(request, ceiling.iodepth, numjobs, pool.size if pool else 1),
        )
        if refusal:
            raise BenchError(refusal)
        assert pool is not None  # no refusal without a pool
        hugepage_size = pool.size
    cmd = fio_command(
        directory, rw="read", block_size=request, numjobs=numjobs, size=size, direct=direct,
        ioengine=ceiling.ioengine, iodepth=ceiling.iodepth, hugepage_size=hugepage_size,
    )  # fmt: skip
    result: dict = {
        "numjobs": numjobs, "size_per_job": size, "direct": direct,
        "ioengine": ceiling.ioengine, "iodepth": ceiling.iodepth, "request_bytes": request,
        "hugetlb": ceiling.hugetlb,
    }  # fmt: skip
    result.update(_figures(cmd, "read", numjobs))
    return result


def run_fio(
    directory: Path,
    *,
    block_size: int,
    total_bytes: int,
    numjobs: int,
    direct: bool,
    ceiling: Ceiling = BASIC_CEILINGS[0],
) -> dict:
    """Sequential write then read of ``numjobs`` files (or, for a file-per-block ceiling, of
    one file per block); GB/s per direction and the commands.

    The read runs on the files the write created; with ``direct`` false (no O_DIRECT on this
    file system) fio's default ``invalidate=1`` drops them from the page cache first.
    """
    directory.mkdir(parents=True, exist_ok=True)
    size = fio_job_size(total_bytes, block_size, numjobs)
    result: dict = {"numjobs": numjobs, "size_per_job": size, "direct": direct}
    if ceiling.key != "fio":  # the original ceiling's JSON stays as it was
        result.update(ioengine=ceiling.ioengine, file_per_block=ceiling.file_per_block)
    try:
        for rw, key in (("write", "write"), ("read", "read")):
            cmd = fio_command(
                directory,
                rw=rw,
                block_size=block_size,
                numjobs=numjobs,
                size=size,
                direct=direct,
                ioengine=ceiling.ioengine,
                file_per_block=ceiling.file_per_block,
            )
            result.update(_figures(cmd, key, numjobs))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result

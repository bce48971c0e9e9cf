"""The ceiling: what `fio` reaches on the same directory, block size and parallelism."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from kvtier.bench.errors import BenchError

FIO_TIMEOUT_S = 900


def fio_available() -> str | None:
    """Path of the fio executable, or None."""
    return shutil.which("fio")


def fio_job_size(total_bytes: int, block_size: int, numjobs: int) -> int:
    """Bytes per fio job: the workload split over the jobs, at least one block."""
    per_job = total_bytes // numjobs
    return max(block_size, per_job - per_job % block_size)


@dataclass(frozen=True)
class Ceiling:
    """One way of running fio as a ceiling: its I/O engine, and whether it writes one new file
    per block the way the tier does (or streams one file per job)."""

    key: str  # where its figures live in a size's results ("fio" is the original ceiling)
    label: str  # its row in the report
    ioengine: str
    file_per_block: bool = False


#: fio with pread/pwrite (the ceiling the issue-13 targets compare against), fio with io_uring,
#: and fio creating, writing and closing one file per block (create_on_open, one open file at a
#: time, files in order: open(O_CREAT), one pwrite, close per block, as strace shows), so the
#: per-file cost the tier pays is visible as its own line. The tier also writes a tmp name and
#: renames it; fio has no rename, so that cost stays the tier's.
CEILINGS = (
    Ceiling("fio", "fio (ceiling)", "psync"),
    Ceiling("fio_io_uring", "fio io_uring (ceiling)", "io_uring"),
    Ceiling("fio_new_files", "fio new file per block", "psync", file_per_block=True),
)


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
) -> list[str]:
    """The fio command line for one direction (``rw`` = ``write`` or ``read``)."""
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


def run_fio(
    directory: Path,
    *,
    block_size: int,
    total_bytes: int,
    numjobs: int,
    direct: bool,
    ceiling: Ceiling = CEILINGS[0],
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
            report = _run(cmd)
            job = report["jobs"][0]
            stats = job[key]
            result[f"{rw}_command"] = shlex.join(cmd)
            result[f"{rw}_gbps"] = stats["bw_bytes"] / 1e9
            result[f"{rw}_bytes"] = stats["io_bytes"]
            # usr_cpu/sys_cpu are percentages of the jobs' summed run time (job_runtime, ms).
            job_runtime_s = job.get("job_runtime", stats.get("runtime", 0) * numjobs) / 1e3
            if job_runtime_s and stats["io_bytes"]:
                cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job_runtime_s
                result[f"{rw}_cpu_s_per_gib"] = cpu_s / (stats["io_bytes"] / (1 << 30))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return result

"""The ceiling: what `fio` reaches on the same directory, block size and parallelism."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
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


def fio_command(
    directory: Path, *, rw: str, block_size: int, numjobs: int, size: int, direct: bool
) -> list[str]:
    """The fio command line for one direction (``rw`` = ``write`` or ``read``)."""
    return [
        "fio",
        "--name=kvtier-ceiling",
        f"--directory={directory}",
        "--ioengine=psync",
        f"--direct={1 if direct else 0}",
        f"--bs={block_size}",
        f"--numjobs={numjobs}",
        f"--size={size}",
        f"--rw={rw}",
        "--group_reporting",
        "--output-format=json",
    ]


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
    directory: Path, *, block_size: int, total_bytes: int, numjobs: int, direct: bool
) -> dict:
    """Sequential write then read of ``numjobs`` files; GB/s per direction and the commands.

    The read runs on the files the write created; with ``direct`` false (no O_DIRECT on this
    file system) fio's default ``invalidate=1`` drops them from the page cache first.
    """
    directory.mkdir(parents=True, exist_ok=True)
    size = fio_job_size(total_bytes, block_size, numjobs)
    result: dict = {"numjobs": numjobs, "size_per_job": size, "direct": direct}
    try:
        for rw, key in (("write", "write"), ("read", "read")):
            cmd = fio_command(
                directory, rw=rw, block_size=block_size, numjobs=numjobs, size=size, direct=direct
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

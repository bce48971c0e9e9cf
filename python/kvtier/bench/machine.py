"""Describe the machine and the file system a benchmark ran on."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

import kvtier
from kvtier import _core


def _read(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _lscpu() -> dict[str, str]:
    if shutil.which("lscpu") is None:
        return {}
    try:
        out = subprocess.run(
            ["lscpu"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _memory_bytes() -> int | None:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def mount_of(path: Path) -> dict[str, str]:
    """The /proc/mounts entry (device, mount point, type, options) that holds ``path``."""
    real = os.path.realpath(path)
    best: dict[str, str] = {}
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        device, mount_point, fs_type, options = parts[:4]
        mount_point = mount_point.replace("\\040", " ")
        inside = real == mount_point or real.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) >= len(best.get("mount_point", "")):
            best = {
                "device": device,
                "mount_point": mount_point,
                "type": fs_type,
                "options": options,
            }
    return best


def _block_device(device: str) -> dict[str, str]:
    """Queue settings of the block device behind a mount (when it is one)."""
    if not device.startswith("/dev/"):
        return {}
    name = os.path.basename(os.path.realpath(device))
    base = Path("/sys/class/block") / name
    if (base / "partition").exists():
        base = base.resolve().parent
    queue = base / "queue"
    info: dict[str, str] = {"name": base.name}
    for key in ("rotational", "scheduler", "nr_requests", "max_sectors_kb"):
        value = _read(str(queue / key)).strip()
        if value:
            info[key] = value
    model = _read(str(base / "device" / "model")).strip()
    if model:
        info["model"] = model
    return info


def describe_machine(root: Path) -> dict:
    """CPU, cores, memory, kernel, and the file system and device holding ``root``."""
    lscpu = _lscpu()
    mount = mount_of(root)
    usage = shutil.disk_usage(root)
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "hypervisor": lscpu.get("Hypervisor vendor", ""),
        "memory_bytes": _memory_bytes(),
        "kernel": platform.release(),
        "os": platform.platform(),
        "python": platform.python_version(),
        "kvtier_version": kvtier.__version__,
        "crc32c_hardware": bool(_core.crc32c_is_hardware()),
        "root": str(root),
        "filesystem": {
            **mount,
            "size_bytes": usage.total,
            "free_bytes": usage.free,
            "o_direct": _core.probe_o_direct(str(root)) or "supported",
        },
        "block_device": _block_device(mount.get("device", "")),
    }


def describe_short(machine: dict) -> str:
    """One line for the terminal report."""
    fs = machine.get("filesystem", {})
    cpus = machine.get("usable_cpus") or machine.get("logical_cpus")
    hyper = f", {machine['hypervisor']} guest" if machine.get("hypervisor") else ""
    return (
        f"{machine.get('cpu_model', '?')} ({cpus} CPUs{hyper}), kernel {machine.get('kernel')}, "
        f"{fs.get('type', '?')} on {fs.get('device', '?')} at {fs.get('mount_point', '?')}"
    )

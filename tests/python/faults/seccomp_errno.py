"""Python side of seccomp_errno.c: make one system call of this whole process fail with a
chosen errno, for the first N calls or always, from the moment :func:`fail_syscall` returns.

Use it in a child process (a seccomp filter stays for the life of the process). It sees raw
``syscall(2)`` calls, which an LD_PRELOAD interposer of libc wrappers does not.
"""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "seccomp_errno.c"

# System call numbers shared by every Linux architecture (the io_uring calls came late).
IO_URING_SETUP = 425
IO_URING_ENTER = 426


def build(out: Path, cc: str = "cc") -> Path:
    """Builds the library into the directory ``out`` and returns its path."""
    lib = out / "seccomp_errno.so"
    cmd = [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(lib)]
    done = subprocess.run(
        [*cmd, str(SOURCE), "-lpthread"], check=False, capture_output=True, text=True, timeout=120
    )
    if done.returncode != 0:
        raise RuntimeError(f"building {SOURCE.name} failed:\n{done.stderr}")
    return lib


class SyscallFault:
    """The filter of one process: install once, then read what it did."""

    def __init__(self, lib: Path) -> None:
        self._lib = ctypes.CDLL(str(lib))
        self._lib.kvtier_fail_syscall.argtypes = [ctypes.c_long, ctypes.c_int, ctypes.c_long]
        self._lib.kvtier_fail_syscall.restype = ctypes.c_int
        self._lib.kvtier_fail_syscall_calls.restype = ctypes.c_long
        self._lib.kvtier_fail_syscall_injected.restype = ctypes.c_long

    def install(self, nr: int, err: int, times: int | None = None) -> None:
        """From now on, system call ``nr`` fails with ``err`` in every thread, the first
        ``times`` calls (later ones run) or, with ``None``, always. Raises OSError where seccomp
        refuses (Linux < 5.7, or a filter installed already)."""
        rc = self._lib.kvtier_fail_syscall(nr, err, -1 if times is None else times)
        if rc != 0:
            raise OSError(-rc, f"installing a seccomp filter for system call {nr} failed")

    @property
    def calls(self) -> int:
        """Matching calls made since the filter was installed."""
        return int(self._lib.kvtier_fail_syscall_calls())

    @property
    def injected(self) -> int:
        """Of those, the calls that got the errno."""
        return int(self._lib.kvtier_fail_syscall_injected())

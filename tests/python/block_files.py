"""What the tests count and read on disk themselves, independently of kvtier's own code."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def skip_on_memory_fs(path: Path) -> None:
    """Skips a test that needs `path` on storage that is not memory (the disk the tests run
    on), where it lies on tmpfs or ramfs instead."""
    kind = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True)
    if kind.stdout.strip() in ("tmpfs", "ramfs"):
        pytest.skip(f"{path} is on a memory file system here")


def block_bytes_on_disk(root: Path | str) -> int:
    """Bytes of block files and block tmp files under ``root``, by a walk of our own."""
    total = 0
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".kvb") or (n.endswith(".tmp") and ".kvb." in n):
                try:
                    total += os.lstat(os.path.join(d, n)).st_size
                except OSError:  # gone meanwhile (ENOENT), or ESTALE over FUSE
                    pass
    return total


def block_bytes_still_on_disk(root: Path | str) -> int:
    """block_bytes_on_disk for a sampler racing an evictor: a walk is no snapshot, and a file
    counted early in it may be evicted while a store that took its room lands in a directory
    visited later, so the walk alone can exceed what was ever on disk at once. Counts only the
    files walked that are still there after the walk: all of them existed together at its
    end. (A tmp file renamed meanwhile drops out: an under-count by the stores in flight.)"""
    walked = []
    for d, _, names in os.walk(root):
        walked += [os.path.join(d, n) for n in names if n.endswith(".kvb") or
                   (n.endswith(".tmp") and ".kvb." in n)]  # fmt: skip
    total = 0
    for path in walked:
        try:
            total += os.lstat(path).st_size
        except OSError:  # gone meanwhile (ENOENT), or ESTALE over FUSE
            pass
    return total


FS_IOC_GETFLAGS, FS_IOC_SETFLAGS, FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


@contextlib.contextmanager
def immutable(directory: Path) -> Iterator[None]:
    """chattr +i on ``directory`` (nothing in it can be removed, even by root: EPERM); skips
    where the file system has no such flag (tmpfs) or the caller lacks CAP_LINUX_IMMUTABLE."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = struct.unpack("i", fcntl.ioctl(fd, FS_IOC_GETFLAGS, b"\0" * 4))[0]
        try:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags | FS_IMMUTABLE_FL))
        except OSError as e:
            pytest.skip(f"cannot make {directory} immutable here: {e}")
        try:
            yield
        finally:
            fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", flags))
    except OSError as e:
        if e.errno in (errno.ENOTTY, errno.EOPNOTSUPP, errno.EINVAL):
            pytest.skip(f"no file attributes on {directory}'s file system: {e}")
        raise
    finally:
        os.close(fd)


def planted_blocks(directory: Path, first: int, n: int, size: int, age: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for i in range(first, first + n):
        path = directory / f"{i:072x}.kvb"
        path.write_bytes(b"x" * size)
        os.utime(path, ns=(age + i, age + i))

"""Shared recency: a use of a block sets its file's mtime, which every process and host sees.

atime is useless on relatime and noatime mounts, and no index outlives a process; mtime is
what scanners order eviction by. Uses are batched: a process remembers the paths it used, in
the order of their last use, and at most every FLUSH_SECONDS sets each one's mtime to "now"
(one utimensat per distinct block per flush), so others see a use at most that much later.

"Now" is the file system's clock, never this process's: the times are not passed
(``utimensat(dir, name, NULL, AT_SYMLINK_NOFOLLOW)``), which NFS sends as "set to server
time", so hosts with skewed clocks still order their uses on one clock. Passing no times also
needs only write permission on the file, not its ownership: on a root shared through
``file_mode`` 0o660 or 0o666, one user's use of another user's block lands. Paths are walked
from the root one directory at a time with ``O_NOFOLLOW`` and the final name is not followed,
so a symbolic link planted anywhere below the root never re-dates a file outside it.

A process's own pending uses are checked before it evicts anything
(:meth:`RecencyLog.is_pending`), so they count for its own evictions at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

FLUSH_SECONDS = 2.0

# Directory descriptors one flush keeps open while it walks (blocks of one fan-out directory
# are usually used together); beyond this many the cache starts again.
_MAX_OPEN_DIRS = 64
# Levels kept open across cache overflows: the namespace and the rank directory.
_KEPT_DEPTH = 2
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RecencyLog:
    """Uses not yet written to the mtimes of block files beneath ``root``. Thread-safe;
    record() is the hot path."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self._lock = threading.Lock()
        # path -> None, in the order of each path's last use (a use moves it to the end), so
        # a flush sets mtimes in that order and the file system's clock keeps it.
        self._pending: dict[str, None] = {}
        self._flushing: dict[str, None] = {}

    def record(self, paths: Iterable[str]) -> None:
        with self._lock:
            pending = self._pending
            for path in paths:
                pending.pop(path, None)
                pending[path] = None

    def is_pending(self, path: str) -> bool:
        with self._lock:
            return path in self._pending or path in self._flushing

    def flush(self) -> int:
        """Set the mtime of every pending path to the file system's "now"; returns how many
        were set. Uses that cannot land (the block is gone, a link or a foreign directory
        is in the way, no write permission) are dropped: a use is a hint."""
        with self._lock:
            batch, self._pending = self._pending, {}
            self._flushing = batch
        try:
            return self._touch_all(batch) if batch else 0
        finally:
            with self._lock:
                self._flushing = {}

    def _touch_all(self, paths: Iterable[str]) -> int:
        try:
            root_fd = os.open(self.root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # root_dir may be a link
        except OSError:
            return 0  # the root is gone or unreachable: nothing to keep warm
        walker = _Walker(root_fd, self.root.rstrip("/") + "/")
        done = 0
        try:
            for path in paths:
                parent, _, name = path.rpartition("/")
                try:
                    os.utime(name, dir_fd=walker.open(parent), follow_symlinks=False)
                    done += 1
                except (OSError, ValueError):
                    # ENOENT: evicted or never written; ELOOP/ENOTDIR: a link or a file where
                    # a directory belongs; EACCES/EPERM: no write permission; ValueError: not
                    # a plain path beneath the root. Its use is lost.
                    pass
        finally:
            walker.close()
            os.close(root_fd)
        return done


class _Walker:
    """Directories beneath a root, opened one component at a time without following links,
    kept open for the rest of one flush (uses cluster in few directories)."""

    def __init__(self, root_fd: int, prefix: str) -> None:
        self._root_fd = root_fd
        self._prefix = prefix  # the root's path with one trailing "/"
        self._dirs: dict[str, int] = {}  # directory path -> descriptor

    def open(self, directory: str) -> int:
        fd = self._dirs.get(directory)
        if fd is not None:
            return fd
        if not directory.startswith(self._prefix):
            raise ValueError(f"{directory} is not beneath {self._prefix}")
        parts = directory[len(self._prefix) :].split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"{directory} is not a plain path")
        if len(self._dirs) + len(parts) > _MAX_OPEN_DIRS:
            self._shrink(len(parts))
        fd, path = self._root_fd, self._prefix.rstrip("/")
        for part in parts:
            path = f"{path}/{part}"
            cached = self._dirs.get(path)
            if cached is None:
                cached = os.open(part, _DIR_FLAGS, dir_fd=fd)
                self._dirs[path] = cached
            fd = cached
        return fd

    def _shrink(self, room: int) -> None:
        # Fan-out directories go (there are 65,536 per rank); namespaces and ranks stay,
        # unless there are that many of them. Never during a walk: it holds some of them.
        depth = self._prefix.count("/") + _KEPT_DEPTH - 1  # of a rank directory
        deep = [p for p in self._dirs if p.count("/") > depth]
        if len(self._dirs) - len(deep) + room > _MAX_OPEN_DIRS:
            deep = list(self._dirs)
        for path in deep:
            os.close(self._dirs.pop(path))

    def close(self) -> None:
        for fd in self._dirs.values():
            os.close(fd)
        self._dirs.clear()


__all__ = ["FLUSH_SECONDS", "RecencyLog"]

"""Shared recency: a use of a block sets its file's mtime, which every process and host sees.

atime is useless on relatime and noatime mounts, and no index outlives a process; mtime is
set explicitly (utimensat) and is what scanners order eviction by. Uses are batched: a
process remembers the paths it used and when, and sets their mtimes to that time at most
every FLUSH_SECONDS (one utimensat per distinct block per flush), so others see a use at
most that much later. The time is this host's clock (the order of uses within a flush must
survive it); hosts sharing a root keep their clocks in sync (NTP), as NFS expects anyway.
A process's own pending uses are checked before it evicts anything
(:meth:`RecencyLog.is_pending`), so they count for its own evictions at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable

FLUSH_SECONDS = 2.0


class RecencyLog:
    """Uses not yet written to the files' mtimes. Thread-safe; record() is the hot path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}  # path -> time of its last use (ns)
        self._flushing: dict[str, int] = {}

    def record(self, paths: Iterable[str]) -> None:
        now = time.time_ns()
        with self._lock:
            self._pending.update(dict.fromkeys(paths, now))

    def is_pending(self, path: str) -> bool:
        with self._lock:
            return path in self._pending or path in self._flushing

    def flush(self) -> int:
        """Set the mtime of every pending path to its last use; returns how many were set."""
        with self._lock:
            batch, self._pending = self._pending, {}
            self._flushing = batch
        done = 0
        try:
            for path, when in batch.items():
                try:
                    os.utime(path, ns=(when, when))
                    done += 1
                except FileNotFoundError:
                    pass  # evicted (or never written: a failed store): nothing to keep warm
                except OSError:
                    pass  # not ours to touch (EPERM on a foreign file): its use is lost
        finally:
            with self._lock:
                self._flushing = {}
        return done


__all__ = ["FLUSH_SECONDS", "RecencyLog"]

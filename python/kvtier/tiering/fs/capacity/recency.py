"""Shared recency: a use of a block sets its file's mtime, which every process and host sees.

atime is useless on relatime and noatime mounts, and no index outlives a process; mtime is
set explicitly (utimensat with UTIME_NOW: the file server's clock on NFS) and is what
scanners order eviction by. Uses are batched: a process remembers the paths it used and
sets their mtimes at most every FLUSH_SECONDS (one utimensat per distinct block per flush),
so others see a use at most that much later. Its own pending uses are checked before it
evicts anything (:meth:`RecencyLog.is_pending`), so they count for its own evictions at once.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

FLUSH_SECONDS = 2.0


class RecencyLog:
    """Uses not yet written to the files' mtimes. Thread-safe; record() is the hot path."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, None] = {}
        self._flushing: dict[str, None] = {}

    def record(self, paths: Iterable[str]) -> None:
        with self._lock:
            self._pending.update(dict.fromkeys(paths))

    def is_pending(self, path: str) -> bool:
        with self._lock:
            return path in self._pending or path in self._flushing

    def flush(self) -> int:
        """Set the mtime of every pending path to now; returns how many were set."""
        with self._lock:
            batch, self._pending = self._pending, {}
            self._flushing = batch
        done = 0
        try:
            for path in batch:
                try:
                    os.utime(path)
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

"""Eviction: one evictor per root at a time, unlinking least recently used block files.

The evictor lock is ``<root>/.kvtier/evictor.lock``, taken without waiting (fcntl, so it
works across NFS hosts and is released if its holder dies); a process that does not get it
leaves the work to the holder instead of repeating it. Only block files (``*.kvb``) are
ever unlinked, never tmp files of writers in flight or anything else. Racing deleters are
harmless: ENOENT means someone else removed the file and is not counted here, so nothing is
uncounted twice.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from kvtier.tiering.fs.capacity.ledger import shared_fd, state_dir
from kvtier.tiering.fs.capacity.scanner import FileEntry, is_block_name

EVICTOR_LOCK_NAME = "evictor.lock"


@contextlib.contextmanager
def evictor_lock(root: str, file_mode: int = 0o600) -> Iterator[bool]:
    """Yields True while this thread holds the root's evictor lock, False if another does."""
    fd, thread_lock = shared_fd(os.path.join(state_dir(root), EVICTOR_LOCK_NAME), file_mode)
    if not thread_lock.acquire(blocking=False):
        yield False
        return
    try:
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            yield False
            return
        try:
            yield True
        finally:
            fcntl.lockf(fd, fcntl.LOCK_UN)
    finally:
        thread_lock.release()


@dataclass
class Evicted:
    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    skipped_recent: int = 0  # candidates used since the scan: kept
    vanished: int = 0  # candidates someone else removed first


def evict(
    candidates: Sequence[FileEntry],
    need_bytes: int,
    *,
    in_use: Callable[[str], bool] = lambda path: False,
    dry_run: bool = False,
    on_batch: Callable[[list[str], int], None] | None = None,
    batch: int = 256,
    stop: threading.Event | None = None,
) -> Evicted:
    """Unlink candidates (oldest first) until ``need_bytes`` are freed.

    A candidate whose mtime moved since the scan, or that ``in_use`` says was used and not
    yet flushed, is kept. ``on_batch(paths, bytes)`` is called after every ``batch`` unlinks
    and at the end, so budgets and lookup caches learn of evictions while they happen.
    """
    done = Evicted()
    pending: list[str] = []
    pending_bytes = 0
    for entry in candidates:
        if done.bytes >= need_bytes or (stop is not None and stop.is_set()):
            break
        if not is_block_name(os.path.basename(entry.path)):
            continue  # scanners only offer blocks; this keeps any other file out of reach
        if in_use(entry.path):
            done.skipped_recent += 1
            continue
        try:
            st = os.lstat(entry.path)
        except FileNotFoundError:
            done.vanished += 1
            continue
        if st.st_mtime_ns != entry.mtime_ns:
            done.skipped_recent += 1
            continue
        if not dry_run:
            try:
                os.unlink(entry.path)
            except FileNotFoundError:
                done.vanished += 1
                continue
        done.paths.append(entry.path)
        done.bytes += st.st_size
        pending.append(entry.path)
        pending_bytes += st.st_size
        if on_batch is not None and len(pending) >= batch:
            on_batch(pending, pending_bytes)
            pending, pending_bytes = [], 0
    if on_batch is not None and pending:
        on_batch(pending, pending_bytes)
    return done


__all__ = ["EVICTOR_LOCK_NAME", "Evicted", "evict", "evictor_lock"]

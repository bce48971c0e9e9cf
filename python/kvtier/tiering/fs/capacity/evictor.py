"""Eviction: one evictor per root at a time, unlinking least recently used block files
(or renaming some for a store of this process to overwrite: ``Recycle``).

The evictor lock is ``<root>/.kvtier/evictor.lock``, an open-file-description lock
(``F_OFD_SETLK``) taken without waiting through a descriptor of the caller's own: two tiers of
one process conflict like two processes (also when they reach the root by different paths),
the lock goes with its holder's death, and nothing stays open once the pass is over. A holder
whose lock file was removed or replaced meanwhile does not count as holding it. A process
that does not get it leaves the work to the holder instead of repeating it. Only block files
(``*.kvb``) are ever unlinked, never tmp files of writers in flight or anything else.
Racing deleters are harmless: ENOENT means someone else removed the file and is not counted
here, so nothing is uncounted twice.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field

from kvtier import _core
from kvtier.tiering.fs.capacity.daemon_pool import DaemonPool
from kvtier.tiering.fs.capacity.ledger import (
    PROCESS_CLOSE_FAILURES,
    CloseFailures,
    open_lock_file,
    state_dir,
    still_at,
    try_ofd_lock,
)
from kvtier.tiering.fs.capacity.scanner import FileEntry, is_block_name

EVICTOR_LOCK_NAME = "evictor.lock"
UNLINK_WORKERS = 32
# A wave (unlinks between two ledger updates) ends at WAVE_FILES files or WAVE_BYTES bytes:
# stores waiting for room get it wave by wave, not at the end of a pass (unlinks of large
# files on a busy journal take milliseconds each).
WAVE_FILES = 256
WAVE_BYTES = 32 << 20


@contextlib.contextmanager
def evictor_lock(
    root: str, file_mode: int = 0o600, close_failures: CloseFailures | None = None
) -> Iterator[bool]:
    """Yields True while the caller holds the root's evictor lock, False if another does.
    A failed close (the lock is dropped all the same) is counted in ``close_failures``."""
    path = os.path.join(state_dir(root), EVICTOR_LOCK_NAME)
    fd = open_lock_file(path, file_mode)
    try:
        yield try_ofd_lock(fd) and still_at(fd, path)
    finally:
        (close_failures or PROCESS_CLOSE_FAILURES).close(fd, path)  # drops the lock


@dataclass
class UnlinkTuning:
    """The unlink thread count of the next wave and what the last one measured."""

    threads: int
    rate: float = 0.0  # files per second of the last wave (0: none measured yet)
    last_step: int = 0  # -1: the last wave had fewer threads than the one before, +1: more
    hold: int = 0  # waves to stay at this count before trying fewer again


@dataclass
class Recycle:
    """Evicted files to keep for reuse instead of unlinking (_core.unlink_unchanged_files):
    up to ``files`` of exactly ``file_size`` bytes, owned by this user, below the directory
    ``below`` (the root of the engine whose stores take them). ``files`` counts down as a pass
    renames them."""

    file_size: int
    files: int
    below: str


# The outcome of a candidate after the error that stopped its thread's share of a wave.
_UNTRIED = -2
# The outcome of a candidate whose unlink was refused (EACCES, EPERM).
_DENIED = -3

# Fewer threads are kept unless the wave rate fell below this share of the one before.
_SLOWER = 0.8
# After a step up, waves at that count before fewer are tried again.
_HOLD_WAVES = 8


@dataclass
class Evicted:
    paths: list[str] = field(default_factory=list)
    bytes: int = 0
    recycled: list[str] = field(default_factory=list)  # tmp names of the files kept (Recycle)
    used_since: list[str] = field(default_factory=list)  # candidates used since the scan: kept
    vanished: int = 0  # candidates someone else removed first
    # Candidates this process may not remove (EACCES, EPERM: another user's directory, an
    # immutable file): kept, and the pass goes on; the first of them, for the operator.
    denied: int = 0
    denied_bytes: int = 0
    first_denied: str | None = None
    unlink_cpu_seconds: float = 0.0  # CPU time of the threads that checked and unlinked
    # Where the thread count of the waves ended (see evict()): the next pass's start.
    tuning: UnlinkTuning | None = None

    @property
    def skipped_recent(self) -> int:
        return len(self.used_since)


def evict(
    candidates: Sequence[FileEntry],
    need_bytes: int,
    *,
    in_use: Callable[[str], bool] = lambda path: False,
    dry_run: bool = False,
    on_batch: Callable[[list[str], int, list[str]], None] | None = None,
    stop: threading.Event | None = None,
    workers: int = UNLINK_WORKERS,
    pool: Executor | None = None,
    tuning: UnlinkTuning | None = None,
    root: str = "",
    recycle: Recycle | None = None,
) -> Evicted:
    """Unlink candidates (oldest first) until ``need_bytes`` are freed.

    A candidate whose mtime moved since the scan, or that ``in_use`` says was used and not
    yet flushed, is kept. Unlinks run on ``workers`` threads (unlink is the slow part, and
    it releases the GIL) in waves of the oldest candidates that cover what is still needed;
    ``on_batch(paths, bytes, recycled)`` is called after each wave, so budgets and lookup
    caches learn of evictions while they happen; ``recycled`` are the new names of the files
    ``recycle`` kept (their blocks are evicted all the same: in ``paths`` and ``bytes``).
    ``pool`` (with at least ``workers`` threads) is used instead of a pool of this call's
    own: a tier evicts often, and starting threads for every pass costs more than a small
    pass does.

    Of those ``workers``, each wave uses only as many as make it faster: an unlink that
    waits on a device or a server (milliseconds on a busy journal, a network file system)
    gains from more threads; one that only burns CPU (tmpfs freeing pages, a fast local disk)
    does not, and more threads then only add GIL hand-offs and context switches (three to
    four times the Python CPU per file at 32 threads on tmpfs) that the stores need. Waves
    try halving the count while the files per second hold (within _SLOWER), and double it
    back when they fall (_next_threads). ``tuning`` carries that across passes (start:
    ``workers``); Evicted.tuning is where it ended.

    With ``root``, candidates are reached from it without following any symbolic link below
    it (a link planted in the tree is never followed to a file outside). A file this process
    may not remove (EACCES, EPERM) is kept and counted in Evicted.denied; the pass goes on.
    Any other error but a vanished file (EIO, EROFS, an audit hook's veto) stops the pass:
    the files removed before it, by every thread, are reported through ``on_batch``, then
    it is raised. ``recycle`` needs ``root``.
    """
    done = Evicted()
    tune = tuning if tuning is not None else UnlinkTuning(workers)
    tune.threads = max(1, min(workers, tune.threads))
    own_pool = pool is None and workers > 1 and not dry_run
    if own_pool:
        pool = DaemonPool(workers, "kvtier-evict")  # never joined at exit (daemon_pool.py)
    elif dry_run or workers <= 1:
        pool = None
    i = 0
    try:
        while i < len(candidates) and done.bytes < need_bytes:
            if stop is not None and stop.is_set():
                break
            start, covered = i, 0
            # Never more than is still needed: a block beyond that may be in use by the time
            # its turn comes (its use flushed to its mtime after the scan read it).
            while i < len(candidates) and i - start < WAVE_FILES:
                if covered >= min(WAVE_BYTES, need_bytes - done.bytes):
                    break
                covered += candidates[i].size
                i += 1
            wave = candidates[start:i]
            if pool is not None:  # one task per thread: a task per file costs more than it saves
                n_slices = min(tune.threads, len(wave))
                slices = [wave[w::n_slices] for w in range(n_slices)]
                # Each slice may keep its share of the files still wanted.
                keeps = _shares(recycle, n_slices)
                began = time.perf_counter()
                parts = list(
                    pool.map(
                        lambda part, keep: _evict_all(part, in_use, dry_run, root, keep),
                        slices,
                        keeps,
                    )
                )
                wall = time.perf_counter() - began
                wave = [e for part in slices for e in part]
                if len(wave) >= 2 * n_slices and wall > 0:  # a wave too small tells nothing
                    _next_threads(tune, len(wave) / wall, workers)
            else:
                parts = [_evict_all(wave, in_use, dry_run, root, _shares(recycle, 1)[0])]
            outcomes = [o for part, _, _, _ in parts for o in part]
            done.unlink_cpu_seconds += sum(cpu for _, cpu, _, _ in parts)
            error = next((e for _, _, e, _ in parts if e is not None), None)
            recycled = [name for _, _, _, names in parts for name in names]
            if recycle is not None:
                recycle.files = max(0, recycle.files - len(recycled))
                done.recycled += recycled
            paths, nbytes = [], 0
            for entry, outcome in zip(wave, outcomes):
                if outcome is None:
                    done.vanished += 1
                elif outcome == _UNTRIED:
                    continue
                elif outcome == _DENIED:
                    done.denied += 1
                    done.denied_bytes += entry.size
                    done.first_denied = done.first_denied or entry.path
                elif outcome == _core.UNLINK_RECYCLED:
                    paths.append(entry.path)
                    nbytes += entry.size
                elif outcome < 0:
                    done.used_since.append(entry.path)
                else:
                    paths.append(entry.path)
                    nbytes += outcome
            done.paths += paths
            done.bytes += nbytes
            if on_batch is not None and paths:
                on_batch(paths, nbytes, recycled)
            if error is not None:
                raise error  # after the files it did remove were reported
    finally:
        if own_pool and pool is not None:
            pool.shutdown()
    done.tuning = tune
    return done


def _next_threads(tune: UnlinkTuning, rate: float, workers: int) -> None:
    """Choose the next wave's thread count from this wave's ``rate`` (files per second)."""
    slower = tune.rate > 0 and rate < _SLOWER * tune.rate
    if tune.last_step < 0 and slower and tune.threads < workers:
        tune.threads, tune.last_step, tune.hold = min(workers, 2 * tune.threads), 1, _HOLD_WAVES
    elif tune.hold > 0:
        tune.hold -= 1
        tune.last_step = 0
    elif tune.threads > 1:
        tune.threads, tune.last_step = tune.threads // 2, -1
    else:
        tune.last_step = 0
    tune.rate = rate


@dataclass(frozen=True)
class _Keep:
    """What one thread's share of a wave may keep for reuse."""

    recycle: Recycle | None
    files: int


_NO_KEEP = _Keep(None, 0)


def _shares(recycle: Recycle | None, n: int) -> list[_Keep]:
    """``recycle.files`` split over ``n`` threads as evenly as whole files go."""
    if recycle is None:
        return [_NO_KEEP] * n
    base, extra = divmod(recycle.files, n)
    return [_Keep(recycle, base + (w < extra)) for w in range(n)]


def _evict_all(
    entries: Sequence[FileEntry],
    in_use: Callable[[str], bool],
    dry_run: bool,
    root: str,
    keep: _Keep = _NO_KEEP,
) -> tuple[list[int | None], float, Exception | None, list[str]]:
    """Outcomes of ``entries`` (bytes freed; -1 for a block kept: not a block, or used since
    the scan; None if it was gone; _DENIED if this process may not remove it;
    UNLINK_RECYCLED if it was kept for reuse as ``keep`` asks; _UNTRIED past an error), this
    thread's CPU seconds for them, the error that stopped them, if any, and the new names of
    the files kept for reuse.

    The Python checks come first; the system calls of the rest (an lstat to see that the
    mtime is still the scan's, then the unlink) are one native call with the GIL released: a
    call per file handed the GIL to and fro three times per file, which the engine's callers
    and the other unlink threads waited for."""
    started = time.thread_time()
    outcomes: list[int | None] = [-1] * len(entries)
    # is_block_name: scanners only offer blocks; this keeps any other file out of reach.
    # A store that begins after these checks shows in the mtime the native call compares (it
    # renames a new file into place) unless it lands between that lstat and the unlink (an
    # over-count until the next scan). A use recorded here after them and not yet flushed
    # does not show: that block, the oldest the scan saw, may go, a miss for its next load.
    todo = [
        i
        for i, e in enumerate(entries)
        if is_block_name(os.path.basename(e.path)) and not in_use(e.path)
    ]
    error: Exception | None
    recycled: list[str] = []
    try:
        results, error, recycled = _core.unlink_unchanged_files(
            [entries[i].path for i in todo],
            [divmod(entries[i].mtime_ns, 10**9) for i in todo],
            root,
            dry_run,
            keep.recycle.file_size if keep.recycle else 0,
            keep.files,
            keep.recycle.below if keep.recycle else None,
        )
    except Exception as e:  # an audit hook's veto, a path no system call takes: none tried
        results, error = [], e
    for i, result in zip(todo, results):
        if result == _core.UNLINK_GONE:
            outcomes[i] = None
        elif result == _core.UNLINK_DENIED:
            outcomes[i] = _DENIED
        elif result == _core.UNLINK_RECYCLED:
            outcomes[i] = result
        else:
            outcomes[i] = -1 if result < 0 else result
    for i in todo[len(results) :]:
        outcomes[i] = _UNTRIED
    return outcomes, time.thread_time() - started, error, recycled


__all__ = ["EVICTOR_LOCK_NAME", "Evicted", "Recycle", "UnlinkTuning", "evict", "evictor_lock"]

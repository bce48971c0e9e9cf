"""Existence answers for lookup(): a cache of known blocks plus a thread that checks the others.

Storage can stop answering (docs/tiers.md, "When storage stalls"), so no existence check runs
on the caller's thread when the tier has a deadline: synchronous lookups hand it to a checker
thread and wait for at most ``io_timeout_s`` (or until the root is degraded), asynchronous
ones never wait at all. A check that does not answer by then degrades the root.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING

from kvtier import _core
from kvtier.tiering.base import OffloadKey

if TYPE_CHECKING:
    from kvtier.tiering.fs.health import RootHealth

logger = logging.getLogger(__name__)

_BATCH = 1024
# Caches are hints, so they are bounded: past this many keys the oldest are forgotten and
# asked about again (one stat), which keeps a long-running server's memory flat.
_MAX_PRESENT = 1 << 20
_MAX_ANSWERS = 1 << 16
# A known block is re-checked once it has been known this long: another process or host (or
# `kvtier gc`) may have evicted it. This bounds how long a lookup can report a block that was
# evicted elsewhere; an eviction by this process is applied at once (mark_absent).
PRESENT_TTL_SECONDS = 10.0
# How long close() without a deadline waits for the resolver thread (it holds nothing of the
# tier's); the fs tier passes its own deadline instead, derived from io_timeout_s.
CLOSE_WAIT_SECONDS = 1.0
# A synchronous lookup waiting for its check looks at the root's health this often, so a root
# degraded by another operation's timeout frees it at once rather than at its own deadline.
HEALTH_POLL_SECONDS = 0.02
# Checker threads abandoned in the kernel (a stalled root) and still there; past this many
# alive, a lookup that would need a new one answers "absent" without touching the storage.
MAX_STUCK_CHECKERS = 4


@dataclass(eq=False)
class _Check:
    """One synchronous lookup's existence check, handed to the checker thread."""

    path: str
    # Held until the checker has answered: the caller waits on it with a timeout (a lock
    # wait is the cheapest hand-off threading has, and it releases the GIL).
    answered: threading.Lock = field(default_factory=threading.Lock)
    exists: bool = False
    taken: bool = False  # the checker is running it (it cannot be withdrawn any more)


class LookupCache:
    """Answers ``lookup``: True for known blocks, else one stat or an asynchronous check.

    Thread-safe. With ``asynchronous`` a miss in the cache returns None and queues the path
    for a background thread that checks batches with ``_core.paths_exist`` (GIL released);
    the next lookup of that key returns the answer. The thread holds no reference to the
    tier, so a tier that is dropped without shutdown() can still be collected.

    A known block older than PRESENT_TTL_SECONDS is checked again: with one stat
    (synchronous mode), or still answered True while the resolver re-checks it.
    """

    def __init__(
        self,
        path_of: Callable[[OffloadKey], str],
        asynchronous: bool,
        name: str,
        root_dir: str = "",
        timeout_s: float = 0.0,
    ) -> None:
        self._path_of = path_of
        self._name = name
        # The deadline of a check (io_timeout_s; 0: none, checks run on the caller's thread).
        self._timeout_s = timeout_s
        self._health: RootHealth | None = None
        # Blocks count only as regular files reached from here without following links.
        self._root_dir = root_dir
        self._asynchronous = asynchronous
        self._cond = threading.Condition(threading.Lock())
        # Known blocks and when they were last confirmed (time.monotonic()), least recently
        # asked first. A plain dict, not an OrderedDict: the garbage collector stops tracking
        # a dict of bytes and floats, never an OrderedDict, whose million keys every full
        # collection of the process then walked with the GIL held.
        self._present: dict[OffloadKey, float] = {}
        # Resolved "absent" answers, handed out once: the file may appear later.
        self._answers: dict[OffloadKey, bool] = {}
        self._pending: dict[OffloadKey, None] = {}  # insertion-ordered set
        self._closed = False
        self.lookups = self.hits = self.misses = self.unknown = 0
        self.timeouts = 0  # checks abandoned at their deadline
        # Synchronous checks with a deadline: one checker thread at a time serves them, started
        # when first needed; one abandoned at a deadline is replaced by the next check.
        self._checks: deque[_Check] = deque()
        self._checker: threading.Thread | None = None
        self._stuck_checkers = 0
        self._checker_check: _Check | None = None  # the check the checker is running
        self._batch_started: float | None = None  # the resolver's batch in the kernel since
        self._batch_epoch = 0
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def watch(self, health: RootHealth) -> None:
        """Report checks past their deadline to ``health`` (degrading the root) and stop
        waiting for one once the root is degraded. Call before the first lookup."""
        self._health = health

    def lookup(self, key: OffloadKey) -> bool | None:
        now = time.monotonic()
        overdue: tuple[int, float] | None = None
        with self._cond:
            self.lookups += 1
            confirmed = self._present.get(key)
            if confirmed is not None:
                fresh = now - confirmed < PRESENT_TTL_SECONDS
                if fresh or (self._asynchronous and not self._closed):
                    self._present[key] = self._present.pop(key)  # now the most recent
                    if not fresh and key not in self._pending:
                        self._pending[key] = None
                        self._cond.notify()
                    self.hits += 1
                    return True
            if self._asynchronous and not self._closed:
                answer = self._answers.pop(key, None)
                if answer is not None:
                    self.misses += 1
                    return answer
                if key not in self._pending:
                    self._pending[key] = None
                    self._cond.notify()
                self.unknown += 1
                overdue = self._resolver_overdue(now)
                if overdue is None:
                    return None
            elif self._closed and self._timeout_s > 0:
                # Shut down: no checker is started again, and nothing waits on the storage.
                self.misses += 1
                return False
        if overdue is not None:
            # The resolver has been in the kernel past the deadline: the root stopped
            # answering, and "not known yet" would be the answer for as long as it does.
            self._timed_out(overdue[0], now - overdue[1], "an asynchronous existence check")
            return None
        if self._timeout_s > 0:
            exists = self._check_bounded(self._path_of(key))
            if exists is None:  # no answer by the deadline, or the root degraded meanwhile
                with self._cond:
                    self.misses += 1
                return False
        else:
            # No deadline (io_timeout_s=0): checked on the caller's thread, however long the
            # storage takes.
            exists = bool(_core.paths_exist([self._path_of(key)], self._root_dir)[0])
        with self._cond:
            if exists:
                self._add_present(key, now)
                self.hits += 1
            else:
                self._present.pop(key, None)
                self.misses += 1
        return exists

    # -- deadlines -----------------------------------------------------------------------------

    def _resolver_overdue(self, now: float) -> tuple[int, float] | None:
        """(epoch, start) of the resolver's batch if it has been in the kernel longer than
        the deadline and was not reported yet (call under _cond)."""
        since = self._batch_started
        if since is None or self._timeout_s <= 0 or now - since < self._timeout_s:
            return None
        self._batch_started = None  # reported once per batch
        return self._batch_epoch, since

    def _timed_out(self, epoch: int, waited: float, what: str) -> None:
        with self._cond:
            self.timeouts += 1
        health = self._health
        if health is not None:
            health.report_timeout(
                f"{what} timed out (io_timeout_s={self._timeout_s:g}): no answer from the "
                f"storage for {waited:.1f} s",
                epoch,
            )

    def _check_bounded(self, path: str) -> bool | None:
        """Whether ``path`` is a block file, checked on the checker thread; None when it did
        not answer within the deadline (the root is then degraded) or the root degraded
        meanwhile. The caller waits for at most the deadline."""
        health = self._health
        epoch = health.epoch if health is not None else 0
        check = _Check(path)
        check.answered.acquire()
        with self._cond:
            if self._checker is None:
                if self._stuck_checkers >= MAX_STUCK_CHECKERS:
                    return None  # that many already wait in the kernel: the root is stalled
                self._start_checker()
            self._checks.append(check)
            self._cond.notify_all()
        started = time.monotonic()
        deadline = started + self._timeout_s
        while True:
            left = deadline - time.monotonic()
            if check.answered.acquire(timeout=max(0.0, min(left, HEALTH_POLL_SECONDS))):
                return check.exists
            if health is not None and health.degraded:
                timed_out = False
                break
            if left <= HEALTH_POLL_SECONDS:
                timed_out = True
                break
        with self._cond:
            if check.answered.acquire(blocking=False):
                return check.exists  # answered just now
            if check.taken:
                # The checker is stuck on it in the kernel: abandon that thread (it exits
                # when the kernel returns) and let the next check start another.
                if self._checker is not None and self._checker_check is check:
                    self._checker = None
                    self._stuck_checkers += 1
                    if self._checks:  # others queued behind it get a checker of their own
                        self._start_checker()
            else:
                self._checks.remove(check)
        if timed_out:
            self._timed_out(epoch, time.monotonic() - started, "a lookup's existence check")
        return None

    def _start_checker(self) -> None:
        """Start the checker thread (call under _cond, with none running)."""
        if self._stuck_checkers >= MAX_STUCK_CHECKERS:
            return
        self._checker = threading.Thread(
            target=self._check_loop, name=f"{self._name}-check", daemon=True
        )
        self._checker.start()

    def _check_loop(self) -> None:
        me = threading.current_thread()
        while True:
            with self._cond:
                while not self._checks and not self._closed and self._checker is me:
                    self._cond.wait()
                if self._closed or self._checker is not me:
                    return
                check = self._checks.popleft()
                check.taken = True
                self._checker_check = check
            try:
                check.exists = bool(_core.paths_exist([check.path], self._root_dir)[0])
            except Exception:  # never let the checker die: answer "absent"
                logger.exception("Existence check of %s failed; answering 'absent'", check.path)
                check.exists = False
            with self._cond:
                self._checker_check = None
                check.answered.release()
                if self._checker is not me:
                    self._stuck_checkers -= 1  # abandoned meanwhile, and back now
                    return

    def mark_present(self, keys: Iterable[OffloadKey]) -> None:
        now = time.monotonic()
        with self._cond:
            for key in keys:
                self._answers.pop(key, None)
                self._add_present(key, now)

    def mark_absent(self, keys: Iterable[OffloadKey]) -> None:
        with self._cond:
            for key in keys:
                self._present.pop(key, None)
                self._answers.pop(key, None)

    def forget_present(self) -> None:
        """Treat every known block as unknown (for evictions whose keys cannot be named)."""
        with self._cond:
            self._present.clear()

    def _add_present(self, key: OffloadKey, now: float) -> None:
        self._present.pop(key, None)
        self._present[key] = now
        if len(self._present) > _MAX_PRESENT:
            # The oldest sixteenth at once: a dict finds its first key past every one deleted
            # before it (until it is resized), so one at a time would cost a walk per key.
            for old in list(islice(self._present, _MAX_PRESENT // 16)):
                del self._present[old]

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "lookups": self.lookups,
                "lookup_hits": self.hits,
                "lookup_misses": self.misses,
                "lookup_unknown": self.unknown,
                "lookup_pending": len(self._pending),
                "lookup_timeouts": self.timeouts,
            }

    def stop(self) -> None:
        """Ask the resolver and checker threads to finish; returns at once (idempotent)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()

    def join(self, deadline: float) -> bool:
        """Wait for the resolver thread until ``deadline`` (time.monotonic()); True once it
        has finished. A check stuck on a stalled file system is left to return on its own:
        it holds only its own paths, nothing of the tier's that could be freed under it."""
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(max(0.0, deadline - time.monotonic()))
        return not thread.is_alive()

    def close(self, deadline: float | None = None) -> None:
        """:meth:`stop`, then :meth:`join` until ``deadline``, or for at most
        CLOSE_WAIT_SECONDS without one (idempotent)."""
        self.stop()
        self.join(time.monotonic() + CLOSE_WAIT_SECONDS if deadline is None else deadline)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(islice(self._pending, _BATCH))
                asked = time.monotonic()
                # Seen by lookups: a batch in the kernel past the deadline degrades the root.
                self._batch_started = asked
                health = self._health
                self._batch_epoch = health.epoch if health is not None else 0
            try:
                paths = [self._path_of(k) for k in batch]
                exists = _core.paths_exist(paths, self._root_dir)
            except Exception:  # never let the resolver die: callers would get None forever
                logger.exception("Asynchronous lookup failed; answering 'absent'")
                exists = [False] * len(batch)
            with self._cond:
                self._batch_started = None
                for key, found in zip(batch, exists):
                    self._pending.pop(key, None)
                    if found:
                        self._add_present(key, asked)
                        continue
                    confirmed = self._present.get(key)
                    if confirmed is not None and confirmed < asked:
                        del self._present[key]  # known before the check: gone since
                    if key not in self._present:  # a store may have finished meanwhile
                        if len(self._answers) >= _MAX_ANSWERS:
                            self._answers.clear()
                        self._answers[key] = False


__all__ = ["LookupCache"]

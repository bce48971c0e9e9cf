"""Existence answers for lookup(): a cache of known blocks plus an optional resolver thread."""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from itertools import islice

from kvtier import _core
from kvtier.tiering.base import OffloadKey

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
# How long close() waits for the resolver thread; it holds nothing of the tier's.
CLOSE_WAIT_SECONDS = 1.0


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
    ) -> None:
        self._path_of = path_of
        # Blocks count only as regular files reached from here without following links.
        self._root_dir = root_dir
        self._asynchronous = asynchronous
        self._cond = threading.Condition(threading.Lock())
        # Known blocks and when they were last confirmed (time.monotonic()).
        self._present: OrderedDict[OffloadKey, float] = OrderedDict()
        # Resolved "absent" answers, handed out once: the file may appear later.
        self._answers: dict[OffloadKey, bool] = {}
        self._pending: dict[OffloadKey, None] = {}  # insertion-ordered set
        self._closed = False
        self.lookups = self.hits = self.misses = self.unknown = 0
        self._thread: threading.Thread | None = None
        if asynchronous:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
            self._thread.start()

    def lookup(self, key: OffloadKey) -> bool | None:
        now = time.monotonic()
        with self._cond:
            self.lookups += 1
            confirmed = self._present.get(key)
            if confirmed is not None:
                fresh = now - confirmed < PRESENT_TTL_SECONDS
                if fresh or (self._asynchronous and not self._closed):
                    self._present.move_to_end(key)
                    if not fresh and key not in self._pending:
                        self._pending[key] = None
                        self._cond.notify()
                    self.hits += 1
                    return True
            if self._asynchronous and not self._closed:
                answer = self._answers.pop(key, None)
                if answer is None:
                    if key not in self._pending:
                        self._pending[key] = None
                        self._cond.notify()
                    self.unknown += 1
                    return None
                self.misses += 1
                return answer
        # Synchronous mode (or after close): checked on the caller's thread.
        exists = bool(_core.paths_exist([self._path_of(key)], self._root_dir)[0])
        with self._cond:
            if exists:
                self._add_present(key, now)
                self.hits += 1
            else:
                self._present.pop(key, None)
                self.misses += 1
        return exists

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
        self._present[key] = now
        self._present.move_to_end(key)
        if len(self._present) > _MAX_PRESENT:
            self._present.popitem(last=False)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "lookups": self.lookups,
                "lookup_hits": self.hits,
                "lookup_misses": self.misses,
                "lookup_unknown": self.unknown,
                "lookup_pending": len(self._pending),
            }

    def close(self) -> None:
        """Stop the resolver thread and wait for it, at most CLOSE_WAIT_SECONDS: a check
        stuck on a stalled file system is left to return on its own (idempotent)."""
        with self._cond:
            self._closed = True
            self._pending.clear()
            self._cond.notify_all()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(CLOSE_WAIT_SECONDS)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch = list(islice(self._pending, _BATCH))
            asked = time.monotonic()
            try:
                paths = [self._path_of(k) for k in batch]
                exists = _core.paths_exist(paths, self._root_dir)
            except Exception:  # never let the resolver die: callers would get None forever
                logger.exception("Asynchronous lookup failed; answering 'absent'")
                exists = [False] * len(batch)
            with self._cond:
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

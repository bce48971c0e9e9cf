"""Health of a root: healthy, or degraded after a block operation timed out until a probe
beneath the root answers again (docs/tiers.md, "When storage stalls").

One :class:`RootHealth` per root directory and process, shared by every tier of the process
on that root (found by the directory's ``(st_dev, st_ino)``): a stall belongs to the storage,
not to one tier, so the first tier that sees a timeout spares the others from sending more
work into the stall, and one probe serves them all. Processes do not share it: each finds out
by its own first timeout.

Nothing here ever waits on the storage on a caller's thread. The probe runs on a thread of
its own; a monitor thread waits for it at most its deadline and, when the probe is stuck in
the kernel, abandons it and starts no other probe until it has returned.

When the root degrades, each member's engine fails the blocks it has not started beneath the
root (``Engine.fail_unstarted``): they would only wait for workers stuck in the stall, and
past the engine's replacement cap for ever, so ``drain_jobs()`` would not be bounded.
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import secrets
import threading
import weakref
from collections.abc import Callable
from itertools import count
from typing import Protocol

from kvtier._fork import after_fork_in_child, inherited, this_process
from kvtier.tiering.fs.capacity.ledger import state_dir
from kvtier.tiering.fs.file_mapper import host_label

logger = logging.getLogger(__name__)

# A degraded root is probed after PROBE_INTERVAL_S, then at doubling intervals up to
# PROBE_MAX_INTERVAL_S while it stays degraded: a root down for an hour costs a probe every
# 30 s, a short stall is over about a second after the storage answers again.
PROBE_INTERVAL_S = 1.0
PROBE_MAX_INTERVAL_S = 30.0
# The probe's deadline when no tier on the root has one (io_timeout_s = 0 everywhere, and the
# root was degraded by a kernel ETIMEDOUT, e.g. an NFS soft mount).
DEFAULT_PROBE_TIMEOUT_S = 10.0
PROBE_PREFIX = "probe."
_PROBE_PAYLOAD = b"kvtier root probe\n" * 16  # 288 bytes: a small write, read back

HEALTHY = "healthy"
DEGRADED = "degraded"

_token = secrets.token_hex(8)
_probe_numbers = count()


class RootHealth:
    """The health of one root; thread-safe. Members (tiers) join with :meth:`join` and leave
    with :meth:`leave`; the registry forgets the root once the last one has left."""

    def __init__(self, root: str, probe_dir: str, key: tuple[int, int]) -> None:
        self.root = root
        self.probe_dir = probe_dir
        self._key = key
        self._cond = threading.Condition(threading.Lock())
        # None while healthy. Read without the lock on the callers' hot paths (lookup,
        # submit): a reference read is atomic, and a stale answer only lets one more job
        # through into the stall, or fails one just as the root recovers.
        self.reason: str | None = None
        # Bumped at each recovery: a timeout of work submitted before it is old news.
        self.epoch = 0
        self._members = 0
        self._probe_timeouts: list[float] = []
        # The members' engines' Engine.fail_unstarted, bound to their directories.
        self._on_degraded: list[Callable[[], object]] = []
        self._monitor: threading.Thread | None = None
        self._probe_stuck = False
        self.degraded_count = 0
        self.probes = 0
        self.probe_failures = 0

    # -- members -----------------------------------------------------------------------------

    def join(self, io_timeout_s: float, fail_unstarted: Callable[[], object] | None = None) -> None:
        """Join with deadline ``io_timeout_s`` (0: none); ``fail_unstarted`` is called (on
        the thread that degrades the root, never with a lock held) each time it degrades."""
        with self._cond:
            self._members += 1
            if io_timeout_s > 0:
                self._probe_timeouts.append(io_timeout_s)
            if fail_unstarted is not None:
                self._on_degraded.append(fail_unstarted)

    def leave(
        self, io_timeout_s: float, fail_unstarted: Callable[[], object] | None = None
    ) -> None:
        with self._cond:
            self._members -= 1
            if io_timeout_s > 0:
                self._probe_timeouts.remove(io_timeout_s)
            if fail_unstarted is not None:
                self._on_degraded.remove(fail_unstarted)
            last = self._members == 0
            if last:  # nobody probes a root without members: whoever joins next starts afresh
                self.reason = None
                self.epoch += 1
            self._cond.notify_all()  # a monitor without members stops
        if last:
            _forget(self)

    # -- state -------------------------------------------------------------------------------

    @property
    def degraded(self) -> bool:
        return self.reason is not None

    def refusal(self, what: str) -> str | None:
        """The error of work ``what`` ("submit_store", ...) refused because the root is
        degraded, or None while it is healthy."""
        reason = self.reason
        if reason is None:
            return None
        return (
            f"{what}: {os.strerror(errno.ETIMEDOUT)} (errno {errno.ETIMEDOUT}): root {self.root} "
            f"is degraded ({reason}); failed at once until a probe of the root answers"
        )

    def report_timeout(self, reason: str, epoch: int) -> None:
        """A block operation of work submitted at ``epoch`` timed out: degrade the root (the
        first timeout does it) and start probing it."""
        with self._cond:
            if self.reason is not None or epoch != self.epoch or self._members == 0:
                return
            self.reason = reason
            self.degraded_count += 1
            if self._monitor is None:
                self._monitor = threading.Thread(
                    target=self._run, name="kvtier-health", daemon=True
                )
                self._monitor.start()
            engines = list(self._on_degraded)
        # Memory only (the engines' queues): never waits on the storage.
        for fail_unstarted in engines:
            try:
                fail_unstarted()
            except Exception as e:  # an engine shut down meanwhile fails nothing; never raise
                logger.debug("Failing unstarted work on root %s: %s", self.root, e)
        logger.warning(
            "Root %s is degraded: %s. Lookups answer absent and its stores and loads fail at "
            "once until a probe of the root answers (first in %.0f s)",
            self.root,
            reason,
            PROBE_INTERVAL_S,
        )

    def stats(self) -> dict[str, int | str]:
        with self._cond:
            return {
                "health": DEGRADED if self.reason is not None else HEALTHY,
                "health_degraded_count": self.degraded_count,
                "health_probes": self.probes,
                "health_probe_failures": self.probe_failures,
                "health_probe_stuck": int(self._probe_stuck),
            }

    # -- probing (the monitor thread) --------------------------------------------------------

    def _probe_timeout(self) -> float:
        # The shortest deadline of the members: the probe answers no later than their work.
        return min(self._probe_timeouts, default=DEFAULT_PROBE_TIMEOUT_S)

    def _run(self) -> None:
        interval = PROBE_INTERVAL_S
        while True:
            with self._cond:
                self._cond.wait_for(self._monitor_done, timeout=interval)
                if self._monitor_done():
                    self._monitor = None
                    return
                interval = min(2 * interval, PROBE_MAX_INTERVAL_S)
                if self._probe_stuck:
                    continue  # the last probe is still in the kernel: no second one beside it
                self._probe_stuck = True  # cleared by the probe thread when it returns
                deadline = self._probe_timeout()
            done = threading.Event()
            outcome: list[BaseException | None] = []
            threading.Thread(
                target=_probe_thread,
                args=(self.probe_dir, done, outcome, self._probe_returned),
                name="kvtier-probe",
                daemon=True,
            ).start()
            answered = done.wait(deadline)
            with self._cond:
                self.probes += 1
                if answered and not outcome[0]:
                    self.reason = None
                    self.epoch += 1
                    self._monitor = None
                    break
                self.probe_failures += 1
                why = f"no answer within {deadline:g} s" if not answered else str(outcome[0])
            logger.debug("Probe of root %s failed: %s", self.root, why)
        logger.warning("Root %s answers again: healthy", self.root)

    def _monitor_done(self) -> bool:
        # No member left (the last one reset the state), or healthy again.
        return self._members == 0 or self.reason is None

    def _probe_returned(self) -> None:
        with self._cond:
            self._probe_stuck = False


def _probe_thread(
    directory: str,
    done: threading.Event,
    outcome: list[BaseException | None],
    returned: Callable[[], None],
) -> None:
    try:
        probe_storage(directory)
        outcome.append(None)
    except Exception as e:  # any failure is "not answering yet"; never let it escape
        outcome.append(e)
    finally:
        returned()
        done.set()


def probe_storage(directory: str) -> None:
    """A small write, read back and remove beneath ``directory``; raises OSError when the
    storage fails it (blocks while the storage does not answer)."""
    name = f"{PROBE_PREFIX}{host_label()}.{this_process()}.{_token}.{next(_probe_numbers)}"
    path = os.path.join(directory, name)
    flags = os.O_CLOEXEC | os.O_NOFOLLOW
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flags, 0o600)
    try:
        try:
            view = memoryview(_PROBE_PAYLOAD)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        fd = os.open(path, os.O_RDONLY | flags)
        try:
            data = os.pread(fd, len(_PROBE_PAYLOAD) + 1, 0)
        finally:
            os.close(fd)
        if data != _PROBE_PAYLOAD:
            raise OSError(errno.EIO, f"probe read back {len(data)} bytes unlike those written")
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


# -- registry: one RootHealth per root and process -----------------------------------------

_registry: dict[tuple[int, int], RootHealth] = {}
_registry_lock = threading.Lock()


def join_root(
    root: str,
    probe_dir: str,
    key: tuple[int, int],
    io_timeout_s: float,
    fail_unstarted: Callable[[], object] | None = None,
) -> RootHealth:
    """The health of the root identified by ``key`` (its ``(st_dev, st_ino)``), joined as a
    member (:meth:`RootHealth.join`); :meth:`RootHealth.leave` when done."""
    with _registry_lock:
        health = _registry.get(key)
        if health is None:
            health = _registry[key] = RootHealth(root, probe_dir, key)
        health.join(io_timeout_s, fail_unstarted)
    return health


class _BudgetedRoot(Protocol):
    """What a user of a root knows of it: its path and ``(st_dev, st_ino)`` (a capacity
    controller's ``root`` and ``identity``)."""

    root: str
    identity: tuple[int, int]


class _Engine(Protocol):
    def fail_unstarted(self, directory: str) -> int: ...


def join_root_for(
    owner: object,
    capacity: _BudgetedRoot,
    io_timeout_s: float,
    engine: _Engine,
    directory: str,
) -> tuple[RootHealth, weakref.finalize]:
    """Join the health of ``capacity``'s root on behalf of ``owner`` (a tier, a transfer, a
    backend) whose ``engine`` writes beneath ``directory``: returns it and the finalizer that
    leaves it, called by the owner's shutdown or when the owner is collected. A forked
    child's copy never leaves: the parent's membership is not the child's, and the registry
    lock may be held for ever there."""
    fail_unstarted = functools.partial(engine.fail_unstarted, directory)
    health = join_root(
        capacity.root, state_dir(capacity.root), capacity.identity, io_timeout_s, fail_unstarted
    )
    return health, weakref.finalize(
        owner, _leave, health, io_timeout_s, fail_unstarted, this_process()
    )


def _leave(
    health: RootHealth,
    io_timeout_s: float,
    fail_unstarted: Callable[[], object],
    owner_pid: int,
) -> None:
    if not inherited(owner_pid):
        health.leave(io_timeout_s, fail_unstarted)


def _forget(health: RootHealth) -> None:
    with _registry_lock:
        if _registry.get(health._key) is health and health._members == 0:
            del _registry[health._key]


@after_fork_in_child
def _reset_registry() -> None:
    # A child has none of the parent's threads, and a lock another thread held stays held.
    global _registry_lock
    _registry_lock = threading.Lock()
    _registry.clear()


__all__ = [
    "DEGRADED",
    "HEALTHY",
    "PROBE_INTERVAL_S",
    "PROBE_MAX_INTERVAL_S",
    "RootHealth",
    "join_root",
    "probe_storage",
]

"""The usage ledger: bytes of block files under a root, shared by every process and host.

``<root>/.kvtier/usage.json`` holds::

    {"files": committed block bytes, "added": bytes ever committed (monotonic),
     "complete": whether a full scan has counted the root, "scanned_at": its wall time,
     "leases": {"<host>:<pid>:<n>": [bytes, heartbeat wall time], ...}}

Accounted usage is ``files + sum(leases)``. A lease is what one tier instance took from the
budget and has not yet moved into ``files``: chunks reserved ahead of its stores, stores in
flight, stores finished since its last settle. Every change is a read-modify-write under an
fcntl lock on the file (works across processes and NFS hosts); fcntl locks belong to the
process, so a process-wide thread lock per file serialises threads and tier instances of one
process, and the file descriptor stays open for the process's life (closing any descriptor
of a file drops the process's fcntl locks on it).

Errors in the accounting only ever over-count (see docs/tiers.md, "Capacity"): a lease of a
crashed process, a block written twice by racing writers. Reconciliation by a full scan
(:meth:`UsageLedger.reconcile`) brings ``files`` back to what is on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kvtier import _core
from kvtier._fork import after_fork_in_child
from kvtier.tiering.fs.capacity.scanner import STATE_DIR_NAME
from kvtier.tiering.fs.file_mapper import make_tier_directory

LEDGER_FILE_NAME = "usage.json"
# A lease whose holder has not written for this long is dropped by the next reconcile; live
# holders heartbeat every HEARTBEAT_SECONDS, and rewrite their lease if it was dropped.
HEARTBEAT_SECONDS = 30.0
LEASE_TIMEOUT_SECONDS = 300.0

_registry_lock = threading.Lock()
_fds: dict[str, tuple[int, threading.Lock]] = {}


@after_fork_in_child
def _new_thread_locks() -> None:
    # A lock another thread held at the fork stays locked in the child. The descriptors stay:
    # fcntl locks belong to a process, so the child's own locks on them are its own.
    global _registry_lock
    _registry_lock = threading.Lock()
    for path, (fd, _) in list(_fds.items()):
        _fds[path] = (fd, threading.Lock())


def _pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (when unsure: alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists, owned by someone else
    return True


def state_dir(root: str) -> str:
    return os.path.join(root, STATE_DIR_NAME)


def shared_fd(path: str, mode: int) -> tuple[int, threading.Lock]:
    """This process's descriptor of ``path`` (created if missing) and its thread lock."""
    with _registry_lock:
        found = _fds.get(path)
        if found is None:
            # Modes follow file_mode exactly, whatever the umask, as for every file and
            # directory of the tier: users sharing a root through file_mode share this too.
            make_tier_directory(os.path.dirname(path), int(_core.directory_mode(mode)))
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, mode)
            found = _fds[path] = (fd, threading.Lock())
        return found


@dataclass(frozen=True)
class LedgerState:
    files: int
    added: int
    complete: bool
    scanned_at: float
    leases: dict[str, tuple[int, float]]

    @property
    def leased(self) -> int:
        return sum(b for b, _ in self.leases.values())

    @property
    def used(self) -> int:
        return self.files + self.leased

    def bounded_used(self, fs_used: int) -> int:
        """Accounted usage, bounded below by the file system's used bytes until a first
        full scan has counted the root (files written before the ledger existed)."""
        return (self.files if self.complete else max(self.files, fs_used)) + self.leased


_EMPTY = LedgerState(0, 0, False, 0.0, {})


def _decode(data: bytes) -> LedgerState:
    try:
        raw: Any = json.loads(data)
        leases = {str(k): (int(v[0]), float(v[1])) for k, v in raw["leases"].items()}
        return LedgerState(
            int(raw["files"]),
            int(raw["added"]),
            bool(raw["complete"]),
            float(raw["scanned_at"]),
            leases,
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        # Missing, torn by a crash mid-write, or foreign: start over; a scan recounts.
        return _EMPTY


def _encode(state: LedgerState) -> bytes:
    return json.dumps(
        {
            "files": state.files,
            "added": state.added,
            "complete": state.complete,
            "scanned_at": state.scanned_at,
            "leases": {k: list(v) for k, v in state.leases.items()},
        },
        sort_keys=True,
    ).encode()


class UsageLedger:
    """Read-modify-write access to ``<root>/.kvtier/usage.json`` under its lock."""

    def __init__(self, root: str, file_mode: int = 0o600) -> None:
        self.path = os.path.join(state_dir(root), LEDGER_FILE_NAME)
        self._fd, self._thread_lock = shared_fd(self.path, file_mode)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[list[LedgerState]]:
        """Yields a one-element list holding the state; whatever is left in it is written."""
        with self._thread_lock:
            fcntl.lockf(self._fd, fcntl.LOCK_EX)
            try:
                size = os.fstat(self._fd).st_size
                before = _decode(os.pread(self._fd, size, 0)) if size else _EMPTY
                box = [before]
                yield box
                if box[0] is not before:
                    data = _encode(box[0])
                    os.pwrite(self._fd, data, 0)
                    os.ftruncate(self._fd, len(data))
            finally:
                fcntl.lockf(self._fd, fcntl.LOCK_UN)

    def read(self) -> LedgerState:
        with self._locked() as box:
            return box[0]

    def settle(
        self,
        lease_id: str,
        lease_bytes: int,
        committed: int,
        take: int = 0,
        limit: int | None = None,
        floor: int = 0,
    ) -> tuple[bool, LedgerState]:
        """Move ``committed`` bytes of a lease into ``files``, set the lease to
        ``lease_bytes`` (absolute, so a lease dropped as stale is restored; 0 removes it) and
        add ``take`` to it if accounted usage then stays within ``limit``. Returns whether
        ``take`` was granted, and the state after.

        ``floor`` is a lower bound of the root's usage that holds even before a first scan
        has counted it (the file system's used bytes); until then usage is
        ``max(files, floor)``.
        """
        with self._locked() as box:
            s = box[0]
            files = s.files + committed
            others = sum(b for k, (b, _) in s.leases.items() if k != lease_id)
            base = files if s.complete else max(files, floor)
            granted = limit is None or base + others + lease_bytes + take <= limit
            held = lease_bytes + (take if granted else 0)
            leases = dict(s.leases)
            if held > 0:
                leases[lease_id] = (held, time.time())
            else:
                leases.pop(lease_id, None)
            box[0] = dataclasses.replace(s, files=files, added=s.added + committed, leases=leases)
            return granted, box[0]

    def add_files(self, nbytes: int) -> None:
        """Count bytes committed by a writer without a lease (``kvtier gc`` never writes)."""
        with self._locked() as box:
            s = box[0]
            box[0] = dataclasses.replace(s, files=s.files + nbytes, added=s.added + nbytes)

    def subtract(self, nbytes: int) -> LedgerState:
        """Uncount block files that this process has just unlinked."""
        with self._locked() as box:
            s = box[0]
            box[0] = dataclasses.replace(s, files=max(0, s.files - nbytes))
            return box[0]

    def stale_leases(self, state: LedgerState) -> list[str]:
        """Leases of dead processes of this host, and of holders silent for
        LEASE_TIMEOUT_SECONDS: what the next reconcile drops."""
        from kvtier.tiering.fs.file_mapper import host_label

        host, now, stale = host_label(), time.time(), []
        for lease_id, (_, beat) in state.leases.items():
            lease_host, _, rest = lease_id.partition(":")
            pid_text = rest.split(":", 1)[0]
            pid = int(pid_text) if pid_text.isdigit() else 0
            if now - beat > LEASE_TIMEOUT_SECONDS or (
                lease_host == host and pid > 0 and not _pid_alive(pid)
            ):
                stale.append(lease_id)
        return stale

    def reconcile(self, scanned: int, added_at_start: int) -> LedgerState:
        """Set ``files`` from a full scan that began when ``added`` was ``added_at_start``.

        Blocks committed during the scan may or may not have been seen by it; they are added
        on top (an over-count until the next scan, never an under-count). Leases of dead
        processes of this host and of holders silent for LEASE_TIMEOUT_SECONDS are dropped.
        """
        now = time.time()
        with self._locked() as box:
            s = box[0]
            stale = set(self.stale_leases(s))
            leases = {k: v for k, v in s.leases.items() if k not in stale}
            files = scanned + max(0, s.added - added_at_start)
            box[0] = dataclasses.replace(
                s, files=files, complete=True, scanned_at=now, leases=leases
            )
            return box[0]


__all__ = ["HEARTBEAT_SECONDS", "LedgerState", "UsageLedger", "shared_fd", "state_dir"]

"""The usage ledger of a root: files that each writer owns, and one evictor's published count.

Nothing shared is read, modified and written back by more than one party (docs/tiers.md,
"Capacity", and docs/FORMAT.md, "Usage ledger"):

- ``<root>/.kvtier/writers/<id>.lock``: a tier instance's liveness. Its owner holds an
  open-file-description lock (``F_OFD_SETLK``) on it for its whole life; a writer is alive
  exactly while that lock is held (a killed, crashed or closed one releases it; pids and
  clocks decide nothing). ``<id>`` is random, so containers and hosts never collide.
- ``<root>/.kvtier/writers/<id>.rec``: that writer's own record, written only by it, replaced
  atomically (write a tmp file, fsync, rename): bytes of block files it ever committed
  (``added``, monotonic), bytes of its stores in flight (``writing``: their tmp files) and
  budget it holds for stores not yet submitted (``reserved``).
- ``<root>/.kvtier/usage.kvl``: written only by the holder of the evictor lock, the same
  way: bytes of block files counted by its last scan and evictions (``files``) and, per
  writer, how much of its ``added`` is already inside ``files`` (``folded``).

Usage is ``files + sum(added - folded) + sum(writing)`` (``used_bytes``), budget taken is that
plus ``sum(reserved)`` (``reserved_bytes``). Every file is read with a bounded size and
checked (magic, version, length, CRC32C, value ranges); an invalid one counts as missing, is
warned about once, and the evictor rebuilds the count by a scan. Errors only over-count
(blocks committed while a scan ran; a writer's record lost with a state directory) until
the next scan; where a reading cannot tell (a dead writer's reservation, a count older than
the records listed: UsageLedger.reap_dead) the count is rebuilt by a scan.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from kvtier import _core
from kvtier.tiering.fs.capacity.scanner import STATE_DIR_NAME
from kvtier.tiering.fs.file_mapper import make_tier_directory

logger = logging.getLogger(__name__)

LEDGER_FILE_NAME = "usage.kvl"
WRITERS_DIR_NAME = "writers"
RECORD_SUFFIX = ".rec"
LOCK_SUFFIX = ".lock"
FORMAT_VERSION = 1
_MAGIC_BASE = b"KVTL"
_MAGIC_WRITER = b"KVTW"
# magic, version, payload length, CRC32C of the payload.
_HEADER = struct.Struct("<4sHxxII")
_WRITER = struct.Struct("<QQQ")  # added, writing, reserved
_BASE_HEAD = struct.Struct("<QII")  # files, flags, number of folded entries
_FOLDED = struct.Struct("<16sQ")  # writer id (raw), folded bytes
_ID_BYTES = 16
# Values beyond this are not byte counts of any real file system (2^62 = 4 EiB).
MAX_VALUE = 1 << 62
# A root with more live and dead writers than this is not one kvtier made; bounded reads.
MAX_WRITERS = 1 << 16
_MAX_BASE_BYTES = _HEADER.size + _BASE_HEAD.size + MAX_WRITERS * _FOLDED.size
_MAX_WRITER_BYTES = _HEADER.size + _WRITER.size
_FLAG_COMPLETE = 1

_OFD_WRITE_LOCK = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
_OFD_UNLOCK = struct.pack("hhqqi4x", fcntl.F_UNLCK, os.SEEK_SET, 0, 0, 0)


class Invalid(ValueError):
    """A ledger file that is not one this version wrote whole."""


def state_dir(root: str) -> str:
    return os.path.join(root, STATE_DIR_NAME)


def writers_dir(root: str) -> str:
    return os.path.join(state_dir(root), WRITERS_DIR_NAME)


def root_identity(root: str) -> tuple[int, int]:
    """What makes two paths one root: its (st_dev, st_ino), whatever links lead there."""
    st = os.stat(root)
    return st.st_dev, st.st_ino


# -- OFD locks -------------------------------------------------------------------------------


def try_ofd_lock(fd: int) -> bool:
    """Take a write lock on the whole of ``fd``'s open file description without waiting.

    OFD locks belong to the description, not the process: two descriptors of one process
    conflict like two processes, and closing another descriptor of the file drops nothing.
    """
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _OFD_WRITE_LOCK)
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


def ofd_unlock(fd: int) -> None:
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _OFD_UNLOCK)


class CloseFailures:
    """Counts ``close(2)`` failures of descriptors that only held a lock or were only read,
    and logs the first one.

    A network or FUSE file system reports a failed flush from ``close`` (EIO, ETIMEDOUT,
    ENOTCONN from a dead daemon), also for a file that was never written. On Linux the
    descriptor is released whatever ``close`` returns (retrying could close another thread's
    new descriptor), and so is an OFD lock held through it, so nothing is lost that the
    caller could still save: such a failure must neither stop the capacity thread nor make
    ``shutdown()`` raise. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.count = 0

    def close(self, fd: int, path: str) -> None:
        try:
            os.close(fd)
        except OSError as e:
            with self._lock:
                self.count += 1
                first = self.count == 1
            if first:
                logger.warning(
                    "Closing %s failed: %s (errno %s); the descriptor and its lock are "
                    "released all the same. Later close failures are counted "
                    "(ledger_close_failures), not logged",
                    path,
                    e.strerror,
                    e.errno,
                )


# Close failures of descriptors opened outside a tier (`kvtier gc`, a lone evictor_lock).
PROCESS_CLOSE_FAILURES = CloseFailures()


def open_lock_file(path: str, mode: int) -> int:
    """A descriptor of ``path`` (created if missing, never through a link)."""
    make_state_dirs(os.path.dirname(path), mode)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        if os.fstat(fd).st_uid == os.geteuid():
            # Modes follow file_mode exactly, whatever the umask: users sharing a root share
            # its state too.
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def make_state_dirs(path: str, mode: int) -> None:
    """Create ``path`` and its parents up to the root's state directory, with file_mode's
    directory mode."""
    if not os.path.isdir(path):
        make_state_dirs(os.path.dirname(path), mode)
        make_tier_directory(path, int(_core.directory_mode(mode)))


def still_at(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open (not removed or replaced)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


# -- records ---------------------------------------------------------------------------------


def _seal(magic: bytes, payload: bytes) -> bytes:
    return _HEADER.pack(magic, FORMAT_VERSION, len(payload), _core.crc32c(payload)) + payload


def _open_payload(data: bytes, magic: bytes) -> bytes:
    if len(data) < _HEADER.size:
        raise Invalid(f"{len(data)} bytes, shorter than a header")
    got_magic, version, length, crc = _HEADER.unpack_from(data)
    if got_magic != magic:
        raise Invalid(f"magic {got_magic!r}, expected {magic!r}")
    if version != FORMAT_VERSION:
        raise Invalid(f"format version {version}, expected {FORMAT_VERSION}")
    if length != len(data) - _HEADER.size:
        raise Invalid(f"payload length {length}, file holds {len(data) - _HEADER.size}")
    payload = data[_HEADER.size :]
    if _core.crc32c(payload) != crc:
        raise Invalid("payload checksum mismatch")
    return payload


def _checked(value: int, what: str) -> int:
    if not 0 <= value < MAX_VALUE:
        raise Invalid(f"{what} {value} out of range")
    return value


# A file replaced by rename while a network client reads it: ESTALE (GlusterFS, NFS) means
# "open the new one", not a broken ledger.
_ESTALE_RETRIES = 5


def read_bounded(path: str, limit: int) -> bytes:
    """The bytes of the regular file ``path`` (never through a link), if at most ``limit``.

    Raises FileNotFoundError if it is missing, Invalid if it is not a small regular file.
    """
    for _ in range(_ESTALE_RETRIES - 1):
        try:
            return _read_bounded_once(path, limit)
        except OSError as e:
            if e.errno != errno.ESTALE:
                raise
    return _read_bounded_once(path, limit)


def _read_bounded_once(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Invalid("not a regular file")
        if st.st_size > limit:
            raise Invalid(f"{st.st_size} bytes, more than the {limit} a ledger file holds")
        data = os.pread(fd, limit + 1, 0)
        if len(data) > limit:
            raise Invalid(f"grew past {limit} bytes while read")
        return data
    finally:
        PROCESS_CLOSE_FAILURES.close(fd, path)  # what was read stands


def refresh_names(directory: str) -> None:
    """List ``directory`` (nothing is done with the names): on a FUSE mount the listing
    refreshes the client's cached names, so a file that another host replaced by rename is
    then opened as the new file. On a GlusterFS mount with default caches a count read
    straight away was up to 1 s old, read after a listing at most 20 ms (docs/tiers.md,
    "Shared file systems")."""
    try:
        with os.scandir(directory) as it:
            for _ in it:
                pass
    except OSError:
        pass  # the read that follows reports what is wrong


def replace_atomically(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a tmp file next to ``path``, fsync it and rename it over ``path``:
    a reader sees the old file or the new one whole, also after a crash."""
    tmp = f"{path}.{secrets.token_hex(8)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, mode)
    try:
        try:
            if os.fstat(fd).st_uid == os.geteuid():
                os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


@dataclass(frozen=True)
class WriterRecord:
    added: int = 0
    writing: int = 0
    reserved: int = 0

    def encode(self) -> bytes:
        return _seal(_MAGIC_WRITER, _WRITER.pack(self.added, self.writing, self.reserved))

    @staticmethod
    def decode(data: bytes) -> WriterRecord:
        payload = _open_payload(data, _MAGIC_WRITER)
        if len(payload) != _WRITER.size:
            raise Invalid(f"writer record of {len(payload)} bytes, expected {_WRITER.size}")
        added, writing, reserved = _WRITER.unpack(payload)
        return WriterRecord(
            _checked(added, "added"), _checked(writing, "writing"), _checked(reserved, "reserved")
        )


@dataclass(frozen=True)
class Base:
    """What the evictor publishes: ``files`` holds ``folded[w]`` bytes of writer ``w``."""

    files: int = 0
    complete: bool = False  # a full scan has counted the root
    folded: dict[str, int] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [
            _BASE_HEAD.pack(self.files, _FLAG_COMPLETE if self.complete else 0, len(self.folded))
        ]
        parts += [_FOLDED.pack(bytes.fromhex(w), n) for w, n in sorted(self.folded.items())]
        return _seal(_MAGIC_BASE, b"".join(parts))

    @staticmethod
    def decode(data: bytes) -> Base:
        payload = _open_payload(data, _MAGIC_BASE)
        if len(payload) < _BASE_HEAD.size:
            raise Invalid("usage record shorter than its head")
        files, flags, n = _BASE_HEAD.unpack_from(payload)
        if flags & ~_FLAG_COMPLETE or n > MAX_WRITERS:
            raise Invalid(f"flags {flags:#x} or {n} writers out of range")
        if len(payload) != _BASE_HEAD.size + n * _FOLDED.size:
            raise Invalid(f"usage record of {len(payload)} bytes does not hold {n} writers")
        folded = {}
        for i in range(n):
            raw, nbytes = _FOLDED.unpack_from(payload, _BASE_HEAD.size + i * _FOLDED.size)
            folded[raw.hex()] = _checked(nbytes, "folded")
        return Base(_checked(files, "files"), bool(flags & _FLAG_COMPLETE), folded)


def new_writer_id() -> str:
    return secrets.token_hex(_ID_BYTES)


def _is_writer_id(text: str) -> bool:
    return len(text) == 2 * _ID_BYTES and all(c in "0123456789abcdef" for c in text)


# -- a root's usage --------------------------------------------------------------------------


@dataclass(frozen=True)
class LedgerState:
    """One reading of a root's ledger (a snapshot of every record)."""

    base: Base
    base_valid: bool  # False: missing or invalid; a scan must count the root
    writers: dict[str, WriterRecord]

    @property
    def complete(self) -> bool:
        return self.base_valid and self.base.complete

    @property
    def files(self) -> int:
        """Block bytes: the evictor's count plus what writers committed since."""
        folded = self.base.folded
        return self.base.files + sum(
            max(0, r.added - folded.get(w, 0)) for w, r in self.writers.items()
        )

    @property
    def orphans(self) -> list[str]:
        """Writers the count has an entry for but no record: read through a cache, a count
        older than the records listed (another evictor has folded such a writer in and
        removed its record since), or a reap that crashed. The count may then miss what they
        added: only a scan can tell (UsageLedger.reap_dead)."""
        return [w for w in self.base.folded if w not in self.writers]

    @property
    def writing(self) -> int:
        return sum(r.writing for r in self.writers.values())

    @property
    def used(self) -> int:
        """Block bytes on disk, tmp files of stores in flight included."""
        return self.files + self.writing

    @property
    def reserved(self) -> int:
        return sum(r.reserved for r in self.writers.values())

    @property
    def added(self) -> int:
        """Sum of every writer's ``added`` (for a scan: what was committed while it ran)."""
        return sum(r.added for r in self.writers.values())

    def bounded_used(self, fs_used: int) -> int:
        """Budget taken (usage plus reservations), bounded below by the file system's used
        bytes until a first full scan has counted the root (files that predate the ledger)."""
        files = self.files if self.complete else max(self.files, fs_used)
        return files + self.writing + self.reserved


class UsageLedger:
    """Reading a root's ledger; publishing its count (only while holding the evictor lock)."""

    def __init__(self, root: str, file_mode: int = 0o600) -> None:
        self.root = root
        self.path = os.path.join(state_dir(root), LEDGER_FILE_NAME)
        self._file_mode = file_mode
        self._warned: set[str] = set()

    def _warn_once(self, path: str, why: object) -> None:
        if path not in self._warned:
            self._warned.add(path)
            logger.warning(
                "Ignoring invalid kvtier ledger file %s (%s); usage is recounted by a scan",
                path,
                why,
            )

    def read(self) -> LedgerState:
        refresh_names(state_dir(self.root))
        try:
            base, valid = Base.decode(read_bounded(self.path, _MAX_BASE_BYTES)), True
        except FileNotFoundError:
            base, valid = Base(), False
        except (Invalid, OSError) as e:
            self._warn_once(self.path, e)
            base, valid = Base(), False
        writers = {}
        for wid, path in self._records():
            try:
                writers[wid] = WriterRecord.decode(read_bounded(path, _MAX_WRITER_BYTES))
            except FileNotFoundError:
                continue
            except (Invalid, OSError) as e:
                self._warn_once(path, e)
        return LedgerState(base, valid, writers)

    def _records(self) -> Iterator[tuple[str, str]]:
        directory = writers_dir(self.root)
        try:
            with os.scandir(directory) as it:
                names = [e.name for e in it]
        except (FileNotFoundError, NotADirectoryError):
            return
        count = 0
        for name in names:
            wid = name[: -len(RECORD_SUFFIX)]
            if name.endswith(RECORD_SUFFIX) and _is_writer_id(wid):
                count += 1
                if count > MAX_WRITERS:
                    self._warn_once(directory, f"more than {MAX_WRITERS} writers")
                    return
                yield wid, os.path.join(directory, name)

    def publish(self, base: Base) -> None:
        make_state_dirs(state_dir(self.root), self._file_mode)
        replace_atomically(self.path, base.encode(), self._file_mode)
        self._warned.discard(self.path)

    def reap_dead(self, state: LedgerState, keep: str | None = None) -> tuple[LedgerState, bool]:
        """Fold the records of writers whose lock is free (dead or closed) into the count and
        remove their files; returns the state after, and whether the count is uncertain (a
        scan should recount). Only the evictor calls this.

        Every step errs towards over-counting (docs/tiers.md, "The margin"):

        - a record is read again once its writer's lock is taken: read before, it could miss
          a final record written in between;
        - a dead writer's stores in flight (``writing``) and its reservation (``reserved``:
          stores admitted from it in memory may have created files its record does not show
          yet) count as committed, and make the count uncertain;
        - the count is published before the writer's files are removed, with its entry
          (fully folded) kept: a crash in between leaves a record that is folded again
          (nothing more of ``added``), never a record lost before it was counted;
        - an entry of a writer with no record (an orphan) means the count read is older
          than the listing of records (a client cache serving an old ``usage.kvl`` after
          another evictor reaped that writer) or a reap that crashed: what the writer added
          after that count cannot be known, so the entry is kept and the count is uncertain
          until a scan rebuilds it (reconcile() drops orphans)."""
        base = state.base
        folded, files = dict(base.folded), base.files
        writers = dict(state.writers)
        orphans = state.orphans
        uncertain = bool(orphans)
        directory = writers_dir(self.root)
        reaped: list[str] = []
        held: list[int] = []  # descriptors of the lock files tried; closed at the end
        try:
            for wid in state.writers:
                if wid == keep:
                    continue
                lock_path = os.path.join(directory, wid + LOCK_SUFFIX)
                try:
                    fd = os.open(
                        lock_path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
                    )
                except FileNotFoundError:
                    fd = -1  # a writer creates its lock before its record: this one is gone
                except OSError:
                    continue
                if fd >= 0:
                    held.append(fd)
                    if not try_ofd_lock(fd):
                        continue  # alive
                reaped.append(wid)
            if not reaped:
                return state, uncertain
            refresh_names(directory)  # after their locks: their last records
            for wid in reaped:
                rec, exact = self._final_record(wid, state.writers[wid])
                # Its stores in flight, and those it admitted from its reservation, may have
                # created their files: count them.
                files += max(0, rec.added - folded.get(wid, 0)) + rec.writing + rec.reserved
                uncertain = uncertain or not exact or rec.writing > 0 or rec.reserved > 0
                folded[wid] = max(rec.added, folded.get(wid, 0))
                writers.pop(wid)
            if state.base_valid:
                self.publish(Base(files, base.complete, folded))
            for wid in reaped:
                # The lock first: a record whose lock file is gone is reaped again if this
                # process dies before the record goes (its `added` is folded already).
                _unlink_quietly(os.path.join(directory, wid + LOCK_SUFFIX))
                _unlink_quietly(os.path.join(directory, wid + RECORD_SUFFIX))
        finally:
            for fd in held:
                PROCESS_CLOSE_FAILURES.close(fd, directory)
        for wid in reaped:
            del folded[wid]
        new = Base(files, base.complete, folded)
        if state.base_valid:
            self.publish(new)  # their entries go once their records are gone
        return LedgerState(new, state.base_valid, writers), uncertain

    def _final_record(self, wid: str, seen: WriterRecord) -> tuple[WriterRecord, bool]:
        """A dead writer's record, read after its lock was taken (nothing can replace it any
        more), and whether it was read: if not, ``seen`` (read earlier) stands, and may be
        older than its last one.

        Through a network client's cache the read may still return an older record (the
        caller lists the directory first, which shrinks that window: refresh_names), and
        nothing read can tell; docs/tiers.md, "Shared file systems", says which mount
        options close it."""
        path = os.path.join(writers_dir(self.root), wid + RECORD_SUFFIX)
        try:
            return WriterRecord.decode(read_bounded(path, _MAX_WRITER_BYTES)), True
        except (Invalid, OSError) as e:
            self._warn_once(path, e)
            return seen, False

    def reconcile(self, scanned: int, added_at_start: int) -> LedgerState:
        """Publish ``files`` from a full scan that began when ``added`` (the sum over writers)
        was ``added_at_start``: blocks committed since are added on top (an over-count until
        the next scan, never an under-count). Call with the evictor lock held."""
        state = self.read()
        later = max(0, state.added - added_at_start)
        base = Base(scanned + later, True, {w: r.added for w, r in state.writers.items()})
        self.publish(base)
        return LedgerState(base, True, state.writers)

    def subtract(self, nbytes: int) -> LedgerState:
        """Uncount block files the evictor has just unlinked (evictor lock held). Writers'
        additions so far are folded in first: the files removed may be theirs."""
        state = self.read()
        # Orphans' entries stay: the next reap sees them and has the count rebuilt.
        folded = {w: state.base.folded[w] for w in state.orphans}
        folded.update((w, r.added) for w, r in state.writers.items())
        base = Base(max(0, state.files - nbytes), state.base.complete, folded)
        if state.base_valid:
            self.publish(base)
        return LedgerState(base, state.base_valid, state.writers)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class WriterSlot:
    """This tier instance's lock and record. Only the capacity thread writes the record."""

    def __init__(
        self, root: str, file_mode: int, close_failures: CloseFailures | None = None
    ) -> None:
        self.root = root
        self._file_mode = file_mode
        self.close_failures = close_failures or CloseFailures()
        self.fd = -1
        self.id = ""
        self.last: WriterRecord | None = None
        self.open()

    @property
    def lock_path(self) -> str:
        return os.path.join(writers_dir(self.root), self.id + LOCK_SUFFIX)

    @property
    def record_path(self) -> str:
        return os.path.join(writers_dir(self.root), self.id + RECORD_SUFFIX)

    def open(self) -> None:
        """Start a new identity: a fresh lock file, locked, with no record yet."""
        self.id = new_writer_id()
        fd = open_lock_file(self.lock_path, self._file_mode)
        if not try_ofd_lock(fd):  # a fresh random name: nobody else can hold it
            self.close_failures.close(fd, self.lock_path)
            raise OSError(errno.EAGAIN, "writer lock unexpectedly held", self.lock_path)
        self.fd, self.last = fd, None

    def lost(self) -> bool:
        """Whether this writer's lock file was removed or replaced (its state directory
        removed, say): others cannot see it alive any more."""
        return not still_at(self.fd, self.lock_path)

    def write(self, record: WriterRecord) -> None:
        if record != self.last:
            replace_atomically(self.record_path, record.encode(), self._file_mode)
            self.last = record

    def close(self) -> None:
        """Release the lock (the record stays, for the evictor to fold in). Never raises for
        the storage's sake: a failed ``close(2)`` is counted and logged once
        (:class:`CloseFailures`), the descriptor is gone all the same."""
        fd, self.fd = self.fd, -1
        if fd >= 0:
            self.close_failures.close(fd, self.lock_path)


__all__ = [
    "LEDGER_FILE_NAME",
    "PROCESS_CLOSE_FAILURES",
    "Base",
    "CloseFailures",
    "Invalid",
    "LedgerState",
    "UsageLedger",
    "WriterRecord",
    "WriterSlot",
    "open_lock_file",
    "root_identity",
    "state_dir",
    "still_at",
    "try_ofd_lock",
]

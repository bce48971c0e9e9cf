"""Where the fs tier keeps each block: namespace, rank and hashed sub-directories.

Path of a block (docs/FORMAT.md is the normative description)::

    <root_dir>/<model-slug>-<fp[:32]>/rank-<rank>/<d[0:2]>/<d[2:4]>/<key-hex>.kvb

- ``fp`` is the SHA-256 (hex) of the layout fields (see :func:`layout_fields`): everything
  that determines a block's bytes. Its 32 raw bytes are also the engine fingerprint stored in
  and verified against every block header, so a block of another layout can never be read.
- ``<model-slug>`` is the model name with runs of characters outside ``[A-Za-z0-9._-]``
  replaced by ``_`` (at most 48 characters); it is for humans only.
- ``d`` is the hex of the 2-byte BLAKE2b digest of the key: 256 x 256 leaf directories keep
  any one directory small even with millions of blocks, whatever the key distribution.
- ``<key-hex>`` is the key (block hash + 4-byte group index) in lower-case hex; a key longer
  than 64 bytes is named ``h<sha256(key) hex>`` instead, to stay within NAME_MAX with the tmp
  suffix added.

Files of the tier, for code that walks a namespace (sweep, capacity): a *block file* is a
regular file whose name ends in :data:`BLOCK_SUFFIX`; a *tmp file* is one that
:func:`parse_tmp_file_name` accepts (``<final>.<host>.<pid>.<token>.<n>.tmp``, the pattern the
native core defines); :func:`tmp_writer_alive` tells whether its writer may still rename it. Every
directory the tier creates has mode ``_core.directory_mode(file_mode)``.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import hashlib
import json
import os
import pwd
import re
import stat
from typing import Any, NamedTuple

from kvtier import _core
from kvtier.errors import ConfigurationError, StorageError
from kvtier.tiering.spec import OffloadingSpec

CONFIG_FILE_NAME = "config.json"
BLOCK_SUFFIX: str = _core.BLOCK_SUFFIX  # the one definition: kvtier/root_survey.hpp
_MAX_KEY_BYTES_IN_NAME = 64
_NAMESPACE_HASH_CHARS = 32
_SLUG_CHARS = 48
TMP_FILE_RE = re.compile(_core.TMP_FILE_PATTERN)


def host_label() -> str:
    """First label of the host name: the host part of tmp file names (as the core writes it)."""
    return str(_core.host_label())


def is_block_file_name(name: str) -> bool:
    """Whether a directory entry's name is a block file's (check it is a regular file too)."""
    return name.endswith(BLOCK_SUFFIX)


def tmp_file_name(final_name: str) -> str:
    """A fresh tmp name for ``final_name`` (same directory), unique by a per-process token."""
    return str(_core.tmp_file_name(final_name))


class TmpFileName(NamedTuple):
    """The parts of ``<final>.<host>.<pid>.<token>.<n>.tmp``."""

    final: str
    host: str
    pid: int  # in the writer's PID namespace: informational only
    token: str  # 16 hex digits, random per process: what makes the name unique
    n: int


def parse_tmp_file_name(name: str) -> TmpFileName | None:
    """The parts of a tmp file's name, or None when ``name`` is not one."""
    m = TMP_FILE_RE.match(name)
    if m is None:
        return None
    return TmpFileName(m.group(1), m.group(2), int(m.group(3)), m.group(4), int(m.group(5)))


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists in this PID namespace (zombies count as dead)."""
    if pid <= 0:
        return True  # never claim a pid we cannot reason about is dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The state follows the parenthesised command name, which may contain spaces.
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state != b"Z"
    except (OSError, IndexError):
        return True


def tmp_writer_alive(path: str, host: str | None = None) -> bool:
    """Whether the process writing the tmp file at ``path`` may still rename it.

    Writers hold an OFD lock on their tmp file from creation to rename, which any process
    can test, also from another PID namespace (another container with the same host name),
    where the pid in the name means nothing: a file whose lock nobody holds is dead (a
    writer that finds its file removed between creating and locking it starts again). Only
    where the lock cannot be tested (the file system has no OFD locks) does the pid decide:
    alive while a process with that pid runs here. Files of other hosts count as alive:
    locks on shared file systems are not always coherent across nodes. A missing file is
    not alive. ``host`` defaults to :func:`host_label`.
    """
    parsed = parse_tmp_file_name(os.path.basename(path))
    if parsed is None:
        return True  # not a tmp file: never anyone's to remove
    if parsed.host != (host if host is not None else host_label()):
        return True
    state = _core.tmp_file_writer(path)
    if state == "missing":
        return False
    if state == "unknown":
        return pid_alive(parsed.pid)
    return state == "alive"


def layout_fields(
    spec: OffloadingSpec, block_bytes: int, checksum: str = "crc32c"
) -> dict[str, Any]:
    """Everything that determines a block's bytes; the rank is deliberately absent.

    ``checksum: "none"`` is part of it (and "crc32c", the default, is not, so that the
    namespaces of tiers with the default are those of every earlier version): a writer that
    checks CRCs may recycle an evicted file while a reader that opened it before still reads
    it (docs/tiers.md, "Recycling evicted files"), which only the reader's own CRC check
    catches. A tier that checks none keeps its blocks apart."""
    fields = {
        "format_version": int(_core.FORMAT_VERSION),
        "model_name": spec.model_name,
        "dtype": spec.dtype,
        "kv_layout": spec.kv_layout,
        "tokens_per_block": spec.tokens_per_block,
        "blocks_per_file": spec.blocks_per_file,
        "tp_size": spec.tp_size,
        "pp_size": spec.pp_size,
        "pcp_size": spec.pcp_size,
        "dcp_size": spec.dcp_size,
        "kv_cache_groups": spec.kv_cache_groups,
        "block_bytes": block_bytes,
    }
    if checksum != "crc32c":
        fields["checksum"] = checksum
    # Round-trip through JSON so the fields compare equal to what config.json reads back
    # (tuples become lists, objects become their repr).
    return json.loads(_canonical_json(fields))


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=repr)


def layout_fingerprint(fields: dict[str, Any]) -> bytes:
    """SHA-256 of the canonical JSON of the layout fields (32 bytes)."""
    return hashlib.sha256(_canonical_json(fields).encode()).digest()


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._-")[:_SLUG_CHARS] or "model"


class FileMapper:
    """Maps keys to block file paths for one (layout, rank) under a root directory."""

    def __init__(
        self,
        root_dir: str,
        offloading_spec: OffloadingSpec,
        block_bytes: int,
        checksum: str = "crc32c",
    ) -> None:
        self.root_dir = os.path.abspath(root_dir)
        self.layout = layout_fields(offloading_spec, block_bytes, checksum)
        self.fingerprint: bytes = layout_fingerprint(self.layout)
        self.namespace = (
            f"{_slug(offloading_spec.model_name)}-{self.fingerprint.hex()[:_NAMESPACE_HASH_CHARS]}"
        )
        self.namespace_dir = os.path.join(self.root_dir, self.namespace)
        self.rank_dir = os.path.join(self.namespace_dir, f"rank-{offloading_spec.rank}")
        self.config_path = os.path.join(self.namespace_dir, CONFIG_FILE_NAME)
        # Saves a join per call: get_file_name runs for every block of every job.
        self._prefix = self.rank_dir + os.sep

    def get_file_name(self, key: bytes) -> str:
        """Absolute path of the block file for ``key``."""
        d = hashlib.blake2b(key, digest_size=2).hexdigest()
        if len(key) <= _MAX_KEY_BYTES_IN_NAME:
            name = key.hex()
        else:
            name = "h" + hashlib.sha256(key).hexdigest()
        return f"{self._prefix}{d[0:2]}/{d[2:4]}/{name}{BLOCK_SUFFIX}"

    def config_contents(self) -> dict[str, Any]:
        return {**self.layout, "fingerprint": self.fingerprint.hex()}

    def prepare(self, file_mode: int) -> None:
        """Create the namespace and rank directories and make sure config.json agrees.

        Directories made here (``root_dir`` too when it is missing) get exactly
        ``_core.directory_mode(file_mode)``. Raises StorageError (an OSError) when the root
        cannot be created or written, with EPERM (a PermissionError) when the namespace
        belongs to another user that ``file_mode`` does not share with, ConfigurationError (a
        ValueError) when an existing config.json describes another layout.
        """
        dir_mode = int(_core.directory_mode(file_mode))
        try:
            _make_directories(self.root_dir, dir_mode)
            for path in (self.namespace_dir, self.rank_dir):
                make_tier_directory(path, dir_mode)
                _check_owner(os.lstat(path), path, file_mode)
        except OSError as e:
            if isinstance(e, PermissionError) and e.errno == errno.EPERM:
                raise
            raise StorageError(
                e.errno, f"cannot create fs tier directory ({e.strerror})", e.filename
            ) from e
        if not os.access(self.rank_dir, os.W_OK | os.X_OK):
            raise StorageError(errno.EACCES, "fs tier directory is not writable", self.rank_dir)
        self._ensure_config(file_mode)

    def _ensure_config(self, file_mode: int) -> None:
        expected = self.config_contents()
        dir_fd = os.open(self.namespace_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            try:
                st = os.lstat(CONFIG_FILE_NAME, dir_fd=dir_fd)
            except FileNotFoundError:
                self._create_config(dir_fd, expected, file_mode)
                st = os.lstat(CONFIG_FILE_NAME, dir_fd=dir_fd)
            if not stat.S_ISREG(st.st_mode):
                raise ConfigurationError(
                    f"fs tier namespace {self.namespace_dir} has a {CONFIG_FILE_NAME} that is "
                    "not a regular file (links below root_dir are never followed); move the "
                    "directory aside or use another root_dir"
                )
            _check_owner(st, self.config_path, file_mode)
            self._check_config(dir_fd, expected)
        finally:
            os.close(dir_fd)

    def _create_config(self, dir_fd: int, expected: dict[str, Any], file_mode: int) -> None:
        # Written whole to a tmp file, then linked into place: readers never see a partial
        # file, and link() fails with EEXIST instead of replacing what another process wrote.
        # The tmp file's descriptor (and so its lock) stays open until its name is gone: a
        # sweep elsewhere must see this writer alive all along.
        data = (json.dumps(expected, indent=2, sort_keys=True) + "\n").encode()
        tmp, fd = "", -1
        try:
            tmp, fd = _locked_tmp_file(dir_fd, file_mode)
            os.fchmod(fd, file_mode)  # exact, whatever the umask (as block files)
            os.write(fd, data)
            os.fsync(fd)
            try:
                os.link(tmp, CONFIG_FILE_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except FileExistsError:
                pass  # another process won the race; _check_config compares its file
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # No hard links on this file system: rename is still atomic, and a racing
                # writer of the same namespace writes identical bytes.
                os.rename(tmp, CONFIG_FILE_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except OSError as e:
            # os.* name only what they were given (a name relative to dir_fd): say where.
            name = e.filename if isinstance(e.filename, str) and e.filename else tmp
            raise StorageError(
                e.errno,
                f"cannot create {CONFIG_FILE_NAME} of fs tier namespace ({e.strerror})",
                os.path.join(self.namespace_dir, name),
            ) from e
        finally:
            if fd >= 0:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp, dir_fd=dir_fd)
                os.close(fd)

    def _check_config(self, dir_fd: int, expected: dict[str, Any]) -> None:
        try:
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
            with open(os.open(CONFIG_FILE_NAME, flags, dir_fd=dir_fd), encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError) as e:
            raise ConfigurationError(
                f"fs tier namespace {self.namespace_dir} has an unreadable {CONFIG_FILE_NAME} "
                f"({e}); move the directory aside or use another root_dir"
            ) from e
        if found != expected:
            found = found if isinstance(found, dict) else {}
            diff = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
            details = ", ".join(
                f"{k}: file has {found.get(k)!r}, this tier has {expected.get(k)!r}" for k in diff
            )
            raise ConfigurationError(
                f"fs tier namespace {self.namespace_dir} belongs to another layout "
                f"({CONFIG_FILE_NAME} disagrees: {details}); refusing to mix blocks. Use "
                "another root_dir or remove that namespace directory."
            )


# A sweep of another process may remove a tmp file in the instant between its creation and its
# lock (it sees no writer yet); a fresh name is tried this many times before giving up.
_TMP_TRIES = 8


def _locked_tmp_file(dir_fd: int, file_mode: int) -> tuple[str, int]:
    """A fresh tmp file for config.json in ``dir_fd``, created and locked: (name, fd)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW
    for _ in range(_TMP_TRIES):
        tmp = tmp_file_name(CONFIG_FILE_NAME)
        fd = os.open(tmp, flags, file_mode, dir_fd=dir_fd)
        try:
            _core.lock_tmp_file(fd)
            if os.fstat(fd).st_nlink > 0:
                return tmp, fd
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dir_fd)
            raise
        os.close(fd)  # a sweep removed it before the lock was taken: try a fresh name
    raise FileNotFoundError(
        errno.ENOENT, f"removed by a sweep before locked, {_TMP_TRIES} times in a row", tmp
    )


def _make_directories(path: str, mode: int) -> None:
    """``os.makedirs`` whose new directories get exactly ``mode``, whatever the umask."""
    missing: list[str] = []
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for d in reversed(missing):
        make_tier_directory(d, mode, check_link=False)


def make_tier_directory(path: str, mode: int, check_link: bool = True) -> None:
    """Create ``path`` with exactly ``mode`` unless it exists; it must be a real directory."""
    try:
        os.mkdir(path, mode)
        os.chmod(path, mode)  # mkdir applies the umask
    except FileExistsError:
        pass
    if check_link:
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise StorageError(
                errno.ELOOP if stat.S_ISLNK(st.st_mode) else errno.ENOTDIR,
                "not a directory of the tier (links below root_dir are never followed)",
                path,
            )


def _name_of(table: Any, ident: int) -> str:
    try:
        return str(table(ident)[0])
    except KeyError:
        return str(ident)


def _check_owner(st: os.stat_result, path: str, file_mode: int) -> None:
    """Refuse an entry of the namespace that another user owns, unless file_mode shares.

    In a root others can write to, anyone can pre-create the (predictable) namespace and
    plant blocks; adopting it means loading their bytes as this process's own KV cache.
    """
    uid = os.geteuid()
    if st.st_uid == uid:
        return
    if file_mode & 0o006 == 0o006:
        return  # shared with every user
    if file_mode & 0o060 == 0o060 and (st.st_gid == os.getegid() or st.st_gid in os.getgroups()):
        return  # shared with the owner's group, which this process is in
    owner = _name_of(pwd.getpwuid, st.st_uid)
    group = _name_of(grp.getgrgid, st.st_gid)
    raise StorageError(
        errno.EPERM,
        f"fs tier namespace entry is owned by user {owner} (uid {st.st_uid}), not by this "
        f"process (uid {uid}), and file_mode {oct(file_mode)} does not share blocks with it: "
        "refusing blocks another user may have planted. Use a root_dir that only you can "
        f"write to, or, to share blocks on purpose, set file_mode to 0o660 with both users in "
        f"group {group} (or 0o666 to share with every user)",
        path,
    )


__all__ = [
    "BLOCK_SUFFIX",
    "CONFIG_FILE_NAME",
    "TMP_FILE_RE",
    "FileMapper",
    "TmpFileName",
    "host_label",
    "is_block_file_name",
    "layout_fields",
    "layout_fingerprint",
    "parse_tmp_file_name",
    "pid_alive",
    "tmp_file_name",
    "tmp_writer_alive",
]

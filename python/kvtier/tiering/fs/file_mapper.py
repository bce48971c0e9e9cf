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
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import re
import socket
from typing import Any

from kvtier import _core
from kvtier.tiering.base import OffloadKey
from kvtier.tiering.spec import OffloadingSpec

CONFIG_FILE_NAME = "config.json"
BLOCK_SUFFIX = ".kvb"
_MAX_KEY_BYTES_IN_NAME = 64
_NAMESPACE_HASH_CHARS = 32
_SLUG_CHARS = 48
_tmp_counter = itertools.count()


def host_label() -> str:
    """First label of the host name: the host part of tmp file names (as the core writes it)."""
    return socket.gethostname().split(".", 1)[0] or "localhost"


def layout_fields(spec: OffloadingSpec, block_bytes: int) -> dict[str, Any]:
    """Everything that determines a block's bytes; the rank is deliberately absent."""
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

    def __init__(self, root_dir: str, offloading_spec: OffloadingSpec, block_bytes: int) -> None:
        self.root_dir = os.path.abspath(root_dir)
        self.layout = layout_fields(offloading_spec, block_bytes)
        self.fingerprint: bytes = layout_fingerprint(self.layout)
        self.namespace = (
            f"{_slug(offloading_spec.model_name)}-{self.fingerprint.hex()[:_NAMESPACE_HASH_CHARS]}"
        )
        self.namespace_dir = os.path.join(self.root_dir, self.namespace)
        self.rank_dir = os.path.join(self.namespace_dir, f"rank-{offloading_spec.rank}")
        self.config_path = os.path.join(self.namespace_dir, CONFIG_FILE_NAME)
        # Saves a join per call: get_file_name runs for every block of every job.
        self._prefix = self.rank_dir + os.sep

    def get_file_name(self, key: OffloadKey) -> str:
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

        Raises OSError when the root cannot be created or written, ValueError when an
        existing config.json describes another layout.
        """
        # Directories are searchable wherever files are readable (as the core makes them).
        dir_mode = (file_mode | ((file_mode & 0o444) >> 2)) & 0o777
        try:
            os.makedirs(self.rank_dir, mode=dir_mode, exist_ok=True)
        except OSError as e:
            raise OSError(
                e.errno, f"cannot create fs tier directory ({e.strerror})", e.filename
            ) from e
        if not os.access(self.rank_dir, os.W_OK | os.X_OK):
            raise PermissionError(errno.EACCES, "fs tier directory is not writable", self.rank_dir)
        self._ensure_config(file_mode)

    def _ensure_config(self, file_mode: int) -> None:
        expected = self.config_contents()
        if not os.path.exists(self.config_path):
            self._create_config(expected, file_mode)
        self._check_config(expected)

    def _create_config(self, expected: dict[str, Any], file_mode: int) -> None:
        # Written whole to a tmp file, then linked into place: readers never see a partial
        # file, and link() fails with EEXIST instead of replacing what another process wrote.
        tmp = f"{self.config_path}.{host_label()}.{os.getpid()}.{next(_tmp_counter)}.tmp"
        data = (json.dumps(expected, indent=2, sort_keys=True) + "\n").encode()
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, file_mode)
        try:
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, self.config_path)
            except FileExistsError:
                pass  # another process won the race; _check_config compares its file
            except OSError as e:
                if e.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK):
                    raise
                # No hard links on this file system: rename is still atomic, and a racing
                # writer of the same namespace writes identical bytes.
                os.rename(tmp, self.config_path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _check_config(self, expected: dict[str, Any]) -> None:
        try:
            with open(self.config_path, encoding="utf-8") as f:
                found = json.load(f)
        except (OSError, ValueError) as e:
            raise ValueError(
                f"fs tier namespace {self.namespace_dir} has an unreadable {CONFIG_FILE_NAME} "
                f"({e}); move the directory aside or use another root_dir"
            ) from e
        if found != expected:
            found = found if isinstance(found, dict) else {}
            diff = sorted(k for k in set(expected) | set(found) if expected.get(k) != found.get(k))
            details = ", ".join(
                f"{k}: file has {found.get(k)!r}, this tier has {expected.get(k)!r}" for k in diff
            )
            raise ValueError(
                f"fs tier namespace {self.namespace_dir} belongs to another layout "
                f"({CONFIG_FILE_NAME} disagrees: {details}); refusing to mix blocks. Use "
                "another root_dir or remove that namespace directory."
            )


__all__ = ["FileMapper", "host_label", "layout_fields", "layout_fingerprint"]

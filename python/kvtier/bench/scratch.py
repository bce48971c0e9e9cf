"""The root a run measures, and the scratch directory it works in.

Every problem with ``--root`` is the user's to fix and is reported as one line that names
``--root`` as the user typed it: never the scratch directory's path, which the user never
chose and which is gone by the time the message is read.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from kvtier.bench.errors import BenchError
from kvtier.bench.machine import mount_of

#: File systems that exist to show kernel state: no regular file can be created in them, so
#: they cannot be the storage a KV cache lives on (the kernel's errors there, such as ENOENT
#: for a file that was just asked to be created, say nothing useful).
PSEUDO_FILE_SYSTEMS = frozenset(
    {
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "debugfs",
        "tracefs",
        "securityfs",
        "pstore",
        "bpf",
        "configfs",
        "efivarfs",
        "fusectl",
        "binfmt_misc",
        "mqueue",
        "nsfs",
        "devpts",
        "autofs",
    }
)


def check_root(root: Path, *, create: bool) -> Path:
    """The absolute root to measure; refuse one that cannot be (one line, BenchError).

    A missing root is refused unless ``create``: a mistyped mount point (``/mnt/nvme1`` for
    ``/mnt/nvme0``) would otherwise be created on the root file system and measure that.
    """
    shown = f"--root {root}"
    if not root.exists():
        if root.is_symlink():
            raise BenchError(f"{shown} is a symbolic link to a path that does not exist")
        if not create:
            raise BenchError(
                f"{shown} does not exist (a mistyped or unmounted mount point?); "
                "pass --create-root to create it"
            )
        try:
            root.mkdir(parents=True)
        except FileExistsError:
            pass  # created by someone else meanwhile: checked below like any directory
        except OSError as exc:
            raise BenchError(f"cannot create {shown}: {exc.strerror}") from exc
    if not root.is_dir():
        raise BenchError(f"{shown} is not a directory")
    resolved = root.resolve()
    fs_type = mount_of(resolved).get("type", "")
    if fs_type in PSEUDO_FILE_SYSTEMS:
        raise BenchError(
            f"{shown} is on a {fs_type} file system, which cannot hold block files; "
            "choose a directory on the storage to measure"
        )
    return resolved


def make_scratch(root: Path, shown: Path) -> Path:
    """A fresh ``kvtier-bench-*`` directory under ``root``, proven writable (remove it after).

    ``shown`` is the root as the user gave it, for messages.
    """
    try:
        scratch = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=root))
    except OSError as exc:
        raise BenchError(f"cannot write to --root {shown}: {exc.strerror}") from exc
    try:
        probe = scratch / "write-probe"
        with open(probe, "wb") as f:
            f.write(b"\0" * 4096)
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        raise BenchError(f"cannot write to --root {shown}: {exc.strerror}") from exc
    return scratch

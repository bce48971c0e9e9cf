"""Start-up sweep of tmp files that crashed processes of this host left behind."""

from __future__ import annotations

import contextlib
import logging
import os
import re

logger = logging.getLogger(__name__)

# <final>.<host>.<pid>.<n>.tmp, as the core (and config.json creation) name them.
_TMP_RE = re.compile(r"^.+\.(?P<host>[^./]+)\.(?P<pid>\d+)\.(?P<n>\d+)\.tmp$")


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid exists on this host (zombies count as dead)."""
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


def sweep_dead_tmp_files(directories: list[str], recursive_dirs: list[str], host: str) -> int:
    """Remove ``*.<host>.<pid>.<n>.tmp`` files whose pid is dead; returns how many went.

    ``directories`` are scanned without descending; ``recursive_dirs`` with all their
    sub-directories. Files of other hosts are left alone: on a shared file system their
    pids mean nothing here.
    """
    alive: dict[int, bool] = {}
    removed = 0

    def visit(path: str, recurse: bool) -> None:
        nonlocal removed
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            return
        for entry in entries:
            if entry.name.endswith(".tmp"):
                m = _TMP_RE.match(entry.name)
                if m is None or m.group("host") != host:
                    continue
                pid = int(m.group("pid"))
                if pid not in alive:
                    alive[pid] = pid_alive(pid)
                if not alive[pid]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                        removed += 1
            elif recurse and entry.is_dir(follow_symlinks=False):
                visit(entry.path, True)

    for d in directories:
        visit(d, False)
    for d in recursive_dirs:
        visit(d, True)
    if removed:
        logger.info("Removed %d tmp files left by dead processes", removed)
    return removed


__all__ = ["pid_alive", "sweep_dead_tmp_files"]

"""Start-up sweep of tmp files that dead writers left behind."""

from __future__ import annotations

import contextlib
import logging
import os

from kvtier.tiering.fs.file_mapper import parse_tmp_file_name, tmp_writer_alive

logger = logging.getLogger(__name__)


def sweep_dead_tmp_files(directories: list[str], recursive_dirs: list[str], host: str) -> int:
    """Remove tmp files of ``host`` whose writer is gone; returns how many went.

    ``directories`` are scanned without descending; ``recursive_dirs`` with all their
    sub-directories, never through a link. A writer counts as gone when nobody holds its
    tmp file's lock (see :func:`~kvtier.tiering.fs.file_mapper.tmp_writer_alive`), so live
    writers in other PID namespaces keep their files. Files of other hosts are left alone.
    """
    removed = 0

    def visit(path: str, name: str, parent_fd: int | None, recurse: bool) -> None:
        # Each directory is opened relative to its parent's descriptor, never through a link.
        nonlocal removed
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=parent_fd)
        except OSError:
            return  # gone, a link, or unreadable: nothing of ours to sweep there
        try:
            with os.scandir(fd) as it:
                entries = list(it)
            for entry in entries:
                parsed = parse_tmp_file_name(entry.name)
                if parsed is not None:
                    if parsed.host != host or not entry.is_file(follow_symlinks=False):
                        continue
                    if not tmp_writer_alive(os.path.join(path, entry.name), host):
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(entry.name, dir_fd=fd)
                            removed += 1
                elif recurse and entry.is_dir(follow_symlinks=False):
                    visit(os.path.join(path, entry.name), entry.name, fd, True)
        finally:
            os.close(fd)

    for d in directories:
        visit(d, d, None, False)
    for d in recursive_dirs:
        visit(d, d, None, True)
    if removed:
        logger.info("Removed %d tmp files left by dead writers", removed)
    return removed


__all__ = ["sweep_dead_tmp_files"]

"""Walking a root: which files are blocks, how big they are, when they were last used.

Every user of a root (tiers, ``kvtier gc``, ``kvtier du``) classifies files here, so they
agree: a block is a regular file named ``*.kvb`` (file_mapper.BLOCK_SUFFIX); a block tmp
file is ``<block>.kvb.<host>.<pid>.<token>.<n>.tmp`` (a store in flight, or a crashed one). Sizes
are ``st_size``; last use is ``st_mtime`` (tiers set it on every use, see recency.py).
Symbolic links are never followed and the state directory is skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

from kvtier.tiering.fs.file_mapper import BLOCK_SUFFIX

STATE_DIR_NAME = ".kvtier"
_TMP_MARK = BLOCK_SUFFIX + "."


class FileEntry(NamedTuple):
    is_block: bool  # False: a block tmp file
    namespace: str  # first directory below the root ("" for files directly in it)
    path: str
    size: int
    mtime_ns: int


def is_block_name(name: str) -> bool:
    return name.endswith(BLOCK_SUFFIX)


def is_block_tmp_name(name: str) -> bool:
    return name.endswith(".tmp") and _TMP_MARK in name


def scan(root: str) -> Iterator[FileEntry]:
    """Every block and block tmp file under ``root``; vanished files are skipped."""
    stack: list[tuple[str, str]] = []
    try:
        with os.scandir(root) as it:
            top = list(it)
    except FileNotFoundError:
        return
    for entry in top:
        if entry.name == STATE_DIR_NAME:
            continue
        yield from _visit_entry(entry, entry.name if _is_dir(entry) else "", stack)
    while stack:
        path, namespace = stack.pop()
        try:
            with os.scandir(path) as it:
                entries = list(it)
        except (FileNotFoundError, NotADirectoryError, PermissionError):
            continue
        for entry in entries:
            yield from _visit_entry(entry, namespace, stack)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir(follow_symlinks=False)
    except OSError:
        return False


def _visit_entry(
    entry: os.DirEntry[str], namespace: str, stack: list[tuple[str, str]]
) -> Iterator[FileEntry]:
    name = entry.name
    block = is_block_name(name)
    if block or is_block_tmp_name(name):
        try:
            st = entry.stat(follow_symlinks=False)
        except FileNotFoundError:
            return  # evicted, renamed or swept meanwhile
        if entry.is_file(follow_symlinks=False):
            yield FileEntry(block, namespace, entry.path, st.st_size, st.st_mtime_ns)
    elif _is_dir(entry):
        stack.append((entry.path, namespace))


__all__ = ["STATE_DIR_NAME", "FileEntry", "is_block_name", "is_block_tmp_name", "scan"]

"""Which files below a root are blocks, and the entry a survey gives for each.

Every user of a root (tiers, ``kvtier gc``, ``kvtier du``) classifies files by the native
core's rules (``kvtier/root_survey.hpp``), so they agree: a block is a regular file named
``*.kvb`` (file_mapper.BLOCK_SUFFIX); a block tmp file is
``<block>.kvb.<host>.<pid>.<token>.<n>.tmp`` (a store in flight, or a crashed one). Sizes are
``st_size``; last use is ``st_mtime`` (tiers set it on every use, see recency.py). The walk
itself is native (survey.py): symbolic links are never followed and the state directory is
skipped.
"""

from __future__ import annotations

from typing import NamedTuple

from kvtier import _core
from kvtier.tiering.fs.file_mapper import BLOCK_SUFFIX

STATE_DIR_NAME: str = _core.STATE_DIR_NAME


class FileEntry(NamedTuple):
    is_block: bool  # False: a block tmp file
    namespace: str  # first directory below the root ("" for files directly in it)
    path: str
    size: int
    mtime_ns: int


def is_block_name(name: str) -> bool:
    return name.endswith(BLOCK_SUFFIX)


__all__ = ["STATE_DIR_NAME", "FileEntry", "is_block_name"]

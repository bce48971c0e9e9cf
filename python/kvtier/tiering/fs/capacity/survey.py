"""One pass over a root: usage per namespace and the least recently used blocks.

Used by tiers (to reconcile the ledger and pick victims), ``kvtier gc`` and ``kvtier du``,
so all of them count the same files the same way. The walk is native
(``kvtier/root_survey.hpp``, with the GIL released): the Python walk it replaced cost 17 us of
the interpreter's CPU per file, and a tier with a full cache rescans its root once per
budget's worth of stores (docs/PERFORMANCE.md section 27).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from kvtier import _core
from kvtier.tiering.fs.capacity.scanner import FileEntry

# Victim candidates kept by one pass at most: bounds memory on huge roots (about 200 bytes
# each); if they do not free enough, the next pass finds more.
MAX_CANDIDATES = 1 << 18
# Files the native walk counts between two looks at the caller's stop event. It is the
# Python scanner's old cadence; a step of the native walk takes a few milliseconds.
_STEP_FILES = 4096
_ALL = (1 << 63) - 1


class Candidates(Sequence[FileEntry]):
    """Blocks to evict, oldest first, read as FileEntry but kept as plain tuples.

    The garbage collector stops tracking a tuple of strings and ints once a collection has
    seen it, but never a NamedTuple: 262,144 FileEntry objects (MAX_CANDIDATES) made every
    full collection of the process traverse them, 222-268 ms with the GIL held on a 2-vCPU
    host, against 11-15 ms kept as tuples (docs/PERFORMANCE.md section 24). A tier
    keeps its candidates for later passes, so they lived long enough to meet every full
    collection of the engine's process.
    """

    __slots__ = ("_rows",)

    def __init__(self, rows: Iterable[tuple[bool, str, str, int, int]] = ()) -> None:
        self._rows = list(rows)  # FileEntry's fields, in its order

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> FileEntry: ...
    @overload
    def __getitem__(self, index: slice) -> list[FileEntry]: ...
    def __getitem__(self, index: int | slice) -> FileEntry | list[FileEntry]:
        if isinstance(index, slice):
            return [FileEntry._make(row) for row in self._rows[index]]
        return FileEntry._make(self._rows[index])

    def __iter__(self) -> Iterator[FileEntry]:
        return (FileEntry._make(row) for row in self._rows)

    def drop_first(self, n: int) -> int:
        """Forget the ``n`` oldest candidates; returns their bytes."""
        gone = sum(row[3] for row in self._rows[:n])
        del self._rows[:n]
        return gone

    @property
    def bytes(self) -> int:
        return sum(row[3] for row in self._rows)


@dataclass
class NamespaceUsage:
    blocks: int = 0
    block_bytes: int = 0
    tmp_files: int = 0
    tmp_bytes: int = 0
    oldest_ns: int | None = None  # least recent use (mtime) of a block
    newest_ns: int | None = None

    @property
    def bytes(self) -> int:
        return self.block_bytes + self.tmp_bytes


@dataclass
class Survey:
    """Totals of one scan, plus the oldest blocks covering ``want_bytes`` (oldest first)."""

    namespaces: dict[str, NamespaceUsage] = field(default_factory=dict)
    candidates: Candidates = field(default_factory=Candidates)

    @property
    def total_bytes(self) -> int:
        """Block bytes plus block tmp bytes: what the budget counts."""
        return sum(n.bytes for n in self.namespaces.values())

    @property
    def block_bytes(self) -> int:
        """Block bytes only: what a tier reconciles its ledger with (the tmp files of live
        writers are in their leases already)."""
        return sum(n.block_bytes for n in self.namespaces.values())

    @property
    def blocks(self) -> int:
        return sum(n.blocks for n in self.namespaces.values())

    @property
    def tmp_files(self) -> int:
        return sum(n.tmp_files for n in self.namespaces.values())


class Interrupted(Exception):
    """The survey was stopped before it finished (its totals would be partial)."""


def survey(
    root: str,
    want_bytes: int,
    stop: threading.Event | None = None,
    max_files: int | None = None,
) -> Survey:
    """Scan ``root`` once; keep the least recently used blocks totalling >= ``want_bytes``.

    The walk is the native core's (``kvtier._core.RootSurvey``: which files count, how
    candidates are chosen; ties in age by the paths' bytes), in steps of _STEP_FILES files
    with the GIL released. Raises Interrupted when ``stop`` is set between two steps or the
    root holds more than ``max_files`` files; OSError for a failure other than a vanished or
    unreadable entry.
    """
    # The native walk counts in 64 bits; more than that is "every block" all the same.
    walk = _core.RootSurvey(root, min(want_bytes, _ALL), MAX_CANDIDATES)
    while True:
        step = _STEP_FILES
        if max_files is not None:
            step = max(1, min(step, max_files + 1 - walk.files))
        ended = walk.advance(step)
        if max_files is not None and walk.files > max(max_files, 0):
            raise Interrupted(root)
        if ended:
            break
        if stop is not None and stop.is_set():
            raise Interrupted(root)
    result = Survey()
    for name, blocks, block_bytes, tmp_files, tmp_bytes, oldest, newest in walk.namespaces():
        result.namespaces[name] = NamespaceUsage(
            blocks, block_bytes, tmp_files, tmp_bytes, oldest, newest
        )
    result.candidates = Candidates(walk.take_candidates())
    return result


__all__ = ["MAX_CANDIDATES", "Candidates", "Interrupted", "NamespaceUsage", "Survey", "survey"]

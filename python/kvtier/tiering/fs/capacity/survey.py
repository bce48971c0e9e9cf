"""One pass over a root: usage per namespace and the least recently used blocks.

Used by tiers (to reconcile the ledger and pick victims), ``kvtier gc`` and ``kvtier du``,
so all of them count the same files the same way (scanner.py decides what a block is).
"""

from __future__ import annotations

import heapq
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from kvtier.tiering.fs.capacity.scanner import FileEntry, scan

# Victim candidates kept by one pass at most: bounds memory on huge roots (about 200 bytes
# each); if they do not free enough, the next pass finds more.
MAX_CANDIDATES = 1 << 18


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

    Raises Interrupted when ``stop`` is set during the scan (checked every 4096 files) or
    the root holds more than ``max_files`` files.
    """
    result = Survey()
    # Max-heap on mtime (negated) of the oldest blocks seen so far; the newest of them is
    # dropped while the rest still cover want_bytes. Plain tuples (see Candidates).
    heap: list[tuple[int, str, int, str]] = []  # (-mtime_ns, path, size, namespace)
    held = 0
    for i, entry in enumerate(scan(root)):
        if stop is not None and not i & 4095 and stop.is_set():
            raise Interrupted(root)
        if max_files is not None and i >= max_files:
            raise Interrupted(root)
        usage = result.namespaces.get(entry.namespace)
        if usage is None:
            usage = result.namespaces[entry.namespace] = NamespaceUsage()
        if not entry.is_block:
            usage.tmp_files += 1
            usage.tmp_bytes += entry.size
            continue
        usage.blocks += 1
        usage.block_bytes += entry.size
        t = entry.mtime_ns
        usage.oldest_ns = t if usage.oldest_ns is None else min(usage.oldest_ns, t)
        usage.newest_ns = t if usage.newest_ns is None else max(usage.newest_ns, t)
        if want_bytes <= 0:
            continue
        if held < want_bytes or (len(heap) and t < -heap[0][0]):
            heapq.heappush(heap, (-t, entry.path, entry.size, entry.namespace))
            held += entry.size
            while heap and (held - heap[0][2] >= want_bytes or len(heap) > MAX_CANDIDATES):
                held -= heapq.heappop(heap)[2]
    heap.sort(key=lambda x: (-x[0], x[1]))
    result.candidates = Candidates((True, ns, path, size, -neg) for neg, path, size, ns in heap)
    return result


__all__ = ["MAX_CANDIDATES", "Candidates", "Interrupted", "NamespaceUsage", "Survey", "survey"]

"""The bench's primary memory: an engine's CPU tier stand-in, with a chosen physical layout.

On a virtio disk without indirect descriptors (``max_segments`` = queue size - 2) the memory
segments of the requests in flight share the queue's descriptors, so how physically
contiguous the memory a load lands in is decides how many bytes the device can hold in
flight, and with it load throughput (docs/perf/disk-loads-investigation.md): the same tier
on the same disk moved by 2x between processes whose fresh memory happened to be laid out
differently. The layout is therefore chosen, not left to chance:

- ``scattered`` (the default of ``kvtier bench``): 4 KiB pages (``MADV_NOHUGEPAGE``) faulted
  in a random order, so every page is its own segment, as in a long-running engine's memory
  or pinned host memory. Reproducible from one process to the next.
- ``thp``: transparent huge pages (``MADV_HUGEPAGE`` on a 2 MiB-aligned range, faulted one
  huge page at a time), 2 MiB segments, as an engine that allocates its CPU tier in huge
  pages. The kernel may refuse some under fragmentation; the share it granted is measured
  (``huge_page_bytes``) and reported.
- ``plain``: whatever the kernel gives fresh anonymous memory (often contiguous for a while,
  less so on a busy host): the layout of the bench before ``--primary``.

The mapping is private anonymous memory (``MAP_PRIVATE``), as an engine's ``malloc``'d or
``torch.empty`` tier is: a shared anonymous mapping is shmem, whose huge pages follow
``shmem_enabled`` (``never`` on most hosts), not ``MADV_HUGEPAGE``.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import random

import numpy as np

from kvtier.bench.errors import BenchError

#: The layouts ``--primary`` accepts, in the order the help lists them.
PRIMARY_LAYOUTS = ("plain", "scattered", "thp")
#: `kvtier bench`'s layout unless ``--primary`` says otherwise: the reproducible one, and the
#: one a long-running engine's memory converges to.
DEFAULT_PRIMARY_LAYOUT = "scattered"
#: What each layout is, for the report's header.
PRIMARY_LAYOUT_TEXT = {
    "plain": "left to the kernel (no madvise, pages faulted in order)",
    "scattered": "4 KiB pages (MADV_NOHUGEPAGE) faulted in a random order: one segment per page",
    "thp": "transparent huge pages (MADV_HUGEPAGE, 2 MiB-aligned)",
}

PAGE = mmap.PAGESIZE
#: The x86-64 / aarch64 (4 KiB granule) PMD size, the unit of a transparent huge page.
HUGE_PAGE = 2 << 20


def check_layout(layout: str) -> str:
    """``layout`` if it is one of PRIMARY_LAYOUTS; BenchError naming the choices otherwise."""
    if layout not in PRIMARY_LAYOUTS:
        choices = ", ".join(PRIMARY_LAYOUTS)
        raise BenchError(f"invalid primary memory layout {layout!r}: expected one of {choices}")
    return layout


def _madvise(address: int, length: int, advice: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), advice) != 0:
        raise BenchError(f"madvise failed: {os.strerror(ctypes.get_errno())}")


def huge_page_bytes(address: int, length: int) -> int | None:
    """Bytes of ``[address, address + length)`` the kernel backs with transparent huge pages
    (``AnonHugePages`` in /proc/self/smaps of the mappings that overlap it, capped at
    ``length``); None where smaps cannot be read.

    With ``scattered`` and ``thp`` the madvise'd range is a mapping of its own, so the figure
    is exact; a ``plain`` range may share its mapping with neighbouring anonymous memory."""
    end = address + length
    total = 0
    inside = False
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split(None, 1)[0]
                if "-" in head and not head.endswith(":"):
                    lo, _, hi = head.partition("-")
                    try:
                        inside = int(lo, 16) < end and int(hi, 16) > address
                    except ValueError:
                        inside = False
                elif inside and head == "AnonHugePages:":
                    total += int(line.split()[1]) * 1024
    except OSError:
        return None
    return min(total, length)


class PrimaryMemory:
    """Page-aligned anonymous memory shaped as ``n_blocks`` rows of ``block_size`` bytes.

    This stands in for an engine's CPU primary tier: the secondary tier gets a C-contiguous
    memoryview whose ``strides[0]`` is the row size, exactly as engines hand it over. The rows
    start on a 2 MiB boundary (so ``thp`` can back all of them) and are laid out as
    ``layout`` says (module docstring) before anything else touches them.
    """

    def __init__(self, n_blocks: int, block_size: int, layout: str = "plain"):
        self.layout = check_layout(layout)
        self.n_blocks = n_blocks
        self.block_size = block_size
        length = n_blocks * block_size
        # Room to start on a huge-page boundary whatever address mmap returns.
        self._map = mmap.mmap(-1, length + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        whole = np.frombuffer(self._map, dtype=np.uint8)
        offset = -whole.ctypes.data % HUGE_PAGE
        self.array = whole[offset : offset + length].reshape(n_blocks, block_size)
        del whole
        self._whole_view = memoryview(self._map)
        self.view = self._whole_view[offset : offset + length].cast("B", (n_blocks, block_size))
        self.address = self.array.ctypes.data
        self.length = length
        self._place()
        #: Bytes in transparent huge pages right after placement (None: not measurable).
        self.huge_page_bytes = huge_page_bytes(self.address, length)

    def _place(self) -> None:
        if self.layout == "plain" or self.length == 0:
            return
        flat = self.array.reshape(-1)
        if self.layout == "thp":
            _madvise(self.address, self.length, mmap.MADV_HUGEPAGE)
            flat[::HUGE_PAGE] = 1  # one fault per 2 MiB: each a huge page where granted
            return
        _madvise(self.address, self.length, mmap.MADV_NOHUGEPAGE)
        pages = list(range(0, self.length, PAGE))
        random.Random(0).shuffle(pages)
        flat[np.asarray(pages, dtype=np.int64)] = 1  # faulted in this (random) order

    def describe(self) -> dict:
        """What the JSON keeps: the layout asked for and what the kernel granted."""
        return {
            "layout": self.layout,
            "bytes": self.length,
            "huge_page_bytes": self.huge_page_bytes,
        }

    def fill(self, seed: int) -> None:
        """Random bytes, different in every row (a repeated random pattern, stamped per row)."""
        rng = np.random.default_rng(seed)
        pattern = rng.integers(0, 256, size=min(self.array.size, 8 << 20), dtype=np.uint8)
        flat = self.array.reshape(-1)
        for start in range(0, flat.size, pattern.size):
            chunk = flat[start : start + pattern.size]
            chunk[:] = pattern[: chunk.size]
        stamps = rng.integers(0, 2**63, size=self.n_blocks, dtype=np.int64)
        self.array[:, :8] = stamps.view(np.uint8).reshape(self.n_blocks, 8)

    def close(self) -> None:
        """Unmap now if nothing else still points into the memory; else leave it to the GC.

        After an error or Ctrl-C, traceback frames may still hold views of rows (numpy slices,
        the tier's view); refusing to unmap then must not replace the original exception.
        """
        del self.array
        try:
            self.view.release()
            self._whole_view.release()
            self._map.close()
        except BufferError:
            pass

"""Whether the CPU memory under a KV cache can be written.

torch has no read-only tensors, yet the pages under one may be mapped read-only
(``torch.from_numpy(np.memmap(path, mode="r"))``, a tensor over an ``mmap`` opened with
``PROT_READ``): a load into them kills the process with SIGSEGV in a worker thread. The
kernel's own map of the process (``/proc/self/maps``) says which ranges are writable, without
touching the memory. A tensor over an immutable Python object in writable pages
(``torch.frombuffer(bytes)``) cannot be told apart; torch warns when one is made.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvtier.gpu.layout import TensorRuns


def _writable_ranges() -> list[tuple[int, int]]:
    """Writable mappings of this process as sorted, merged [start, end) address ranges."""
    ranges: list[tuple[int, int]] = []
    with open("/proc/self/maps", encoding="ascii", errors="replace") as maps:
        for line in maps:
            span, perms = line.split(maxsplit=2)[:2]
            if "w" not in perms:
                continue
            start, end = (int(x, 16) for x in span.split("-"))
            if ranges and ranges[-1][1] == start:
                ranges[-1] = (ranges[-1][0], end)
            else:
                ranges.append((start, end))
    return ranges


def _covered(ranges: list[tuple[int, int]], start: int, end: int) -> bool:
    for lo, hi in ranges:
        if lo <= start < hi:
            if end <= hi:
                return True
            start = hi  # merged ranges: the rest must start exactly here
    return False


def read_only_tensor(described: Sequence[TensorRuns]) -> str | None:
    """Why a load into these host tensors would write read-only memory, or None if it cannot."""
    ranges = _writable_ranges()
    for i, d in enumerate(described):
        end = d.address + (d.num_blocks - 1) * d.block_stride + max(o + n for o, n in d.runs)
        if not _covered(ranges, d.address, end):
            return (
                f"kv_caches[{i}] lies in read-only memory ({d.address:#x}-{end:#x} is not "
                "mapped writable, e.g. a tensor over np.memmap(mode='r'))"
            )
    return None


__all__ = ["read_only_tensor"]

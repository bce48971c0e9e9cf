"""The capacity policy: budget, free-space floor, watermarks; shared by tiers and ``kvtier gc``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

# Eviction starts when the budget taken (block bytes, tmp files of stores in flight and
# reservations) passes HIGH_WATERMARK x max_bytes and goes down to LOW_WATERMARK x max_bytes,
# so a full cache evicts in batches rather than per store. A pass ends within one block file
# below the low mark, and an active writer holds at most one budget chunk (at most 1/64 of the
# budget, at least one file) or, topped up for a burst, 1/32 of the budget
# (controller.RESERVE_FRACTION): with at least 16 block files in the budget, block bytes stay
# between 80% and 100% of max_bytes in steady state. The gap between HIGH_WATERMARK and the
# budget is what stores may take while a pass runs; a store that would pass max_bytes waits
# for room (controller.STORE_WAIT_SECONDS) instead.
HIGH_WATERMARK = 0.95
LOW_WATERMARK = 0.90
# Below the free-space floor, eviction frees this fraction of the file system beyond it.
FREE_SLACK = 0.01
MAX_MIN_FREE_FRACTION = 0.9


@dataclass(frozen=True)
class CapacityPolicy:
    max_bytes: int | None = None
    min_free_fraction: float = 0.05
    eviction: Literal["lru", "none"] = "lru"
    file_bytes: int = 0  # size of one block file (the unit of a store)

    @property
    def high_bytes(self) -> int | None:
        if self.max_bytes is None:
            return None
        return int(self.max_bytes * HIGH_WATERMARK)

    @property
    def low_bytes(self) -> int | None:
        if self.max_bytes is None:
            return None
        return int(self.max_bytes * LOW_WATERMARK)

    def budget_need(self, used: int) -> int:
        """Bytes to evict for ``used`` bytes of budget taken (0 while under the high mark)."""
        high, low = self.high_bytes, self.low_bytes
        if high is None or low is None:
            return 0
        return 0 if used <= high else used - low

    def free_need(self, st: os.statvfs_result) -> int:
        """Bytes to evict to bring free space back above the floor (0 if it is above)."""
        total = st.f_blocks * st.f_frsize
        avail = st.f_bavail * st.f_frsize
        if self.min_free_fraction <= 0 or avail >= self.min_free_fraction * total:
            return 0
        return int((self.min_free_fraction + FREE_SLACK) * total) - avail


def fs_used_bytes(st: os.statvfs_result) -> int:
    """Bytes in use on the file system: an upper bound of any directory's file bytes in it."""
    return (st.f_blocks - st.f_bfree) * st.f_frsize


__all__ = [
    "HIGH_WATERMARK",
    "LOW_WATERMARK",
    "MAX_MIN_FREE_FRACTION",
    "CapacityPolicy",
    "fs_used_bytes",
]

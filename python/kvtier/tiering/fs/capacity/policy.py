"""The capacity policy: budget, free-space floor, watermarks; shared by tiers and ``kvtier gc``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

# Eviction starts when accounted usage passes HIGH_WATERMARK x max_bytes and goes down to
# LOW_WATERMARK x max_bytes, so a full cache evicts in batches rather than per store, and
# stores keep finding room (the budget refuses a reservation only past max_bytes itself).
# Small budgets keep at least HEADROOM_FILES block files between the marks and the budget.
# The gap between HIGH_WATERMARK and the budget is what stores may take while an eviction
# pass runs (tens of milliseconds); bench/capacity_bench.py steady measures the effect.
HIGH_WATERMARK = 0.90
LOW_WATERMARK = 0.80
HEADROOM_FILES = 64
# Below the free-space floor, eviction frees this fraction of the file system beyond it.
FREE_SLACK = 0.01
MAX_MIN_FREE_FRACTION = 0.9


@dataclass(frozen=True)
class CapacityPolicy:
    max_bytes: int | None = None
    min_free_fraction: float = 0.05
    eviction: Literal["lru", "none"] = "lru"
    file_bytes: int = 0  # size of one block file, for the headroom of small budgets

    @property
    def high_bytes(self) -> int | None:
        if self.max_bytes is None:
            return None
        gap = max(
            self.max_bytes - int(self.max_bytes * HIGH_WATERMARK), HEADROOM_FILES * self.file_bytes
        )
        return max(self.max_bytes // 2, self.max_bytes - gap)

    @property
    def low_bytes(self) -> int | None:
        high = self.high_bytes
        if self.max_bytes is None or high is None:
            return None
        headroom = 2 * HEADROOM_FILES * self.file_bytes
        gap = max(self.max_bytes - int(self.max_bytes * LOW_WATERMARK), headroom)
        return max(self.max_bytes // 4, min(high, self.max_bytes - gap))

    def budget_need(self, used: int, lead: int = 0) -> int:
        """Bytes to evict for ``used`` accounted bytes (0 while under the high watermark).

        ``lead`` moves both watermarks down (to at most half / a quarter of the budget): the
        bytes stores are expected to add while one eviction pass runs, so that a fast writer
        does not fill the budget before the pass has made room.
        """
        high, low, budget = self.high_bytes, self.low_bytes, self.max_bytes
        if high is None or low is None or budget is None:
            return 0
        high = max(budget // 2, high - lead)
        low = max(budget // 4, low - lead)
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

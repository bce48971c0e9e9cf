"""What the tests count on disk themselves, independently of kvtier's own scanner."""

from __future__ import annotations

import os
from pathlib import Path


def block_bytes_on_disk(root: Path | str) -> int:
    """Bytes of block files and block tmp files under ``root``, by a walk of our own."""
    total = 0
    for d, _, names in os.walk(root):
        for n in names:
            if n.endswith(".kvb") or (n.endswith(".tmp") and ".kvb." in n):
                try:
                    total += os.lstat(os.path.join(d, n)).st_size
                except OSError:  # gone meanwhile (ENOENT), or ESTALE over FUSE
                    pass
    return total

"""Capacity of the fs tier: a byte budget and a free-space floor for a whole root, shared by
every process and host using it, with LRU eviction (docs/tiers.md, "Capacity").

Modules: ``sizes`` (size strings, block file size), ``scanner`` (which files are blocks),
``survey`` (one pass: usage and LRU candidates), ``ledger`` (per-writer records, the count),
``recency`` (uses as mtimes), ``evictor`` (lock and unlink), ``policy`` (watermarks),
``controller`` (a tier instance's part).
"""

from kvtier.tiering.fs.capacity.controller import CapacityController
from kvtier.tiering.fs.capacity.policy import CapacityPolicy
from kvtier.tiering.fs.capacity.sizes import block_file_bytes, format_size, parse_size

__all__ = [
    "CapacityController",
    "CapacityPolicy",
    "block_file_bytes",
    "format_size",
    "parse_size",
]

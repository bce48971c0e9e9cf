"""Options of GPUStorageTransfer: the fs tier's storage options plus staging."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier.tiering.fs.options import StorageOptions


@dataclass(frozen=True)
class GPUTransferOptions(StorageOptions):
    # Pinned staging memory: at most this much in all, allocated on first use.
    staging_bytes_total: int = 256 << 20
    # One staging buffer; larger blocks stream through it in pieces.
    staging_buffer_bytes: int = 8 << 20
    numa_bind: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> GPUTransferOptions:
        p, get = cls._parser("GPUStorageTransfer", raw)
        buffer_bytes = p.integer("staging_buffer_bytes", get("staging_buffer_bytes"), 4096, None)
        if buffer_bytes % 4096:
            raise p.error("staging_buffer_bytes", "a multiple of 4096", buffer_bytes)
        total = p.integer("staging_bytes_total", get("staging_bytes_total"), buffer_bytes, None)
        return cls(
            **cls._parse_storage(p, raw, get),
            staging_bytes_total=total,
            staging_buffer_bytes=buffer_bytes,
            numa_bind=p.boolean("numa_bind", get("numa_bind")),
        )

    def engine_kwargs(self) -> dict[str, Any]:
        return {
            **super().engine_kwargs(),
            "staging_bytes_total": self.staging_bytes_total,
            "staging_buffer_bytes": self.staging_buffer_bytes,
            "numa_bind": self.numa_bind,
        }

"""Options of GPUStorageTransfer: the fs tier's storage options plus staging.

Defaults and ranges of the staging options are the native engine's (``_core.ENGINE_DEFAULTS``
and ``_core.ENGINE_LIMITS``), as for every engine option: a transfer stages with the same
pool a tier would."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvtier import _core
from kvtier.tiering.fs.options import StorageOptions

_ENGINE = _core.ENGINE_DEFAULTS
_LIMITS = _core.ENGINE_LIMITS


@dataclass(frozen=True)
class GPUTransferOptions(StorageOptions):
    # Pinned staging memory: at most this much in all, allocated on first use.
    staging_bytes_total: int = _ENGINE["staging_bytes_total"]
    # One staging buffer; larger blocks stream through it in pieces.
    staging_buffer_bytes: int = _ENGINE["staging_buffer_bytes"]
    numa_bind: bool = _ENGINE["numa_bind"]

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> GPUTransferOptions:
        p, get = cls._parser("GPUStorageTransfer", raw)
        buffer_bytes = p.byte_count(
            "staging_buffer_bytes", get("staging_buffer_bytes"), *_LIMITS["staging_buffer_bytes"]
        )
        multiple = _LIMITS["staging_buffer_bytes_multiple"]
        if buffer_bytes % multiple:
            raise p.error("staging_buffer_bytes", f"a multiple of {multiple}", buffer_bytes)
        # At least one buffer (the engine's rule beside its range).
        lo = max(buffer_bytes, _LIMITS["staging_bytes_total"][0])
        hi = _LIMITS["staging_bytes_total"][1]
        total = p.byte_count("staging_bytes_total", get("staging_bytes_total"), lo, hi)
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

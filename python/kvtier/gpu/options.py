"""Options of GPUStorageTransfer: the fs tier's storage options plus staging."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from kvtier.tiering.fs.options import OptionParser

_NAME = "GPUStorageTransfer"


@dataclass(frozen=True)
class GPUTransferOptions:
    root_dir: str
    n_read_threads: int = 16
    n_write_threads: int = 16
    o_direct: Literal["auto"] | bool = "auto"
    checksum: Literal["crc32c", "none"] = "crc32c"
    durability: Literal["none", "data", "full"] = "none"
    file_mode: int = 0o600
    # Pinned staging memory: at most this much in all, allocated on first use.
    staging_bytes_total: int = 256 << 20
    # One staging buffer; larger blocks stream through it in pieces.
    staging_buffer_bytes: int = 8 << 20
    numa_bind: bool = False

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> GPUTransferOptions:
        names = [f.name for f in fields(cls)]
        p = OptionParser(_NAME, names)
        p.reject_unknown(raw)
        d = {f.name: f.default for f in fields(cls)}
        get = lambda name: raw.get(name, d[name])  # noqa: E731
        n_read, n_write = p.thread_counts(get("n_read_threads"), get("n_write_threads"))
        buffer_bytes = p.integer("staging_buffer_bytes", get("staging_buffer_bytes"), 4096, None)
        if buffer_bytes % 4096:
            raise p.error("staging_buffer_bytes", "a multiple of 4096", buffer_bytes)
        total = p.integer("staging_bytes_total", get("staging_bytes_total"), buffer_bytes, None)
        return cls(
            root_dir=p.root_dir(raw.get("root_dir")),
            n_read_threads=n_read,
            n_write_threads=n_write,
            o_direct=p.o_direct(get("o_direct")),
            checksum=p.choice("checksum", get("checksum"), ("crc32c", "none")),
            durability=p.choice("durability", get("durability"), ("none", "data", "full")),
            file_mode=p.file_mode(get("file_mode")),
            staging_bytes_total=total,
            staging_buffer_bytes=buffer_bytes,
            numa_bind=p.boolean("numa_bind", get("numa_bind")),
        )

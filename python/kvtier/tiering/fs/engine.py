"""Opening the native engine over a prepared namespace, as every fs-format writer does."""

from __future__ import annotations

import logging
from typing import Any

from kvtier import _core
from kvtier.tiering.fs.file_mapper import FileMapper
from kvtier.tiering.fs.options import StorageOptions

logger = logging.getLogger(__name__)


def open_engine(
    mapper: FileMapper, options: StorageOptions, owner: str, **extra: Any
) -> _core.Engine:
    """An engine writing ``mapper``'s namespace with ``options``; warns once if O_DIRECT fell
    back to buffered I/O. ``extra`` are further ``_core.Engine`` arguments (e.g. use_cuda)."""
    engine = _core.Engine(
        mapper.rank_dir, fingerprint=mapper.fingerprint, **options.engine_kwargs(), **extra
    )
    if engine.o_direct_fallback_reason:
        logger.warning(
            "O_DIRECT is not usable under %s (%s); %s uses buffered I/O",
            mapper.rank_dir,
            engine.o_direct_fallback_reason,
            owner,
        )
    return engine

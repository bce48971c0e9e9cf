"""Opening the native engine over a prepared namespace, as every fs-format writer does."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

from kvtier import _core
from kvtier._fork import after_fork_in_child
from kvtier.errors import IoUringRefusedError
from kvtier.tiering.fs.file_mapper import FileMapper
from kvtier.tiering.fs.options import StorageOptions

logger = logging.getLogger(__name__)

# Reasons for which io_engine="auto" fell back to psync that were logged already: the kernel
# refuses io_uring to the whole process alike, so a server with dozens of tiers, transfers and
# ranks says it once, not once per engine.
_warned_io_engine_fallbacks: set[str] = set()
_warned_lock = threading.Lock()


@after_fork_in_child
def _reset_warnings() -> None:
    # The lock may have been held by another thread of the parent; a child is another process.
    global _warned_lock
    _warned_lock = threading.Lock()
    _warned_io_engine_fallbacks.clear()


def open_engine(
    mapper: FileMapper, options: StorageOptions, owner: str, **extra: Any
) -> _core.Engine:
    """An engine writing ``mapper``'s namespace with ``options``; warns once if O_DIRECT fell
    back to buffered I/O, and once per process and reason if ``io_engine="auto"`` fell back to
    psync. ``extra`` are further ``_core.Engine`` arguments (e.g. use_cuda).

    Raises :class:`~kvtier.errors.IoUringRefusedError` (an OSError: ENOSYS, EPERM, ...) when
    ``io_engine="io_uring"`` is refused, saying which values work instead."""
    kwargs = {**options.engine_kwargs(), **extra}
    try:
        engine = _core.Engine(mapper.rank_dir, fingerprint=mapper.fingerprint, **kwargs)
    except IoUringRefusedError as e:
        # The core says which errors are a refusal of io_uring itself: only those get the
        # advice; any other error (an unusable root) passes unchanged.
        advised = IoUringRefusedError(
            e.errno,
            f"{owner}: {e.strerror}; use io_engine='auto' (io_uring where the kernel allows "
            "it, otherwise psync) or io_engine='psync'",
            e.filename,
        )
        advised.where = e.where
        raise advised from e
    if engine.o_direct_fallback_reason:
        logger.warning(
            "O_DIRECT is not usable under %s (%s); %s uses buffered I/O",
            mapper.rank_dir,
            engine.o_direct_fallback_reason,
            owner,
        )
    reason = engine.io_engine_fallback_reason
    if reason:
        with _warned_lock:
            first = reason not in _warned_io_engine_fallbacks
            _warned_io_engine_fallbacks.add(reason)
        if first:
            logger.warning(
                "io_uring is not usable (%s); io_engine='auto' uses psync (pread/pwrite) in "
                "this process",
                reason,
            )
    return engine


def io_uring_refusal(directory: str | os.PathLike[str]) -> str:
    """Why the native engine refuses io_engine="io_uring" in this process ("" if it accepts):
    the engine's own answer (the kernel's refusal, a seccomp profile, a build without io_uring),
    asked of a real engine on ``directory``, which is created if missing and left empty."""
    try:
        engine = _core.Engine(
            os.fspath(directory), n_read_threads=1, n_write_threads=0, io_engine="io_uring"
        )
    except IoUringRefusedError as exc:
        return exc.strerror or str(exc)
    engine.shutdown()
    return ""


class EngineIoReport:
    """Which I/O engine a native-engine owner (``self._engine``) runs, for its users."""

    _engine: Any

    @property
    def io_engine(self) -> str:
        """``"io_uring"`` or ``"psync"``: the engine moving the bytes (what ``"auto"`` chose)."""
        return str(self._engine.io_engine)

    @property
    def io_engine_fallback_reason(self) -> str:
        """Why ``io_engine="auto"`` chose psync (the kernel's refusal); empty otherwise."""
        return str(self._engine.io_engine_fallback_reason)

"""OSErrors that say which path they are about.

Some failures come from calls that know no path (``os.write`` on a full disk, an fsync); the
user then sees "No space left on device" without knowing where. Constructors of fs-format
writers wrap such steps (writing config.json) in :func:`naming`; the native engine's errors
carry their path already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from kvtier.errors import StorageError


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """Re-raise an OSError as a :class:`~kvtier.errors.StorageError` (the same errno, so the
    same builtin subclass: FileNotFoundError, ...) about ``path`` when it names no file."""
    try:
        yield
    except StorageError as e:
        if e.filename:
            raise
        raise StorageError(e.errno, e.strerror or str(e), path) from e
    except OSError as e:
        raise StorageError(e.errno, e.strerror or str(e), e.filename or path) from e


__all__ = ["naming"]

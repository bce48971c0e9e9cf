"""OSErrors that say which path they are about.

Some failures come from calls that know no path (``os.write`` on a full disk, an fsync); the
user then sees "No space left on device" without knowing where. Constructors of fs-format
writers wrap such steps (writing config.json) in :func:`naming`; the native engine's errors
carry their path already.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def naming(path: str) -> Iterator[None]:
    """Re-raise an OSError without a ``filename`` as the same error about ``path``."""
    try:
        yield
    except OSError as e:
        if e.filename:
            raise
        # OSError(errno, ...) picks the matching subclass (FileNotFoundError, ...) itself.
        raise OSError(e.errno, e.strerror or str(e), path) from e


__all__ = ["naming"]

"""kvtier: fast, crash-safe storage tiers for LLM KV-cache blocks.

The native core lives in ``kvtier._core``; engines use the tiers in ``kvtier.tiering``.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from kvtier import _core
from kvtier.errors import (
    ConfigurationError,
    CoreError,
    ForkedProcessError,
    InvalidArgumentError,
    InvalidTypeError,
    IoUringRefusedError,
    KvtierError,
    ShutDownError,
    StorageError,
)

try:
    __version__ = version("kvtier")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"


def _native_root() -> Path:
    # The compiled files (module, core library, headers, CMake package) are installed side by
    # side. Locating them through the extension module, not this file, keeps editable installs
    # working: there this file stays in the source tree while the build lands in site-packages.
    return Path(_core.__file__).resolve().parent


def cmake_dir() -> str:
    """Directory holding ``kvtierConfig.cmake``: pass it as ``-Dkvtier_DIR=...``."""
    return str(_native_root() / "lib" / "cmake" / "kvtier")


def include_dir() -> str:
    """Directory to add to the include path for ``#include <kvtier/kvtier.hpp>``."""
    return str(_native_root() / "include")


__all__ = [
    "ConfigurationError",
    "CoreError",
    "ForkedProcessError",
    "InvalidArgumentError",
    "InvalidTypeError",
    "IoUringRefusedError",
    "KvtierError",
    "ShutDownError",
    "StorageError",
    "__version__",
    "cmake_dir",
    "include_dir",
]

"""The errors kvtier raises: one base class, and for each a builtin type callers already catch.

::

    KvtierError                                   every error kvtier raises on purpose
    ├── StorageError          (OSError)           a system call failed: errno, strerror,
    │   │                                         filename; also FileNotFoundError,
    │   │                                         PermissionError, ... as the errno says
    │   └── IoUringRefusedError                   io_engine="io_uring" refused (kernel,
    │                                             seccomp, sysctl, a build without io_uring)
    ├── InvalidArgumentError  (ValueError)        a value that cannot be used
    │   └── ConfigurationError                    an option, spec or tier configuration
    ├── InvalidTypeError      (TypeError)         an argument of the wrong type
    ├── ShutDownError         (RuntimeError)      a tier, transfer or engine used after
    │                                             shutdown()
    ├── ForkedProcessError    (RuntimeError)      an object used in a process forked from
    │                                             the one that made it
    └── CoreError             (RuntimeError)      any other failure of the native core

So ``except kvtier.KvtierError`` catches everything kvtier raises, while code written for the
builtin types (``except OSError``, ``except FileNotFoundError``, ``except ValueError``) keeps
working. An error raised by the native core carries the C++ source location of its throw in
``where`` (``"csrc/src/....cpp:123"``; empty for errors raised in Python, whose traceback
says where).
"""

from __future__ import annotations

from typing import Any


class KvtierError(Exception):
    """Base class of every error kvtier raises on purpose."""

    # C++ file:line of the throw for errors from the native core; "" for Python's own.
    where: str = ""


class StorageError(KvtierError, OSError):
    """A system call failed (errno, strerror and filename set, as for OSError).

    ``StorageError(errno, strerror, filename)`` is also the builtin subclass its errno maps
    to, as ``OSError(...)`` would be: ``except FileNotFoundError`` catches an ENOENT one.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> StorageError:
        if len(args) >= 2 and isinstance(args[0], int):
            builtin = type(OSError(args[0], ""))
            if builtin is not OSError and not issubclass(cls, builtin):
                cls = _with_builtin(cls, builtin)
        return super().__new__(cls, *args, **kwargs)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt through the public class (the errno picks the builtin again): the combined
        # classes are made on demand, so pickle could not find them by name.
        args = self.args
        if self.filename is not None:
            args = (self.errno, self.strerror, self.filename)
        return (_public_class(type(self)), args, self.__dict__ or None)


class IoUringRefusedError(StorageError):
    """``io_engine="io_uring"`` was refused in this process: the kernel has no io_uring
    (ENOSYS), a seccomp profile or ``kernel.io_uring_disabled`` forbids it (EPERM), or the
    build has no io_uring engine. ``io_engine="auto"`` falls back to psync instead."""


class InvalidArgumentError(KvtierError, ValueError):
    """A value that cannot be used: an out-of-range block id, a job id still in flight."""


class ConfigurationError(InvalidArgumentError):
    """A bad option, spec or tier configuration; the message names the key and what it
    takes."""


class InvalidTypeError(KvtierError, TypeError):
    """An argument of the wrong type (a job id that is not an int, a key that is not bytes)."""


class ShutDownError(KvtierError, RuntimeError):
    """A tier, transfer or engine was asked for work after ``shutdown()``."""


class ForkedProcessError(KvtierError, RuntimeError):
    """An object was used in a process forked from the one that created it, where its
    threads do not exist; create a new one in the child."""


class CoreError(KvtierError, RuntimeError):
    """A failure of the native core that no other type describes (e.g. ``use_cuda`` without
    a usable CUDA runtime)."""


_combined: dict[tuple[type[StorageError], type[OSError]], type[StorageError]] = {}


def _with_builtin(cls: type[StorageError], builtin: type[OSError]) -> type[StorageError]:
    """``cls`` that is also ``builtin`` (FileNotFoundError, ...); made once per pair. It has
    the name of ``cls``, which is what users see and catch."""
    made = _combined.get((cls, builtin))
    if made is None:
        made = type(cls.__name__, (cls, builtin), {"__module__": cls.__module__})
        made.__qualname__ = cls.__qualname__
        made._kvtier_public = cls  # type: ignore[attr-defined]
        # setdefault is atomic: threads racing to make a pair all get the same class.
        made = _combined.setdefault((cls, builtin), made)
    return made


def _public_class(cls: type[StorageError]) -> type[StorageError]:
    public: type[StorageError] = cls.__dict__.get("_kvtier_public", cls)
    return public


# The kinds of C++ error the binding reports (csrc/bindings/): the class each becomes.
_CORE_KINDS: dict[str, type[KvtierError]] = {
    "system": StorageError,
    "io_uring_refused": IoUringRefusedError,
    "invalid_argument": InvalidArgumentError,
    "shut_down": ShutDownError,
    "forked": ForkedProcessError,
    "runtime": CoreError,
}


def _from_core(kind: str, errno: int, message: str, path: str, where: str) -> BaseException:
    """The exception the binding raises for a C++ error (called by the native core's
    exception translator; must not raise itself)."""
    cls = _CORE_KINDS.get(kind, CoreError)
    error: KvtierError
    if issubclass(cls, StorageError):
        error = cls(errno, message, path) if path else cls(errno, message)
    else:
        error = cls(message)
    error.where = where
    if where and hasattr(error, "add_note"):  # Python 3.11+: shown under the traceback
        error.add_note(f"raised by the native core at {where}")
    return error


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
]

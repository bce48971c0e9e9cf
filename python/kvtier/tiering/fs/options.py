"""Options of the fs tier: parsed and validated once, with errors that say what to write.

Values may come from Python, JSON or YAML, so strings such as ``"16"``, ``"true"`` and
``"0640"`` are accepted where an int, a bool or a file mode is expected.

The native engine's options take their defaults and ranges from the engine itself
(``_core.ENGINE_DEFAULTS`` and ``_core.ENGINE_LIMITS``, read from the C++ configuration and
the constants its checks use), so Python and C++ cannot disagree; only the options Python
implements (capacity, lookups, the store queue) define their defaults here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

from kvtier import _core
from kvtier.errors import ConfigurationError
from kvtier.tiering.fs.capacity.policy import MAX_MIN_FREE_FRACTION, CapacityPolicy
from kvtier.tiering.fs.capacity.sizes import SIZE_SYNTAX, parse_size

_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})
_ENGINE = _core.ENGINE_DEFAULTS
_LIMITS = _core.ENGINE_LIMITS
MAX_THREADS: int = _LIMITS["n_read_threads"][1]  # the native engine's own limit
# file_mode: permission bits only, narrower than the engine's range (which also takes the
# setuid, setgid and sticky bits): block files never want those, and a decimal 640 from
# YAML/JSON (0o1200) is refused instead of taken for 0o640.
FILE_MODE_BITS = 0o777
_FILE_MODE_REQUIRED: int = _LIMITS["file_mode_required_bits"]  # owner read and write
IO_ENGINES = ("auto", "io_uring", "psync")  # values of the io_engine option
# Options the Python side implements (root layout, capacity); never passed to the engine.
_NOT_ENGINE_OPTIONS = frozenset({"root_dir", "max_bytes", "min_free_fraction", "eviction"})


@dataclass(frozen=True)
class StorageOptions:
    """The storage options every user of the native engine shares (fs tier, GPU transfers)."""

    root_dir: str
    # None: sized by the machine (cores, root's device queue; docs/tiers.md).
    n_read_threads: int | None = _ENGINE["n_read_threads"]
    n_write_threads: int | None = _ENGINE["n_write_threads"]
    o_direct: Literal["auto"] | bool = _ENGINE["o_direct"]
    checksum: Literal["crc32c", "none"] = _ENGINE["checksum"]
    durability: Literal["none", "data", "full"] = _ENGINE["durability"]
    file_mode: int = _ENGINE["file_mode"]
    # Nice value of the I/O worker threads: keeps them from starving the scheduler loop.
    worker_nice: int = _ENGINE["worker_nice"]
    # "auto": io_uring where the kernel allows it, else psync (pread/pwrite), with one warning.
    io_engine: Literal["auto", "io_uring", "psync"] = _ENGINE["io_engine"]
    # Nice value of the load-only workers: loads (what a request waits for) above stores.
    load_nice: int = _ENGINE["load_nice"]
    # Stores at most in flight while loads wait or run: a load waits for these writes at the
    # device, and stores get no more done than they allow while loads run.
    max_stores_in_flight_while_loading: int = _ENGINE["max_stores_in_flight_while_loading"]
    # Deadline of one block operation in seconds (0: none); past it the job fails with
    # ETIMEDOUT and the root is degraded (docs/tiers.md, "When storage stalls").
    io_timeout_s: float = _ENGINE["io_timeout_s"]
    # Capacity of the whole root (docs/tiers.md, "Capacity"); kvtier's, not the engine's.
    max_bytes: int | None = None
    min_free_fraction: float = 0.05
    eviction: Literal["lru", "none"] = "lru"

    @classmethod
    def option_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    @classmethod
    def _parser(cls, owner: str, raw: Mapping[str, Any]) -> tuple[OptionParser, Any]:
        """A parser for ``owner`` that has rejected unknown keys, and a getter with defaults."""
        p = OptionParser(owner, cls.option_names())
        p.reject_unknown(raw)
        defaults = {f.name: f.default for f in fields(cls)}
        return p, lambda name: raw.get(name, defaults[name])

    @staticmethod
    def _parse_storage(p: OptionParser, raw: Mapping[str, Any], get: Any) -> dict[str, Any]:
        n_read, n_write = p.thread_counts(get("n_read_threads"), get("n_write_threads"))
        return {
            "root_dir": p.root_dir(raw.get("root_dir")),
            "n_read_threads": n_read,
            "n_write_threads": n_write,
            "o_direct": p.o_direct(get("o_direct")),
            "checksum": p.choice("checksum", get("checksum"), ("crc32c", "none")),
            "durability": p.choice("durability", get("durability"), ("none", "data", "full")),
            "file_mode": p.file_mode(get("file_mode")),
            "worker_nice": p.integer("worker_nice", get("worker_nice"), *_LIMITS["worker_nice"]),
            "io_engine": p.choice("io_engine", get("io_engine"), IO_ENGINES),
            "load_nice": p.integer("load_nice", get("load_nice"), *_LIMITS["load_nice"]),
            "max_stores_in_flight_while_loading": p.integer(
                "max_stores_in_flight_while_loading",
                get("max_stores_in_flight_while_loading"),
                *_LIMITS["max_stores_in_flight_while_loading"],
            ),
            "io_timeout_s": p.seconds(
                "io_timeout_s", get("io_timeout_s"), *_LIMITS["io_timeout_s"]
            ),
            "max_bytes": p.size("max_bytes", get("max_bytes")),
            "min_free_fraction": p.fraction(
                "min_free_fraction", get("min_free_fraction"), MAX_MIN_FREE_FRACTION
            ),
            "eviction": p.choice("eviction", get("eviction"), ("lru", "none")),
        }

    def engine_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``kvtier._core.Engine`` for these options."""
        names = [f.name for f in fields(StorageOptions) if f.name not in _NOT_ENGINE_OPTIONS]
        return {name: getattr(self, name) for name in names}

    def capacity_policy(self) -> CapacityPolicy:
        return CapacityPolicy(self.max_bytes, self.min_free_fraction, self.eviction)


@dataclass(frozen=True)
class FsTierOptions(StorageOptions):
    """Validated options of a :class:`~kvtier.tiering.fs.manager.FileSystemTierManager`."""

    async_lookup: bool = False
    max_queued_store_jobs: int = 1024

    @classmethod
    def parse(cls, tier_type: str, raw: Mapping[str, Any]) -> FsTierOptions:
        """Validate raw option values; raises ConfigurationError (a ValueError) naming the
        option and what it takes."""
        p, get = cls._parser(f"secondary tier '{tier_type}'", raw)
        return cls(
            **cls._parse_storage(p, raw, get),
            async_lookup=p.boolean("async_lookup", get("async_lookup")),
            max_queued_store_jobs=p.integer(
                "max_queued_store_jobs", get("max_queued_store_jobs"), 0, None
            ),
        )


class OptionParser:
    """Parses the storage options shared by the fs tier and GPUStorageTransfer.

    ``owner`` names what is being configured in messages, e.g. "secondary tier 'fs'".
    """

    def __init__(self, owner: str, valid_names: list[str]) -> None:
        self.owner = owner
        self.valid_names = valid_names

    def error(self, name: str, expected: str, value: Any) -> ConfigurationError:
        return ConfigurationError(
            f"Invalid value {value!r} for option '{name}' of {self.owner}: expected {expected}"
        )

    def reject_unknown(self, raw: Mapping[str, Any]) -> None:
        unknown = sorted(k for k in raw if k not in self.valid_names)
        if unknown:
            noun = "option" if len(unknown) == 1 else "options"
            names = ", ".join(repr(k) for k in unknown)
            raise ConfigurationError(
                f"Unknown {noun} {names} for {self.owner}. Valid options: {self.valid_names}"
            )

    def thread_counts(self, n_read: Any, n_write: Any) -> tuple[int | None, int | None]:
        """Validated counts; None (the default) leaves a count to the engine's machine sizing."""
        if n_read is not None:
            n_read = self.integer("n_read_threads", n_read, *_LIMITS["n_read_threads"])
        if n_write is not None:
            n_write = self.integer("n_write_threads", n_write, *_LIMITS["n_write_threads"])
        # A count left to the machine is at least 1, so only two explicit counts can be short.
        least = _LIMITS["n_threads_total"][0]
        if n_read is not None and n_write is not None and n_read + n_write < least:
            raise ConfigurationError(
                f"{self.owner}: n_read_threads + n_write_threads must be at least {least}"
            )
        return n_read, n_write

    def root_dir(self, value: Any) -> str:
        if value is None:
            raise ConfigurationError(
                f"{self.owner[0].upper()}{self.owner[1:]} requires option 'root_dir' (a "
                "directory path for block files)"
            )
        if not isinstance(value, (str, os.PathLike)) or not os.fspath(value):
            raise self.error("root_dir", "a non-empty directory path", value)
        path = os.fspath(value)
        if isinstance(path, bytes):
            raise self.error("root_dir", "a str path", value)
        return os.path.abspath(os.path.expanduser(path))

    def integer(self, name: str, value: Any, lo: int, hi: int | None) -> int:
        span = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        if isinstance(value, bool):  # bool is an int subclass; True threads is a mistake
            raise self.error(name, span, value)
        if isinstance(value, str):
            try:
                value = int(value.strip(), 10)
            except ValueError:
                raise self.error(name, span, value) from None
        if not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise self.error(name, span, value)
        return value

    def byte_count(self, name: str, value: Any, lo: int, hi: int | None) -> int:
        """A number of bytes in [lo, hi]: an int or a size string (``"2MiB"``, ``"64M"``)."""
        span = f"an integer >= {lo}" if hi is None else f"an integer in [{lo}, {hi}]"
        span += ' (bytes, or a size such as "2MiB")'
        try:
            nbytes = parse_size(value.strip() if isinstance(value, str) else value)
        except ValueError:
            raise self.error(name, f"{span}: {SIZE_SYNTAX}", value) from None
        if nbytes < lo or (hi is not None and nbytes > hi):
            raise self.error(name, span, value)
        return nbytes

    def size(self, name: str, value: Any) -> int | None:
        """A byte count (``"500GiB"``, ``"2TB"``, ``750000000``), or None for no limit."""
        if value is None:
            return None
        try:
            nbytes = parse_size(value)
        except ValueError:
            raise self.error(name, f"None or {SIZE_SYNTAX}", value) from None
        if nbytes <= 0:
            raise self.error(name, f"None or a positive size: {SIZE_SYNTAX}", value)
        return nbytes

    def fraction(self, name: str, value: Any, hi: float) -> float:
        span = f"a number in [0, {hi}]"
        if isinstance(value, bool):
            raise self.error(name, span, value)
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise self.error(name, span, value) from None
        if not 0.0 <= number <= hi:  # also rejects NaN
            raise self.error(name, span, value)
        return number

    def seconds(self, name: str, value: Any, lo: float, hi: float) -> float:
        """A duration in seconds in [lo, hi] (0: none): an int, a float or a numeric string."""
        span = f"a number of seconds in [{lo:g}, {hi:g}] (0: no deadline)"
        if isinstance(value, bool):  # True seconds is a mistake, not 1
            raise self.error(name, span, value)
        try:
            number = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            raise self.error(name, span, value) from None
        if not lo <= number <= hi:  # also rejects NaN and infinities
            raise self.error(name, span, value)
        return number + 0.0  # -0.0 becomes 0.0

    def boolean(self, name: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise self.error(name, "true or false", value)

    def choice(self, name: str, value: Any, choices: tuple[str, ...]) -> Any:
        if isinstance(value, str) and value.strip().lower() in choices:
            return value.strip().lower()
        raise self.error(name, f"one of {list(choices)}", value)

    def o_direct(self, value: Any) -> Literal["auto"] | bool:
        if isinstance(value, str) and value.strip().lower() == "auto":
            return "auto"
        try:
            return self.boolean("o_direct", value)
        except ValueError:
            raise self.error("o_direct", "'auto', true or false", value) from None

    def file_mode(self, value: Any) -> int:
        expected = (
            "permission bits as an int (0o640) or an octal string ('0640'), including owner "
            f"read and write ({oct(_FILE_MODE_REQUIRED)})"
        )
        if isinstance(value, bool):
            raise self.error("file_mode", expected, value)
        if isinstance(value, str):
            text = value.strip().lower().removeprefix("0o")
            try:
                value = int(text, 8)
            except ValueError:
                raise self.error("file_mode", expected, value) from None
        if not isinstance(value, int) or not 0 <= value <= FILE_MODE_BITS:
            # A decimal 640 from YAML/JSON lands here: it is 0o1200, not 0o640.
            raise self.error("file_mode", expected, value)
        if value & _FILE_MODE_REQUIRED != _FILE_MODE_REQUIRED:
            raise self.error("file_mode", expected, oct(value))
        return value


__all__ = ["IO_ENGINES", "FsTierOptions", "OptionParser", "StorageOptions"]

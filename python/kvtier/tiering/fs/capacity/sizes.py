"""Byte sizes: parsing ``max_bytes`` strings and the on-disk size of a block file."""

from __future__ import annotations

import re
from typing import Any

from kvtier import _core

# The block format's, as the native core defines it (docs/FORMAT.md).
BLOCK_HEADER_BYTES: int = _core.HEADER_SIZE
_ALIGN: int = _core.ALIGNMENT

# Decimal units (K, M, G, T, P, optionally followed by B) are powers of 1000, as disk vendors
# and `df -H` count; binary units (KiB, MiB, ...) are powers of 1024. Case does not matter.
_UNITS: dict[str, int] = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgtp", start=1):
    _UNITS[_letter] = _UNITS[_letter + "b"] = 1000**_i
    _UNITS[_letter + "i"] = _UNITS[_letter + "ib"] = 1024**_i
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
SIZE_SYNTAX = (
    'an integer number of bytes or a number with a unit: "500GiB", "2TB", "750M" '
    "(K/M/G/T/P[B] are powers of 1000, KiB/MiB/GiB/TiB/PiB powers of 1024)"
)


def parse_size(value: Any) -> int:
    """Bytes of ``value``: an int, or a string such as ``"500GiB"``, ``"2TB"``, ``"750M"``.

    Raises ValueError (saying what is accepted) for anything else, negative values included.
    """
    if isinstance(value, bool):
        raise ValueError(f"invalid size {value!r}: expected {SIZE_SYNTAX}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid size {value!r}: must not be negative")
        return value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        if match is not None and match.group(2).lower() in _UNITS:
            number, unit = match.groups()
            scale = _UNITS[unit.lower()]
            if "." in number:
                whole, frac = number.split(".")
                # Exact integer arithmetic: "1.5GiB" is 1610612736, not a float near it.
                return (int(whole + frac) * scale) // 10 ** len(frac)
            return int(number) * scale
    raise ValueError(f"invalid size {value!r}: expected {SIZE_SYNTAX}")


def format_size(n: int) -> str:
    """``n`` bytes for people, in binary units (``1.5 GiB``)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def block_file_bytes(payload_bytes: int) -> int:
    """Size of the file that holds a block of ``payload_bytes`` (header + padded payload)."""
    return BLOCK_HEADER_BYTES + -(-payload_bytes // _ALIGN) * _ALIGN


__all__ = ["SIZE_SYNTAX", "block_file_bytes", "format_size", "parse_size"]

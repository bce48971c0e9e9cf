"""Byte sizes: parsing ``max_bytes`` strings and the on-disk size of a block file."""

from __future__ import annotations

import re
from typing import Any

from kvtier import _core

# The block format's, as the native core defines it (docs/FORMAT.md).
BLOCK_HEADER_BYTES: int = _core.HEADER_SIZE
_ALIGN: int = _core.ALIGNMENT

# The one size grammar of every kvtier option and command (documented in docs/tiers.md,
# "Sizes"): a bare unit letter and the IEC units are powers of 1024, as block sizes ("256K")
# and `ls -h`, `dd` and fio count; a letter followed by B is SI, a power of 1000, as disk
# vendors and `df -H` count. Case does not matter.
_UNITS: dict[str, int] = {"": 1, "b": 1}
for _i, _letter in enumerate("kmgtp", start=1):
    _UNITS[_letter] = _UNITS[_letter + "i"] = _UNITS[_letter + "ib"] = 1024**_i
    _UNITS[_letter + "b"] = 1000**_i
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")
#: The grammar in a few words, for command-line help.
SIZE_UNITS_HELP = "K/M/G/T and KiB/MiB/GiB/TiB are powers of 1024, KB/MB/GB/TB powers of 1000"
SIZE_SYNTAX = (
    'an integer number of bytes or a number with a unit: "256K", "1.5GiB", "2TB" '
    "(K/M/G/T/P and KiB/MiB/GiB/TiB/PiB are powers of 1024, KB/MB/GB/TB/PB powers of 1000; "
    "see docs/tiers.md, Sizes)"
)


def parse_size(value: Any) -> int:
    """Bytes of ``value``: an int, or a string such as ``"256K"``, ``"1.5GiB"``, ``"2TB"``.

    Raises ValueError (saying what is accepted) for anything else: negative values, and
    fractions that are not a whole number of bytes.
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
            if "." not in number:
                return int(number) * scale
            # Exact integer arithmetic: "1.5GiB" is 1610612736, not a float near it.
            whole, frac = number.split(".")
            nbytes, rest = divmod(int(whole + frac) * scale, 10 ** len(frac))
            if rest == 0:
                return nbytes
            raise ValueError(f"invalid size {value!r}: not a whole number of bytes")
    raise ValueError(f"invalid size {value!r}: expected {SIZE_SYNTAX}")


def format_size(n: int) -> str:
    """``n`` bytes for people, in binary units: ``256 KiB``, ``1.5 GiB``. A whole number of
    the unit has no decimal; anything else has one, so 4 MiB + 1 byte reads ``4.0 MiB``. The
    formatter of every command, message and `kvtier bench` report."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            if unit == "B":
                return f"{int(value)} B"
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def block_file_bytes(payload_bytes: int) -> int:
    """Size of the file that holds a block of ``payload_bytes`` (header + padded payload)."""
    return BLOCK_HEADER_BYTES + -(-payload_bytes // _ALIGN) * _ALIGN


__all__ = ["SIZE_SYNTAX", "SIZE_UNITS_HELP", "block_file_bytes", "format_size", "parse_size"]

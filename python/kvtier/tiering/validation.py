"""The checks every tier and transfer applies to a job's arguments: job id, keys, block ids.

One implementation, so the fs tier and GPUStorageTransfer refuse the same mistakes with the
same words and types (:class:`~kvtier.errors.InvalidTypeError`, a TypeError, and
:class:`~kvtier.errors.InvalidArgumentError`, a ValueError), and refuse them at submit: a key
that is accepted but unusable later (an unhashable bytearray, an int silently turned into
bytes) would fail ``get_finished()`` or store a block under a key nobody asked for.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from kvtier import _core
from kvtier.errors import InvalidArgumentError, InvalidTypeError

_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_BYTES_LIKE = (bytes, bytearray, memoryview)


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def check_job_id(job_id: Any) -> int:
    """``job_id`` as an int; TypeError unless it is an integer, ValueError outside int64."""
    if isinstance(job_id, (bool, np.bool_)) or not isinstance(job_id, (int, np.integer)):
        raise InvalidTypeError(f"job_id must be an int, got {_show(job_id)}")
    if not _INT64_MIN <= int(job_id) <= _INT64_MAX:
        raise InvalidArgumentError(f"job_id {job_id} does not fit in 64 bits")
    return int(job_id)


def check_keys(job_id: int, keys: Iterable[Any]) -> tuple[bytes, ...]:
    """The keys as immutable ``bytes`` (a bytearray or memoryview key is copied).

    TypeError names the first key that is not bytes-like; ValueError the first that is empty
    or longer than the block format allows.
    """
    if isinstance(keys, (*_BYTES_LIKE, str)):
        raise InvalidTypeError(
            f"Job {job_id}: keys must be a sequence of keys, got one {_show(keys)}"
        )
    keys = tuple(keys)
    # The common case costs a few C-level passes: this runs on the caller's thread per job.
    if set(map(type, keys)) <= {bytes}:
        lengths = set(map(len, keys))
        if not lengths or (min(lengths) > 0 and max(lengths) <= _core.MAX_KEY_SIZE):
            return keys
    out = []
    for i, key in enumerate(keys):
        if type(key) is not bytes:
            if not isinstance(key, _BYTES_LIKE):
                raise InvalidTypeError(
                    f"Job {job_id}: keys[{i}] must be bytes (or a bytearray / memoryview of "
                    f"them), got {_show(key)}"
                )
            key = bytes(key)
        if not key or len(key) > _core.MAX_KEY_SIZE:
            raise InvalidArgumentError(
                f"Job {job_id}: keys[{i}] is {len(key)} bytes long; a key has 1 to "
                f"{_core.MAX_KEY_SIZE} bytes"
            )
        out.append(key)
    return tuple(out)


def _not_integer(job_id: int, index: int, value: Any) -> InvalidTypeError:
    return InvalidTypeError(
        f"Job {job_id}: block_ids[{index}] must be an integer, got {_show(value)}"
    )


def check_block_ids(job_id: int, block_ids: Any, num_keys: int, num_blocks: int) -> list[int]:
    """The block ids as Python ints, one per key, each in ``[0, num_blocks)``.

    ``block_ids`` is an integer ``np.ndarray`` (any shape, read in C order) or a sequence of
    ints. TypeError names the first id that is not an integer (floats, bools and strings are
    never rounded or converted); ValueError a count that differs from the keys' or an id out
    of range.
    """
    if isinstance(block_ids, np.ndarray):
        flat = block_ids.reshape(-1)
        values = flat.tolist()  # Python ints for an integer dtype
        if flat.dtype.kind not in "iu":
            for i, b in enumerate(values):
                if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
                    raise _not_integer(job_id, i, b)
            values = [int(b) for b in values]  # an object array may hold numpy scalars
    else:
        values = list(block_ids)
        if not all(type(b) is int for b in values):
            for i, b in enumerate(values):
                if isinstance(b, (bool, np.bool_)) or not isinstance(b, (int, np.integer)):
                    raise _not_integer(job_id, i, b)
            values = [int(b) for b in values]
    if len(values) != num_keys:
        raise InvalidArgumentError(f"Job {job_id}: {num_keys} keys but {len(values)} block_ids")
    if values and (min(values) < 0 or max(values) >= num_blocks):
        i, b = next((i, b) for i, b in enumerate(values) if not 0 <= b < num_blocks)
        raise InvalidArgumentError(
            f"Job {job_id}: block_ids[{i}] = {b} is out of range [0, {num_blocks})"
        )
    return values


__all__ = ["check_block_ids", "check_job_id", "check_keys"]

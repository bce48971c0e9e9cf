"""Where each KV block lives in a list of per-layer tensors.

A block's payload is, for each tensor in order, the C-order bytes of
``tensor.select(block_dim, b)`` — the bytes a CPU primary row holds for the block. A slice
that is not contiguous (e.g. a ``[2, num_blocks, ...]`` tensor with ``block_dim=1``) is a few
contiguous *runs*; only an innermost dimension that is not contiguous cannot be expressed.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.errors import InvalidArgumentError


@dataclass(frozen=True)
class TensorRuns:
    """One tensor's share of every block: block b starts at ``address + b * block_stride``."""

    address: int
    block_stride: int  # bytes
    num_blocks: int
    runs: tuple[tuple[int, int], ...]  # (offset, length) in bytes, relative to the block start
    is_device: bool

    @property
    def bytes_per_block(self) -> int:
        return sum(length for _, length in self.runs)


def tensor_runs(tensor: Any, block_dim: int, index: int) -> TensorRuns:
    """Describe ``tensor`` (a torch.Tensor) as per-block runs; raises InvalidArgumentError
    (a ValueError) if it cannot be."""
    where = f"kv_caches[{index}]"
    ndim = tensor.dim()
    if ndim == 0:
        raise InvalidArgumentError(f"{where} is a scalar; it needs a dimension that indexes blocks")
    if not -ndim <= block_dim < ndim:
        raise InvalidArgumentError(
            f"block_dim {block_dim} is out of range for {where} of shape {tuple(tensor.shape)}"
        )
    block_dim %= ndim
    shape = list(tensor.shape)
    strides = list(tensor.stride())
    if any(s < 0 for s in strides):
        raise InvalidArgumentError(f"{where} has negative strides; make it contiguous first")
    if any(s == 0 and n > 1 for n, s in zip(shape, strides)):
        # An expanded tensor: a load would write several blocks (or bytes) into one place.
        raise InvalidArgumentError(
            f"{where} has a dimension of stride 0 (shape {tuple(tensor.shape)}, strides "
            f"{tuple(tensor.stride())}): its elements share memory; make it contiguous first"
        )
    itemsize = tensor.element_size()
    num_blocks = shape.pop(block_dim)
    block_stride = strides.pop(block_dim) * itemsize
    if num_blocks == 0 or math.prod(shape) == 0:
        raise InvalidArgumentError(f"{where} of shape {tuple(tensor.shape)} holds no block bytes")

    # Fold the contiguous innermost dimensions into one run; dimensions of size 1 never break
    # contiguity whatever their stride.
    run_elems, k = 1, len(shape)
    while k > 0 and (shape[k - 1] == 1 or strides[k - 1] == run_elems):
        run_elems *= shape[k - 1]
        k -= 1
    if k == len(shape) and shape:
        raise InvalidArgumentError(
            f"{where}: the innermost dimension of a block slice is not contiguous "
            f"(shape {tuple(tensor.shape)}, strides {tuple(tensor.stride())}, "
            f"block_dim {block_dim}); make the tensor contiguous or choose another block_dim"
        )
    outer = [(n, s) for n, s in zip(shape[:k], strides[:k]) if n > 1]
    offsets = [
        sum(i * s for i, (_, s) in zip(idx, outer)) * itemsize
        for idx in itertools.product(*(range(n) for n, _ in outer))
    ]
    runs = tuple((off, run_elems * itemsize) for off in offsets)
    return TensorRuns(
        address=tensor.data_ptr(),
        block_stride=block_stride,
        num_blocks=num_blocks,
        runs=runs,
        is_device=bool(tensor.is_cuda),
    )


def describe_kv_caches(kv_caches: Sequence[Any], block_dim: int) -> list[TensorRuns]:
    """Runs of every tensor; all must hold the same number of blocks."""
    if len(kv_caches) == 0:
        raise InvalidArgumentError("kv_caches is empty: pass the list of per-layer KV tensors")
    described = [tensor_runs(t, block_dim, i) for i, t in enumerate(kv_caches)]
    counts = {d.num_blocks for d in described}
    if len(counts) != 1:
        raise InvalidArgumentError(
            f"kv_caches disagree on the number of blocks along block_dim: {sorted(counts)}"
        )
    return described

#!/usr/bin/env python3
"""CRC32C throughput of kvtier's checksum (the cost every stored and loaded byte pays).

    python bench/crc32c_speed.py [--size 256M] [--repeat 7]

Prints the median GiB/s over `--repeat` passes over one buffer far larger than the CPU caches
(so memory bandwidth counts, as it does for real blocks), and whether the CPU's crc32
instruction is used.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from kvtier import _core


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=256 << 20, help="bytes per pass")
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    data = np.random.default_rng(0).integers(0, 256, args.size, dtype=np.uint8)
    rates = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        _core.crc32c(data)
        rates.append(args.size / (time.perf_counter() - start) / 2**30)
    print(
        f"crc32c: {statistics.median(rates):.2f} GiB/s median of {args.repeat} passes over "
        f"{args.size >> 20} MiB (hardware instruction: {_core.crc32c_is_hardware()})"
    )


if __name__ == "__main__":
    main()

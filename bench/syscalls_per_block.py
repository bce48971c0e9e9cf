"""System calls per block store and per block load, counted with `strace -f -c`.

    python bench/syscalls_per_block.py [--io-engine psync] [--root /dev/shm] [--blocks 1000]
                                       [--size 256K] [--layout contiguous|segments]

Runs a child process under `strace -f -c` three times: one that only creates the block
directories (a small block in each of 251, a one-off cost), one that then stores `--blocks`
new blocks of `--size` bytes through `kvtier._core.Engine` (one load-first and one
store-first worker), and one that also loads them all back. The differences per block are
what one store and one load cost in steady state. `futex` (worker wake-ups, which depend
on timing, not on the block path) is listed apart. `--layout segments` describes each row
as 16 host segments through a BlockLayout, the path the SGLang backend and GPU transfers
over host memory take.
Needs strace (Debian: apt-get install strace). Never part of the test run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from kvtier.tiering.fs.capacity.sizes import parse_size

CHILD = textwrap.dedent(
    """
    import mmap, sys
    from kvtier import _core
    root, io_engine, n, size, phase, layout = sys.argv[1:7]
    n, size = int(n), int(size)
    rows = mmap.mmap(-1, max(1, n) * size)
    base = _core.buffer_address(rows, True)
    e = _core.Engine(root, n_read_threads=1, n_write_threads=1, io_engine=io_engine,
                     o_direct=False)
    paths = [f"{root}/{i % 251:02x}/{i:08d}.kvb" for i in range(n)]
    keys = [i.to_bytes(8, "big") for i in range(n)]
    runs = 16
    regions = [(base + r * (size // runs), size, max(1, n), [(0, size // runs)], False)
               for r in range(runs)]
    def run(direction, job):
        if layout == "segments":
            e.submit_blocks(job, direction, paths, keys, list(range(n)),
                            _core.BlockLayout(regions))
        elif direction == _core.Direction.STORE:
            e.submit_store(job, [(p, k, base + i * size, size)
                                 for i, (p, k) in enumerate(zip(paths, keys))])
        else:
            e.submit_load(job, [(p, k, base + i * size, size)
                                for i, (p, k) in enumerate(zip(paths, keys))])
        e.drain()
        (c,) = e.pop_completions()
        assert c.success, c.error
    # Every directory exists before the measured blocks: their creation is a one-off cost.
    warm = [(f"{root}/{d:02x}/warm.kvb", b"w", base, min(size, 4096)) for d in range(251)]
    e.submit_store(0, warm)
    e.drain()
    assert all(c.success for c in e.pop_completions())
    if phase in ("store", "load"):
        run(_core.Direction.STORE, 1)
    if phase == "load":
        run(_core.Direction.LOAD, 2)
    e.shutdown()
    """
)


def count(root: Path, args: argparse.Namespace, n: int, phase: str) -> dict[str, int]:
    """Calls per system call name for one child run."""
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    done = subprocess.run(
        ["strace", "-f", "-c", "-U", "name,calls", "-o", "/dev/stdout", sys.executable]
        + ["-c", CHILD, str(root), args.io_engine, str(n), str(args.size), phase, args.layout],
        check=False,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:  # e.g. an io_engine this build or kernel does not have
        raise SystemExit(f"syscalls_per_block: the measured child failed:\n{done.stderr[-2000:]}")
    calls: dict[str, int] = {}
    for line in done.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit() and not parts[0].startswith("-"):
            calls[parts[0]] = int(parts[1])
    calls.pop("total", None)
    return calls


def difference(more: dict[str, int], less: dict[str, int], blocks: int) -> dict[str, float]:
    """Calls per block of the work `more` did beyond `less` (rounding noise dropped)."""
    names = sorted(set(more) | set(less))
    per = {name: (more.get(name, 0) - less.get(name, 0)) / blocks for name in names}
    return {name: v for name, v in per.items() if abs(v) >= 0.05}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--io-engine", default="psync", choices=["psync", "io_uring", "auto"])
    parser.add_argument("--root", default="/dev/shm", help="file system to measure on")
    parser.add_argument("--blocks", type=int, default=1000)
    parser.add_argument("--size", type=parse_size, default=parse_size("256K"))
    parser.add_argument("--layout", default="contiguous", choices=["contiguous", "segments"])
    args = parser.parse_args()
    if shutil.which("strace") is None:
        print("strace is not installed (apt-get install strace)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvtier-syscalls-", dir=args.root) as scratch:
        root = Path(scratch) / "root"
        base = count(root, args, args.blocks, "base")
        stored = count(root, args, args.blocks, "store")
        loaded = count(root, args, args.blocks, "load")
    stores, loads = difference(stored, base, args.blocks), difference(loaded, stored, args.blocks)
    size = f"{args.size >> 10} KiB" if args.size % 1024 == 0 else f"{args.size} B"
    print(
        f"io_engine={args.io_engine} layout={args.layout} {args.blocks} blocks of {size} "
        f"on {args.root} ({os.uname().release})"
    )
    for label, calls in (("store", stores), ("load", loads)):
        futex = calls.pop("futex", 0.0)
        total = sum(calls.values())
        detail = ", ".join(f"{name} {v:.2f}" for name, v in calls.items())
        print(f"{label}: {total:.2f} system calls per block (+ futex {futex:.2f}): {detail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What one `kvtier bench` run measures: sizes, volumes, threads, phases."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kvtier.bench.errors import BenchError
from kvtier.bench.primary import DEFAULT_PRIMARY_LAYOUT
from kvtier.tiering.fs.capacity import sizes

KiB = 1 << 10
MiB = 1 << 20
GiB = 1 << 30

#: Block files are read and written with O_DIRECT, which needs 4096-byte multiples.
BLOCK_ALIGNMENT = 4096

DEFAULT_SIZES = (256 * KiB, 2 * MiB)
#: Bytes per block size over all runs: what sets a run's duration.
DEFAULT_TOTAL = 1 * GiB
#: Runs per block size: enough for a median and a min-max spread from one invocation.
DEFAULT_REPEAT = 5
#: A figure whose runs differ by more than this factor (max/min) is flagged as too noisy to
#: trust: the middle run could be off by a fifth or more either way.
NOISY_RATIO = 1.5
#: A workload needs room for the latency hot set (4-block jobs) and a store flood.
MIN_BLOCKS = 8
#: The fs tier's options that `kvtier bench` takes as flags of the same name (``--io-timeout-s``)
#: and BenchConfig fields; None there leaves the tier's default.
TIER_OPTION_FLAGS = ("io_timeout_s", "max_stores_in_flight_while_loading")


def parse_size(text: str) -> int:
    """Bytes of a positive size in kvtier's one size grammar (``256K``, ``2MiB``, ``1G``;
    docs/tiers.md, "Sizes"); BenchError otherwise."""
    try:
        value = sizes.parse_size(text)
    except ValueError as exc:
        raise BenchError(str(exc)) from None
    if value <= 0:
        raise BenchError(f"invalid size {text!r}: must be positive")
    return value


def parse_block_sizes(text: str) -> tuple[int, ...]:
    """Parse a comma-separated list of block sizes (``256K,2M``); each a multiple of 4096."""
    parts = [p for p in (s.strip() for s in text.split(",")) if p]
    if not parts:
        raise BenchError(f"invalid block sizes {text!r}: expected e.g. 256K,2M")
    sizes: list[int] = []
    for part in parts:
        size = parse_size(part)
        if size % BLOCK_ALIGNMENT:
            raise BenchError(
                f"invalid block size {part!r} ({size} bytes): must be a multiple of "
                f"{BLOCK_ALIGNMENT} bytes so blocks can be read and written with O_DIRECT"
            )
        if size not in sizes:
            sizes.append(size)
    return tuple(sizes)


@dataclass(frozen=True)
class BenchConfig:
    """One run of `kvtier bench`.

    ``total_bytes`` (None: the default), ``latency_samples`` and ``loop_seconds`` are budgets
    per block size, split evenly over the ``repeat`` runs. ``create_root``: create a missing
    root instead of refusing it.
    """

    root: Path | None = None
    create_root: bool = False
    block_sizes: tuple[int, ...] = DEFAULT_SIZES
    total_bytes: int | None = None
    read_threads: int = 16
    write_threads: int = 16
    blocks_per_job: int = 8
    repeat: int = DEFAULT_REPEAT
    latency_samples: int = 100
    loop_seconds: float = 1.0
    peers: tuple[str, ...] = ()
    #: The fs tier's io_engine; with compare_io_engines, psync and io_uring run side by side.
    io_engine: str = "auto"
    compare_io_engines: bool = False
    checksum: str = "crc32c"
    #: The fs tier's io_timeout_s (`--io-timeout-s`); None: the tier's default.
    io_timeout_s: float | None = None
    #: The fs tier's max_stores_in_flight_while_loading; None: the tier's default.
    max_stores_in_flight_while_loading: int | None = None
    #: The physical layout of the primary memory (`--primary`, kvtier.bench.primary).
    primary: str = DEFAULT_PRIMARY_LAYOUT
    run_fio: bool = True
    #: The fio ceilings (kvtier.bench.ceiling.Ceiling, --ceilings); None: the default set.
    ceilings: tuple | None = None
    json_path: Path | None = None
    plot_path: Path | None = None
    progress: bool = True
    #: `--max-bytes`: also measure a full cache of this budget (kvtier.bench.capacity).
    max_bytes: int | None = None

    @property
    def threads(self) -> int:
        """Workers one direction can keep busy (every worker falls back to the other queue)."""
        return self.read_threads + self.write_threads

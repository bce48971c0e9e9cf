"""One size grammar for every size kvtier accepts (issue 18, item 13; docs/tiers.md, "Sizes"):
bench's --total and --sizes, bench's and gc's --max-bytes, and the tiers' max_bytes option."""

from __future__ import annotations

import argparse

import pytest
from kvtier.bench.config import parse_size as bench_size
from kvtier.bench.errors import BenchError
from kvtier.cli import _build_parser
from kvtier.gpu.options import GPUTransferOptions
from kvtier.tiering.fs.capacity.sizes import format_size, parse_size
from kvtier.tiering.fs.options import FsTierOptions

GRAMMAR = [
    ("4096", 4096),
    ("256K", 256 << 10),
    ("256k", 256 << 10),
    ("256KiB", 256 << 10),
    ("2M", 2 << 20),
    ("1G", 1 << 30),
    ("1g", 1 << 30),
    ("1GiB", 1 << 30),
    ("1.5GiB", 3 << 29),
    ("2T", 2 << 40),
    ("1GB", 10**9),
    ("2TB", 2 * 10**12),
    ("750MB", 750 * 10**6),
    (" 8 KiB ", 8192),
]


def _parse(*argv: str) -> argparse.Namespace:
    parser, _ = _build_parser()
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(("text", "expected"), GRAMMAR)
def test_every_surface_reads_a_size_the_same_way(tmp_path, text: str, expected: int) -> None:
    assert parse_size(text) == expected
    assert bench_size(text) == expected
    bench = _parse("bench", "--root", str(tmp_path), "--total", text, "--max-bytes", text)
    assert bench.total == bench.max_bytes == expected
    assert _parse("gc", str(tmp_path), "--max-bytes", text).max_bytes == expected
    options = FsTierOptions.parse("fs", {"root_dir": str(tmp_path), "max_bytes": text})
    assert options.max_bytes == expected


def test_max_bytes_1g_and_total_1g_mean_the_same(tmp_path) -> None:
    args = _parse("bench", "--root", str(tmp_path), "--total", "1G", "--max-bytes", "1G")
    assert args.total == args.max_bytes == 1 << 30


def test_block_sizes_in_the_grammar_stay_o_direct_aligned(tmp_path) -> None:
    args = _parse("bench", "--root", str(tmp_path), "--sizes", "64K,2MiB,1M")
    assert args.sizes == (64 << 10, 2 << 20, 1 << 20)


@pytest.mark.parametrize("bad", ["", "K", "1.5", "0.1K", "12 apples", "-5", "1e9", "5 XB"])
def test_bad_sizes_are_refused_everywhere(tmp_path, bad: str) -> None:
    with pytest.raises(ValueError, match="invalid size"):
        parse_size(bad)
    with pytest.raises(BenchError, match="invalid size"):
        bench_size(bad)
    with pytest.raises(ValueError, match="max_bytes"):
        FsTierOptions.parse("fs", {"root_dir": str(tmp_path), "max_bytes": bad})


def test_a_fraction_of_a_byte_is_refused() -> None:
    with pytest.raises(ValueError, match="whole number of bytes"):
        parse_size("0.1K")


def test_staging_sizes_of_gpu_transfers_read_the_same_grammar(tmp_path) -> None:
    options = GPUTransferOptions.parse(
        {"root_dir": str(tmp_path), "staging_buffer_bytes": "2M", "staging_bytes_total": "64MiB"}
    )
    assert (options.staging_buffer_bytes, options.staging_bytes_total) == (2 << 20, 64 << 20)
    with pytest.raises(ValueError, match="staging_buffer_bytes"):
        GPUTransferOptions.parse({"root_dir": str(tmp_path), "staging_buffer_bytes": "2MB"})


@pytest.mark.parametrize(
    ("n", "text"),
    [
        (0, "0 B"),
        (1023, "1023 B"),
        (1024, "1 KiB"),
        (256 << 10, "256 KiB"),
        ((4 << 20) + 1, "4.0 MiB"),  # not a whole MiB: a decimal says so
        ((2 << 20) + 4096, "2.0 MiB"),
        (3 << 29, "1.5 GiB"),
        (1 << 40, "1 TiB"),
        (1 << 50, "1024 TiB"),  # no unit above TiB
        (-1536, "-1.5 KiB"),
    ],
)
def test_sizes_are_written_the_same_way_everywhere(n: int, text: str) -> None:
    """One formatter (kvtier du and gc, refusals, kvtier bench): whole units without a
    decimal, anything else with one."""
    assert format_size(n) == text

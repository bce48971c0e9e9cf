"""`kvtier bench --max-bytes`: a full cache next to no budget, on a tiny real run.

The tests check that the section's figures are there and consistent (and its argument
errors), never how fast anything was: performance goes to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TIMEOUT_S = 300
CAPACITY_BENCH = Path(__file__).resolve().parents[2] / "bench" / "capacity_bench.py"
TINY = [
    "--sizes", "64K",
    "--total", "1M",
    "--repeat", "1",
    "--read-threads", "2",
    "--write-threads", "2",
    "--latency-samples", "5",
    "--loop-seconds", "0.05",
    "--no-fio",
]  # fmt: skip


def bench(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtier", "bench", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvtier bench: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("lots", "invalid size 'lots'"), ("0", "must be positive"), ("-1G", "invalid size")],
)
def test_bad_max_bytes_is_a_one_line_error(tmp_path: Path, value: str, fragment: str) -> None:
    proc = bench("--root", tmp_path, *TINY, f"--max-bytes={value}")
    assert_one_line_error(proc, fragment)
    assert list(tmp_path.iterdir()) == []


def test_max_bytes_the_root_cannot_hold_three_times_is_refused_before_measuring(
    tmp_path: Path,
) -> None:
    proc = bench("--root", tmp_path, *TINY, "--max-bytes", "1PiB")
    assert_one_line_error(proc, "--max-bytes 1024 TiB", "free")
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone again
    assert "Throughput" not in proc.stdout  # nothing was measured


def test_the_root_must_hold_three_budgets_for_the_unbudgeted_steady_run() -> None:
    """That run keeps the budget it stores before the timing and the 2 x max_bytes timed."""
    from types import SimpleNamespace

    from kvtier.bench.capacity import _SPACE_MARGIN, check_room
    from kvtier.bench.errors import BenchError
    from kvtier.tiering.fs.capacity.sizes import block_file_bytes

    row, budget = 64 << 10, 48 << 20
    config = SimpleNamespace(max_bytes=budget, block_sizes=(row,))
    files = 3 * budget // row * block_file_bytes(row)  # three budgets of block files
    check_room(config, files + _SPACE_MARGIN)
    with pytest.raises(BenchError, match="three times the budget"):
        check_room(config, files + _SPACE_MARGIN - (1 << 20))


def test_the_unbudgeted_steady_run_stores_its_warm_up_before_the_timing(tmp_path: Path) -> None:
    """store_run without a budget stores ``before`` bytes untimed and keeps them: the timed
    figures count only the new blocks, and the root holds both."""
    from kvtier.bench.capacity import store_run
    from kvtier.tiering.fs.capacity.sizes import block_file_bytes

    before = 8 * block_file_bytes(64 << 10)  # eight block files, headers included
    out = store_run(tmp_path, 64 << 10, 1 << 20, None, 10**6, threads=(1, 1), before=before)
    assert out["refused_jobs"] == 0
    assert out["stored_blocks"] == 16  # 1 MiB of 64 KiB blocks: the timed part only
    assert sum(1 for _ in tmp_path.rglob("*.kvb")) == 16 + 8


def test_max_bytes_adds_a_capacity_section(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "out.json"
    proc = bench("--root", root, *TINY, "--max-bytes", "4MiB", "--json", out)
    assert proc.returncode == 0, proc.stderr
    capacity = json.loads(out.read_text())["capacity"]
    assert capacity["max_bytes"] == 4 << 20
    assert capacity["stored_bytes_per_run"] == 8 << 20
    # The tiers ran with the bench's defaults, as its throughput tiers do.
    tier = capacity["tier"]
    assert (tier["checksum"], tier["primary"]) == ("crc32c", "scattered"), tier
    assert tier["io_engine"] in ("psync", "io_uring"), tier
    (entry,) = capacity["steady"].values()
    assert entry["block_size"] == 64 << 10
    assert entry["store_gbps_no_budget"] > 0 and entry["store_gbps_full_cache"] > 0
    full = entry["runs"]["full_cache"][0]
    assert entry["ratio"] == pytest.approx(full["gbps"] / entry["runs"]["no_budget"][0]["gbps"])
    # Every store made room: the budgeted run evicted about what it stored beyond the
    # budget, and its eviction work was measured.
    assert full["evicted_bytes"] >= 4 << 20
    assert full["used_bytes"] <= 4 << 20
    assert entry["eviction_cpu_s_per_gib"] > 0
    assert entry["runs"]["no_budget"][0]["evicted_bytes"] == 0
    # submit_store latency: jobs of --blocks-per-job 8 blocks of the smallest size, as many
    # as fill max_bytes (4 MiB // (8 x 68 KiB) = 7), with a full budget against none.
    submit = capacity["submit"]
    assert (submit["block_size"], submit["blocks_per_job"], submit["submits_each"]) == (
        64 << 10,
        8,
        7,
    )
    assert submit["failed_jobs"] == {"budget": 0, "none": 0}
    # The cache was full: it evicted for the stores (all but what room was left under the
    # budget after the fill), and the run without a budget evicted nothing.
    assert submit["evicted_bytes"]["budget"] >= 7 * 8 * (64 << 10) // 2
    assert submit["evicted_bytes"]["none"] == 0
    assert 0 < submit["budget"]["p50_us"] <= submit["budget"]["p99_us"]
    assert 0 < submit["none"]["p50_us"] <= submit["none"]["p99_us"]
    assert submit["p99_ratio"] == round(submit["budget"]["p99_us"] / submit["none"]["p99_us"], 2)
    recency = capacity["recency"]
    assert recency["samples_each"] == 50
    assert recency["ratio"] == pytest.approx(
        recency["load_p50_us_recency_on"] / recency["load_p50_us_recency_off"]
    )
    assert "Capacity: a full cache (max_bytes 4 MiB" in proc.stdout
    assert "recency bookkeeping on one-block load p50" in proc.stdout
    assert "submit_store on the caller's thread, full cache / no budget: p99" in proc.stdout
    assert "submit_store p99 <= 1.2x" in proc.stdout
    assert "capacity: submit_store latency, full cache (run 1/1)" in proc.stderr
    assert "capacity:" in proc.stderr  # its steps are in the progress output
    assert list(root.iterdir()) == []

    again = bench("--from-json", out)
    assert again.returncode == 0, again.stderr
    section = proc.stdout[proc.stdout.index("Capacity:") :].split("\n\nResults")[0]
    assert section.strip() in again.stdout

    # A result saved before the submit latency and the tiers' settings were recorded still
    # renders, without them.
    saved = json.loads(out.read_text())
    del saved["capacity"]["submit"], saved["capacity"]["tier"]
    out.write_text(json.dumps(saved))
    older = bench("--from-json", out)
    assert older.returncode == 0, older.stderr
    assert "Capacity: a full cache" in older.stdout
    assert "submit_store" not in older.stdout
    assert "tiers: io_engine" not in older.stdout


def test_the_capacity_runs_honour_the_tier_options_and_memory_layout_asked_for(
    tmp_path: Path,
) -> None:
    """--checksum, --io-engine, --io-timeout-s, --max-stores-in-flight-while-loading and
    --primary apply to the capacity section's tiers too: each tier reports what it ran with."""
    out = tmp_path / "out.json"
    proc = bench(
        "--root", tmp_path, *TINY, "--max-bytes", "4MiB", "--json", out, "--checksum", "none",
        "--io-engine", "psync", "--io-timeout-s", "0", "--max-stores-in-flight-while-loading",
        "3", "--primary", "plain", "--quiet",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    tier = json.loads(out.read_text())["capacity"]["tier"]
    assert tier == {
        "io_engine": "psync",
        "checksum": "none",
        "io_timeout_s": 0,
        "max_stores_in_flight_while_loading": 3,
        "primary": "plain",
    }
    assert (
        "tiers: io_engine psync, checksum none, io_timeout_s 0, "
        "max_stores_in_flight_while_loading 3, primary memory plain"
    ) in proc.stdout


def test_max_bytes_below_two_store_jobs_of_the_largest_block_is_refused(tmp_path: Path) -> None:
    """A job larger than the whole budget would be refused every time it is offered: the
    capacity runs' 8-block jobs of 2 MiB need a budget of at least two of them."""
    sizes = ["--sizes", "64K,2M", "--total", "16M"]
    proc = bench("--root", tmp_path, *TINY[4:], *sizes, "--max-bytes", "24MiB")
    assert_one_line_error(proc, "--max-bytes 24 MiB is too small", "give at least 32.1 MiB")
    assert list(tmp_path.iterdir()) == []


def test_max_bytes_with_compare_io_engines_is_refused_before_measuring(tmp_path: Path) -> None:
    proc = bench("--root", tmp_path, *TINY, "--max-bytes", "4MiB", "--compare-io-engines")
    assert_one_line_error(proc, "--max-bytes measures one tier", "--compare-io-engines")
    assert list(tmp_path.iterdir()) == []
    assert "Throughput" not in proc.stdout


def test_capacity_bench_submit_times_each_call_in_both_runs_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """`capacity_bench.py submit` runs kvtier.bench.capacity.submit_cost, as `kvtier bench
    --max-bytes` does: every call of two pairs of runs timed, the budget's runs evicting."""
    proc = subprocess.run(
        [
            sys.executable, str(CAPACITY_BENCH), "submit", "--root", str(tmp_path),
            "--budget", "4MiB", "--jobs", "20", "--repeat", "2", "--inflight", "4",
            "--blocks-per-job", "2",
        ],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["submits_each"], out["blocks_per_job"], out["inflight_jobs"]) == (40, 2, 4)
    assert out["failed_jobs"] == {"budget": 0, "none": 0}
    assert out["evicted_bytes"]["budget"] > 0 and out["evicted_bytes"]["none"] == 0
    low, high = out["p99_ratio_spread"]
    assert 0 < low <= high
    assert list(tmp_path.iterdir()) == []


def test_a_steady_run_with_leaf_dirs_stores_beside_every_leaf_directory(tmp_path: Path) -> None:
    """`capacity_bench.py steady --leaf-dirs`: the run's namespace has its 65,536 leaf
    directories (docs/FORMAT.md) before the first store, as a cache that has run a while."""
    from kvtier.bench.capacity import store_run

    out = store_run(tmp_path, 64 << 10, 1 << 20, None, 1, threads=(1, 1), leaf_dirs=True)
    assert out["refused_jobs"] == 0
    ranks = list(tmp_path.glob("*/rank-*"))
    assert len(ranks) == 1
    leaves = [d for d in ranks[0].glob("*/*") if d.is_dir()]
    assert len(leaves) == 65536
    assert sum(1 for d in leaves for _ in d.glob("*.kvb")) == 16


def test_capacity_bench_steady_runs_the_tier_with_the_threads_asked_for(tmp_path: Path) -> None:
    """`capacity_bench.py steady --threads 1`: both runs of each pair use a tier of one read
    and one write thread (what leaves eviction a CPU of its own on a small machine)."""
    proc = subprocess.run(
        [sys.executable, str(CAPACITY_BENCH), "steady", "--root", str(tmp_path),
         "--budget", "32MiB", "--total", "8MiB", "--repeat", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["label"] for r in rows] == ["256 KiB", "2 MiB"]
    assert all(r["threads"] == [1, 1] and r["refused_jobs"] == [0] for r in rows)
    assert all(r["evicted_bytes_per_run"] > 0 for r in rows)  # the budgeted run was full
    assert list(tmp_path.iterdir()) == []


def _capacity_bench_script():
    import importlib.util

    spec = importlib.util.spec_from_file_location("capacity_bench_under_test", CAPACITY_BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_churn_steps_store_reuse_in_place_and_unlink_real_files(tmp_path: Path) -> None:
    """`capacity_bench.py churn`'s steps do what PERFORMANCE.md section 31 says: "store" makes
    new block files, "reuse" turns each into another block's file in place (same inode, the
    other block's bytes), "unlink" removes them; with O_DIRECT where kvtier's probe finds it."""
    from kvtier import _core

    bench = _capacity_bench_script()
    size = bench.block_file_bytes(64 << 10)
    stored_bytes, reused_bytes = bench.churn_bytes(size, 0), bench.churn_bytes(size, 1)
    assert stored_bytes != reused_bytes
    n = 6

    out = bench._churn_once(tmp_path, 64 << 10, n, steps=("store",))
    assert out["o_direct"] == (_core.probe_o_direct(str(tmp_path)) == "")
    assert set(out) == {"o_direct", "store_wall_s_per_gib", "store_cpu_s_per_gib"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{i}.kvb" for i in range(n))
    assert all(p.read_bytes() == stored_bytes for p in tmp_path.iterdir())
    inodes = {i: (tmp_path / f"{i}.kvb").stat().st_ino for i in range(n)}

    bench._churn_once(tmp_path, 64 << 10, n, steps=("reuse",))
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == sorted(f"{n + i}.kvb" for i in range(n))
    for i in range(n):
        reused = tmp_path / f"{n + i}.kvb"
        assert reused.stat().st_ino == inodes[i]  # the stored file itself, not a new one
        assert reused.read_bytes() == reused_bytes  # overwritten whole

    bench._churn_once(tmp_path, 64 << 10, n, steps=("unlink",))
    assert list(tmp_path.iterdir()) == []

    out = bench._churn_once(tmp_path, 64 << 10, n)
    assert list(tmp_path.iterdir()) == []
    assert all(out[f"{s}_wall_s_per_gib"] > 0 for s in ("store", "reuse", "unlink"))


def test_capacity_bench_churn_reports_each_step_and_the_bound_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """`capacity_bench.py churn`: per block size, the file system's seconds per GiB for each
    step, the bound an unlinking full cache can reach, the run's parameters, and nothing
    left under the root."""
    out = tmp_path / "churn.json"
    root = tmp_path / "root"
    root.mkdir()
    proc = subprocess.run(
        [sys.executable, str(CAPACITY_BENCH), "churn", "--root", str(root), "--files", "8",
         "--repeat", "1", "--pause", "0.01", "--json", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert (result["files"], result["repeat"], result["root"], result["pause_s"]) == (
        8,
        1,
        str(root),
        0.01,
    )
    for label in ("256 KiB", "2 MiB"):
        entry = result[label]
        for kind in ("wall", "cpu"):
            store, unlink = entry[f"store_{kind}_s_per_gib"], entry[f"unlink_{kind}_s_per_gib"]
            reuse = entry[f"reuse_{kind}_s_per_gib"]
            assert entry[f"unlink_bound_{kind}"] == pytest.approx(
                store / (store + unlink), abs=0.01
            )
            assert entry[f"store_over_reuse_{kind}"] == pytest.approx(store / reuse, rel=0.05)
        assert entry["unlink_wall_s_per_gib"] > 0 and entry["reuse_wall_s_per_gib"] > 0
    assert list(root.iterdir()) == []

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


def test_max_bytes_the_root_cannot_hold_twice_is_refused_before_measuring(
    tmp_path: Path,
) -> None:
    proc = bench("--root", tmp_path, *TINY, "--max-bytes", "1PiB")
    assert_one_line_error(proc, "--max-bytes 1048576 GiB", "free")
    assert list(tmp_path.iterdir()) == []  # the scratch directory is gone again
    assert "Throughput" not in proc.stdout  # nothing was measured


def test_max_bytes_adds_a_capacity_section(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "out.json"
    proc = bench("--root", root, *TINY, "--max-bytes", "4MiB", "--json", out)
    assert proc.returncode == 0, proc.stderr
    capacity = json.loads(out.read_text())["capacity"]
    assert capacity["max_bytes"] == 4 << 20
    assert capacity["stored_bytes_per_run"] == 8 << 20
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
    recency = capacity["recency"]
    assert recency["samples_each"] == 50
    assert recency["ratio"] == pytest.approx(
        recency["load_p50_us_recency_on"] / recency["load_p50_us_recency_off"]
    )
    assert "Capacity: a full cache (max_bytes 4 MiB" in proc.stdout
    assert "recency bookkeeping on one-block load p50" in proc.stdout
    assert "capacity:" in proc.stderr  # its steps are in the progress output
    assert list(root.iterdir()) == []

    again = bench("--from-json", out)
    assert again.returncode == 0, again.stderr
    section = proc.stdout[proc.stdout.index("Capacity:") :].split("\n\nResults")[0]
    assert section.strip() in again.stdout


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
    script = Path(__file__).resolve().parents[2] / "bench" / "capacity_bench.py"
    proc = subprocess.run(
        [sys.executable, str(script), "steady", "--root", str(tmp_path), "--budget", "32MiB",
         "--total", "8MiB", "--repeat", "1", "--threads", "1"],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["label"] for r in rows] == ["256 KiB", "2 MiB"]
    assert all(r["threads"] == [1, 1] and r["refused_jobs"] == [0] for r in rows)
    assert all(r["evicted_bytes_per_run"] > 0 for r in rows)  # the budgeted run was full
    assert list(tmp_path.iterdir()) == []


def test_capacity_bench_churn_measures_store_unlink_and_reuse_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """`capacity_bench.py churn`: per block size, the file system's seconds per GiB for each
    step, the bound an unlinking full cache can reach, and nothing left under the root."""
    script = Path(__file__).resolve().parents[2] / "bench" / "capacity_bench.py"
    out = tmp_path / "churn.json"
    root = tmp_path / "root"
    root.mkdir()
    proc = subprocess.run(
        [sys.executable, str(script), "churn", "--root", str(root), "--files", "8",
         "--repeat", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert list(result) == ["256 KiB", "2 MiB"]
    for entry in result.values():
        for step in ("store", "reuse", "unlink"):
            assert entry[f"{step}_wall_s_per_gib"] > 0
            assert entry[f"{step}_cpu_s_per_gib"] >= 0
        store, unlink = entry["store_wall_s_per_gib"], entry["unlink_wall_s_per_gib"]
        assert entry["unlink_bound_wall"] == pytest.approx(store / (store + unlink), abs=0.01)
        assert 0 < entry["unlink_bound_wall"] < 1
    assert list(root.iterdir()) == []

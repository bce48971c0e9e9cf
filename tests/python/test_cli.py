"""The `kvtier` command: `kvtier bench` on tiny workloads, `kvtier info`, argument errors.

The bench runs for real (real files under tmp_path, the real fs tier, fio when installed) on
a workload of a few MiB; the tests check that every figure is there and sane, never how fast
anything was.
"""

from __future__ import annotations

import io
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kvtier.bench.config import NOISY_RATIO, BenchConfig, GiB, MiB, parse_block_sizes, parse_size
from kvtier.bench.errors import BenchError
from kvtier.bench.progress import Progress
from kvtier.bench.runner import plan_total, summarize_runs

TIMEOUT_S = 300
SIZES = (64 * 1024, 128 * 1024)
#: A tiny workload without a run count (the default then applies) ...
TINY_ANY_RUNS = [
    "--sizes", "64K,128K",
    "--total", "2M",
    "--read-threads", "2",
    "--write-threads", "2",
    "--latency-samples", "5",
    "--loop-seconds", "0.05",
]  # fmt: skip
#: ... and with two runs: the fewest that have a spread.
TINY = [*TINY_ANY_RUNS, "--repeat", "2"]


def kvtier_cmd(*args: str | os.PathLike) -> list[str]:
    return [sys.executable, "-m", "kvtier", *map(str, args)]


def run(args: list[str], *, env: dict | None = None, cwd: Path | None = None):
    return subprocess.run(
        args, capture_output=True, text=True, timeout=TIMEOUT_S, env=env, cwd=cwd, check=False
    )


def scratch_dirs(root: Path) -> list[Path]:
    return sorted(root.glob("kvtier-bench-*"))


def _has_matplotlib() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


# -- one real tiny run, shared by the tests that read its output --------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict]:
    base = tmp_path_factory.mktemp("bench")
    root = base / "root"
    root.mkdir()
    out = base / "out.json"
    args = kvtier_cmd("bench", "--root", root, *TINY, "--json", out)
    png = base / "out.png"
    if _has_matplotlib():
        args += ["--plot", str(png)]
    proc = run(args)
    assert proc.returncode == 0, proc.stderr
    yield {
        "proc": proc,
        "root": root,
        "json": json.loads(out.read_text()),
        "json_path": out,
        "png": png if _has_matplotlib() else None,
    }


def test_bench_reports_every_throughput_figure(tiny_run: dict) -> None:
    results = tiny_run["json"]
    assert [e["block_size"] for e in results["sizes"]] == list(SIZES)
    for entry in results["sizes"]:
        assert entry["bytes"] == 2 * MiB  # --total: all runs together
        assert entry["bytes_per_run"] == MiB
        assert entry["blocks"] == MiB // entry["block_size"]
        assert list(entry["tiers"]) == ["kvtier"]
        tp = entry["tiers"]["kvtier"]["throughput"]
        for key in ("store_gbps", "load_gbps", "store_cpu_s_per_gib", "load_cpu_s_per_gib"):
            assert tp[key] > 0, key
        # Each direction twice: the first pass (a new root, a new tier) kept apart.
        for key in ("first_store_gbps", "first_load_gbps", "first_load_cpu_s_per_gib"):
            assert tp[key] > 0 and all(r[key] > 0 for r in tp["runs"]), key
        assert len(tp["runs"]) == 2  # --repeat 2: medians of two runs
        assert all(r["cache_bypass"] in ("O_DIRECT", "posix_fadvise(DONTNEED)") for r in tp["runs"])
    assert set(results["cache_bypass"]) == {"kvtier"}
    assert results["config"]["statistic"].startswith("median of 2 runs")
    lines = tiny_run["proc"].stdout.splitlines()
    header = next(line for line in lines if line.startswith("block / tier") and "1st" in line)
    assert header.split()[-6:] == ["1st", "store", "GB/s", "1st", "load", "GB/s"]


def test_bench_reports_interference_and_ordered_latency_percentiles(tiny_run: dict) -> None:
    for entry in tiny_run["json"]["sizes"]:
        tier = entry["tiers"]["kvtier"]
        it = tier["interference"]
        assert it["idle_iter_per_s"] > 0 and it["busy_iter_per_s"] > 0
        assert it["ratio"] == pytest.approx(statistics_median([r["ratio"] for r in it["runs"]]))
        lat = tier["latency"]
        assert lat["blocks_per_load"] == 4
        assert lat["idle"]["n"] == 2 * math.ceil(5 / 2)  # 5 samples shared out over 2 runs
        assert lat["flood"]["n"] >= 2  # at least one per run: the flood was really queued
        for phase in ("idle", "flood"):
            p = lat[phase]
            assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"], (phase, p)
            assert len(p["samples_ms"]) == p["n"]
        assert lat["p95_ratio"] > 0
        # The flood's store rate, loads running until it drained.
        for r in lat["runs"]:
            assert r["flood_bytes"] > 0 and r["flood_drain_s"] > 0
            gbps = r["flood_bytes"] / r["flood_drain_s"] / 1e9
            assert r["flood_store_gbps"] == pytest.approx(gbps)
        assert lat["flood_store_gbps"] == pytest.approx(
            statistics_median([r["flood_store_gbps"] for r in lat["runs"]])
        )


def statistics_median(values: list[float]) -> float:
    import statistics

    return statistics.median(values)


def test_bench_describes_the_machine(tiny_run: dict) -> None:
    machine = tiny_run["json"]["machine"]
    assert machine["logical_cpus"] >= 1
    assert machine["cpu_model"]
    assert machine["kernel"] == platform.release()
    assert machine["filesystem"]["type"]
    assert machine["filesystem"]["root"] == str(tiny_run["root"].resolve())
    assert isinstance(machine["crc32c_hardware"], bool)


def test_bench_ceiling_is_fio_with_the_exact_command_or_skipped(tiny_run: dict) -> None:
    results = tiny_run["json"]
    stdout = tiny_run["proc"].stdout
    if shutil.which("fio") is None:
        assert "fio" in results["fio"]["skipped"]
        assert "Ceiling: skipped" in stdout
        return
    for entry in results["sizes"]:
        fio = entry["fio"]
        assert fio["write_gbps"] > 0 and fio["read_gbps"] > 0
        for rw in ("write", "read"):
            cmd = fio[f"{rw}_command"]
            assert "--ioengine=psync" in cmd and f"--bs={entry['block_size']}" in cmd
            assert "--numjobs=4" in cmd and f"--rw={rw}" in cmd  # 2 + 2 threads
            assert cmd in stdout  # the exact command is printed
        tp = entry["tiers"]["kvtier"]["throughput"]
        assert tp["store_vs_fio"] == pytest.approx(tp["store_gbps"] / fio["write_gbps"])


def test_bench_prints_a_table_and_progress_without_a_tty(tiny_run: dict) -> None:
    proc = tiny_run["proc"]
    assert "Throughput" in proc.stdout and "64 KiB kvtier fs" in proc.stdout
    assert "Load latency" in proc.stdout and "Scheduler loop" in proc.stdout
    # stderr is a pipe here: plain progress lines, no carriage-return redraws.
    assert "kvtier bench: [1/" in proc.stderr
    assert "\r" not in proc.stderr
    assert "Traceback" not in proc.stderr


def test_bench_shows_the_spread_of_every_throughput_figure(tiny_run: dict) -> None:
    results, stdout = tiny_run["json"], tiny_run["proc"].stdout
    assert "median of 2 runs" in stdout
    for entry in results["sizes"]:
        tp = entry["tiers"]["kvtier"]["throughput"]
        for key in ("store_gbps", "load_gbps"):
            low, high = tp["spread"][key]
            values = [r[key] for r in tp["runs"]]
            assert (low, high) == (min(values), max(values))
            assert low <= tp[key] <= high
            assert (key in tp["noisy"]) == (high / low > NOISY_RATIO)
            assert f"{tp[key]:.2f} ({low:.2f}-{high:.2f})" in stdout
        ratio = entry["tiers"]["kvtier"]["interference"]["spread"]["ratio"]
        assert ratio[0] <= entry["tiers"]["kvtier"]["interference"]["ratio"] <= ratio[1]
        if "fio" in entry:
            assert entry["fio"]["spread"]["write_gbps"][0] <= entry["fio"]["write_gbps"]


def test_noisy_figures_are_flagged_with_the_threshold() -> None:
    steady = summarize_runs([{"x": 1.0}, {"x": 1.1}, {"x": 1.2}], ("x",))
    assert steady["x"] == 1.1 and steady["spread"]["x"] == [1.0, 1.2] and steady["noisy"] == []
    noisy = summarize_runs([{"x": 0.43}, {"x": 1.27}, {"x": 0.81}], ("x",))
    assert noisy["x"] == 0.81 and noisy["noisy"] == ["x"]
    assert summarize_runs([{"x": 5.0}], ("x",))["noisy"] == []  # one run: no spread to judge


def test_the_report_says_which_figures_are_too_noisy(tiny_run: dict, tmp_path: Path) -> None:
    results = json.loads(json.dumps(tiny_run["json"]))
    tp = results["sizes"][0]["tiers"]["kvtier"]["throughput"]
    tp["store_gbps"], tp["spread"]["store_gbps"], tp["noisy"] = 0.81, [0.43, 1.27], ["store_gbps"]
    for entry in results["sizes"]:  # nothing else noisy
        for stats in (entry["tiers"]["kvtier"]["interference"], entry.get("fio", {})):
            stats["noisy"] = []
        if entry is not results["sizes"][0]:
            entry["tiers"]["kvtier"]["throughput"]["noisy"] = []
    saved = tmp_path / "noisy.json"
    saved.write_text(json.dumps(results))
    proc = run(kvtier_cmd("bench", "--from-json", saved))
    assert proc.returncode == 0, proc.stderr
    assert "0.81 (0.43-1.27) !" in proc.stdout
    assert f"Too noisy to trust (marked !: the runs differ by more than {NOISY_RATIO:g}x" in (
        proc.stdout
    )
    noisy_lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("  64 KiB kvtier fs, ")]
    assert noisy_lines == ["  64 KiB kvtier fs, store GB/s: 0.81 (0.43-1.27)"]


def test_default_run_repeats_within_the_same_budget(tmp_path: Path) -> None:
    # No --repeat: several runs share the --total (the time budget) instead of one run.
    out = tmp_path / "out.json"
    root = tmp_path / "root"
    root.mkdir()
    proc = run(
        kvtier_cmd("bench", "--root", root, *TINY_ANY_RUNS, "--sizes", "64K", "--total", "5M",
                   "--no-fio", "--json", out, "--quiet")
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    repeat = results["config"]["repeat"]
    assert repeat >= 3  # enough for a median and a min-max spread
    assert results["config"]["bytes_per_block_size"] == 5 * MiB
    assert results["config"]["bytes_per_run"] == 5 * MiB // repeat
    tp = results["sizes"][0]["tiers"]["kvtier"]["throughput"]
    assert len(tp["runs"]) == repeat
    assert all(r["bytes"] == 5 * MiB // repeat for r in tp["runs"])


def test_bench_says_where_it_wrote_json_and_plot(tiny_run: dict) -> None:
    lines = tiny_run["proc"].stdout.splitlines()
    assert f"Results (JSON): {tiny_run['json_path'].resolve()}" in lines
    if tiny_run["png"] is not None:
        assert f"Plot: {tiny_run['png'].resolve()}" in lines


def test_bench_reports_the_share_of_the_ceiling(tiny_run: dict) -> None:
    stdout = tiny_run["proc"].stdout
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed: no ceiling to compare with")
    assert "Against the ceiling" in stdout
    for entry in tiny_run["json"]["sizes"]:
        tp, fio = entry["tiers"]["kvtier"]["throughput"], entry["fio"]
        share_rows = [
            ln
            for ln in stdout.split("Against the ceiling", 1)[1].splitlines()
            if ln.startswith(f"{entry['label']} kvtier fs ")  # not the targets' "fs: " rows
        ]
        assert len(share_rows) == 1
        assert f"{tp['store_gbps'] / fio['write_gbps'] * 100:.0f}%" in share_rows[0]
        assert f"{tp['load_gbps'] / fio['read_gbps'] * 100:.0f}%" in share_rows[0]


def _with_fio(results: dict, *, read_gbps: float, write_gbps: float) -> dict:
    """A copy of a result with a fio ceiling of the given speeds (and tiny spreads)."""
    results = json.loads(json.dumps(results))
    results["fio"] = {"found": "/usr/bin/fio", "direct": True}
    for entry in results["sizes"]:
        entry["fio"] = {
            "numjobs": 4,
            "size_per_job": 256 * 1024,
            "write_gbps": write_gbps,
            "read_gbps": read_gbps,
            "spread": {"write_gbps": [write_gbps, write_gbps], "read_gbps": [read_gbps] * 2},
            "noisy": [],
            "runs": [{}, {}],
            "write_command": "fio --rw=write",
            "read_command": "fio --rw=read",
        }
    return results


@pytest.mark.parametrize("direct", [True, False], ids=["O_DIRECT", "buffered"])
def test_loads_above_the_ceiling_are_explained(
    tiny_run: dict, tmp_path: Path, direct: bool
) -> None:
    results = _with_fio(tiny_run["json"], read_gbps=1e-6, write_gbps=1e6)  # loads way above
    results["fio"]["direct"] = direct
    saved = tmp_path / "above.json"
    saved.write_text(json.dumps(results))
    proc = run(kvtier_cmd("bench", "--from-json", saved))
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())  # the explanation is wrapped
    assert "Above 100% does not mean faster than the device" in text
    assert "4 jobs each stream one 256 KiB file" in text  # what fio really did
    assert "its slowest job's time" in text
    if direct:
        assert "Both bypass this machine's page cache (O_DIRECT)" in text
    else:
        assert "fio ran buffered (--direct=0)" in text and "posix_fadvise(DONTNEED)" in text


def test_no_explanation_when_every_figure_is_below_the_ceiling(
    tiny_run: dict, tmp_path: Path
) -> None:
    saved = tmp_path / "below.json"
    saved.write_text(json.dumps(_with_fio(tiny_run["json"], read_gbps=1e6, write_gbps=1e6)))
    proc = run(kvtier_cmd("bench", "--from-json", saved))
    assert proc.returncode == 0, proc.stderr
    assert "Against the ceiling" in proc.stdout and "0%" in proc.stdout
    assert "Above 100%" not in proc.stdout


def test_targets_are_judged_met_or_missed_with_the_measured_ratio(
    tiny_run: dict, tmp_path: Path
) -> None:
    results = _with_fio(tiny_run["json"], read_gbps=1e-6, write_gbps=1e6)
    entry = results["sizes"][0]
    entry["block_size"], entry["label"] = 256 * 1024, "256 KiB"  # a size with a target
    tier = entry["tiers"]["kvtier"]
    tier["latency"]["p95_ratio"], tier["interference"]["ratio"] = 5.0, 0.99
    saved = tmp_path / "targets.json"
    saved.write_text(json.dumps(results))
    proc = run(kvtier_cmd("bench", "--from-json", saved))
    assert proc.returncode == 0, proc.stderr
    section = proc.stdout.split("Against the targets", 1)[1]
    rows = {ln.split(": ", 1)[1].rsplit(None, 2)[0].strip(): ln.split()[-2:] for ln in
            section.splitlines() if ln.startswith("256 KiB kvtier fs: ")}  # fmt: skip
    store = tier["throughput"]["store_gbps"] / 1e6
    assert rows["store >= 0.8x fio psync"] == [f"{store:.2f}x", "missed"]
    assert rows["load >= 0.8x fio psync"][1] == "met"  # far above a 1e-6 GB/s "fio"
    assert rows["load p95 under flood <= 3x idle"] == ["5.0x", "missed"]
    assert rows["scheduler loop kept >= 95%"] == ["99%", "met"]
    # The CPU target is set for checksum none: shown, judged only when that ran.
    cpu = next(k for k in rows if k.startswith("store CPU/GiB"))
    assert rows[cpu][1] == "-"


def test_bench_says_which_io_engine_ran_and_why_auto_fell_back(tiny_run: dict) -> None:
    info = tiny_run["json"]["io_engines"]["kvtier"]
    assert info["requested"] == "auto" and tiny_run["json"]["config"]["io_engine"] == "auto"
    assert info["io_engine"] in ("psync", "io_uring")
    line = next(ln for ln in tiny_run["proc"].stdout.splitlines() if "io engine:" in ln)
    if info["io_engine"] == "psync":
        assert info["fallback_reason"] and f"auto fell back: {info['fallback_reason']}" in line
    else:
        assert info["fallback_reason"] == "" and "io_uring (chosen by auto)" in line


def test_every_fio_ceiling_is_shown_with_its_command(tiny_run: dict) -> None:
    if shutil.which("fio") is None:
        pytest.skip("fio is not installed: no ceilings")
    stdout = tiny_run["proc"].stdout
    skipped = tiny_run["json"]["fio"]["skipped_ceilings"]
    for entry in tiny_run["json"]["sizes"]:
        per_file = entry["fio_new_files"]
        blocks_per_job = per_file["size_per_job"] // entry["block_size"]
        write = per_file["write_command"]
        for option in ("--create_on_open=1", "--openfiles=1", f"--nrfiles={blocks_per_job}"):
            assert option in write
        assert f"{entry['label']} fio new file per block" in stdout
        assert f"fio new file per block: {write}" in stdout
        if "fio_io_uring" in skipped:  # fio or the kernel without io_uring: said so
            assert "fio io_uring (ceiling): skipped" in stdout
        else:
            assert "--ioengine=io_uring" in entry["fio_io_uring"]["write_command"]
            assert f"{entry['label']} fio io_uring (ceiling)" in stdout


def test_the_new_file_ceiling_really_creates_one_file_per_block(tmp_path: Path) -> None:
    from kvtier.bench.ceiling import CEILINGS, fio_command

    if shutil.which("fio") is None or shutil.which("strace") is None:
        pytest.skip("needs fio and strace")
    ceiling = next(c for c in CEILINGS if c.file_per_block)
    block, blocks = 64 * 1024, 6
    cmd = fio_command(
        tmp_path / "d",
        rw="write",
        block_size=block,
        numjobs=1,
        size=blocks * block,
        direct=False,
        ioengine=ceiling.ioengine,
        file_per_block=True,
    )
    (tmp_path / "d").mkdir()
    trace = tmp_path / "trace"
    proc = run(["strace", "-f", "-o", str(trace), "-e", "trace=openat,pwrite64,close", *cmd])
    assert proc.returncode == 0, proc.stderr
    calls = trace.read_text().splitlines()
    creates = [ln for ln in calls if "O_CREAT" in ln and str(tmp_path / "d") in ln]
    # A call strace splits ("<unfinished ...>", then "resumed") shows its arguments first.
    writes = [ln for ln in calls if re.search(rf"pwrite64\(.*, {block}, 0(\)| <unfinished)", ln)]
    assert len(creates) == blocks  # a new file per block, each written once at offset 0
    assert len(writes) == blocks
    assert sorted(p.stat().st_size for p in (tmp_path / "d").iterdir()) == [block] * blocks


def test_compare_io_engines_runs_both_side_by_side(tmp_path: Path) -> None:
    from kvtier.tiering.fs.engine import io_uring_refusal

    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "out.json"
    args = ["--sizes", "64K", "--compare-io-engines", "--no-fio", "--json", out]
    proc = run(kvtier_cmd("bench", "--root", root, *TINY, *args))
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    engines = results["io_engines"]
    assert list(engines) == ["kvtier-psync", "kvtier-io_uring"]
    assert engines["kvtier-psync"]["io_engine"] == "psync"
    assert "io_uring against psync" in proc.stdout
    table = proc.stdout.split("io_uring against psync", 1)[1]
    row = next(ln for ln in table.splitlines() if ln.startswith("64 KiB "))
    refusal = io_uring_refusal(tmp_path / "probe")
    if refusal:
        assert engines["kvtier-io_uring"]["unavailable"] == refusal
        assert list(results["sizes"][0]["tiers"]) == ["kvtier-psync"]
        assert "unavailable" in row
    else:
        assert engines["kvtier-io_uring"]["io_engine"] == "io_uring"
        assert list(results["sizes"][0]["tiers"]) == ["kvtier-psync", "kvtier-io_uring"]
        assert row.count("x") >= 3  # the ratios


def test_explicit_io_uring_that_is_refused_is_a_one_line_error(tmp_path: Path) -> None:
    from kvtier.tiering.fs.engine import io_uring_refusal

    refusal = io_uring_refusal(tmp_path / "probe")
    if not refusal:
        pytest.skip("io_uring works here")
    root = tmp_path / "root"
    root.mkdir()
    proc = run(kvtier_cmd("bench", "--root", root, *TINY, "--io-engine", "io_uring", "--no-fio"))
    assert_one_line_error(proc, "--io-engine io_uring", refusal, "--io-engine auto")
    assert scratch_dirs(root) == []


def test_bench_removes_its_scratch_directory(tiny_run: dict) -> None:
    assert scratch_dirs(tiny_run["root"]) == []
    assert list(tiny_run["root"].iterdir()) == []


def test_bench_plot_is_a_png(tiny_run: dict) -> None:
    if tiny_run["png"] is None:
        pytest.skip("matplotlib is not installed (optional extra kvtier[plot])")
    assert tiny_run["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_from_json_prints_the_table_of_a_saved_run(tiny_run: dict, tmp_path: Path) -> None:
    saved = tmp_path / "saved.json"
    saved.write_text(json.dumps(tiny_run["json"]))
    proc = run(kvtier_cmd("bench", "--from-json", saved, "--quiet"))
    assert proc.returncode == 0, proc.stderr
    # The same figures: the table printed now equals the one the run printed (which went on
    # to say where it wrote its JSON and plot).
    assert tiny_run["proc"].stdout.startswith(proc.stdout)
    rest = tiny_run["proc"].stdout[len(proc.stdout) :].split()
    assert rest[:2] == ["Results", "(JSON):"]


@pytest.mark.parametrize(
    "saved", sorted((Path(__file__).parents[2] / "docs" / "perf").glob("bench-*.json")),
    ids=lambda p: p.name,
)  # fmt: skip
def test_from_json_prints_results_saved_by_older_versions(saved: Path) -> None:
    proc = run(kvtier_cmd("bench", "--from-json", saved))
    assert proc.returncode == 0, proc.stderr
    assert "Throughput" in proc.stdout and "Load latency" in proc.stdout
    assert "Against the ceiling" in proc.stdout or "Ceiling: skipped" in proc.stdout


def test_from_json_of_something_else_is_a_one_line_error(tmp_path: Path) -> None:
    other = tmp_path / "other.json"
    other.write_text('{"not": "a result"}')
    assert_one_line_error(run(kvtier_cmd("bench", "--from-json", other)), "not a kvtier bench")
    assert_one_line_error(
        run(kvtier_cmd("bench", "--from-json", tmp_path / "missing.json")), "cannot read"
    )


# -- skips and peers ----------------------------------------------------------------------------


def test_peer_vllm_without_vllm_says_so_and_exits_cleanly(tmp_path: Path) -> None:
    # A `vllm` that cannot be imported, whatever is installed in this environment.
    fake = tmp_path / "fake"
    (fake / "vllm").mkdir(parents=True)
    (fake / "vllm" / "__init__.py").write_text("raise ImportError('No module named vllm')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "out.json"
    proc = run(
        kvtier_cmd("bench", "--root", tmp_path, *TINY, "--no-fio", "--peer", "vllm", "--json", out),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "vLLM is not importable" in proc.stderr and "skipping the vLLM peer" in proc.stderr
    assert "vLLM peer: skipped" in proc.stdout
    results = json.loads(out.read_text())
    assert "not importable" in results["peers"]["vllm"]["skipped"]
    assert all(list(e["tiers"]) == ["kvtier"] for e in results["sizes"])


def test_peer_sglang_without_sglang_says_so_and_exits_cleanly(tmp_path: Path) -> None:
    # An `sglang` that cannot be imported, whatever is installed in this environment.
    fake = tmp_path / "fake"
    (fake / "sglang").mkdir(parents=True)
    (fake / "sglang" / "__init__.py").write_text("raise ImportError('No module named sglang')\n")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "out.json"
    proc = run(
        kvtier_cmd(
            "bench", "--root", tmp_path, *TINY, "--no-fio", "--peer", "sglang", "--json", out
        ),
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "SGLang is not importable" in proc.stderr and "skipping the SGLang peer" in proc.stderr
    results = json.loads(out.read_text())
    assert "not importable" in results["sglang"]["skipped"]


def test_peer_vllm_runs_vllms_fs_tier_side_by_side(tmp_path: Path) -> None:
    pytest.importorskip("vllm.v1.kv_offload.tiering.fs.manager", reason="vLLM is not installed")
    out = tmp_path / "out.json"
    proc = run(
        kvtier_cmd("bench", "--root", tmp_path, *TINY, "--no-fio", "--peer", "vllm", "--json", out)
    )
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    peer = results["peers"]["vllm"]
    assert peer["available"] and peer["version"]
    assert peer["io_path"].startswith(("native", "pure Python"))  # which vLLM path ran
    assert peer["io_path"].split(" (")[0] in proc.stdout
    for entry in results["sizes"]:
        assert list(entry["tiers"]) == ["kvtier", "vllm"]
        vllm = entry["tiers"]["vllm"]
        assert vllm["throughput"]["store_gbps"] > 0 and vllm["throughput"]["load_gbps"] > 0
        assert vllm["throughput"]["store_cpu_s_per_gib"] > 0
        p = vllm["latency"]["flood"]
        assert 0 < p["p50_ms"] <= p["p95_ms"] <= p["p99_ms"]


def test_bench_without_fio_says_the_ceiling_was_skipped(tmp_path: Path) -> None:
    # fio is hidden through PATH (an empty directory); Python itself is started by its full
    # path, sys.executable, never through a link to it: a link elsewhere loses the virtual
    # environment (no pyvenv.cfg beside it) and with it the installed kvtier.
    no_tools = tmp_path / "empty-bin"
    no_tools.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "out.json"
    proc = run(
        kvtier_cmd("bench", "--root", root, *TINY, "--sizes", "64K", "--json", out),
        env={**os.environ, "PATH": str(no_tools)},
    )
    assert proc.returncode == 0, proc.stderr
    assert "Ceiling: skipped (fio is not installed" in proc.stdout
    # Said once, not again as a note or on stderr.
    assert (proc.stdout + proc.stderr).count("not installed") == 1, proc.stdout + proc.stderr
    results = json.loads(out.read_text())
    assert "not installed" in results["fio"]["skipped"]
    assert "fio" not in results["sizes"][0]


# -- errors -------------------------------------------------------------------------------------


def assert_one_line_error(proc: subprocess.CompletedProcess, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kvtier bench: error: "), lines[0]
    for fragment in fragments:
        assert fragment in lines[0]
    assert "Traceback" not in proc.stderr + proc.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--sizes", "3K"], "multiple of 4096"),
        (["--sizes", "256Q"], "invalid size '256Q'"),
        (["--sizes", ","], "invalid block sizes"),
        (["--total", "lots"], "invalid size 'lots'"),
        (["--total", "64K"], "too small"),
        (["--repeat", "0"], "at least 1"),
        (["--read-threads", "x"], "invalid count"),
        (["--loop-seconds", "-1"], "must be positive"),
        (["--peer", "bogus"], "invalid choice"),
        (["--io-engine", "libaio"], "invalid choice"),
        (["--io-engine", "psync", "--compare-io-engines"], "not allowed with"),
        (["--checksum", "md5"], "invalid choice"),
        (["--io-timeout-s", "-1"], "'io_timeout_s'"),
        (["--io-timeout-s", "soon"], "0: no deadline"),
        (["--max-stores-in-flight-while-loading", "0"], "'max_stores_in_flight_while_loading'"),
        (["--max-stores-in-flight-while-loading", "two"], "max_stores_in_flight_while_loading"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_arguments_are_one_line_errors(tmp_path: Path, args: list[str], fragment: str) -> None:
    proc = run(kvtier_cmd("bench", "--root", tmp_path, "--no-fio", *args))
    assert_one_line_error(proc, fragment)
    assert scratch_dirs(tmp_path) == []


def test_root_that_is_a_file_is_a_one_line_error(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = run(kvtier_cmd("bench", "--root", a_file, *TINY))
    assert_one_line_error(proc, str(a_file))


def test_json_into_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run(kvtier_cmd("bench", "--root", tmp_path, *TINY, "--json", tmp_path / "no" / "x.json"))
    assert_one_line_error(proc, "--json", "does not exist")
    assert scratch_dirs(tmp_path) == []  # refused before anything ran


def _mount_tmpfs(mnt: Path, options: str) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a read-only or size-limited tmpfs")
    if shutil.which("mount") is None:
        pytest.skip("needs mount/umount")
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs CAP_SYS_ADMIN): {proc.stderr.strip()}")


def _umount(mnt: Path) -> None:
    if subprocess.run(["umount", str(mnt)], capture_output=True, timeout=60).returncode:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, timeout=60)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "small"
    _mount_tmpfs(mnt, "size=4m,mode=0700")
    try:
        yield mnt
    finally:
        _umount(mnt)


@pytest.fixture
def read_only_tmpfs(tmp_path: Path) -> Iterator[Path]:
    mnt = tmp_path / "ro"
    _mount_tmpfs(mnt, "ro,size=1m")
    try:
        yield mnt
    finally:
        _umount(mnt)


@pytest.mark.root
def test_read_only_root_is_a_one_line_error(read_only_tmpfs: Path) -> None:
    proc = run(kvtier_cmd("bench", "--root", read_only_tmpfs, *TINY))
    assert_one_line_error(proc, "Read-only file system")


@pytest.mark.root
def test_too_little_free_space_is_a_one_line_error(small_tmpfs: Path) -> None:
    proc = run(kvtier_cmd("bench", "--root", small_tmpfs, *TINY, "--total", "8M"))
    assert_one_line_error(proc, "too little free space")
    assert scratch_dirs(small_tmpfs) == []


@pytest.mark.root
def test_full_root_is_a_one_line_error(small_tmpfs: Path) -> None:
    filler = small_tmpfs / "filler"
    with open(filler, "wb") as f:  # fill the file system to the last block
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    proc = run(kvtier_cmd("bench", "--root", small_tmpfs, *TINY))
    assert_one_line_error(proc)
    assert "No space left" in proc.stderr or "too little free space" in proc.stderr
    assert scratch_dirs(small_tmpfs) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_removes_the_scratch_directory(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen(
        kvtier_cmd("bench", "--root", tmp_path, *TINY, "--no-fio", "--loop-seconds", "30"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background commands with SIGINT ignored, and
        # the child would inherit that: give it the default, as a terminal's Ctrl-C finds.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # The first progress line: the run is measuring (scratch directory and tier exist);
        # the idle loop then runs for 30 s, so the interrupt lands in the middle of the run.
        assert proc.stderr is not None
        first = proc.stderr.readline()
        while first and not first.startswith("kvtier bench: [1/"):  # a message, e.g. a fallback
            first = proc.stderr.readline()
        assert first.startswith("kvtier bench: [1/"), first
        assert scratch_dirs(tmp_path), "no scratch directory while the bench runs"
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if sig == signal.SIGINT:
        # 130 is what `kvtier` returns; -SIGINT if the interpreter re-raised it at exit.
        assert proc.returncode in (130, -signal.SIGINT), stderr
        assert "interrupted" in stderr
    else:
        assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert scratch_dirs(tmp_path) == []


# -- info and entry points ----------------------------------------------------------------------


def test_info_reports_version_build_cuda_and_o_direct(tmp_path: Path) -> None:
    import kvtier
    from kvtier import _core

    proc = run(kvtier_cmd("info", tmp_path))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert any(
        line.startswith("kvtier ") and kvtier.__version__ in line for line in out.splitlines()
    )
    expected_crc = "hardware" if _core.crc32c_is_hardware() else "software"
    assert any(line.startswith("crc32c") and expected_crc in line for line in out.splitlines())
    cuda = [line for line in out.splitlines() if line.startswith("CUDA ")]
    assert len(cuda) == 1
    if hasattr(_core, "cuda_available") and _core.cuda_available():
        assert cuda[0].split(None, 1)[1] == "available"
    else:
        assert "not available" in cuda[0]
    probe = _core.probe_o_direct(str(tmp_path))
    o_direct = [line for line in out.splitlines() if line.startswith("O_DIRECT in")]
    assert len(o_direct) == 1 and str(tmp_path.resolve()) in o_direct[0]
    assert ("not supported" in o_direct[0]) == bool(probe)
    from kvtier.tiering.fs.engine import io_uring_refusal

    refusal = io_uring_refusal(tmp_path / "probe")
    uring = [line for line in out.splitlines() if line.startswith("io_uring (io_engine)")]
    assert len(uring) == 1
    assert uring[0].endswith(f"not usable, 'auto' uses psync: {refusal}" if refusal else "usable")


def test_version_prints_the_installed_packages_version() -> None:
    from importlib.metadata import version

    proc = run(kvtier_cmd("--version"))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kvtier {version('kvtier')}\n"
    # The installed console script says the same.
    script = shutil.which("kvtier", path=os.path.dirname(sys.executable))
    if script is not None:
        assert run([script, "--version"]).stdout == proc.stdout


def test_info_of_a_missing_directory_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run(kvtier_cmd("info", tmp_path / "missing"))
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith("kvtier info: error:")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_python_dash_m_kvtier_shows_help() -> None:
    proc = run(kvtier_cmd("--help"))
    assert proc.returncode == 0
    assert "bench" in proc.stdout and "info" in proc.stdout


def test_console_script_runs() -> None:
    script = shutil.which(
        "kvtier",
        path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    )
    if script is None:
        pytest.skip("the kvtier console script is not on PATH (package not installed)")
    proc = run([script, "info"])
    assert proc.returncode == 0, proc.stderr
    assert "O_DIRECT" in proc.stdout


def test_missing_subcommand_is_a_usage_error() -> None:
    proc = run(kvtier_cmd())
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].startswith("kvtier: error:")


# -- pure functions -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [("262144", 262144), ("256K", 256 << 10), ("256KiB", 256 << 10), ("2m", 2 << 20),
     ("1G", 1 << 30), (" 4k ", 4096)],
)  # fmt: skip
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "0", "-1K", "0.1K", "2X", "K"])
def test_parse_size_rejects(text: str) -> None:
    with pytest.raises(BenchError):
        parse_size(text)


def test_parse_block_sizes_keeps_order_and_drops_duplicates() -> None:
    assert parse_block_sizes("2M,256K,2097152") == (2 << 20, 256 << 10)
    with pytest.raises(BenchError, match="multiple of 4096"):
        parse_block_sizes("256K,1000")


def test_default_total_is_bounded_by_free_disk() -> None:
    config = BenchConfig(block_sizes=(256 << 10, 2 << 20), repeat=1)
    assert plan_total(config, free_bytes=100 * GiB, memory_bytes=64 * GiB) == GiB
    bounded = plan_total(config, free_bytes=600 * MiB, memory_bytes=64 * GiB)
    assert 16 * MiB <= bounded < GiB and bounded % (2 << 20) == 0
    with pytest.raises(BenchError, match="too little free space"):
        plan_total(config, free_bytes=32 * MiB, memory_bytes=64 * GiB)


def test_explicit_total_that_does_not_fit_is_refused() -> None:
    config = BenchConfig(block_sizes=(256 << 10,), total_bytes=GiB, repeat=1)
    with pytest.raises(BenchError, match="too little free space"):
        plan_total(config, free_bytes=512 * MiB, memory_bytes=64 * GiB)
    assert plan_total(config, free_bytes=100 * GiB, memory_bytes=64 * GiB) == GiB


def test_runs_share_the_total_so_disk_holds_one_runs_share() -> None:
    config = BenchConfig(block_sizes=(256 << 10, 2 << 20))
    assert config.repeat >= 3  # the default shows a spread
    # Default: 1 GiB per block size over all runs, each run a whole number of largest blocks.
    total = plan_total(config, free_bytes=100 * GiB, memory_bytes=64 * GiB)
    assert GiB - config.repeat * (2 << 20) < total <= GiB
    assert total % (config.repeat * (2 << 20)) == 0
    # 1 GiB does not fit in 512 MiB in one run, but a fifth of it does.
    split = BenchConfig(block_sizes=(256 << 10,), total_bytes=GiB, repeat=5)
    assert plan_total(split, free_bytes=512 * MiB, memory_bytes=64 * GiB) == GiB
    with pytest.raises(BenchError, match="too small for 5 run"):
        plan_total(BenchConfig(block_sizes=(2 << 20,), total_bytes=32 * MiB), 100 * GiB, None)


class Tty(io.StringIO):
    """A stream that says it is a terminal; writes from the ticker thread are serialized by
    Progress itself."""

    def isatty(self) -> bool:
        return True


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Poll until ``condition`` holds; a generous deadline, a hang guard (no timing check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_progress_redraws_on_a_tty_and_prints_lines_otherwise() -> None:

    tty, pipe = Tty(), io.StringIO()
    for stream in (tty, pipe):
        progress = Progress(2, stream=stream, tick_s=3600)  # no redraw from the ticker here
        progress.step("first")
        progress.advance()
        progress.message("a note")
        progress.step("second")
        progress.advance()
        progress.close()
    assert "\r[" in tty.getvalue() and "100%" in tty.getvalue()
    assert "\r" not in pipe.getvalue()
    lines = pipe.getvalue().splitlines()
    assert len(lines) == 3 and lines[1] == "kvtier bench: a note"
    assert "[1/2] first" in pipe.getvalue() and "[2/2] second" in pipe.getvalue()


def test_progress_line_moves_while_a_step_runs() -> None:
    tty = Tty()
    progress = Progress([1.0, 3.0], stream=tty, tick_s=0.01)
    try:
        progress.step("first")
        progress.advance()
        progress.step("a long step")
        # Nothing calls the progress now, as during a long measurement: the ticker redraws.
        wait_until(lambda: tty.getvalue().count("a long step") >= 3, "redraws during the step")
    finally:
        progress.close()
    redraws = [line for line in tty.getvalue().split("\r") if "a long step" in line]
    assert all("elapsed" in line and "left" in line for line in redraws), redraws
    assert "25%" in redraws[-1]  # the first step had a quarter of the weight
    assert all(t.name != "kvtier-bench-progress" for t in threading.enumerate())  # stopped


def test_progress_without_a_tty_says_a_long_step_is_still_running() -> None:
    pipe = io.StringIO()
    progress = Progress(2, stream=pipe, tick_s=0.01, heartbeat_s=0.05)
    try:
        progress.step("slow")
        wait_until(lambda: "still running" in pipe.getvalue(), "a heartbeat line")
    finally:
        progress.close()
    lines = pipe.getvalue().splitlines()
    assert lines[0].startswith("kvtier bench: [1/2] slow (")
    assert lines[1].startswith("kvtier bench: [1/2] still running after ")
    assert "\r" not in pipe.getvalue()


def test_progress_eta_counts_down_from_the_finished_steps() -> None:
    progress = Progress([1.0, 1.0, 2.0], enabled=False)
    assert progress.eta() is None  # nothing finished: nothing to estimate from
    progress.step("one")
    # The finished step must have taken some time, or the estimate has no rate: wait until
    # the clock Progress reads (time.monotonic) has moved past the step's start.
    started = time.monotonic()
    wait_until(lambda: time.monotonic() > started, "the monotonic clock to advance")
    progress.advance()
    now = time.monotonic()
    eta = progress.eta(now)
    assert eta is not None and eta >= 0
    # A step running far past its estimate: never negative, and the last step (twice the
    # weight of the first) is still ahead.
    late = progress.eta(now + 3600)
    assert late is not None and late > 0


def test_bench_progress_moves_on_a_terminal_during_a_step(tmp_path: Path) -> None:
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    # A wide terminal, so that the whole line (label included) fits.
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 250, 0, 0))
    # One run whose idle loop lasts 3 s: the scheduler-loop step runs long enough to be redrawn.
    proc = subprocess.Popen(
        kvtier_cmd("bench", "--root", tmp_path, *TINY_ANY_RUNS, "--sizes", "64K", "--no-fio",
                   "--repeat", "1", "--loop-seconds", "6"),
        stdout=subprocess.PIPE, stderr=slave, text=True,
    )  # fmt: skip
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:  # EIO: the child closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        stdout, _ = proc.communicate(timeout=TIMEOUT_S)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    screen = b"".join(chunks).decode(errors="replace")
    redraws = [r for r in screen.split("\r") if "scheduler loop" in r]
    # The same step, drawn again and again with the time it has run so far.
    step_times = {r.split("(this step ", 1)[1].split(")")[0] for r in redraws}
    assert len(step_times) >= 2, redraws
    assert all("elapsed" in r and "left" in r for r in redraws), redraws
    assert "Throughput" in stdout


# -- --root and thread-count errors -------------------------------------------------------------


def assert_no_internals(proc: subprocess.CompletedProcess) -> None:
    text = proc.stderr + proc.stdout
    assert "kvtier-bench-" not in text  # the scratch directory is not the user's business
    assert "cannot create the kvtier fs tier" not in text


def test_missing_root_is_refused_and_not_created(tmp_path: Path) -> None:
    typo = tmp_path / "mnt" / "nvme1"
    proc = run(kvtier_cmd("bench", "--root", typo, *TINY, "--no-fio"))
    assert_one_line_error(proc, f"--root {typo} does not exist", "--create-root")
    assert_no_internals(proc)
    assert not (tmp_path / "mnt").exists()


def test_create_root_creates_a_missing_root(tmp_path: Path) -> None:
    new = tmp_path / "new" / "root"
    out = tmp_path / "out.json"
    proc = run(
        kvtier_cmd("bench", "--root", new, "--create-root", *TINY, "--sizes", "64K", "--no-fio",
                   "--json", out, "--quiet")
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert json.loads(out.read_text())["config"]["root"] == str(new.resolve())
    assert new.is_dir() and list(new.iterdir()) == []  # created, and the scratch dir removed


def test_dangling_symlink_root_is_a_one_line_error(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "gone")
    proc = run(kvtier_cmd("bench", "--root", link, "--create-root", *TINY, "--no-fio"))
    assert_one_line_error(proc, f"--root {link}", "symbolic link")
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("root", ["/proc", "/proc/self", "/sys/kernel"])
def test_root_on_a_kernel_file_system_is_a_one_line_error(root: str) -> None:
    if not Path(root).is_dir():
        pytest.skip(f"{root} is not mounted here")
    proc = run(kvtier_cmd("bench", "--root", root, *TINY, "--no-fio"))
    assert_one_line_error(proc, f"--root {root} is on a ", "cannot hold block files")
    assert_no_internals(proc)


def test_root_naming_a_file_says_so_without_internals(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    proc = run(kvtier_cmd("bench", "--root", a_file, "--create-root", *TINY))
    assert_one_line_error(proc, f"--root {a_file} is not a directory")
    assert_no_internals(proc)


@pytest.mark.parametrize("option", ["--read-threads", "--write-threads"])
def test_thread_count_over_the_limit_is_a_one_line_error(tmp_path: Path, option: str) -> None:
    proc = run(kvtier_cmd("bench", "--root", tmp_path, *TINY, "--no-fio", option, "1025"))
    assert_one_line_error(proc, option, "at most 1024")
    assert_no_internals(proc)
    assert scratch_dirs(tmp_path) == []

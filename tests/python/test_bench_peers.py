"""`kvtier bench`'s peers and ceilings, the parts that need no peer installed: the --ceilings
option, the report of recorded peer runs (tests/python/data, taken in the peers' own
environments), the clear error when a peer's environment is missing, and fio's load
ceilings on real files (fio is needed: CI installs it)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kvtier.bench.ceiling import (
    BASIC_CEILINGS,
    CEILINGS,
    HUGE_LOAD_CEILINGS,
    LOAD_CEILINGS,
    HugePages,
    fio_command,
    hugetlb_pages_needed,
    hugetlb_refusal,
    load_ceiling,
    parse_ceilings,
    parse_huge_pages,
    read_huge_pages,
)
from kvtier.bench.errors import BenchError
from kvtier.bench.report import render

DATA = Path(__file__).resolve().parent / "data"
TINY = ["--total", "8M", "--sizes", "256K", "--repeat", "1", "--latency-samples", "8"]
TINY += ["--loop-seconds", "0.1", "--read-threads", "2", "--write-threads", "2"]


def _bench(*args: object, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvtier", "bench", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, check=False)


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("kvtier bench: error")]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    return lines[0]


# -- --ceilings ----------------------------------------------------------------------------


def test_ceilings_presets() -> None:
    assert parse_ceilings("default") == CEILINGS == BASIC_CEILINGS + LOAD_CEILINGS
    assert parse_ceilings("basic") == BASIC_CEILINGS
    loads = parse_ceilings("loads")
    assert loads[0].key == "fio" and loads[1:] == LOAD_CEILINGS  # psync always runs, first
    # Both asynchronous engines, three depths, the block size and the block size + header;
    # then psync into huge pages, of both request sizes.
    assert {(c.ioengine, c.iodepth, c.header, c.hugetlb) for c in LOAD_CEILINGS} == {
        (e, d, h, False) for e in ("libaio", "io_uring") for d in (4, 16, 32) for h in (0, 4096)
    } | {("psync", 1, 0, True), ("psync", 1, 4096, True)}
    assert all(c.load for c in LOAD_CEILINGS) and not any(c.load for c in BASIC_CEILINGS)
    huge = parse_ceilings("huge")
    assert huge[0].key == "fio" and huge[1:] == HUGE_LOAD_CEILINGS
    assert all(c.hugetlb for c in HUGE_LOAD_CEILINGS)


def test_ceilings_specs_in_order_without_duplicates() -> None:
    chosen = parse_ceilings("io_uring:qd64:+4k, libaio:qd16 ,basic,io_uring:qd64:+4K")
    assert [c.key for c in chosen] == [
        "fio",
        "fio_load_io_uring_qd64_plus4k",
        "fio_load_libaio_qd16",
        "fio_io_uring",
        "fio_new_files",
    ]
    assert chosen[1] == load_ceiling("io_uring", 64, 4096)
    assert chosen[1].label == "fio load io_uring qd64 bs+4K"
    assert parse_ceilings("psync")[1].iodepth == 1  # a psync load line (reads only)
    huge = parse_ceilings("psync:+4k:hugetlb,libaio:qd4:huge")[1:]
    keys = ["fio_load_psync_qd1_plus4k_hugetlb", "fio_load_libaio_qd4_hugetlb"]
    assert [c.key for c in huge] == keys
    assert huge[0].label == "fio load psync qd1 bs+4K hugetlb" and all(c.hugetlb for c in huge)
    assert not parse_ceilings("psync:+4k")[1].hugetlb  # a different line, not a duplicate


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("", "expected e.g."),
        ("spdk:qd4", "unknown fio engine 'spdk'"),
        ("libaio:qd0", "unknown option 'qd0'"),
        ("libaio:deep", "unknown option 'deep'"),
        ("psync:qd8", "psync has one request in flight"),
        ("psync:thp", r"or hugetlb \(buffers in huge pages\)"),
    ],
)
def test_bad_ceilings_say_what_is_expected(text: str, fragment: str) -> None:
    with pytest.raises(BenchError, match=fragment):
        parse_ceilings(text)


def test_bad_ceilings_option_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _bench("--root", tmp_path, "--ceilings", "libaio:qd16,spdk")
    assert "--ceilings" in _one_line_error(proc) and "unknown fio engine 'spdk'" in proc.stderr
    assert list(tmp_path.iterdir()) == []  # refused before anything was created


# -- a peer's environment missing ------------------------------------------------------------


def _without(module: str, tmp_path: Path) -> dict:
    """An environment where ``module`` cannot be imported, whatever is installed."""
    fake = tmp_path / "fake"
    (fake / module).mkdir(parents=True)
    (fake / module / "__init__.py").write_text(f"raise ImportError('No module named {module}')\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(fake), *sys.path])}


def test_peer_lmcache_without_lmcache_says_how_to_build_its_environment(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    proc = _bench("--root", root, *TINY, "--peer", "lmcache", env=_without("lmcache", tmp_path))
    line = _one_line_error(proc)
    assert line.startswith("kvtier bench: error: --peer lmcache: LMCache is not importable")
    assert "bash .ci/lmcache-env.sh" in line and ".venv-lmcache/bin/python -m kvtier" in line
    assert proc.stdout == ""  # nothing was measured
    assert list(root.iterdir()) == []  # the scratch directory is gone


def test_peer_vllm_without_vllm_names_the_native_environment(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    out = tmp_path / "out.json"
    proc = _bench(
        "--root", root, *TINY, "--no-fio", "--peer", "vllm", "--quiet", "--json", out,
        env=_without("vllm", tmp_path),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    skipped = json.loads(out.read_text())["peers"]["vllm"]["skipped"]
    assert "bash .ci/vllm-native-env.sh" in skipped and "vLLM peer: skipped" in proc.stdout


# -- the report of recorded peer runs --------------------------------------------------------


def _recorded(name: str) -> dict:
    return json.loads((DATA / name).read_text())


def test_report_of_a_recorded_lmcache_run() -> None:
    results = _recorded("bench-peer-lmcache.json")
    text = render(results)
    for backend in ("LMCache LocalDisk ", "LMCache LocalDisk O_DIRECT", "LMCache FSConnector"):
        assert f"256 KiB {backend}" in text  # in the throughput, loop and latency tables
        assert text.count(f"256 KiB {backend}") >= 3
    assert "LMCache peer: LMCache 0.5.6 at its storage API" in text
    assert "256 KiB kvtier fs: load >= LMCache LocalDisk O_DIRECT" in text
    assert "issue" not in text.lower()  # the targets are named by what they measure


def test_report_of_a_recorded_vllm_native_run() -> None:
    results = _recorded("bench-peer-vllm-native.json")
    assert results["peers"]["vllm"]["io_path_kind"] == "native"
    text = render(results)
    assert "vLLM peer: vLLM 0.33.0, native (vllm.fs_io_C)" in text
    assert "256 KiB vllm fs (native)" in text
    assert "256 KiB kvtier fs: store >= vLLM's fs tier" in text
    assert "issue" not in text.lower()
    # Saved before io_path_kind existed: the label comes from the text of io_path.
    del results["peers"]["vllm"]["io_path_kind"]
    assert "256 KiB vllm fs (native)" in render(results)
    results["peers"]["vllm"]["io_path"] = "pure Python (vllm.fs_io_C could not load: x)"
    assert "256 KiB vllm fs (pure Python)" in render(results)


def test_report_shows_the_best_load_ceiling_and_keeps_every_line_in_the_json() -> None:
    results = _recorded("bench-peer-vllm-native.json")
    entry = results["sizes"][0]
    loads = entry["fio_loads"]
    assert set(loads) == {"fio_load_libaio_qd4", "fio_load_io_uring_qd16_plus4k"}
    best = max(loads, key=lambda k: loads[k]["read_gbps"])
    assert entry["fio_load_best"] == best
    text = render(results)
    label = {"fio_load_libaio_qd4": "fio load libaio qd4"}.get(best, "fio load io_uring qd16 bs+4K")
    assert f"256 KiB {label} (best load)" in text
    assert text.count("(best load)") == 2  # its table row and its command
    assert "load / best fio load" in text
    assert f"--bs={256 * 1024 + 4096}" in loads["fio_load_io_uring_qd16_plus4k"]["read_command"]
    assert "--iodepth=16" in loads["fio_load_io_uring_qd16_plus4k"]["read_command"]
    assert "load ceilings, read GB/s" in text  # every load line's median, on one line


# -- fio's load ceilings on real files -------------------------------------------------------


def test_load_ceilings_read_the_layout_in_their_request_size(tmp_path: Path) -> None:
    if shutil.which("fio") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("fio is not installed (.ci/run installs it)")
        pytest.skip("fio is not installed")
    root, out = tmp_path / "root", tmp_path / "out.json"
    root.mkdir()
    ceilings = "psync,libaio:qd4,io_uring:qd8:+4k"
    proc = _bench("--root", root, *TINY, "--quiet", "--ceilings", ceilings, "--json", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    assert results["fio"]["ceilings"] == [
        "fio", "fio_load_psync_qd1", "fio_load_libaio_qd4", "fio_load_io_uring_qd8_plus4k",
    ]  # fmt: skip
    entry = results["sizes"][0]
    assert "fio_io_uring" not in entry and "fio" in entry  # only what was asked for, and psync
    skipped = results["fio"]["skipped_ceilings"]
    for key, engine, depth, request in (
        ("fio_load_psync_qd1", "psync", 1, 256 << 10),
        ("fio_load_libaio_qd4", "libaio", 4, 256 << 10),
        ("fio_load_io_uring_qd8_plus4k", "io_uring", 8, (256 << 10) + 4096),
    ):
        if key in skipped:  # an engine this kernel or fio refuses: said, not hidden
            assert engine != "psync", skipped
            continue
        fio = entry["fio_loads"][key]
        assert (fio["ioengine"], fio["iodepth"], fio["request_bytes"]) == (engine, depth, request)
        assert fio["read_gbps"] > 0 and f"--bs={request}" in fio["read_command"]
        # Every block of the layout is read: the files hold room for the header.
        assert fio["size_per_job"] // request * request == fio["size_per_job"]
        assert fio["size_per_job"] >= entry["fio_load_layout"]["size_per_job"] - request
    assert "(best load)" in proc.stdout
    assert list(root.iterdir()) == []


# -- the huge-page load ceilings: the pool, the skip, the command ------------------------------

MEMINFO = """MemTotal:       32000000 kB
HugePages_Total:      10
HugePages_Free:        6
HugePages_Rsvd:        2
HugePages_Surp:        3
Hugepagesize:       2048 kB
Hugetlb:           20480 kB
"""


def test_huge_page_pool_is_parsed_from_meminfo_and_the_overcommit_limit() -> None:
    pool = parse_huge_pages(MEMINFO, "5\n")
    # 6 free less 2 reserved by others; 5 may be added on demand, 3 already are.
    assert pool == HugePages(size=2 << 20, free=4, surplus_left=2)
    assert pool.available == 6
    assert parse_huge_pages(MEMINFO, "") == HugePages(size=2 << 20, free=4, surplus_left=0)
    assert parse_huge_pages("MemTotal: 1 kB\n", "0") is None  # no hugetlb in this kernel
    real = read_huge_pages()  # this kernel's own files parse (Linux with hugetlb)
    if Path("/proc/meminfo").read_text().find("Hugepagesize") >= 0:
        assert real is not None and real.size > 0 and real.available >= 0


def test_pages_needed_round_each_jobs_buffers_up_to_whole_pages() -> None:
    page = 2 << 20
    assert hugetlb_pages_needed(2 << 20, 1, 32, page) == 32
    assert hugetlb_pages_needed((2 << 20) + 4096, 1, 32, page) == 64  # 2 MiB + header: 2 each
    assert hugetlb_pages_needed(256 << 10, 1, 8, page) == 8
    assert hugetlb_pages_needed((256 << 10) + 4096, 16, 8, page) == 24  # 4.06 MiB: 3 each


def test_hugetlb_refusal_says_what_is_missing_and_how_to_get_it() -> None:
    pool = HugePages(size=2 << 20, free=4, surplus_left=2)
    assert hugetlb_refusal(pool, 6) == ""
    reason = hugetlb_refusal(pool, 7)
    assert "needs 7 free huge pages of 2 MiB" in reason and "4 free and may add 2" in reason
    assert "sysctl vm.nr_overcommit_hugepages=7" in reason
    assert "no hugetlb" in hugetlb_refusal(None, 1)


def test_hugetlb_command_maps_anonymous_huge_pages() -> None:
    cmd = fio_command(
        Path("/x"), rw="read", block_size=4096, numjobs=2, size=8192, direct=True,
        hugepage_size=2 << 20,
    )  # fmt: skip
    assert "--iomem=mmaphuge" in cmd and f"--hugepage-size={2 << 20}" in cmd
    assert not any(a.startswith("--mmap") or a.startswith("--iomem=mmaphuge:") for a in cmd)
    plain = fio_command(Path("/x"), rw="read", block_size=4096, numjobs=2, size=8192, direct=True)
    assert not any(a.startswith("--iomem") for a in plain)


def test_hugetlb_load_ceiling_runs_or_is_skipped_with_the_pool_it_lacked(tmp_path: Path) -> None:
    """On this kernel, as it is: fio reads into huge pages where the pool has enough of them,
    else the line is skipped with the reason (and the other ceilings still run)."""
    if shutil.which("fio") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("fio is not installed (.ci/run installs it)")
        pytest.skip("fio is not installed")
    root, out = tmp_path / "root", tmp_path / "out.json"
    root.mkdir()
    before = read_huge_pages()
    ceilings = "basic,psync:+4k:hugetlb"
    proc = _bench("--root", root, *TINY, "--quiet", "--ceilings", ceilings, "--json", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    key = "fio_load_psync_qd1_plus4k_hugetlb"
    entry = results["sizes"][0]
    skipped = results["fio"]["skipped_ceilings"]
    needed = hugetlb_pages_needed((256 << 10) + 4096, 1, 4, before.size if before else 1)
    if before is None or before.available < needed:
        assert key in skipped, results["fio"]
        assert "huge pages" in skipped[key] or "hugetlb" in skipped[key]
        assert f"fio load psync qd1 bs+4K hugetlb: skipped ({skipped[key]})" in proc.stdout
        assert "fio_loads" not in entry
    elif key not in skipped:  # granted: the pool may also fail fio (fragmentation), then said
        fio = entry["fio_loads"][key]
        assert fio["hugetlb"] is True and fio["request_bytes"] == (256 << 10) + 4096
        assert "--iomem=mmaphuge" in fio["read_command"] and fio["read_gbps"] > 0
        assert "bs+4K hugetlb" in proc.stdout
    else:
        assert "fio failed" in skipped[key]
    assert entry["fio"]["read_gbps"] > 0  # the psync ceiling ran either way
    assert list(root.iterdir()) == []

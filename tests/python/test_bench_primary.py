"""`kvtier bench --primary`: the physical layout of the bench's primary memory reaches the
memory (checked in /proc/self/smaps, where the kernel says what backs it), bad layouts are
refused, and the report and JSON say which layout ran."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kvtier.bench.errors import BenchError
from kvtier.bench.primary import (
    DEFAULT_PRIMARY_LAYOUT,
    HUGE_PAGE,
    PRIMARY_LAYOUTS,
    PrimaryMemory,
    huge_page_bytes,
)

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    """The bracketed THP mode (always, madvise, never), or None without THP."""
    try:
        text = THP.read_text()
    except OSError:
        return None
    return text.split("[", 1)[1].split("]", 1)[0] if "[" in text else None


def _vm_flags(address: int, length: int) -> list[list[str]]:
    """VmFlags of every mapping overlapping the range."""
    flags, inside = [], False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split(None, 1)[0] if line.strip() else ""
        if "-" in head and not head.endswith(":"):
            lo, _, hi = head.partition("-")
            inside = int(lo, 16) < address + length and int(hi, 16) > address
        elif inside and head == "VmFlags:":
            flags.append(line.split()[1:])
    return flags


def test_layouts_and_default() -> None:
    assert PRIMARY_LAYOUTS == ("plain", "scattered", "thp")
    assert DEFAULT_PRIMARY_LAYOUT == "scattered"


@pytest.mark.parametrize("layout", ["huge", "THP", ""])
def test_a_bad_layout_is_refused(layout: str) -> None:
    with pytest.raises(BenchError, match=r"expected one of plain, scattered, thp"):
        PrimaryMemory(4, 4096, layout)


def test_rows_start_on_a_huge_page_boundary_and_keep_their_shape() -> None:
    for layout in PRIMARY_LAYOUTS:
        primary = PrimaryMemory(3, 8192, layout)
        try:
            assert primary.address % HUGE_PAGE == 0
            assert primary.view.shape == (3, 8192) and primary.view.strides == (8192, 1)
            assert primary.array.ctypes.data == primary.address
            primary.fill(7)
            assert primary.view.tobytes()[8192:8200] == primary.array[1, :8].tobytes()
            assert primary.describe()["layout"] == layout
        finally:
            primary.close()


def test_thp_is_backed_by_huge_pages_where_thp_is_enabled() -> None:
    if _thp_mode() not in ("always", "madvise"):
        pytest.skip(f"transparent huge pages are not enabled here ({_thp_mode()})")
    primary = PrimaryMemory(16, 2 << 20, "thp")  # 32 MiB
    try:
        assert any("hg" in f for f in _vm_flags(primary.address, primary.length))
        granted = huge_page_bytes(primary.address, primary.length)
        assert granted == primary.huge_page_bytes
        # The kernel may refuse some under fragmentation, not all of 16.
        assert granted is not None and granted >= HUGE_PAGE, granted
    finally:
        primary.close()


def test_scattered_is_never_huge_pages() -> None:
    primary = PrimaryMemory(16, 2 << 20, "scattered")
    try:
        flags = _vm_flags(primary.address, primary.length)
        assert flags and all("nh" in f for f in flags)  # MADV_NOHUGEPAGE on all of it
        assert primary.huge_page_bytes == 0
        primary.fill(3)  # touching every byte does not make huge pages either
        assert huge_page_bytes(primary.address, primary.length) == 0
    finally:
        primary.close()


def _bench(*args: object) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "kvtier", "bench", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


TINY = ["--total", "4M", "--sizes", "256K", "--repeat", "1", "--latency-samples", "4"]
TINY += ["--loop-seconds", "0.1", "--read-threads", "2", "--write-threads", "2", "--no-fio"]


@pytest.mark.parametrize("layout", [None, "thp"])
def test_the_report_and_json_say_which_layout_ran(tmp_path: Path, layout: str | None) -> None:
    root, out = tmp_path / "root", tmp_path / "out.json"
    root.mkdir()
    extra = ["--primary", layout] if layout else []
    proc = _bench("--root", root, *TINY, *extra, "--quiet", "--json", out)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(out.read_text())
    ran = layout or DEFAULT_PRIMARY_LAYOUT
    assert results["config"]["primary"] == ran
    placed = results["sizes"][0]["primary"]
    assert placed["layout"] == ran and placed["bytes"] > 0
    assert f"  primary memory: {ran}, " in proc.stdout
    if ran == "scattered":
        assert placed["huge_page_bytes"] == 0 and "256 KiB 0%" in proc.stdout
    elif _thp_mode() in ("always", "madvise"):
        assert placed["huge_page_bytes"] > 0


def test_a_bad_primary_option_is_a_one_line_error(tmp_path: Path) -> None:
    proc = _bench("--root", tmp_path, *TINY, "--primary", "hugetlb")
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvtier bench: error: "), proc.stderr
    assert "--primary" in lines[0] and "'hugetlb'" in lines[0] and "thp" in lines[0]
    assert list(tmp_path.iterdir()) == []

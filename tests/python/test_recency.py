"""Shared recency (issue 18, item 10): a use dates its block on the file system's clock,
beneath the root without following links, for every user ``file_mode`` admits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest
from kvtier.tiering.base import JobMetadata, ReqContext
from kvtier.tiering.fs.capacity.recency import RecencyLog
from kvtier.tiering.fs.manager import FileSystemTierManager
from test_shared_root import ROW, SPEC, _users, key, mapper, run_tier
from test_shared_root import shared_root as shared_root  # noqa: F401 (fixture)

OLD_NS = 1_000_000_000 * 10**9  # 2001-09-09: far older than any use a test makes
HOUR_NS = 3600 * 10**9


def _tier(root: Path, data: np.ndarray) -> FileSystemTierManager:
    return FileSystemTierManager(SPEC, memoryview(data), "fs", root_dir=str(root))


def _stored_block(root: Path) -> tuple[FileSystemTierManager, np.ndarray, Path]:
    data = np.zeros((4, ROW), dtype=np.uint8)
    tier = _tier(root, data)
    tier.submit_store(
        JobMetadata(1, [key(1)], np.array([0], dtype=np.int64), False, ReqContext("t"))
    )
    tier.drain_jobs()
    assert all(r.success for r in tier.get_finished())
    block = Path(tier.file_mapper.get_file_name(key(1)))
    os.utime(block, ns=(OLD_NS, OLD_NS))
    return tier, data, block


def test_a_use_is_dated_by_the_file_system_not_by_a_skewed_client_clock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tier, _, block = _stored_block(tmp_path / "root")
    real_time_ns = time.time_ns
    before = real_time_ns()
    # This host's clock runs an hour slow (as on a host whose NTP failed): its uses must
    # still be ordered with the other hosts' on the file system's clock.
    monkeypatch.setattr(time, "time_ns", lambda: real_time_ns() - HOUR_NS)
    monkeypatch.setattr(time, "time", lambda: (real_time_ns() - HOUR_NS) / 1e9)
    tier.touch([key(1)], ReqContext("t"))
    tier.shutdown()  # flushes pending uses
    mtime = block.stat().st_mtime_ns
    # The kernel's coarse clock may trail time.time_ns() by a tick; an hour is not a tick.
    assert mtime > before - HOUR_NS // 2, (mtime, before)


def test_a_link_at_a_block_path_never_redates_a_file_outside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    tier, _, block = _stored_block(root)
    outside = tmp_path / "outside"
    outside.write_bytes(b"not a block")
    os.utime(outside, ns=(OLD_NS, OLD_NS))
    block.unlink()
    block.symlink_to(outside)
    # A link in place of a fan-out directory, too, with a same-named file behind it.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    other = Path(tier.file_mapper.get_file_name(key(2)))
    fan_out = other.parent
    if fan_out.exists():
        pytest.skip("keys 1 and 2 share a fan-out directory")
    fan_out.parent.mkdir(parents=True, exist_ok=True)
    victim = elsewhere / other.name
    victim.write_bytes(b"not a block either")
    os.utime(victim, ns=(OLD_NS, OLD_NS))
    fan_out.symlink_to(elsewhere, target_is_directory=True)

    tier.touch([key(1), key(2)], ReqContext("t"))
    tier.shutdown()
    assert outside.stat().st_mtime_ns == OLD_NS
    assert victim.stat().st_mtime_ns == OLD_NS


def test_paths_outside_the_root_are_not_dated(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside.kvb"
    outside.write_bytes(b"x")
    os.utime(outside, ns=(OLD_NS, OLD_NS))
    log = RecencyLog(str(root))
    log.record([str(outside), str(root / ".." / "outside.kvb")])
    assert log.flush() == 0
    assert outside.stat().st_mtime_ns == OLD_NS


def test_uses_land_in_the_order_they_were_made(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    paths = [root / "d" / f"{i}.kvb" for i in range(50)]
    for p in paths:
        p.write_bytes(b"x")
        os.utime(p, ns=(OLD_NS, OLD_NS))
    log = RecencyLog(str(root))
    order = list(reversed(paths))
    log.record(str(p) for p in order)
    log.record([str(paths[-1])])  # used again last: it moves to the end
    order = order[1:] + [paths[-1]]
    assert log.flush() == len(paths)
    mtimes = [p.stat().st_mtime_ns for p in order]
    assert all(m > OLD_NS for m in mtimes)
    assert mtimes == sorted(mtimes)


@pytest.mark.parametrize(("file_mode", "user"), [(0o660, "b"), (0o666, "c")])
def test_a_use_by_another_user_lands_wherever_file_mode_shares_the_root(
    shared_root: Path,  # noqa: F811
    file_mode: int,
    user: str,
) -> None:
    """kvt-b shares kvt-a's group (0660); kvt-c does not (0666). Either may write kvt-a's
    block, neither owns it: its use must still date it."""
    with _users() as users:
        options = {"file_mode": file_mode, "max_bytes": "1GiB"}
        stored = run_tier(shared_root, [("store", [1])], options, user=users["a"])
        assert stored["error"] is None and stored["results"][0]["success"], stored
        block = Path(mapper(shared_root).get_file_name(key(1)))
        os.utime(block, ns=(OLD_NS, OLD_NS))
        loaded = run_tier(shared_root, [("load", [1])], options, user=users[user])
        assert loaded["error"] is None and loaded["results"][0]["success"], loaded
        assert loaded["results"][0]["data_ok"] == [True]
        assert block.stat().st_mtime_ns > OLD_NS + HOUR_NS


def test_a_flush_over_many_directories_dates_every_block(tmp_path: Path) -> None:
    """More fan-out directories than one flush keeps open: each block is still dated once."""
    root = tmp_path / "root"
    paths = [
        root / "ns" / "rank-0" / f"{i:02x}" / f"{j:02x}" / "b.kvb"
        for i in range(10)
        for j in range(15)
    ]
    for p in paths:
        p.parent.mkdir(parents=True)
        p.write_bytes(b"x")
        os.utime(p, ns=(OLD_NS, OLD_NS))
    log = RecencyLog(str(root))
    log.record(str(p) for p in paths)
    assert log.flush() == len(paths)
    assert all(p.stat().st_mtime_ns > OLD_NS for p in paths)
    assert log.flush() == 0  # nothing pending twice

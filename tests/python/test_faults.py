"""Failures injected at the system-call boundary are reported as failed jobs, not crashes.

A small LD_PRELOAD interposer (faults/faultinject.c, built here with the C compiler) fails or
shortens chosen calls on paths that contain a substring; a child Python process
(faults/child.py) drives the engine under it and prints what happened as JSON. The native
library imports openat, pwritev, preadv, renameat2, renameat, fdatasync, fsync, close, mkdir,
mkdirat and syscall (for openat2) from libc (see `nm -D libkvtier_core.so`); the interposer also
covers their 64-bit and path-based variants, and matches *at calls on the directory's path joined
with the name.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from block_files import skip_on_memory_fs
from kvtier import _core as core

FAULTS = Path(__file__).resolve().parent / "faults"
CHILD_TIMEOUT_S = 120
ROW = 3 * 4096 + 777  # not a multiple of the page size


# The interposer sees libc calls. The io_uring engine makes these through the ring instead,
# out of its sight: their faults are injected at the ring (tests/cpp/test_uring_faults.cpp).
# A store's close, rename and directory fsync are libc calls on both engines.
RING_CALLS = {"pwrite", "pread", "fdatasync"}
IO_ENGINE_ENV = "KVTIER_TEST_FAULTS_IO_ENGINE"


@pytest.fixture(autouse=True, params=["psync", "io_uring"])
def io_engine(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, io_uring_refused: str
) -> str:
    """Every fault test runs on both I/O engines (run_child passes it to the child)."""
    if request.param == "io_uring" and io_uring_refused:
        pytest.skip(f"io_uring is refused here: {io_uring_refused}")
    monkeypatch.setenv(IO_ENGINE_ENV, request.param)
    return request.param


class Child:
    """Result of one child run: the JSON it printed and the faults the interposer injected."""

    def __init__(self, result: dict[str, Any], injected: list[str]) -> None:
        self.result = result
        self.injected = injected
        self.completions = {c["job_id"]: c for c in result["completions"]}

    def job(self, job_id: int) -> dict[str, Any]:
        return self.completions[job_id]


def run_child(
    interposer: Path,
    spec: dict[str, Any],
    fault: str,
    match: str = "",
    err: int = errno.EIO,
    short: int | None = None,
    times: int | None = None,
    after: int | None = None,
) -> Child:
    env = dict(os.environ)
    env.update(
        LD_PRELOAD=str(interposer),
        KVTIER_FAULT=fault,
        KVTIER_FAULT_MATCH=match,
        KVTIER_FAULT_ERRNO=str(err),
    )
    if short is not None:
        env["KVTIER_FAULT_SHORT"] = str(short)
    if times is not None:
        env["KVTIER_FAULT_TIMES"] = str(times)
    if after is not None:
        env["KVTIER_FAULT_AFTER"] = str(after)
    spec.setdefault("row_size", ROW)
    spec.setdefault("rows", 4)
    spec.setdefault("engine", {})
    spec["engine"].setdefault("n_read_threads", 2)
    spec["engine"].setdefault("n_write_threads", 2)
    io_engine = os.environ.get(IO_ENGINE_ENV, "psync")
    if io_engine == "io_uring" and fault in RING_CALLS:
        pytest.skip(f"io_uring makes {fault} through the ring (tests/cpp/test_uring_faults.cpp)")
    spec["engine"].setdefault("io_engine", io_engine)
    proc = subprocess.run(
        [sys.executable, str(FAULTS / "child.py"), json.dumps(spec)],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=CHILD_TIMEOUT_S,
    )
    # A fault must never crash the process.
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{proc.stderr[-4000:]}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, proc.stdout + proc.stderr
    injected = [line for line in proc.stderr.splitlines() if line.startswith("kvtier-fault: ")]
    return Child(json.loads(lines[-1]), injected)


def block(root: Path, name: str) -> str:
    return str(root / "blocks" / "ab" / f"{name}.kvb")


def store_then_load(root: Path, names: list[str], load_names: list[str] | None = None) -> list:
    rows = {n: i for i, n in enumerate(names)}
    load_names = names if load_names is None else load_names
    return [
        {"id": 1, "kind": "store", "blocks": [[block(root, n), rows[n]] for n in names]},
        {"id": 2, "kind": "load", "blocks": [[block(root, n), rows[n]] for n in load_names]},
    ]


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def direct_ok(root: Path) -> bool:
    root.mkdir(parents=True, exist_ok=True)
    return core.probe_o_direct(str(root)) == ""


# --------------------------------------------------------------------------------------------
# O_DIRECT refused (EINVAL on open with O_DIRECT)


@pytest.mark.parametrize("memory", ["aligned", "unaligned"])
def test_o_direct_refused_auto_falls_back_to_buffered(
    interposer: Path, tmp_path: Path, memory: str
) -> None:
    root = tmp_path / "root"
    spec = {
        "root": str(root),
        "engine": {"o_direct": "auto"},
        "memory": memory,
        "jobs": store_then_load(root, ["a", "b", "c"]),
    }
    child = run_child(interposer, spec, "open_direct", match=str(root), err=errno.EINVAL)
    r = child.result
    assert r["construct_error"] is None
    assert r["direct_io"] is False
    assert "Invalid argument" in r["fallback_reason"]
    assert any("kvtier-odirect-probe" in line for line in child.injected)
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True, True, True]
    assert tmp_files(root) == []
    assert list(root.rglob(".kvtier-odirect-probe*")) == []  # the probe cleaned up too


def test_o_direct_refused_true_fails_clearly(interposer: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "engine": {"o_direct": True}, "jobs": []}
    child = run_child(interposer, spec, "open_direct", match=str(root), err=errno.EINVAL)
    error = child.result["construct_error"]
    assert error is not None, "o_direct=True must refuse a directory without O_DIRECT"
    assert error["errno"] == errno.EINVAL
    assert error["filename"] == str(root)
    assert "o_direct" in error["message"].lower()


def test_o_direct_refused_on_block_files_auto_falls_back_per_file(
    interposer: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    if not direct_ok(root):
        pytest.skip("O_DIRECT unsupported here; the probe itself would fall back")
    spec = {
        "root": str(root),
        "engine": {"o_direct": "auto"},
        "memory": "aligned",
        "jobs": store_then_load(root, ["a", "b", "c"]),
    }
    child = run_child(interposer, spec, "open_direct", match="/blocks/", err=errno.EINVAL)
    r = child.result
    assert r["direct_io"] is True  # the probe was not hit
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True, True, True]
    assert r["stats"]["o_direct_fallbacks"] == 6  # three stores and three loads
    assert len(child.injected) >= 6
    assert tmp_files(root) == []


def test_o_direct_refused_on_block_files_true_fails_the_jobs(
    interposer: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    if not direct_ok(root):
        pytest.skip("O_DIRECT unsupported here; o_direct=True cannot even be constructed")
    spec = {
        "root": str(root),
        "engine": {"o_direct": True},
        "jobs": store_then_load(root, ["a", "b"]),
    }
    child = run_child(interposer, spec, "open_direct", match="/blocks/", err=errno.EINVAL)
    store = child.job(1)
    assert not store["success"]
    assert store["errno"] == errno.EINVAL
    assert store["operation"] == "open"
    assert store["block_errnos"] == [errno.EINVAL, errno.EINVAL]
    assert "/blocks/" in store["path"]
    assert not child.job(2)["success"]
    assert tmp_files(root) == []
    assert not Path(block(root, "a")).exists()


# --------------------------------------------------------------------------------------------
# write path


@pytest.mark.parametrize(
    "o_direct,memory",
    [(False, "aligned"), (False, "unaligned"), (True, "aligned"), (True, "unaligned")],
)
def test_eio_on_pwrite_fails_the_block_and_leaves_no_tmp(
    interposer: Path, tmp_path: Path, o_direct: bool, memory: str
) -> None:
    root = tmp_path / "root"
    if o_direct and not direct_ok(root):
        pytest.skip("O_DIRECT unsupported here")
    spec = {
        "root": str(root),
        "engine": {"o_direct": o_direct},
        "memory": memory,
        "jobs": store_then_load(root, ["a", "victim", "c"], ["a", "c"]),
    }
    child = run_child(interposer, spec, "pwrite", match="victim", err=errno.EIO)
    store = child.job(1)
    assert not store["success"]
    assert store["block_errnos"] == [0, errno.EIO, 0]
    assert store["errno"] == errno.EIO
    assert store["operation"] == "pwrite"
    assert store["path"].startswith(block(root, "victim"))
    assert store["bytes"] == 2 * ROW
    assert child.injected
    assert tmp_files(root) == []
    assert not Path(block(root, "victim")).exists()
    # The blocks that were written are intact.
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True, True]
    stats = child.result["stats"]
    assert stats["failed_store_jobs"] == 1 and stats["failed_store_blocks"] == 1


@pytest.mark.parametrize("call", ["pwrite", "pread"])
@pytest.mark.parametrize(
    "o_direct,memory,limit",
    [
        (False, "aligned", 1000),
        (False, "unaligned", 1),
        (True, "aligned", 4096),
        (True, "unaligned", 4096),
    ],
)
def test_short_transfers_are_continued(
    interposer: Path, tmp_path: Path, call: str, o_direct: bool, memory: str, limit: int
) -> None:
    root = tmp_path / "root"
    if o_direct and not direct_ok(root):
        pytest.skip("O_DIRECT unsupported here")
    spec = {
        "root": str(root),
        "engine": {"o_direct": o_direct},
        "memory": memory,
        "jobs": store_then_load(root, ["a", "b"]),
    }
    child = run_child(interposer, spec, call, match="/blocks/", short=limit, times=200)
    assert child.injected, "the interposer never shortened a call"
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True, True]
    for name in ("a", "b"):
        assert Path(block(root, name)).stat().st_size == 4096 + 4 * 4096


# --------------------------------------------------------------------------------------------
# Stores to a file system of memory: large payloads written in checked pieces (psync_engine.cpp,
# kCrcPieceBytes = 256 KiB; docs/core.md "Stores to memory")

DEADLINES = pytest.mark.parametrize("io_timeout_s", [10.0, 0.0], ids=["deadline", "no deadline"])


@DEADLINES
@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "O_DIRECT"])
@pytest.mark.parametrize(
    "where,size,writes",
    [
        ("tmpfs", (1 << 20) + 100, 5),  # four pieces of the payload, then the header
        ("tmpfs", 256 << 10, 1),  # one piece: with its header in one call, as before
        ("disk", (1 << 20) + 100, 1),  # not memory: one call, the CRC taken before it
    ],
)
def test_large_stores_to_memory_are_written_in_checked_pieces(
    interposer: Path, tmp_path: Path, tmpfs_mount: Path, io_timeout_s: float, o_direct: bool,
    where: str, size: int, writes: int,
) -> None:  # fmt: skip
    """Each piece's CRC32C is taken right before the piece is written, and the header, which
    carries the CRC, goes last: the block loads back byte-exact (its CRC verified), and the
    interposer (logging only) counts its writes. With O_DIRECT the partial last page goes
    through the tail page, in the last piece."""
    if where == "disk":
        skip_on_memory_fs(tmp_path)
    root = (tmpfs_mount if where == "tmpfs" else tmp_path) / "root"
    if o_direct and not direct_ok(root):
        pytest.skip(f"O_DIRECT unsupported on {where} here")
    spec = {
        "root": str(root),
        "row_size": size,
        "rows": 1,
        "engine": {"io_timeout_s": io_timeout_s, "o_direct": o_direct},
        "jobs": store_then_load(root, ["a"]),
    }
    child = run_child(interposer, spec, "pwrite", match="/blocks/", err=0)
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True]
    assert child.result["direct_io"] == o_direct
    assert len(child.injected) == writes, child.injected
    memory_path = where == "tmpfs" and io_timeout_s > 0
    assert child.result["stats"]["memory_fs_stores"] == (1 if memory_path else 0)


@DEADLINES
@pytest.mark.parametrize("err", [errno.EIO, errno.ENOSPC])
def test_a_failed_later_piece_fails_the_store_and_leaves_no_tmp(
    interposer: Path, tmpfs_mount: Path, io_timeout_s: float, err: int
) -> None:
    """The third of a block's piece writes fails: the block fails with that errno, its tmp
    file is removed (nothing half-written is ever linked), the other block of the job is
    stored and loads back whole."""
    root = tmpfs_mount / "root"
    spec = {
        "root": str(root),
        "row_size": (1 << 20) + 100,
        "rows": 2,
        "engine": {"io_timeout_s": io_timeout_s, "n_write_threads": 1, "o_direct": False},
        "jobs": store_then_load(root, ["a", "victim"], ["a"]),
    }
    child = run_child(interposer, spec, "pwrite", match="victim", err=err, after=2, times=1)
    assert len(child.injected) == 1
    store = child.job(1)
    assert not store["success"]
    assert store["block_errnos"] == [0, err]
    assert store["operation"] == "pwrite"
    assert tmp_files(root) == []
    assert not Path(block(root, "victim")).exists()
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True]


@pytest.mark.parametrize("call", ["pwrite", "pread"])
def test_eintr_is_retried(interposer: Path, tmp_path: Path, call: str) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a", "b"])}
    child = run_child(interposer, spec, call, match="/blocks/", err=errno.EINTR, times=3)
    assert len(child.injected) == 3
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["success"], child.job(2)["error"]
    assert child.job(2)["data_ok"] == [True, True]


def test_failing_rename_fails_the_store_and_leaves_nothing(
    interposer: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a", "b"])}
    child = run_child(interposer, spec, "rename", match="/blocks/", err=errno.EIO)
    store = child.job(1)
    assert not store["success"]
    assert store["operation"] == "rename"
    assert store["errno"] == errno.EIO
    assert store["block_errnos"] == [errno.EIO, errno.EIO]
    assert child.injected
    assert tmp_files(root) == []
    assert not Path(block(root, "a")).exists()
    load = child.job(2)
    assert not load["success"] and load["errno"] == errno.ENOENT


@pytest.mark.parametrize("err", [errno.ENOSYS, errno.EINVAL])
def test_rename_without_noreplace_support_falls_back(
    interposer: Path, tmp_path: Path, err: int
) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a", "b"])}
    child = run_child(interposer, spec, "renameat2", match="/blocks/", err=err)
    assert any(line.startswith("kvtier-fault: renameat2") for line in child.injected)
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["data_ok"] == [True, True]
    assert tmp_files(root) == []


def test_failing_close_fails_the_store_and_leaves_nothing(interposer: Path, tmp_path: Path) -> None:
    """A close that reports a deferred write error (NFS does) stops the publish."""
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a", "b"])}
    child = run_child(interposer, spec, "close", match=".tmp", err=errno.EIO)
    store = child.job(1)
    assert not store["success"]
    assert store["operation"] == "close"
    assert store["errno"] == errno.EIO
    assert store["path"].endswith(".tmp")
    assert store["block_errnos"] == [errno.EIO, errno.EIO]
    assert tmp_files(root) == []
    assert not Path(block(root, "a")).exists()


def test_fdatasync_failure_fails_the_store(interposer: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    spec = {
        "root": str(root),
        "engine": {"durability": "data"},
        "jobs": store_then_load(root, ["a"]),
    }
    child = run_child(interposer, spec, "fdatasync", match="/blocks/", err=errno.EIO)
    store = child.job(1)
    assert not store["success"]
    assert store["operation"] == "fdatasync"
    assert store["errno"] == errno.EIO
    assert tmp_files(root) == []
    assert not Path(block(root, "a")).exists()


@pytest.mark.parametrize("durability,synced", [("none", False), ("data", True), ("full", True)])
def test_durability_decides_whether_data_is_synced(
    interposer: Path, tmp_path: Path, durability: str, synced: bool
) -> None:
    """Whether fdatasync is called on block files, observed through the interposer."""
    root = tmp_path / "root"
    spec = {
        "root": str(root),
        "engine": {"durability": durability},
        "jobs": store_then_load(root, ["a", "b"]),
    }
    # errno 0: the interposer only logs the matching calls and lets them through.
    child = run_child(interposer, spec, "fdatasync", match="/blocks/", err=0)
    assert child.job(1)["success"], child.job(1)["error"]
    assert child.job(2)["data_ok"] == [True, True]
    assert (len(child.injected) > 0) is synced


def test_directory_fsync_failure_with_full_durability(interposer: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    spec = {
        "root": str(root),
        "engine": {"durability": "full"},
        "jobs": store_then_load(root, ["a"]),
    }
    child = run_child(interposer, spec, "fsync", match="/blocks", err=errno.EIO)
    store = child.job(1)
    assert not store["success"]
    assert store["operation"] == "fsync"
    assert store["errno"] == errno.EIO
    assert store["path"] == str(root / "blocks" / "ab")
    assert tmp_files(root) == []


def test_data_durability_does_not_sync_the_directory(interposer: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    spec = {
        "root": str(root),
        "engine": {"durability": "data"},
        "jobs": store_then_load(root, ["a"]),
    }
    child = run_child(interposer, spec, "fsync", match="/blocks", err=errno.EIO)
    assert child.injected == []
    assert child.job(1)["success"], child.job(1)["error"]


def test_mkdir_failure_fails_the_store(interposer: Path, tmp_path: Path) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a"])}
    child = run_child(interposer, spec, "mkdir", match="/blocks", err=errno.EACCES)
    store = child.job(1)
    assert not store["success"]
    assert store["operation"] == "mkdir"
    assert store["errno"] == errno.EACCES
    assert store["path"] == str(root / "blocks")  # the first directory that could not be made
    assert not (root / "blocks").exists()


@pytest.mark.parametrize("err", [errno.EMFILE, errno.EACCES])
def test_open_failure_fails_store_and_load(interposer: Path, tmp_path: Path, err: int) -> None:
    root = tmp_path / "root"
    spec = {"root": str(root), "jobs": store_then_load(root, ["a"])}
    child = run_child(interposer, spec, "open", match="/ab/a.kvb", err=err)
    for job_id in (1, 2):
        c = child.job(job_id)
        assert not c["success"]
        assert c["operation"] == "open"
        assert c["errno"] == err
        assert c["path"].startswith(block(root, "a"))
    assert tmp_files(root) == []


# --------------------------------------------------------------------------------------------
# read path


def test_estale_on_opening_a_block_to_load_is_a_miss_like_enoent(
    interposer: Path, tmp_path: Path
) -> None:
    # What an NFS-like client answers for a name it looked up before another host evicted
    # the file: the load must report the block absent (ENOENT), as docs/tiers.md promises.
    root = tmp_path / "root"
    names = ["a", "victim", "c"]
    stored = run_child(
        interposer,
        {"root": str(root), "jobs": store_then_load(root, names)[:1]},
        "open",
        match="/nothing-matches/",
    )
    assert stored.job(1)["success"], stored.job(1)["error"]
    spec = {"root": str(root), "jobs": store_then_load(root, names)[1:]}
    child = run_child(interposer, spec, "open", match="/ab/victim.kvb", err=errno.ESTALE)
    assert any("victim.kvb" in line for line in child.injected), child.injected
    load = child.job(2)
    assert not load["success"]
    assert load["block_errnos"] == [0, errno.ENOENT, 0]
    assert load["errno"] == errno.ENOENT and load["operation"] == "open"
    assert load["path"] == block(root, "victim")
    assert "stale file handle: treated as absent" in load["message"], load["message"]
    assert load["data_ok"][0] and load["data_ok"][2]
    assert Path(block(root, "victim")).exists()  # nothing removed for it
    assert child.result["stats"]["corrupt_files_removed"] == 0


@pytest.mark.parametrize("o_direct", [False, True])
def test_eio_on_pread_fails_the_load_and_keeps_the_file(
    interposer: Path, tmp_path: Path, o_direct: bool
) -> None:
    root = tmp_path / "root"
    if o_direct and not direct_ok(root):
        pytest.skip("O_DIRECT unsupported here")
    spec = {
        "root": str(root),
        "engine": {"o_direct": o_direct},
        "memory": "unaligned",
        "jobs": store_then_load(root, ["a", "victim", "c"]),
    }
    child = run_child(interposer, spec, "pread", match="victim", err=errno.EIO)
    assert child.job(1)["success"], child.job(1)["error"]
    load = child.job(2)
    assert not load["success"]
    assert load["block_errnos"] == [0, errno.EIO, 0]
    assert load["errno"] == errno.EIO
    assert load["operation"] == "pread"
    assert load["path"] == block(root, "victim")
    assert load["data_ok"][0] and load["data_ok"][2]
    assert load["bytes"] == 2 * ROW
    # An I/O error is not evidence of a bad file: it stays for the next try.
    assert Path(block(root, "victim")).exists()
    stats = child.result["stats"]
    assert stats["corrupt_files_removed"] == 0
    assert stats["failed_load_jobs"] == 1 and stats["failed_load_blocks"] == 1


# --------------------------------------------------------------------------------------------
# resolution beneath the root: openat2 where the kernel has it, per-component O_NOFOLLOW
# otherwise (forced here by failing openat2 with ENOSYS, as an old kernel or a seccomp
# filter does)

RESOLUTION = ["openat2", "fallback"]


def run_resolution(interposer: Path, spec: dict[str, Any], resolution: str) -> Child:
    # errno 0 only logs openat2 calls: proof that the kernel path was the one taken.
    err = 0 if resolution == "openat2" else errno.ENOSYS
    child = run_child(interposer, spec, "openat2", err=err)
    assert any(line.startswith("kvtier-fault: openat2") for line in child.injected)
    return child


@pytest.mark.parametrize("resolution", RESOLUTION)
def test_symlinked_directory_below_root_fails_the_block(
    interposer: Path, tmp_path: Path, resolution: str
) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "blocks").mkdir(parents=True)
    outside.mkdir()
    (root / "blocks" / "ab").symlink_to(outside, target_is_directory=True)
    spec = {"root": str(root), "jobs": store_then_load(root, ["a"])}
    child = run_resolution(interposer, spec, resolution)
    for job_id in (1, 2):
        c = child.job(job_id)
        assert not c["success"]
        assert c["errno"] == errno.ELOOP, c["error"]
        assert c["path"] == str(root / "blocks" / "ab")
        assert "never followed" in c["message"]
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("resolution", RESOLUTION)
def test_symlinked_block_file_is_not_loaded(
    interposer: Path, tmp_path: Path, resolution: str
) -> None:
    root = tmp_path / "root"
    first = run_child(interposer, {"root": str(root), "jobs": store_then_load(root, ["a"])}, "")
    assert first.job(2)["data_ok"] == [True]
    planted = tmp_path / "planted.kvb"
    Path(block(root, "a")).rename(planted)  # valid bytes for this key, outside the root
    Path(block(root, "a")).symlink_to(planted)
    spec = {"root": str(root), "jobs": store_then_load(root, ["a"])}
    child = run_resolution(interposer, spec, resolution)
    store, load = child.job(1), child.job(2)
    assert not store["success"] and store["errno"] == errno.ELOOP  # never a dedup success
    assert not load["success"] and load["errno"] == errno.ELOOP
    assert load["data_ok"] == [False]
    assert planted.exists()


@pytest.mark.parametrize("resolution", RESOLUTION)
def test_dot_dot_and_outside_paths_are_refused(
    interposer: Path, tmp_path: Path, resolution: str
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    escape = f"{root}/../escaped.kvb"
    spec = {
        "root": str(root),
        "jobs": [
            {"id": 1, "kind": "store", "blocks": [[escape, 0]]},
            {"id": 2, "kind": "store", "blocks": [[str(tmp_path / "outside.kvb"), 0]]},
            {"id": 3, "kind": "store", "blocks": [[block(root, "a"), 0]]},
        ],
    }
    child = run_child(
        interposer, spec, "openat2", err=0 if resolution == "openat2" else errno.ENOSYS
    )
    for job_id in (1, 2):
        c = child.job(job_id)
        assert not c["success"] and c["errno"] == errno.EPERM
        assert "not below root_dir" in c["message"]
    assert child.job(3)["success"], child.job(3)["error"]
    assert not (tmp_path / "escaped.kvb").exists() and not (tmp_path / "outside.kvb").exists()

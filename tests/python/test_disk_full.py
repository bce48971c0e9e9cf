"""A store that runs out of space fails cleanly.

The disk is a 4 MiB tmpfs mounted for the test, which needs root (CAP_SYS_ADMIN); without it
the tests are skipped and say so.
"""

from __future__ import annotations

import errno
import mmap
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtier import _core as core

pytestmark = pytest.mark.root

PAGE = 4096
ROW = 256 * 1024  # a block file is 260 KiB: about 15 fit in 4 MiB
WAIT_S = 60.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A freshly mounted 4 MiB tmpfs, unmounted at teardown."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a size-limited tmpfs for the disk-full tests")
    if shutil.which("mount") is None or shutil.which("umount") is None:
        pytest.skip("needs mount/umount to mount a size-limited tmpfs")
    mnt = tmp_path / "small-disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs (needs CAP_SYS_ADMIN): {proc.stderr.strip()}")
    try:
        yield mnt
    finally:
        if subprocess.run(
            ["umount", str(mnt)], check=False, capture_output=True, timeout=60
        ).returncode:
            subprocess.run(["umount", "-l", str(mnt)], check=False, capture_output=True, timeout=60)


def collect_one(engine: Any, job_id: int) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        got = engine.pop_completions()
        if got:
            assert [c.job_id for c in got] == [job_id]
            return got[0]
        assert time.monotonic() < deadline, f"job {job_id} not reported within {WAIT_S}s"
        time.sleep(0.002)


def rows(n: int, aligned: bool, seed: int | None) -> tuple[Any, np.ndarray]:
    if aligned:
        owner: Any = mmap.mmap(-1, n * ROW)
        arr = np.frombuffer(owner, dtype=np.uint8)
    else:
        owner = bytearray(n * ROW + PAGE)
        arr = np.frombuffer(owner, dtype=np.uint8)[1 : 1 + n * ROW]
    if seed is not None:
        arr[:] = np.random.default_rng(seed).integers(0, 256, size=arr.size, dtype=np.uint8)
    return owner, arr


def block(root: Path, i: int) -> tuple[Path, bytes]:
    return root / "blocks" / f"{i % 4}" / f"b{i}.kvb", b"key-%d" % i


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


@pytest.mark.parametrize(
    "o_direct,aligned", [(False, True), (False, False), ("auto", True), ("auto", False)]
)
def test_store_hitting_enospc_fails_cleanly_and_earlier_blocks_survive(
    small_disk: Path, o_direct: Any, aligned: bool, io_engine: str
) -> None:
    root = small_disk / "root"
    n = 40  # well past what 4 MiB holds
    _src_owner, src = rows(n, aligned, seed=99)
    _dst_owner, dst = rows(n, aligned, seed=None)
    engine = core.Engine(
        str(root), o_direct=o_direct, n_read_threads=1, n_write_threads=1, io_engine=io_engine
    )
    try:
        failed_at = None
        for i in range(n):
            path, key = block(root, i)
            engine.submit_store(i, [(path, key, src.ctypes.data + i * ROW, ROW)])
            c = collect_one(engine, i)
            if not c.success:
                failed_at = i
                break
        assert failed_at is not None, "a 4 MiB tmpfs took 40 blocks of 256 KiB"
        assert failed_at > 0
        assert c.errno == errno.ENOSPC, c.error
        assert list(c.block_errnos) == [errno.ENOSPC]
        assert c.path.startswith(str(block(root, failed_at)[0])), c.path
        assert tmp_files(small_disk) == []
        assert not block(root, failed_at)[0].exists()
        assert engine.stats()["failed_store_jobs"] == 1

        # Everything stored before the failure loads byte-exact.
        load = [
            (block(root, i)[0], block(root, i)[1], dst.ctypes.data + i * ROW, ROW)
            for i in range(failed_at)
        ]
        engine.submit_load(1000, load)
        c = collect_one(engine, 1000)
        assert c.success, c.error
        assert np.array_equal(dst[: failed_at * ROW], src[: failed_at * ROW])

        # Once space is freed the same block stores fine: nothing stuck, nothing leaked.
        for i in range(2):
            block(root, i)[0].unlink()
        path, key = block(root, failed_at)
        engine.submit_store(2000, [(path, key, src.ctypes.data + failed_at * ROW, ROW)])
        c = collect_one(engine, 2000)
        assert c.success, c.error
        engine.submit_load(2001, [(path, key, dst.ctypes.data + failed_at * ROW, ROW)])
        assert collect_one(engine, 2001).success
        assert np.array_equal(
            dst[failed_at * ROW : (failed_at + 1) * ROW],
            src[failed_at * ROW : (failed_at + 1) * ROW],
        )
    finally:
        engine.shutdown()


@pytest.mark.parametrize("o_direct", [False, "auto"])
def test_one_job_overflowing_the_disk_reports_each_block(
    small_disk: Path, o_direct: Any, io_engine: str
) -> None:
    root = small_disk / "root"
    n = 24
    _src_owner, src = rows(n, True, seed=5)
    _dst_owner, dst = rows(n, True, seed=None)
    engine = core.Engine(
        str(root), o_direct=o_direct, n_read_threads=1, n_write_threads=2, io_engine=io_engine
    )
    try:
        blocks = [
            (block(root, i)[0], block(root, i)[1], src.ctypes.data + i * ROW, ROW) for i in range(n)
        ]
        engine.submit_store(1, blocks)
        c = collect_one(engine, 1)
        assert not c.success
        assert c.errno == errno.ENOSPC, c.error
        errnos = list(c.block_errnos)
        assert set(errnos) <= {0, errno.ENOSPC}, errnos
        ok = [i for i in range(n) if errnos[i] == 0]
        assert ok and len(ok) < n
        assert c.bytes == len(ok) * ROW
        assert tmp_files(small_disk) == []
        for i in range(n):
            assert block(root, i)[0].exists() == (i in ok), i

        engine.submit_load(
            2, [(block(root, i)[0], block(root, i)[1], dst.ctypes.data + i * ROW, ROW) for i in ok]
        )
        c = collect_one(engine, 2)
        assert c.success, c.error
        for i in ok:
            assert np.array_equal(dst[i * ROW : (i + 1) * ROW], src[i * ROW : (i + 1) * ROW]), i
    finally:
        engine.shutdown()


def fill(disk: Path) -> None:
    """Writes a file until the disk is full."""
    with open(disk / "filler", "wb") as f:
        try:
            while True:
                f.write(bytes(64 * 1024))
                f.flush()
        except OSError as e:
            assert e.errno == errno.ENOSPC, e


@pytest.mark.parametrize("holder", ["fs", "transfer"])
def test_constructor_on_a_full_disk_raises_an_oserror_naming_the_path(
    small_disk: Path, holder: str
) -> None:
    from kvtier.tiering.spec import OffloadingSpec

    fill(small_disk)
    root = small_disk / "root"
    spec = OffloadingSpec(model_name="full", dtype="uint8")
    with pytest.raises(OSError) as raised:
        if holder == "fs":
            from kvtier.tiering.fs.manager import FileSystemTierManager

            FileSystemTierManager(
                spec, memoryview(bytearray(4 * ROW)).cast("B", (4, ROW)), root_dir=str(root)
            )
        else:
            torch = pytest.importorskip("torch")
            from kvtier.gpu.transfer import GPUStorageTransfer

            GPUStorageTransfer([torch.zeros(4, ROW, dtype=torch.uint8)], spec, str(root))
    assert raised.value.errno == errno.ENOSPC, raised.value
    assert raised.value.filename, raised.value
    assert str(raised.value.filename).startswith(str(root) + os.sep), raised.value
    assert str(root) in str(raised.value)


@pytest.mark.parametrize("o_direct", ["auto", True])
def test_engine_started_on_a_full_disk_keeps_o_direct(small_disk: Path, o_direct: Any) -> None:
    """A volume that is full when an engine starts (another tenant's files, blocks about to
    be evicted) says nothing against O_DIRECT: the engine uses it, and stores succeed once
    there is room. Before, "auto" fell back to buffered I/O for the engine's life and True
    refused to start."""
    root = small_disk / "root"
    probe = core.Engine(str(root), o_direct="auto")
    if not probe.direct_io:
        pytest.skip(f"this kernel's tmpfs refuses O_DIRECT: {probe.o_direct_fallback_reason}")
    probe.shutdown()
    fill(small_disk)
    engine = core.Engine(str(root), o_direct=o_direct, n_read_threads=1, n_write_threads=1)
    try:
        assert engine.direct_io, engine.o_direct_fallback_reason
        assert engine.o_direct_fallback_reason == ""
        _owner, src = rows(1, aligned=True, seed=7)
        path, key = block(root, 0)
        engine.submit_store(1, [(path, key, src.ctypes.data, ROW)])
        c = collect_one(engine, 1)
        assert c.errno == errno.ENOSPC, c.error  # still full: the store fails cleanly
        (small_disk / "filler").unlink()
        engine.submit_store(2, [(path, key, src.ctypes.data, ROW)])
        c = collect_one(engine, 2)
        assert c.success, c.error
        assert engine.stats()["o_direct_fallbacks"] == 0
        _dst_owner, dst = rows(1, aligned=True, seed=None)
        engine.submit_load(3, [(path, key, dst.ctypes.data, ROW)])
        assert collect_one(engine, 3).success
        assert np.array_equal(dst, src)
    finally:
        engine.shutdown()

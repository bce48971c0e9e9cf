"""Loads and stores under a deadline on a file system that holds only memory (docs/core.md,
"Loads from memory", "Stores to memory"): on tmpfs without swap the worker reads straight
into the caller's memory, and writes straight from it, instead of through its arena, with
the CRC32C taken there. Real tmpfs mounts, real files.

`memory_fs_loads` and `memory_fs_stores` (stats counters) say which path a block took; every
test also checks the bytes, so a path that ran but moved the wrong bytes fails too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from block_files import skip_on_memory_fs
from kvtier import _core
from kvtier.tiering.fs.engine import io_uring_refusal

PAGE = 4096
WAIT_S = 60.0


def _swap_configured() -> bool:
    with open("/proc/swaps") as f:
        return len(f.read().splitlines()) > 1


pytestmark = pytest.mark.skipif(
    _swap_configured(), reason="swap is configured: tmpfs reads may wait for it (arena path)"
)


class Buffer:
    """n rows of `size` bytes in one page-aligned numpy array."""

    def __init__(self, n: int, size: int) -> None:
        self._raw = np.zeros(n * size + PAGE, dtype=np.uint8)
        start = (-self._raw.ctypes.data) % PAGE
        self.rows = self._raw[start : start + n * size].reshape(n, size)
        self.size = size

    def blocks(self, paths: list[Path], keys: list[bytes]) -> list[tuple]:
        base = self.rows.ctypes.data
        return [
            (str(p), k, base + i * self.size, self.size)
            for i, (p, k) in enumerate(zip(paths, keys))
        ]


def _collect(engine, job_id: int):
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for c in engine.pop_completions():
            assert c.job_id == job_id
            return c
        time.sleep(0.001)
    raise AssertionError(f"job {job_id} not reported within {WAIT_S} s")


def _paths(root: Path, n: int) -> tuple[list[Path], list[bytes]]:
    paths = [root / "blocks" / f"{i % 3:02x}" / f"b{i}.kvb" for i in range(n)]
    return paths, [b"key-%d" % i + bytes([i, 0, 0, 1]) for i in range(n)]


def _store(engine, root: Path, n: int, size: int, seed: int):
    src = Buffer(n, size)
    src.rows[:] = np.random.default_rng(seed).integers(0, 256, src.rows.shape, dtype=np.uint8)
    paths, keys = _paths(root, n)
    engine.submit_store(1, src.blocks(paths, keys))
    assert _collect(engine, 1).success
    return src, paths, keys


def _through_memory_fs(engine, root: Path, n: int, size: int, seed: int) -> tuple[int, int]:
    """Stores n blocks, loads them back into fresh rows, checks the bytes and that no tmp file
    is left; returns how many blocks took the memory path each way (the engine's
    `memory_fs_stores` and `memory_fs_loads`)."""
    src, paths, keys = _store(engine, root, n, size, seed)
    dst = Buffer(n, size)
    engine.submit_load(2, dst.blocks(paths, keys))
    c = _collect(engine, 2)
    assert c.success, c.error
    assert np.array_equal(dst.rows, src.rows)
    assert sorted(p for p in (root / "blocks").rglob("*") if p.is_file()) == sorted(paths)
    stats = engine.stats()
    return int(stats["memory_fs_stores"]), int(stats["memory_fs_loads"])


@pytest.mark.parametrize("io_engine", ["psync", "io_uring"])
@pytest.mark.parametrize("size", [256 << 10, (2 << 20) + 100])
def test_stores_and_loads_on_tmpfs_skip_the_arena_and_arrive_whole(
    tmpfs_mount: Path, io_engine: str, size: int
) -> None:
    if io_engine == "io_uring" and (reason := io_uring_refusal(tmpfs_mount / "probe")):
        pytest.skip(f"io_uring is refused here: {reason}")
    engine = _core.Engine(str(tmpfs_mount), n_read_threads=2, n_write_threads=2,
                          io_engine=io_engine, io_timeout_s=10.0)  # fmt: skip
    try:
        assert _through_memory_fs(engine, tmpfs_mount, 6, size, seed=size) == (6, 6)
    finally:
        engine.shutdown()


def test_a_disk_root_uses_the_arena(tmp_path: Path) -> None:
    """The counter can fail: a root that is not memory (the test's own directory, a disk
    here; skipped where tmp_path is itself a tmpfs) takes the arena path."""
    skip_on_memory_fs(tmp_path)
    engine = _core.Engine(str(tmp_path), n_read_threads=1, n_write_threads=1, io_timeout_s=10.0)
    try:
        assert _through_memory_fs(engine, tmp_path, 3, 256 << 10, seed=1) == (0, 0)
    finally:
        engine.shutdown()


@contextlib.contextmanager
def _mounted_below(root: Path, mount_args: list[str]) -> Iterator[Path]:
    """``mount <mount_args> root/blocks`` for the block files' first directory level, where
    the root's engine finds it after the open; skipped where this machine cannot mount."""
    below = root / "blocks"
    below.mkdir()
    if subprocess.run(["mount", *mount_args, str(below)]).returncode != 0:
        pytest.skip(f"cannot mount {' '.join(mount_args)} here")
    try:
        yield below
    finally:
        subprocess.run(["umount", "-l", str(below)])


def _through_below(root: Path, seed: int) -> tuple[int, int]:
    """Of 3 blocks of 256 KiB stored and loaded back under a deadline by an engine on
    ``root``, how many took the memory path each way."""
    engine = _core.Engine(str(root), n_read_threads=1, n_write_threads=1, io_timeout_s=10.0)
    try:
        return _through_memory_fs(engine, root, 3, 256 << 10, seed=seed)
    finally:
        engine.shutdown()


def test_a_second_tmpfs_mounted_below_a_tmpfs_root_is_asked_per_file(tmpfs_mount: Path) -> None:
    """A file on another file system than the root's (its st_dev differs) is asked itself
    (fstatfs), not judged by the root's type learnt at start: a tmpfs of its own below a tmpfs
    root still stores and loads from memory, every block of the batch."""
    with _mounted_below(tmpfs_mount, ["-t", "tmpfs", "-o", "size=16m", "tmpfs"]) as below:
        assert os.stat(below).st_dev != os.stat(tmpfs_mount).st_dev
        assert _through_below(tmpfs_mount, seed=3) == (3, 3)


def test_a_disk_directory_bound_below_a_tmpfs_root_uses_the_arena(
    tmpfs_mount: Path, tmp_path: Path
) -> None:
    """A file system mounted below a memory root (here a bind mount of a disk directory) is
    found per file, after the open: those loads and stores go through the arena under the
    deadline (a store's tmp file, created there before it was judged, is removed first)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    skip_on_memory_fs(disk)
    with _mounted_below(tmpfs_mount, ["--bind", str(disk)]):
        assert _through_below(tmpfs_mount, seed=2) == (0, 0)


@pytest.mark.parametrize("io_engine", ["psync", "io_uring"])
def test_a_corrupt_payload_on_tmpfs_fails_and_its_file_goes(
    tmpfs_mount: Path, io_engine: str
) -> None:
    if io_engine == "io_uring" and (reason := io_uring_refusal(tmpfs_mount / "probe")):
        pytest.skip(f"io_uring is refused here: {reason}")
    engine = _core.Engine(str(tmpfs_mount), n_read_threads=1, n_write_threads=1,
                          io_engine=io_engine, io_timeout_s=10.0)  # fmt: skip
    try:
        src, paths, keys = _store(engine, tmpfs_mount, 2, 256 << 10, seed=3)
        with open(paths[1], "r+b") as f:
            f.seek(PAGE + 12345)
            byte = f.read(1)
            f.seek(PAGE + 12345)
            f.write(bytes([byte[0] ^ 0x01]))
        dst = Buffer(2, 256 << 10)
        engine.submit_load(2, dst.blocks(paths, keys))
        c = _collect(engine, 2)
        assert not c.success
        assert list(c.block_errnos) == [0, errno.EBADMSG]
        assert c.operation == "verify" and "checksum" in c.message
        assert np.array_equal(dst.rows[0], src.rows[0])
        assert paths[0].exists() and not paths[1].exists()
        stats = engine.stats()
        assert stats["corrupt_files_removed"] == 1
        assert stats["memory_fs_loads"] == 1
    finally:
        engine.shutdown()


@pytest.mark.parametrize("io_timeout_s", [10.0, 0.0], ids=["deadline", "no deadline"])
@pytest.mark.parametrize("where", ["a later piece", "the last byte"])
def test_a_byte_flipped_past_the_first_piece_fails_the_block(
    tmpfs_mount: Path, where: str, io_timeout_s: float
) -> None:
    """A file that holds only memory is read and checked 256 KiB at a time (psync_engine.cpp,
    kCrcPieceBytes), under a deadline and without one: a flipped byte in any piece, the
    partial last page included, fails the block; the other block of the job arrives whole."""
    size = (1 << 20) + 100
    engine = _core.Engine(str(tmpfs_mount), n_read_threads=1, n_write_threads=1,
                          io_engine="psync", io_timeout_s=io_timeout_s)  # fmt: skip
    try:
        src, paths, keys = _store(engine, tmpfs_mount, 2, size, seed=5)
        offset = PAGE + (3 * (256 << 10) + 777 if where == "a later piece" else size - 1)
        with open(paths[0], "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x80]))
        dst = Buffer(2, size)
        engine.submit_load(2, dst.blocks(paths, keys))
        c = _collect(engine, 2)
        assert not c.success
        assert list(c.block_errnos) == [errno.EBADMSG, 0]
        assert c.operation == "verify" and "checksum" in c.message
        assert np.array_equal(dst.rows[1], src.rows[1])
        assert not paths[0].exists() and paths[1].exists()
        # `memory_fs_loads` counts only the deadline's loads from memory (the intact block);
        # without a deadline every load is read in place and none is counted.
        assert engine.stats()["memory_fs_loads"] == (1 if io_timeout_s else 0)
    finally:
        engine.shutdown()


def test_a_truncated_file_on_tmpfs_fails_the_block(tmpfs_mount: Path) -> None:
    engine = _core.Engine(str(tmpfs_mount), n_read_threads=1, n_write_threads=1,
                          io_timeout_s=10.0)  # fmt: skip
    try:
        _, paths, keys = _store(engine, tmpfs_mount, 1, 2 << 20, seed=4)
        os.truncate(paths[0], PAGE + (1 << 20))
        dst = Buffer(1, 2 << 20)
        engine.submit_load(2, dst.blocks(paths, keys))
        c = _collect(engine, 2)
        assert not c.success
        assert c.errno == errno.EBADMSG and "truncated" in c.message
        assert engine.stats()["memory_fs_loads"] == 0
    finally:
        engine.shutdown()


_TRUNCATING_CO_TENANT = textwrap.dedent(
    """
    import os, sys, threading, time
    import numpy as np
    sys.path.insert(0, sys.argv[2])
    from test_memory_fs import Buffer, _collect, _store
    from kvtier import _core
    from pathlib import Path

    root = Path(sys.argv[1])
    engine = _core.Engine(str(root), n_read_threads=2, n_write_threads=1, io_timeout_s=10.0)
    src, paths, keys = _store(engine, root, 4, 2 << 20, seed=5)
    good = [p.read_bytes() for p in paths]
    stop = threading.Event()

    def co_tenant():
        # Truncates and rewrites the block files in place while they are loaded, as a
        # hostile process sharing the root could (kvtier itself never truncates them).
        i = 0
        while not stop.is_set():
            p = paths[i % 4]
            i += 1
            try:
                fd = os.open(p, os.O_WRONLY)
            except FileNotFoundError:  # removed as corrupt: the main loop writes it back
                continue
            try:
                os.ftruncate(fd, PAGE_CUT[i % len(PAGE_CUT)])
                os.pwrite(fd, good[(i - 1) % 4], 0)
            finally:
                os.close(fd)

    PAGE_CUT = [0, 4096, 4096 + 12345, 1 << 20]
    t = threading.Thread(target=co_tenant)
    t.start()
    ok = failed = 0
    dst = Buffer(4, 2 << 20)
    for job in range(2, 202):
        engine.submit_load(job, dst.blocks(paths, keys))
        c = _collect(engine, job)
        for i, e in enumerate(c.block_errnos):
            if e == 0:
                assert np.array_equal(dst.rows[i], src.rows[i]), "a block loaded wrong bytes"
                ok += 1
            else:
                assert e in (2, 74), e  # ENOENT (removed as corrupt), EBADMSG
                failed += 1
        # A block removed as corrupt is written back for the next round.
        for p, g in zip(paths, good):
            if not p.exists():
                p.write_bytes(g)
    stop.set()
    t.join()
    engine.shutdown()
    print("ok", ok, "failed", failed, "memory", engine.stats()["memory_fs_loads"])
    """
)


def test_a_co_tenant_truncating_files_mid_load_never_crashes(tmpfs_mount: Path) -> None:
    """pread of a file that shrinks returns short (never SIGBUS, as a mapping would): each
    block either arrives whole and verified or fails. In a subprocess, so a crash is seen."""
    proc = subprocess.run(
        [sys.executable, "-c", _TRUNCATING_CO_TENANT, str(tmpfs_mount), str(Path(__file__).parent)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[0] == "ok" and int(words[1]) + int(words[3]) == 800
    assert int(words[3]) > 0  # the co-tenant did cut files under the loads
    assert int(words[5]) > 0  # the memory path ran


def test_a_full_tmpfs_fails_the_store_and_leaves_no_tmp_file(tmp_path: Path) -> None:
    """A store written from the caller's memory into a tmpfs that fills up (size=1m) fails
    with ENOSPC, blocks that fit are stored, and the failed block's tmp file is gone."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)]).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        engine = _core.Engine(str(mnt), n_read_threads=1, n_write_threads=1, io_timeout_s=10.0)
        try:
            src = Buffer(3, 384 << 10)
            src.rows[:] = 7
            paths, keys = _paths(mnt, 3)
            engine.submit_store(1, src.blocks(paths, keys))
            c = _collect(engine, 1)
            assert not c.success
            assert errno.ENOSPC in c.block_errnos and 0 in c.block_errnos, c.block_errnos
            stored = [p for p, e in zip(paths, c.block_errnos) if e == 0]
            files = sorted(p for p in (mnt / "blocks").rglob("*") if p.is_file())
            assert files == sorted(stored)  # no tmp file of the failed block left
            assert engine.stats()["memory_fs_stores"] == len(stored)
        finally:
            engine.shutdown()
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


def test_stores_to_tmpfs_from_several_threads_arrive_whole(tmpfs_mount: Path) -> None:
    """Four threads submit stores on one engine at once, then load every block back: each
    byte-exact, every block through the memory path both ways."""
    engine = _core.Engine(str(tmpfs_mount), n_read_threads=2, n_write_threads=2,
                          io_timeout_s=10.0)  # fmt: skip
    jobs, size = 8, 64 << 10
    results: dict[int, list[tuple[Path, bytes, np.ndarray]]] = {}
    lock = threading.Lock()

    def submitter(t: int) -> None:
        for j in range(jobs):
            src = Buffer(4, size)
            src.rows[:] = np.random.default_rng(t * 100 + j).integers(0, 256, src.rows.shape,
                                                                      dtype=np.uint8)  # fmt: skip
            paths = [tmpfs_mount / "blocks" / f"t{t}" / f"j{j}b{i}.kvb" for i in range(4)]
            keys = [b"t%dj%db%d" % (t, j, i) for i in range(4)]
            with lock:
                results[t * jobs + j] = [(p, k, src.rows[i]) for i, (p, k) in
                                         enumerate(zip(paths, keys))]  # fmt: skip
            engine.submit_store(1000 + t * jobs + j, src.blocks(paths, keys))

    try:
        threads = [threading.Thread(target=submitter, args=(t,)) for t in range(4)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        done: list = []
        deadline = time.monotonic() + WAIT_S
        while len(done) < 4 * jobs:
            assert time.monotonic() < deadline, f"{len(done)} of {4 * jobs} stores reported"
            done += engine.pop_completions()
            time.sleep(0.001)
        assert all(c.success for c in done), [c.error for c in done if not c.success]
        for n, blocks in sorted(results.items()):
            dst = Buffer(4, size)
            engine.submit_load(n, dst.blocks([b[0] for b in blocks], [b[1] for b in blocks]))
            c = _collect(engine, n)
            assert c.success, c.error
            for i, (_, _, row) in enumerate(blocks):
                assert np.array_equal(dst.rows[i], row)
        stats = engine.stats()
        assert stats["memory_fs_stores"] == stats["memory_fs_loads"] == 4 * jobs * 4
    finally:
        engine.shutdown()

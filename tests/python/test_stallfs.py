"""The stall file system itself (tests/stallfs/stallfs.c and the stallfs fixtures): a real
FUSE mount whose operations block while frozen, fail with a chosen errno, slow down, and can
be aborted; its teardown leaves nothing behind; what FUSE does with O_DIRECT, locks,
RENAME_NOREPLACE and openat2; and the fs tier storing and loading through it."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import mmap
import os
import struct
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec
from stallfs import WAIT_SECONDS, StallFS

PAYLOAD = os.urandom(3 * 4096 + 123)


class Call(threading.Thread):
    """Runs ``fn`` on a thread and keeps its result or OSError, so a test can watch it block."""

    def __init__(self, fn) -> None:
        super().__init__(daemon=True)
        self._fn = fn
        self.result: object = None
        self.error: OSError | None = None

    def run(self) -> None:
        try:
            self.result = self._fn()
        except OSError as e:
            self.error = e


def still_blocked(call: Call) -> bool:
    """True if ``call`` has not returned after a generous wait (never a timing assertion: a
    call that is really frozen never returns, however long this waits)."""
    call.join(1.0)
    return call.is_alive()


def in_mountinfo(path: Path) -> bool:
    return f" {path} " in Path("/proc/self/mountinfo").read_text()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_write_and_read_round_trip(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "sub" / "file"
    path.parent.mkdir()
    path.write_bytes(PAYLOAD)
    assert path.read_bytes() == PAYLOAD
    assert (stallfs.backing / "sub" / "file").read_bytes() == PAYLOAD  # a passthrough
    assert os.listdir(stallfs.mountpoint / "sub") == ["file"]
    fd = os.open(path, os.O_RDWR)
    try:
        assert os.pwritev(fd, [b"ab", b"cd"], 10) == 4
        assert os.preadv(fd, [bytearray(2), bytearray(2)], 10) == 4
        assert os.pread(fd, 4, 10) == b"abcd"
        os.fsync(fd)
        os.fdatasync(fd)
    finally:
        os.close(fd)
    os.utime(path, ns=(1_000_000_123, 2_000_000_456))
    os.chmod(path, 0o640)
    st = os.stat(path)
    assert (st.st_mtime_ns, st.st_mode & 0o777) == (2_000_000_456, 0o640)
    assert os.statvfs(stallfs.mountpoint).f_bsize > 0
    os.unlink(path)
    assert not (stallfs.backing / "sub" / "file").exists()


def test_frozen_read_blocks_until_thaw_and_returns_the_bytes(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "f"
    path.write_bytes(PAYLOAD)
    fd = os.open(path, os.O_RDONLY)
    try:
        stallfs.freeze("data")
        read = Call(lambda: os.pread(fd, len(PAYLOAD), 0))
        read.start()
        stallfs.wait_blocked(1)
        assert still_blocked(read)
        # Only data is frozen: metadata still answers.
        assert os.stat(path).st_size == len(PAYLOAD)
        stallfs.thaw()
        read.join(WAIT_SECONDS)
        assert not read.is_alive()
        assert read.error is None
        assert read.result == PAYLOAD
    finally:
        stallfs.thaw()  # first: a close flushes, and a flush is data
        os.close(fd)


def test_frozen_metadata_blocks_a_stat_in_another_process(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "f"
    path.write_bytes(b"x" * 10)
    stallfs.freeze("meta")
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, sys; print(os.stat(sys.argv[1]).st_size)", str(path)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        stallfs.wait_blocked(1)
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(1.0)  # frozen: it cannot have returned
        stallfs.thaw()
        out, _ = child.communicate(timeout=WAIT_SECONDS)
        assert child.returncode == 0
        assert out.strip() == "10"
    finally:
        stallfs.thaw()  # first: a killed caller waits for its answer all the same
        child.kill()
        child.wait()


def test_a_frozen_read_blocks_only_itself(stallfs: StallFS) -> None:
    # With data frozen, metadata operations on the very file being read still answer (a
    # daemon on libfuse's path API would hold them behind the read's path lock).
    path = stallfs.mountpoint / "x"
    path.write_bytes(PAYLOAD)
    fd = os.open(path, os.O_RDONLY)
    try:
        stallfs.freeze("data")
        read = Call(lambda: os.pread(fd, len(PAYLOAD), 0))
        read.start()
        stallfs.wait_blocked(1)
        rename = Call(lambda: os.rename(path, stallfs.mountpoint / "y"))
        rename.start()
        rename.join(WAIT_SECONDS)
        assert not rename.is_alive(), "a rename waited for a frozen read of the same file"
        assert rename.error is None
        os.unlink(stallfs.mountpoint / "y")
        assert still_blocked(read)
        stallfs.thaw()
        read.join(WAIT_SECONDS)
        assert (read.error, read.result) == (None, PAYLOAD)  # the open file outlives its name
    finally:
        stallfs.thaw()  # first: a close flushes, and a flush is data
        os.close(fd)
    assert os.listdir(stallfs.backing) == []  # and leaves no hidden name behind


def test_sigkill_does_not_free_a_frozen_caller_but_thaw_does(stallfs: StallFS) -> None:
    (stallfs.mountpoint / "f").write_bytes(PAYLOAD)
    stallfs.freeze("data")
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; open(sys.argv[1], 'rb').read()"]
        + [str(stallfs.mountpoint / "f")]
    )
    try:
        stallfs.wait_blocked(1)
        reader.kill()
        # The daemon has taken the request: the kernel waits for its answer even for a
        # killed caller (uninterruptibly, in request_wait_answer).
        with pytest.raises(subprocess.TimeoutExpired):
            reader.wait(1.0)
        stallfs.thaw()
        assert reader.wait(WAIT_SECONDS) == -9
    finally:
        stallfs.thaw()
        reader.kill()
        reader.wait()


def test_freeze_all_blocks_writes_too(stallfs: StallFS) -> None:
    fd = os.open(stallfs.mountpoint / "w", os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        stallfs.freeze()
        write = Call(lambda: os.pwrite(fd, PAYLOAD, 0))
        write.start()
        stallfs.wait_blocked(1)
        assert still_blocked(write)
        assert not (stallfs.backing / "w").read_bytes()  # nothing reached the backing file
        stallfs.thaw()
        write.join(WAIT_SECONDS)
        assert (write.error, write.result) == (None, len(PAYLOAD))
    finally:
        stallfs.thaw()  # first: a close flushes, and a flush is data
        os.close(fd)
    assert (stallfs.backing / "w").read_bytes() == PAYLOAD


def test_fail_gives_the_chosen_errno_per_class_and_path(stallfs: StallFS) -> None:
    (stallfs.mountpoint / "a.kvb").write_bytes(b"a")
    (stallfs.mountpoint / "b.json").write_bytes(b"b")
    stallfs.fail(errno.EIO, "data")
    with pytest.raises(OSError) as read_error:
        (stallfs.mountpoint / "a.kvb").read_bytes()
    assert read_error.value.errno == errno.EIO
    assert (stallfs.mountpoint / "a.kvb").stat().st_size == 1  # metadata unaffected
    stallfs.fail(errno.ENOSPC, "data")
    fd = os.open(stallfs.mountpoint / "a.kvb", os.O_WRONLY)
    with pytest.raises(OSError) as write_error:
        os.pwrite(fd, b"zz", 0)
    assert write_error.value.errno == errno.ENOSPC
    with pytest.raises(OSError) as close_error:  # close(2) flushes: a data operation too
        os.close(fd)
    assert close_error.value.errno == errno.ENOSPC
    stallfs.fail(errno.EACCES, "meta")
    stallfs.match(".kvb")  # only block-like names fail; others work
    assert (stallfs.mountpoint / "b.json").read_bytes() == b"b"
    with pytest.raises(OSError) as open_error:
        os.open(stallfs.mountpoint / "c.kvb", os.O_CREAT | os.O_WRONLY, 0o600)
    assert open_error.value.errno == errno.EACCES
    stallfs.fail(0)
    stallfs.match(None)
    assert (stallfs.mountpoint / "a.kvb").read_bytes() == b"a"
    assert stallfs.status()["fail"] == "0:none"


def test_delay_slows_each_operation_and_lets_it_through(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "d"
    path.write_bytes(PAYLOAD)
    fd = os.open(path, os.O_RDONLY)
    try:
        stallfs.delay(300, "data")
        start = time.monotonic()
        data = os.pread(fd, len(PAYLOAD), 0)
        # A lower bound only: the daemon sleeps at least this long before it answers.
        assert time.monotonic() - start >= 0.3
        assert data == PAYLOAD
        assert stallfs.status()["delay"] == "300:data"
    finally:
        os.close(fd)


def test_abort_frees_a_blocked_caller(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "f"
    path.write_bytes(PAYLOAD)
    fd = os.open(path, os.O_RDONLY)
    try:
        stallfs.freeze()
        read = Call(lambda: os.pread(fd, 10, 0))
        read.start()
        stallfs.wait_blocked(1)
        stallfs.abort()
        read.join(WAIT_SECONDS)
        assert not read.is_alive()
        assert read.error is not None, read.result
        assert read.error.errno in (errno.ECONNABORTED, errno.ENOTCONN)
        with pytest.raises(OSError) as later:
            os.stat(path)
        assert later.value.errno == errno.ENOTCONN
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            stallfs.thaw()  # where the abort failed, close's flush must not block for good
        with contextlib.suppress(OSError):  # released, though flush reports ENOTCONN
            os.close(fd)


def test_teardown_with_a_caller_still_blocked_leaves_nothing(make_stallfs) -> None:
    mount: StallFS = make_stallfs()
    (mount.mountpoint / "f").write_bytes(PAYLOAD)
    mount.freeze()
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; print(len(open(sys.argv[1], 'rb').read()))"]
        + [str(mount.mountpoint / "f")],
        stdout=subprocess.PIPE,
        text=True,
    )
    mount.wait_blocked(1)
    mount.close()
    assert not in_mountinfo(mount.mountpoint)
    assert not alive(mount.process.pid)
    out, _ = reader.communicate(timeout=WAIT_SECONDS)  # thawed by the teardown
    assert (reader.returncode, out.strip()) == (0, str(len(PAYLOAD)))


def test_teardown_of_a_stopped_daemon_aborts_the_blocked_caller(make_stallfs) -> None:
    mount: StallFS = make_stallfs()
    (mount.mountpoint / "f").write_bytes(PAYLOAD)
    fd = os.open(mount.mountpoint / "f", os.O_RDONLY)
    try:
        mount.freeze()
        read = Call(lambda: os.pread(fd, 10, 0))
        read.start()
        mount.wait_blocked(1)
        mount.stop_daemon()  # no thaw can come now: only the abort frees the reader
        mount.close()
        read.join(WAIT_SECONDS)
        assert not read.is_alive()
        assert read.error is not None and read.error.errno in (errno.ECONNABORTED, errno.ENOTCONN)
    finally:
        with contextlib.suppress(OSError):
            os.close(fd)
    assert not in_mountinfo(mount.mountpoint)
    assert not alive(mount.process.pid)


_FAILING_TEST = textwrap.dedent(
    """
    import json, os, threading

    def test_leaves_a_blocked_thread(stallfs):
        (stallfs.mountpoint / "f").write_bytes(b"x")
        fd = os.open(stallfs.mountpoint / "f", os.O_RDONLY)
        stallfs.freeze()
        threading.Thread(target=os.pread, args=(fd, 1, 0), daemon=True).start()
        stallfs.wait_blocked(1)
        stallfs.stop_daemon()
        with open(os.environ["STALLFS_RECORD"], "w") as f:
            json.dump({"mount": str(stallfs.mountpoint), "pid": stallfs.process.pid}, f)
        assert False, "this test fails on purpose with a caller blocked in the mount"
    """
)


def test_fixture_teardown_after_a_failed_test_leaves_nothing(tmp_path: Path) -> None:
    tests = Path(__file__).resolve().parent
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(tests)!r})\n"
        "from stallfs import make_stallfs, stallfs, stallfs_binary  # noqa: F401\n"
    )
    (tmp_path / "test_inner.py").write_text(_FAILING_TEST)
    record = tmp_path / "record.json"
    inner = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, STALLFS_RECORD=str(record)),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert inner.returncode == 1, inner.stdout + inner.stderr  # the inner test failed
    assert "fails on purpose" in inner.stdout
    assert "error" not in inner.stdout.splitlines()[-1], inner.stdout  # teardown did not
    seen = json.loads(record.read_text())
    assert not in_mountinfo(Path(seen["mount"]))
    assert not alive(seen["pid"])


# ---- what FUSE does here with what kvtier relies on -----------------------------------------


def test_large_directories_list_completely(stallfs: StallFS) -> None:
    names = {
        f"block-{i:05d}-with-a-long-name-to-fill-the-reply-buffers-sooner" for i in range(3000)
    }
    for name in names:
        (stallfs.backing / name).write_bytes(b"")
    assert set(os.listdir(stallfs.mountpoint)) == names  # several readdir replies
    os.link(stallfs.mountpoint / min(names), stallfs.mountpoint / "hard")
    assert os.stat(stallfs.mountpoint / "hard").st_nlink == 2


def test_o_direct_opens_work_and_take_any_alignment(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "direct"
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_DIRECT, 0o600)
    try:
        page = mmap.mmap(-1, 8192)
        page.write(PAYLOAD[:8192])
        assert os.pwritev(fd, [page], 0) == 8192
        # FUSE has no block size to enforce: misaligned offsets and lengths pass as well.
        assert os.pwrite(fd, b"abc", 3) == 3
        assert os.pread(fd, 5, 1) == PAYLOAD[1:3] + b"abc"
    finally:
        os.close(fd)


def test_o_excl_create_and_rename_noreplace(stallfs: StallFS) -> None:
    a, b = stallfs.mountpoint / "a", stallfs.mountpoint / "b"
    os.close(os.open(a, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
    with pytest.raises(FileExistsError):
        os.open(a, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    b.write_bytes(b"b")
    libc = ctypes.CDLL(None, use_errno=True)
    rename_noreplace = 1
    at_fdcwd = -100
    assert libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(b), rename_noreplace) == -1
    assert ctypes.get_errno() == errno.EEXIST
    assert b.read_bytes() == b"b"
    c = stallfs.mountpoint / "c"
    assert libc.renameat2(at_fdcwd, bytes(a), at_fdcwd, bytes(c), rename_noreplace) == 0
    assert c.exists() and not a.exists()


def test_openat2_resolve_beneath_refuses_planted_links(stallfs: StallFS) -> None:
    root = stallfs.mountpoint / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_bytes(b"f")
    os.symlink("d/f", root / "link")
    assert os.readlink(root / "link") == "d/f"
    resolve_beneath, resolve_no_symlinks = 0x08, 0x04
    how = struct.pack("QQQ", os.O_RDONLY, 0, resolve_beneath | resolve_no_symlinks)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    dirfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:

        def openat2(name: bytes) -> int:
            fd = libc.syscall(437, dirfd, name, how, len(how))  # openat2: 437 everywhere
            if fd >= 0:
                os.close(fd)
                return 0
            return ctypes.get_errno()

        assert openat2(b"d/f") == 0
        assert openat2(b"link") == errno.ELOOP
        assert openat2(b"../root/d/f") == errno.EXDEV
    finally:
        os.close(dirfd)


def test_locks_are_kept_by_the_kernel_and_never_freeze(stallfs: StallFS) -> None:
    path = stallfs.mountpoint / "lock"
    path.write_bytes(b"l")
    first, second = os.open(path, os.O_RDWR), os.open(path, os.O_RDWR)
    try:
        stallfs.freeze()
        ofd_setlk = 37  # F_OFD_SETLK
        lock = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
        fcntl.fcntl(first, ofd_setlk, lock)  # answered while frozen: never sent to the daemon
        with pytest.raises(OSError) as busy:
            fcntl.fcntl(second, ofd_setlk, lock)
        assert busy.value.errno in (errno.EAGAIN, errno.EACCES)
        with pytest.raises(OSError) as posix_busy:  # a POSIX lock meets the same lock table
            fcntl.lockf(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert posix_busy.value.errno in (errno.EAGAIN, errno.EACCES)
        fcntl.flock(first, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(BlockingIOError):
            fcntl.flock(second, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert stallfs.status()["blocked"] == 0
    finally:
        stallfs.thaw()
        os.close(first)
        os.close(second)


# ---- kvtier's fs tier through the mount ------------------------------------------------------

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
CTX = ReqContext("req-0")


@pytest.mark.parametrize("direct_io", [False, True], ids=["cached", "direct_io"])
def test_fs_tier_stores_and_loads_through_the_mount(
    make_stallfs, io_engine: str, collect_results, direct_io: bool
) -> None:
    mount: StallFS = make_stallfs(direct_io=direct_io)
    rows = np.random.default_rng(7).integers(0, 256, (8, 5000), dtype=np.uint8)
    config = {
        "type": "fs",
        "root_dir": str(mount.mountpoint / "root"),
        "n_read_threads": 2,
        "n_write_threads": 2,
        "io_engine": io_engine,
        "o_direct": "auto",
    }
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), SPEC)
    try:
        keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(4)]
        tier.submit_store(JobMetadata(1, keys, np.arange(4, dtype=np.int64), False, CTX))
        assert collect_results(tier, [1])[1].success
        assert all(tier.lookup(k, CTX) for k in keys)
        for k in keys:  # every block file went through the daemon to the backing directory
            name = Path(tier.file_mapper.get_file_name(k)).relative_to(mount.mountpoint)
            assert (mount.backing / name).stat().st_size > rows.shape[1]
        tier.submit_load(JobMetadata(2, keys, np.arange(4, 8, dtype=np.int64), False, CTX))
        result = collect_results(tier, [2])[2]
        assert result.success, result.error
        assert np.array_equal(rows[4:8], rows[0:4])
        assert mount.status()["ops"] > 0
    finally:
        tier.shutdown()


def test_fs_tier_block_io_parks_in_a_frozen_mount_and_finishes_after_thaw(
    stallfs: StallFS, io_engine: str, collect_results
) -> None:
    rows = np.random.default_rng(8).integers(0, 256, (4, 5000), dtype=np.uint8)
    config = {
        "type": "fs",
        "root_dir": str(stallfs.mountpoint / "root"),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_engine": io_engine,
    }
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), SPEC)
    try:
        keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(2)]
        stallfs.match(".kvb")  # block files (and their tmp files) only
        stallfs.freeze("data")
        tier.submit_store(JobMetadata(1, keys, np.arange(2, dtype=np.int64), False, CTX))
        stallfs.wait_blocked(1)  # a worker's write is held in the kernel
        stallfs.thaw()
        assert collect_results(tier, [1])[1].success
        stallfs.freeze("data")
        tier.submit_load(JobMetadata(2, keys, np.arange(2, 4, dtype=np.int64), False, CTX))
        stallfs.wait_blocked(1)  # and a read
        stallfs.thaw()
        result = collect_results(tier, [2])[2]
        assert result.success, result.error
        assert np.array_equal(rows[2:4], rows[0:2])
    finally:
        stallfs.thaw()
        tier.shutdown()

"""What GlusterFS (two FUSE mounts of one volume, .ci/glusterfs.sh) does for each file-system
semantic kvtier relies on: OFD and POSIX locks across mounts, rename into place seen from the
other mount, mtime set from the other mount, O_DIRECT, statvfs. docs/tiers.md ("Shared file
systems: what GlusterFS showed") records the results and names these tests."""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from gluster import _FLOCK, F_OFD_GETLK, GLUSTER_DIR, Volume, host_prefix, volume_fixture
from kvtier import _core

F_OFD_SETLK = 37
A, B = "hostA", "hostB"


@pytest.fixture(scope="session")
def gluster() -> Iterator[Volume]:
    yield from volume_fixture()


def _ofd(fd: int, cmd: int, kind: int) -> int:
    """One OFD lock call on the whole file; returns the l_type it reports."""
    got = fcntl.fcntl(fd, cmd, struct.pack(_FLOCK, kind, os.SEEK_SET, 0, 0, 0))
    return int(struct.unpack(_FLOCK, got)[0])


def test_ofd_locks_exclude_across_mounts(gluster: Volume) -> None:
    d = gluster.fresh_dir("sem-ofd")
    fa = os.open(d[A] / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    fb = os.open(d[B] / "lock", os.O_RDWR)
    try:
        _ofd(fa, F_OFD_SETLK, fcntl.F_WRLCK)
        assert _ofd(fb, F_OFD_GETLK, fcntl.F_WRLCK) == fcntl.F_WRLCK  # B sees A's lock
        with pytest.raises(OSError) as refused:
            _ofd(fb, F_OFD_SETLK, fcntl.F_WRLCK)
        assert refused.value.errno in (errno.EAGAIN, errno.EACCES)
        _ofd(fa, F_OFD_SETLK, fcntl.F_UNLCK)
        assert _ofd(fb, F_OFD_GETLK, fcntl.F_WRLCK) == fcntl.F_UNLCK
        _ofd(fb, F_OFD_SETLK, fcntl.F_WRLCK)  # now B gets it
    finally:
        os.close(fa)
        os.close(fb)


def test_posix_lock_of_a_process_on_one_host_excludes_the_other(gluster: Volume) -> None:
    """A POSIX lock (what today's ledger and evictor lock take) held by a process on host A
    is seen by F_OFD_GETLK on host B, and goes when that process is SIGKILLed."""
    import subprocess
    import sys

    d = gluster.fresh_dir("sem-posix")
    (d[A] / "lock").write_bytes(b"")
    holder = subprocess.Popen(
        [
            *host_prefix(A),
            sys.executable,
            "-c",
            "import fcntl, sys, time; f = open(sys.argv[1], 'r+'); "
            "fcntl.lockf(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
            str(d[A] / "lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    fb = os.open(d[B] / "lock", os.O_RDWR)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        assert _ofd(fb, F_OFD_GETLK, fcntl.F_WRLCK) == fcntl.F_WRLCK
        holder.kill()
        holder.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _ofd(fb, F_OFD_GETLK, fcntl.F_WRLCK) != fcntl.F_UNLCK:
            assert time.monotonic() < deadline, "a killed holder's lock was never freed"
            time.sleep(0.01)
    finally:
        os.close(fb)
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_rename_into_place_is_never_seen_partial_from_the_other_mount(gluster: Volume) -> None:
    """A writes a tmp file and renames it over the final name, 200 times; B reads the final
    name throughout and must only ever see a whole version (ESTALE is retried and counted)."""
    d = gluster.fresh_dir("sem-rename")
    size = 64 << 10
    final_a, final_b = d[A] / "block", d[B] / "block"
    final_a.write_bytes(bytes([0]) * size)
    partial = estale = reads = 0
    for v in range(1, 201):
        tmp = d[A] / f"block.{v}.tmp"
        tmp.write_bytes(bytes([v % 256]) * size)
        os.rename(tmp, final_a)
        for _ in range(3):
            try:
                data = final_b.read_bytes()
            except OSError as e:
                if e.errno != errno.ESTALE:
                    raise
                estale += 1
                continue
            reads += 1
            partial += len(data) != size or len(set(data)) != 1
    assert reads > 0
    assert partial == 0, f"{partial} of {reads} reads saw a partial file ({estale} ESTALE)"


@pytest.mark.parametrize("explicit", [False, True])
def test_mtime_set_on_one_mount_reaches_the_other(gluster: Volume, explicit: bool) -> None:
    """utime with no times (what recency uses: the file system's clock) and with explicit
    times, set through B, are seen through A (after A's attribute cache, about 1 s)."""
    d = gluster.fresh_dir(f"sem-mtime-{explicit}")
    (d[A] / "f").write_bytes(b"x")
    old = 1_000_000_000
    os.utime(d[A] / "f", (old, old))
    assert os.stat(d[A] / "f").st_mtime == old
    want = 1_500_000_000.25 if explicit else None
    before = time.time()
    os.utime(d[B] / "f", (want, want) if explicit else None)
    deadline = time.monotonic() + 10
    while (seen := os.stat(d[A] / "f").st_mtime) == old:
        assert time.monotonic() < deadline, "A never saw B's utime"
        time.sleep(0.05)
    if explicit:
        assert abs(seen - 1_500_000_000.25) < 1e-6
    else:
        assert abs(seen - before) < 5  # one machine: the server's clock is ours


def test_o_direct_works_on_the_fuse_mount(gluster: Volume) -> None:
    """kvtier's own probe says O_DIRECT works; an aligned O_DIRECT write through A reads back
    through B, also with O_DIRECT."""
    import mmap

    d = gluster.fresh_dir("sem-odirect")
    assert _core.probe_o_direct(str(d[A])) == ""
    size = 1 << 20
    wbuf, rbuf = mmap.mmap(-1, size), mmap.mmap(-1, size)  # page-aligned
    wbuf.write(os.urandom(size))
    fa = os.open(d[A] / "f", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    try:
        assert os.pwritev(fa, [wbuf], 0) == size
        os.fsync(fa)
    finally:
        os.close(fa)
    fb = os.open(d[B] / "f", os.O_RDONLY | os.O_DIRECT)
    try:
        assert os.preadv(fb, [rbuf], 0) == size
    finally:
        os.close(fb)
    assert rbuf[:] == wbuf[:]


def test_statvfs_of_the_mount_is_the_bricks_file_system(gluster: Volume) -> None:
    brick = os.statvfs(GLUSTER_DIR / "bricks" / "b1")
    for h in (A, B):
        mount = os.statvfs(gluster.mount[h])
        assert mount.f_blocks * mount.f_frsize == brick.f_blocks * brick.f_frsize
        free_m, free_b = mount.f_bavail * mount.f_frsize, brick.f_bavail * brick.f_frsize
        assert abs(free_m - free_b) < 1 << 30  # the same disk, give or take other writers


def test_host_processes_have_their_own_host_name_and_pids(gluster: Volume) -> None:
    import subprocess
    import sys

    out = subprocess.run(
        [
            *host_prefix(B),
            sys.executable,
            "-c",
            "import os, socket; print(socket.gethostname(), os.getpid())",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(Path(gluster.mount[B])),
        check=True,
    ).stdout.split()
    assert out == ["hostB", "1"]

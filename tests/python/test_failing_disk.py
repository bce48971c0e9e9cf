"""A disk that fails every call (issue 19): an ext4 volume on a loop device, shut down with
EXT4_IOC_SHUTDOWN, under an fs tier that is in use.

After the ioctl every system call on the volume answers EIO. Block errors must come back as
failed jobs (each reported once), and neither submit_store / submit_load / lookup nor
shutdown() may raise for the storage's sake; once the tier is gone none of its descriptors
on the volume is left open.

Needs root, mkfs.ext4 and loop devices; skips with the reason where any is missing (fails
under CI=true, as the other mount-based tests do).
"""

from __future__ import annotations

import errno
import fcntl
import gc
import logging
import os
import shutil
import subprocess
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

EXT4_IOC_SHUTDOWN = 0x8004587D  # _IOR('X', 125, __u32)
EXT4_GOING_FLAGS_NOLOGFLUSH = 2  # stop at once, without flushing the journal
ROW = 12_000
CTX = ReqContext("req-0")


def _unavailable(reason: str) -> None:
    """Skips the test, or fails it under CI=true (the CI machine can loop-mount)."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the ext4 loop volume cannot be made in CI: {reason}", pytrace=False)
    pytest.skip(reason)


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=120)


class Ext4Volume:
    """An ext4 file system in an image file, mounted through a loop device."""

    def __init__(self, image: Path, mountpoint: Path) -> None:
        self.image = image
        self.mountpoint = mountpoint

    def mount(self) -> None:
        r = _run("mount", "-o", "loop", str(self.image), str(self.mountpoint))
        if r.returncode != 0:
            raise RuntimeError(f"mount -o loop failed: {r.stderr.strip()}")

    def shut_down(self) -> None:
        """EXT4_IOC_SHUTDOWN: from now on every call on the volume fails with EIO."""
        fd = os.open(self.mountpoint, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.ioctl(fd, EXT4_IOC_SHUTDOWN, EXT4_GOING_FLAGS_NOLOGFLUSH.to_bytes(4, "little"))
        finally:
            os.close(fd)


@pytest.fixture
def ext4_volume(tmp_path: Path) -> Iterator[Ext4Volume]:
    if os.geteuid() != 0:
        _unavailable("loop mounts need root")
    if shutil.which("mkfs.ext4") is None or shutil.which("mount") is None:
        _unavailable("mkfs.ext4 or mount is missing")
    image = tmp_path / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(128 << 20)
    r = _run("mkfs.ext4", "-q", "-F", str(image))
    if r.returncode != 0:
        _unavailable(f"mkfs.ext4 failed: {r.stderr.strip()}")
    mountpoint = tmp_path / "mnt"
    mountpoint.mkdir()
    volume = Ext4Volume(image, mountpoint)
    try:
        volume.mount()
    except RuntimeError as e:
        _unavailable(f"loop mounts are not possible here: {e}")
    try:
        yield volume
    finally:
        # Lazily: the capacity budget keeps its ledger open for the process (see below).
        _run("umount", "-l", str(mountpoint))


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # the directory listing's own descriptor, closed meanwhile
        return ""


@pytest.mark.parametrize(
    ("io_engine", "max_bytes"),
    [
        ("psync", None),
        ("auto", None),
        # A budget whose lease runs out (chunks of max_bytes / 64) while the disk is dead:
        # admitting a store then has to settle the ledger on the failing volume.
        ("auto", "32MiB"),
    ],
)
def test_a_shut_down_ext4_volume_fails_jobs_and_never_breaks_teardown(
    ext4_volume: Ext4Volume, io_engine: str, max_bytes: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    root = ext4_volume.mountpoint / "kv"
    n = 64
    rows = np.random.default_rng(3).integers(0, 256, (2 * n, ROW), np.uint8)
    fds_before = _open_fds()
    config = {
        "type": "fs",
        "root_dir": str(root),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_engine": io_engine,
    }
    if max_bytes is not None:
        config["max_bytes"] = max_bytes
    spec = OffloadingSpec(model_name=f"org/disk-{uuid.uuid4().hex[:8]}", dtype="float16")
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), spec)
    reports: Counter[int] = Counter()
    results = {}

    def collect(tier) -> None:
        for r in tier.get_finished():
            reports[r.job_id] += 1
            results[r.job_id] = r

    # Healthy first: a few blocks stored (and so loadable) before the disk goes.
    tier.submit_store(JobMetadata(0, [_key(i) for i in range(4)], np.arange(4), False, CTX))
    tier.drain_jobs()
    collect(tier)
    assert results[0].success, results[0]

    ext4_volume.shut_down()
    with caplog.at_level(logging.ERROR, logger="kvtier"):
        # One block per job, so the store path's synchronous steps (capacity admission
        # included) run again and again against the dead disk: none may raise.
        for j in range(1, n):
            tier.submit_store(JobMetadata(j, [_key(100 + j)], np.array([j]), False, CTX))
        tier.submit_load(
            JobMetadata(n, [_key(i) for i in range(4)], np.arange(n, n + 4), False, CTX)
        )
        for i in range(4):
            tier.lookup(_key(100 + i), CTX)  # answers, whatever it answers
        tier.drain_jobs()
        collect(tier)
        tier.shutdown()  # must not raise
        collect(tier)
    assert sorted(reports) == list(range(n + 1)), sorted(reports)
    assert set(reports.values()) == {1}, "a job was reported more than once"
    failed = [j for j in range(1, n + 1) if not results[j].success]
    # The stores after the ioctl cannot have succeeded: each failed, with the errno said.
    assert failed[: n - 1] == list(range(1, n)), failed
    for j in failed:
        assert results[j].error, results[j]
    assert any(f"errno {errno.EIO}" in (results[j].error or "") for j in failed), [
        results[j].error for j in failed
    ]
    # Once the tier is gone, every descriptor it opened is closed.
    del tier
    gc.collect()
    leaked = {fd: _target(fd) for fd in _open_fds() - fds_before}
    # The capacity budget keeps its ledger and evictor lock (root/.kvtier/) open for the
    # process, healthy disk or not: not the tier's descriptors.
    leaked = {
        fd: target
        for fd, target in leaked.items()
        if str(root) in target and f"{os.sep}.kvtier{os.sep}" not in target
    }
    assert leaked == {}, leaked

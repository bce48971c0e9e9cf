"""A FUSE mount the tests can freeze, fail, slow down and abort: tests/stallfs/stallfs.c.

Fixtures (registered by conftest.py):
- ``stallfs``: one mounted :class:`StallFS` over a fresh backing directory.
- ``make_stallfs``: ``make(direct_io=False) -> StallFS``, for several mounts or other options.
- ``stallfs_binary``: the daemon, built once per session with ``cc`` and ``pkg-config fuse3``.

Every mount is torn down at the end of its test, whether the test passed or not and even with
callers still blocked in it: thaw, unmount, and where that is not enough abort the FUSE
connection (which fails the blocked calls with ECONNABORTED), detach the mount and kill the
daemon. The fixtures skip with a reason where FUSE, libfuse3 or root is missing, and fail
instead under ``CI=true``.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import job_control
import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "stallfs" / "stallfs.c"
FUSECTL = Path("/sys/fs/fuse/connections")
OP_CLASSES = ("all", "data", "meta")

WAIT_SECONDS = 60.0  # a hang guard for slow shared machines, never a timing check
CONTROL_TIMEOUT = 10.0  # the control thread never waits on FUSE: only a stopped daemon is slow
MNT_DETACH = 2


def skip_or_fail(reason: str) -> None:
    """Skips the test, or fails it under CI=true, where stallfs cannot run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"stallfs cannot run in CI: {reason}")
    pytest.skip(reason)


def unavailable_reason() -> str:
    """Why stallfs cannot run here ("" where it can)."""
    if sys.platform != "linux":
        return "FUSE stall tests are Linux only"
    if os.geteuid() != 0:
        return "stallfs needs root (it mounts FUSE without fusermount3)"
    try:
        os.close(os.open("/dev/fuse", os.O_RDWR))
    except OSError as e:
        return f"/dev/fuse cannot be opened ({e.strerror}): no FUSE here"
    if shutil.which("pkg-config") is None:
        return "pkg-config not found (apt-get install pkg-config libfuse3-dev fuse3)"
    if shutil.which("cc") is None:
        return "no C compiler 'cc' to build tests/stallfs/stallfs.c"
    found = subprocess.run(["pkg-config", "--exists", "fuse3"], check=False, timeout=30)
    if found.returncode != 0:
        return "libfuse3 development files missing (apt-get install libfuse3-dev fuse3)"
    return ""


def build(out: Path) -> Path:
    """Builds the daemon into ``out`` (the directory) and returns its path."""
    flags = subprocess.run(
        ["pkg-config", "--cflags", "--libs", "fuse3"],
        check=True,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    binary = out / "stallfs"
    cmd = ["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(SOURCE), *flags]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"building stallfs failed ({' '.join(cmd)}):\n{done.stderr}")
    return binary


def _mount_device(mountpoint: Path) -> str | None:
    """The "major:minor" of the mount at ``mountpoint``, read without touching the mount."""
    target = os.fsencode(mountpoint)
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            fields = line.split()
            # field 5 is the mount point, with spaces and the like escaped as \ooo
            if fields[4].decode("unicode_escape").encode("latin-1") == target:
                return fields[2].decode()
    return None


def _ensure_fusectl() -> None:
    """Mounts the FUSE control file system where it is not mounted yet (left mounted: other
    users of FUSE on this machine may rely on it)."""
    with open("/proc/self/mountinfo") as f:
        if any(line.split(" - ")[-1].startswith("fusectl ") for line in f):
            return
    proc = subprocess.run(
        ["mount", "-t", "fusectl", "none", str(FUSECTL)],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:  # without it no abort reaches a frozen mount: say so, never hang
        raise RuntimeError(f"cannot mount fusectl at {FUSECTL}: {proc.stderr.strip()}")


class StallFS:
    """One stallfs mount: a passthrough of ``backing`` at ``mountpoint``.

    Operation classes: ``"data"`` (read, write, flush, fsync, fallocate), ``"meta"``
    (lookup, getattr, open, create, rename, unlink, mkdir, readdir, statfs, utimens, chmod,
    readlink, symlink, ...) or ``"all"``. Locks never reach the daemon (the kernel handles them
    locally), so they are never frozen or failed.
    """

    def __init__(self, binary: Path, workdir: Path, *, direct_io: bool = False) -> None:
        self.backing = workdir / "backing"
        self.mountpoint = workdir / "mnt"
        self.backing.mkdir(parents=True)
        self.mountpoint.mkdir(parents=True)
        # A short directory of its own: a Unix socket path has at most 107 bytes.
        self._control_dir = Path(tempfile.mkdtemp(prefix="stallfs-"))
        self.control = self._control_dir / "control"
        self.log = workdir / "stallfs.log"
        self.connection: str | None = None  # the name under /sys/fs/fuse/connections
        cmd = [str(binary), "--backing", str(self.backing), "--control", str(self.control)]
        if direct_io:
            cmd.append("--direct-io")
        cmd += ["-f", "-o", "allow_other,fsname=stallfs,subtype=stallfs", str(self.mountpoint)]
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self._closed = False
        try:
            self._wait_mounted()
        except BaseException:
            self.close()
            raise

    # -- faults ----------------------------------------------------------------------------

    def freeze(self, ops: str = "all") -> None:
        """Operations of class ``ops`` block in the daemon (the caller in the kernel's FUSE
        request wait) until :meth:`thaw`."""
        self._command(f"freeze {self._class(ops)}")

    def thaw(self) -> None:
        """Releases every frozen operation; later ones run at once."""
        self._command("thaw")

    def thaw_and_reap(self, proc: subprocess.Popen[str], timeout: float) -> None:
        """Thaws the mount, then waits up to ``timeout`` seconds for the child ``proc`` to
        exit, killing it past that. The thaw comes first: a thread in a frozen FUSE request
        keeps its process from exiting until the daemon answers."""
        self.thaw()
        try:
            proc.wait(timeout)
        finally:
            if proc.poll() is None:
                proc.kill()

    def fail(self, err: int, ops: str = "all") -> None:
        """Operations of class ``ops`` fail with errno ``err``; ``fail(0)`` stops failing."""
        self._command(f"fail {int(err)} {self._class(ops)}")

    def delay(self, ms: int, ops: str = "all") -> None:
        """Operations of class ``ops`` first sleep ``ms`` milliseconds; ``delay(0)`` stops."""
        self._command(f"delay {int(ms)} {self._class(ops)}")

    def match(self, substring: str | None = None) -> None:
        """Faults hit only operations whose backing path (the file under ``backing``, or the
        directory plus the name it acts on) contains ``substring``; ``None`` (the start) hits
        every path."""
        if substring is not None and (not substring or any(c.isspace() for c in substring)):
            raise ValueError(f"match substring must be non-empty without spaces: {substring!r}")
        self._command("match" if substring is None else f"match {substring}")

    def reset(self) -> None:
        """Thaw, no failures, no delays, every path."""
        self._command("reset")

    def status(self) -> dict[str, str | int]:
        """The daemon's state: frozen, fail, delay, match, and the counters ``blocked``
        (operations frozen right now), ``active`` (operations in the daemon right now, frozen
        or not) and ``ops`` (operations the daemon has seen)."""
        reply = self._command("status")
        fields = dict(item.split("=", 1) for item in reply.split()[1:])
        return {k: int(v) if k in ("blocked", "active", "ops") else v for k, v in fields.items()}

    def wait_blocked(self, n: int = 1, timeout: float = WAIT_SECONDS) -> None:
        """Waits until at least ``n`` operations are frozen in the daemon: the way to know a
        caller really is stuck, without sleeping for a guessed time."""
        deadline = time.monotonic() + timeout
        while (blocked := self.status()["blocked"]) < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{blocked} operations frozen after {timeout}s, wanted {n}")
            time.sleep(0.01)

    def abort(self) -> None:
        """Aborts the FUSE connection: calls blocked in it fail with ECONNABORTED, later calls
        with ENOTCONN, until the mount is gone. (fusectl was mounted with the mount.)"""
        if self.connection is None:
            return
        abort = FUSECTL / self.connection / "abort"
        try:
            abort.write_text("1")
        except FileNotFoundError:
            if self.process.poll() is None and _mount_device(self.mountpoint) is not None:
                # Mounted and served, yet fusectl does not list it: an abort that silently
                # did nothing would leave every caller blocked for good.
                raise RuntimeError(f"fusectl has no connection {self.connection}") from None
            # otherwise the connection is gone already

    def stop_daemon(self) -> None:
        """SIGSTOPs the daemon, as a hung FUSE server: everything on the mount blocks, the
        control socket included (only :meth:`abort` and teardown help then)."""
        job_control.stop(self.process.pid, WAIT_SECONDS)

    # -- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Thaws, unmounts, and where a caller or a stopped daemon keeps the mount busy,
        aborts the connection, detaches the mount and kills the daemon. Idempotent; raises
        only if a mount or the daemon is still there at the end."""
        if self._closed:
            return
        self._closed = True
        if self.process.poll() is None and not job_control.is_stopped(self.process.pid):
            try:
                self._command("reset", timeout=2.0)
            except OSError:
                pass  # a stopped or wedged daemon: the abort below frees its callers
        if self._unmount_when_idle() and self._wait_exit(10.0):
            self._cleanup_files()
            return
        self.abort()
        self._unmount(MNT_DETACH)
        if self.process.poll() is None:
            self.process.kill()  # SIGKILL also ends a SIGSTOPped daemon
        self._wait_exit(30.0)
        self._cleanup_files()
        left = []
        if self.process.poll() is None:
            left.append(f"daemon pid {self.process.pid} still running")
        if _mount_device(self.mountpoint) is not None:
            left.append(f"{self.mountpoint} still mounted")
        if left:
            raise RuntimeError("stallfs teardown incomplete: " + "; ".join(left))

    def __enter__(self) -> StallFS:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals -------------------------------------------------------------------------

    @staticmethod
    def _class(ops: str) -> str:
        if ops not in OP_CLASSES:
            raise ValueError(f"ops must be one of {OP_CLASSES}, got {ops!r}")
        return ops

    def _command(self, line: str, timeout: float = CONTROL_TIMEOUT) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(self.control))
            s.sendall(line.encode() + b"\n")
            reply = b""
            while not reply.endswith(b"\n"):
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
        text = reply.decode().strip()
        if not text.startswith("ok"):
            raise RuntimeError(f"stallfs refused {line!r}: {text or 'no reply'}")
        return text

    def _wait_mounted(self) -> None:
        deadline = time.monotonic() + WAIT_SECONDS
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"stallfs exited with status {self.process.returncode} before mounting: "
                    + self.log.read_text(errors="replace")
                )
            device = _mount_device(self.mountpoint)
            if device is not None and self.control.exists():
                try:
                    self._command("ping", timeout=2.0)
                    break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"stallfs did not mount within {WAIT_SECONDS}s")
            time.sleep(0.01)
        major, minor = (int(x) for x in device.split(":"))
        # fusectl names a connection by the kernel's dev_t (major << 20 | minor), which the
        # user-space encoding in mountinfo matches only for small minor numbers.
        self.connection = str((major << 20) | minor)
        # Now, while nothing is frozen: spawning `mount` later, with a caller blocked, would
        # hang in the child, whose close_range() flushes inherited descriptors on the mount.
        _ensure_fusectl()

    def _unmount_when_idle(self) -> bool:
        """Unmounts once callers just thawed are out of the mount. Gives up (False) when the
        mount stays busy while the daemon sees no operation for a while: descriptors held
        open (kvtier keeps its ledger and lock files open for the life of the process)."""
        quiet_since, last_ops = time.monotonic(), -1
        deadline = time.monotonic() + WAIT_SECONDS
        while not self._unmount(0):
            if self.process.poll() is not None or job_control.is_stopped(self.process.pid):
                return False
            try:
                state = self.status()
            except (OSError, RuntimeError):
                return False
            now = time.monotonic()
            if state["active"] or state["ops"] != last_ops:
                quiet_since, last_ops = now, state["ops"]
            elif now - quiet_since > 0.5 or now > deadline:
                return False
            time.sleep(0.02)
        return True

    def _unmount(self, flags: int) -> bool:
        if _mount_device(self.mountpoint) is None:
            return True
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.umount2(os.fsencode(self.mountpoint), flags) == 0:
            return True
        e = ctypes.get_errno()
        if e in (errno.EINVAL, errno.ENOENT):  # not a mount point (any more)
            return True
        return False

    def _wait_exit(self, timeout: float) -> bool:
        try:
            self.process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            return False

    def _cleanup_files(self) -> None:
        shutil.rmtree(self._control_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def stallfs_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/stallfs/stallfs.c built once per session (skips, or fails in CI, without FUSE)."""
    if reason := unavailable_reason():
        skip_or_fail(reason)
    return build(tmp_path_factory.mktemp("stallfs-build"))


@pytest.fixture
def make_stallfs(stallfs_binary: Path, tmp_path: Path) -> Iterator[Callable[..., StallFS]]:
    """``make(direct_io=False) -> StallFS``: mounts, every one torn down after the test."""
    mounts: list[StallFS] = []

    def make(*, direct_io: bool = False) -> StallFS:
        mount = StallFS(stallfs_binary, tmp_path / f"stallfs{len(mounts)}", direct_io=direct_io)
        mounts.append(mount)
        return mount

    yield make
    errors = []
    for mount in reversed(mounts):
        try:
            mount.close()
        except RuntimeError as e:
            errors.append(str(e))
    assert not errors, errors


@pytest.fixture
def stallfs(make_stallfs: Callable[..., StallFS]) -> StallFS:
    """One mounted stallfs (see :class:`StallFS`), torn down after the test."""
    return make_stallfs()

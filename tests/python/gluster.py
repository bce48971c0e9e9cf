"""A real shared file system for the tests: one GlusterFS volume mounted twice (.ci/glusterfs.sh),
each mount standing in for a host, and processes "on" a host: children in their own UTS and
PID namespaces (their own host name and pids) that work on that host's mount.

As a module: the ``gluster`` fixture and helpers for tests/python/test_gluster_*.py. As a
script (``python gluster.py JSON``): the worker those tests run on a host (see ``_worker``).

The volume comes up once per test session (about 3 s) and goes down at its end, also when a
test fails. Where it cannot run (no root, no /dev/fuse, no glusterd) the tests skip with the
reason; with ``CI=true`` in the environment they fail instead, so CI cannot skip them silently.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import os
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "glusterfs.sh"
GLUSTER_DIR = Path(os.environ.get("KVTIER_GLUSTER_DIR", "/tmp/kvtier-gluster"))
HOSTS = ("hostA", "hostB")
CHILD_TIMEOUT_S = 120.0
# The audit event of the evictor's removals (a batch: paths, root; csrc/bindings/module.cpp).
REMOVE_BATCH = "kvtier.unlink_unchanged_files"
F_OFD_GETLK = 36  # <fcntl.h>; Python's fcntl module has no name for it before 3.12
_FLOCK = "hhqqi4x"  # struct flock on Linux x86_64/aarch64: type, whence, start, len, pid


@dataclass(frozen=True)
class Volume:
    """Both mounts of the one volume; ``mount[h]`` is host h's path to it."""

    mount: dict[str, Path]

    def fresh_dir(self, name: str) -> dict[str, Path]:
        """A new empty directory on the volume, as each host's path (removed first if left)."""
        a = self.mount[HOSTS[0]] / name
        if a.exists():
            subprocess.run(["rm", "-rf", str(a)], check=True, timeout=120)
        a.mkdir(parents=True)
        return {h: m / name for h, m in self.mount.items()}


_state: dict[str, Any] = {"users": 0, "volume": None, "started": False}


def _unavailable(reason: str) -> None:
    import pytest

    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"GlusterFS tests cannot run in CI: {reason}", pytrace=False)
    pytest.skip(f"GlusterFS volume unavailable: {reason}")


def _down() -> None:
    if _state["started"]:
        _state["started"] = False
        subprocess.run(["bash", str(SCRIPT), "down"], check=False, capture_output=True, timeout=180)


def acquire_volume() -> Volume:
    """Bring the volume up (once per process) and count one more user of it."""
    if _state["volume"] is None:
        if os.geteuid() != 0:
            _unavailable("needs root (FUSE mounts, network and PID namespaces)")
        check = subprocess.run(
            ["bash", str(SCRIPT), "check"], capture_output=True, text=True, timeout=30
        )
        if check.returncode != 0:
            _unavailable(check.stdout.strip() or check.stderr.strip())
        probe = subprocess.run(
            ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "true"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if probe.returncode != 0:
            _unavailable(f"unshare --uts --pid is not permitted: {probe.stderr.strip()}")
        # Registered before the attempt: a half-built set-up is torn down whatever happens.
        _state["started"] = True
        atexit.register(_down)
        up = subprocess.run(
            ["bash", str(SCRIPT), "up"], capture_output=True, text=True, timeout=180
        )
        if up.returncode != 0:
            _down()
            _unavailable(f".ci/glusterfs.sh up failed ({up.returncode}): {up.stderr[-2000:]}")
        _state["volume"] = Volume({h: GLUSTER_DIR / h for h in HOSTS})
    _state["users"] += 1
    return _state["volume"]


def release_volume() -> None:
    _state["users"] -= 1
    if _state["users"] == 0:
        _state["volume"] = None
        _down()


def volume_fixture() -> Iterator[Volume]:
    """Body of each test module's session fixture: modules importing the same fixture get
    separate fixture definitions, so the volume itself is counted here and shared."""
    volume = acquire_volume()
    try:
        yield volume
    finally:
        release_volume()


# --------------------------------------------------------------------------------------------
# processes on a host


def host_prefix(host: str) -> list[str]:
    """argv prefix: run the rest in new UTS, PID and mount (for /proc) namespaces as ``host``."""
    return [
        "unshare",
        "--uts",
        "--pid",
        "--fork",
        "--mount-proc",
        "--kill-child",
        "sh",
        "-c",
        'hostname "$0" && exec "$@"',
        host,
    ]


def on_host(host: str, argv: list[str], **popen: Any) -> subprocess.Popen[str]:
    """Start ``argv`` on ``host``; its working directory is that host's mount."""
    popen.setdefault("cwd", str(GLUSTER_DIR / host))
    return subprocess.Popen(
        [*host_prefix(host), *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def start_worker(host: str, **spec: Any) -> subprocess.Popen[str]:
    """A ``_worker`` on ``host``; spec as ``_worker`` reads it."""
    return on_host(host, [sys.executable, __file__, json.dumps({"host": host, **spec})])


def inner_pid(proc: subprocess.Popen[str], timeout: float = 30.0) -> int:
    """This machine's pid of the process ``unshare --fork`` runs (pid 1 of its namespace)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
        except FileNotFoundError:
            children = []
        if children:
            return int(children[0])
        time.sleep(0.01)
    raise AssertionError("the host process did not start")


def finish(proc: subprocess.Popen[str], timeout: float = CHILD_TIMEOUT_S) -> dict[str, Any]:
    """Wait for a worker (killed on timeout: a hang is a failure) and return its last report."""
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"host process hung; stderr: {err[-3000:]}") from None
    assert proc.returncode == 0, err[-4000:]
    assert "Traceback" not in err, err[-4000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


# --------------------------------------------------------------------------------------------
# observing a root from outside kvtier


def lock_held(fd: int) -> bool:
    """Whether any other open file description holds a lock on fd's whole file (OFD GETLK:
    conflicts with OFD and POSIX locks alike, whatever process or host holds them)."""
    req = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    got = fcntl.fcntl(fd, F_OFD_GETLK, req)
    return bool(struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK)


# --------------------------------------------------------------------------------------------
# the worker


def payload(i: int, row: int) -> bytes:
    """Block bytes as a function of the key: any process can check any block it loads."""
    import numpy as np

    return bytes(np.random.default_rng(i).integers(0, 256, row, dtype=np.uint8))


def _worker(spec: dict[str, Any]) -> None:
    """Store ``count`` blocks from key ``first`` into ``root`` with a budget, loading back a
    block stored earlier after each store; prints ``{"ready": pid}`` once the tier is up and
    a JSON report at the end. Removals of block files (Python's os.remove and the evictor's
    batches, through an audit hook) are checked against the evictor lock at that moment, and
    removals of other hosts' tmp files are counted."""
    import socket
    import threading

    import numpy as np
    from kvtier.tiering.base import JobMetadata
    from kvtier.tiering.fs.manager import FileSystemTierManager
    from kvtier.tiering.spec import OffloadingSpec

    root, row = spec["root"], spec["row_bytes"]
    me = socket.gethostname()
    buf = np.zeros((2, row), dtype=np.uint8)
    tier = FileSystemTierManager(
        OffloadingSpec(model_name="org/gluster", dtype="float16", kv_layout="NHD"),
        memoryview(buf),
        "fs",
        root_dir=root,
        **spec["options"],
    )
    counts = {"unlocked_removals": 0, "removals": 0, "foreign_tmp_removals": 0}
    lock_path = os.path.join(root, ".kvtier", "evictor.lock")
    lock_fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    inside = threading.local()

    def audit(event: str, args: tuple[Any, ...]) -> None:
        # os.remove: one path; kvtier.unlink_unchanged_files: the evictor's batch (paths, root)
        if event not in ("os.remove", REMOVE_BATCH) or getattr(inside, "busy", False):
            return
        inside.busy = True
        try:
            names = args[0] if event == REMOVE_BATCH else [args[0]]
            for name in (os.fsdecode(n) for n in names if isinstance(n, (str, bytes))):
                if name.endswith(".kvb"):
                    counts["removals"] += 1
                    if not lock_held(lock_fd):
                        counts["unlocked_removals"] += 1
                elif name.endswith(".tmp") and ".kvb." in name:
                    host = os.path.basename(name).split(".kvb.", 1)[1].split(".")[0]
                    if host != me:
                        counts["foreign_tmp_removals"] += 1
        finally:
            inside.busy = False

    sys.addaudithook(audit)
    print(json.dumps({"ready": os.getpid(), "host": me}), flush=True)

    def run(job_id: int, i: int, slot: int, load: bool) -> Any:
        key = i.to_bytes(32, "big") + (0).to_bytes(4, "big")
        job = JobMetadata(job_id, [key], np.array([slot], np.int64), load, None)
        (tier.submit_load if load else tier.submit_store)(job)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            for r in tier.get_finished():
                assert r.job_id == job_id, r
                return r
            time.sleep(0.001)
        raise AssertionError(f"job {job_id} did not finish in 60 s")

    report: dict[str, Any] = {"stored": 0, "refused": 0, "errors": [], "loaded": 0}
    report.update({"missing": 0, "stale": 0, "wrong": 0, "load_errors": []})
    stored: list[int] = []
    rng = np.random.default_rng(spec["first"])
    job_id = 0
    for i in range(spec["first"], spec["first"] + spec["count"]):
        buf[0] = np.frombuffer(payload(i, row), dtype=np.uint8)
        job_id += 1
        r = run(job_id, i, 0, False)
        if r.success:
            report["stored"] += 1
            stored.append(i)
        elif "errno 28" in (r.error or ""):
            report["refused"] += 1
        else:
            report["errors"].append(r.error)
        if stored:
            j = stored[int(rng.integers(len(stored)))]
            buf[1] = 0
            job_id += 1
            r = run(job_id, j, 1, True)
            if r.success:
                report["loaded"] += 1
                report["wrong"] += bytes(buf[1]) != payload(j, row)
            elif "errno 2)" in (r.error or "") or "No such file" in (r.error or ""):
                report["missing"] += 1  # evicted meanwhile: a miss, not an error
            elif "errno 116)" in (r.error or ""):
                # Evicted through another mount after the open: a read may still meet
                # ESTALE (at the open the core already reports ENOENT). Also a miss.
                report["stale"] += 1
            else:
                report["load_errors"].append(r.error)
        time.sleep(spec.get("pause", 0.0))
    report.update({k: v for k, v in tier.stats().items() if isinstance(v, int)})
    tier.shutdown()
    report.update(counts)
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    _worker(json.loads(sys.argv[1]))

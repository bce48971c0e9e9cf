"""A GlusterFS brick stopped with SIGSTOP under an fs tier (issue 19): jobs are reported with
ETIMEDOUT by io_timeout_s, lookups answer absent while the root is degraded, shutdown returns
with the brick stopped, and the tier recovers after SIGCONT (docs/tiers.md, "When storage
stalls").

The volume is this module's own (its directory, network namespace, CLI socket and volume
name: .ci/glusterfs.sh's KVTIER_GLUSTER_* settings), so stopping its brick disturbs no other
test's volume, and its ``network.ping-timeout`` is short (PING_TIMEOUT_S) so the test also sees
what GlusterFS's client does once its own timeout fires. The waits are hang guards, never
timing checks; the figures printed (pytest -s) are what docs/tiers.md reports.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hang_guard import guarded
from kvtier import _core
from kvtier.tiering.base import JobMetadata, JobResult, ReqContext, make_offload_key
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "glusterfs.sh"
STATE = Path("/tmp/kvtier-gluster-stall")
VOLUME = "kvtier-stall"
ENV = {
    "KVTIER_GLUSTER_DIR": str(STATE),
    "KVTIER_GLUSTER_NS": "kvtier-gfs-stall",
    "KVTIER_GLUSTER_VOL": VOLUME,
}
PING_TIMEOUT_S = 10  # GlusterFS's own client timeout on this volume (its default is 42)
TIMEOUT = 1.0  # io_timeout_s
WAIT_SECONDS = 120.0  # hang guard: longer than the client's own timeout
ROW = 64 * 1024
CTX = ReqContext("req-gluster-stall")
SPEC = OffloadingSpec(model_name="gluster-stall", dtype="bfloat16")

pytestmark = pytest.mark.skipif(
    "io_timeout_s" not in _core.ENGINE_DEFAULTS,
    reason="the native core has no io_timeout_s (issue 19, core part)",
)


def _script(verb: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), verb],
        env={**os.environ, **ENV, **env},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


@pytest.fixture(scope="module")
def volume() -> Iterator[Path]:
    """This module's volume, mounted at STATE/hostA; torn down after the module."""
    if os.geteuid() != 0:
        pytest.skip("GlusterFS volume unavailable: needs root")
    check = _script("check")
    if check.returncode != 0:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"GlusterFS tests cannot run in CI: {check.stdout.strip()}")
        pytest.skip(f"GlusterFS volume unavailable: {check.stdout.strip()}")
    up = _script("up", KVTIER_GLUSTER_PING=str(PING_TIMEOUT_S))
    try:
        assert up.returncode == 0, up.stderr[-2000:]
        yield STATE / "hostA"
    finally:
        _continue_bricks()  # never leave a stopped brick behind
        _script("down")


def _brick_pids() -> list[int]:
    pids = []
    for pid_file in Path(f"/var/run/gluster/vols/{VOLUME}").glob("*.pid"):
        try:
            pids.append(int(pid_file.read_text().strip()))
        except (OSError, ValueError):
            pass
    return pids


def _continue_bricks() -> None:
    for pid in _brick_pids():
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _job(job_id: int, keys: list[bytes], rows: list[int]) -> JobMetadata:
    return JobMetadata(job_id, keys, np.array(rows, dtype=np.int64), False, CTX)


def _tier(root: Path, **options: Any) -> FileSystemTierManager:
    buf = np.zeros((16, ROW), dtype=np.uint8)
    for r in range(16):
        buf[r, :] = r + 1
    opts: dict[str, Any] = {
        "root_dir": str(root),
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_timeout_s": TIMEOUT,
        **options,
    }
    return FileSystemTierManager(SPEC, memoryview(buf), "fs", **opts)


def _wait_for(what: str, condition: Callable[[], bool], timeout: float = WAIT_SECONDS) -> float:
    """Waits for ``condition``; returns the seconds it took (for the printed figures)."""
    start = time.monotonic()
    while not condition():
        assert time.monotonic() - start < timeout, f"never happened: {what}"
        time.sleep(0.01)
    return time.monotonic() - start


def _collect(tier: FileSystemTierManager, wanted: set[int]) -> dict[int, tuple[JobResult, float]]:
    """Each job's result and the seconds from this call until it was reported."""
    start = time.monotonic()
    results: dict[int, tuple[JobResult, float]] = {}
    while wanted - results.keys():
        for r in tier.get_finished():
            assert r.job_id not in results, f"job {r.job_id} reported twice"
            results[r.job_id] = (r, time.monotonic() - start)
        assert time.monotonic() - start < WAIT_SECONDS, f"never reported: {wanted - results.keys()}"
        time.sleep(0.005)
    return results


def test_a_stopped_brick_times_out_degrades_and_recovers(volume: Path) -> None:
    root = volume / "stall"
    tier = _tier(root)
    reader = _tier(root, async_lookup=False)  # knows no block: its lookups must check
    closing = _tier(root)  # shut down while the brick is stopped
    figures: dict[str, str] = {}
    try:
        tier.submit_store(_job(1, [_key(1), _key(2)], [1, 2]))
        assert _collect(tier, {1})[1][0].success
        for t in (tier, reader, closing):
            assert t.health == "healthy"
        bricks = _brick_pids()
        assert bricks, "no brick process"
        # Past the client's caches of the block just stored (the kernel's 1 s attribute and
        # entry timeouts, GlusterFS's md-cache): a load must ask the brick, not a cache.
        time.sleep(3.0)
        stopped = time.monotonic()
        for pid in bricks:
            os.kill(pid, signal.SIGSTOP)

        # Work sent into the stopped brick: reported with ETIMEDOUT by its deadline.
        tier.submit_store(_job(2, [_key(3)], [3]))
        tier.submit_load(_job(3, [_key(2)], [4]))
        results = _collect(tier, {2, 3})
        for job_id, (result, took) in results.items():
            assert not result.success
            assert f"errno {errno.ETIMEDOUT}" in (result.error or ""), result.error
            figures[f"job {job_id} reported after"] = f"{took:.2f} s"
        assert results[3][0].successful_keys == []
        assert tier.health == "degraded" and reader.health == "degraded"

        # Degraded: lookups absent (the reader's too, without a check), new work failed at once.
        assert guarded(lambda: tier.lookup(_key(1), CTX), "lookup", WAIT_SECONDS) is False
        assert guarded(lambda: reader.lookup(_key(2), CTX), "lookup", WAIT_SECONDS) is False
        tier.submit_store(_job(4, [_key(5)], [5]))
        fast = _collect(tier, {4})[4][0]
        assert not fast.success and "is degraded" in (fast.error or "")

        began = time.monotonic()
        guarded(closing.shutdown, "shutdown with the brick stopped", WAIT_SECONDS)
        figures["shutdown with the brick stopped"] = f"{time.monotonic() - began:.2f} s"

        # GlusterFS's own client timeout: the operations abandoned in the kernel come back.
        def returned() -> bool:
            return tier.stats()["workers_stuck"] == 0

        _wait_for("the client's ping-timeout returned the stuck operations", returned)
        figures["stuck operations returned after"] = f"{time.monotonic() - stopped:.1f} s"
        probe_failures = tier.stats()["health_probe_failures"]
        assert tier.health == "degraded"  # the brick is still stopped

        continued = time.monotonic()
        for pid in bricks:
            os.kill(pid, signal.SIGCONT)
        _wait_for("the root recovered", lambda: tier.health == "healthy")
        figures["healthy after SIGCONT"] = f"{time.monotonic() - continued:.1f} s"
        figures["probe failures while stopped"] = str(probe_failures)
        tier.submit_store(_job(5, [_key(6)], [6]))
        tier.submit_load(_job(6, [_key(1)], [7]))
        after = _collect(tier, {5, 6})
        assert after[5][0].success, after[5][0].error
        assert after[6][0].success, after[6][0].error
        assert reader.lookup(_key(6), CTX) is True
    finally:
        _continue_bricks()
        for t in (tier, reader, closing):
            guarded(t.shutdown, "shutdown", WAIT_SECONDS)
    print("\nGlusterFS brick SIGSTOP figures:", figures)

"""`kvtier bench`'s peers in their own environments: LMCache (.ci/lmcache-env.sh) and vLLM on
its native I/O path (.ci/vllm-native-env.sh).

Each test needs its peer importable in this Python. Elsewhere (the default test environment)
it is skipped, unless KVTIER_BENCH_PEER_ENV names the peer: then this is the peer's own
environment (CI runs these tests there) and a peer that cannot be imported is a failure.
"""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from kvtier import _core

TINY = ["--total", "8M", "--sizes", "256K", "--repeat", "1", "--latency-samples", "8"]
TINY += ["--loop-seconds", "0.1", "--read-threads", "2", "--write-threads", "2", "--quiet"]


def _require(peer: str, status: dict) -> None:
    if status.get("available"):
        return
    if os.environ.get("KVTIER_BENCH_PEER_ENV") == peer:
        pytest.fail(f"KVTIER_BENCH_PEER_ENV={peer}, but the peer cannot run: {status}")
    pytest.skip(f"--peer {peer} cannot run in this Python: {status.get('reason')}")


@pytest.fixture
def lmcache() -> None:
    from kvtier.bench.peer_lmcache import lmcache_status

    _require("lmcache", lmcache_status())


@pytest.fixture
def vllm_native() -> None:
    from kvtier.bench.peer_vllm import vllm_status

    status = vllm_status()
    if status.get("available") and status.get("io_path_kind") != "native":
        status = {"available": False, "reason": status["io_path"]}
    _require("vllm-native", status)


def _bench(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "out.json"
    root = tmp_path / "root"
    root.mkdir()
    cmd = [sys.executable, "-m", "kvtier", "bench", "--root", str(root), *TINY, *args]
    proc = subprocess.run(
        [*cmd, "--json", str(out)], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr
    assert [p.name for p in root.iterdir()] == []  # the scratch directory is gone
    return proc, json.loads(out.read_text())


def test_peer_lmcache_runs_its_backends_beside_kvtier(tmp_path: Path, lmcache: None) -> None:
    # With fio (the basic ceilings only): the targets, each peer's among them, follow it.
    proc, results = _bench(tmp_path, "--peer", "lmcache", "--ceilings", "basic")
    peer = results["peers"]["lmcache"]
    assert peer["available"] and peer["version"] == "0.5.6"
    direct = _core.probe_o_direct(str(tmp_path)) == ""
    expected = ["lmcache-disk", "lmcache-disk-odirect", "lmcache-fs"]
    if not direct:
        expected.remove("lmcache-disk-odirect")
    assert peer["backends"] == expected
    tiers = results["sizes"][0]["tiers"]
    assert set(tiers) == {"kvtier", *expected}
    for name in expected:  # every figure measured: the loads were checked byte for byte
        tp = tiers[name]["throughput"]
        assert tp["store_gbps"] > 0 and tp["load_gbps"] > 0
        assert tiers[name]["latency"]["idle"]["n"] == 8
    assert results["cache_bypass"]["lmcache-disk"] == "posix_fadvise(DONTNEED)"
    if direct:
        assert results["cache_bypass"]["lmcache-disk-odirect"] == "O_DIRECT"
    assert "256 KiB LMCache LocalDisk " in proc.stdout
    assert "256 KiB LMCache FSConnector" in proc.stdout
    assert "kvtier fs: load >= LMCache FSConnector" in proc.stdout
    assert "LMCache peer: LMCache 0.5.6" in proc.stdout


class _UnalignedPrimary:
    """Primary memory whose rows start 64 bytes into a page: an address O_DIRECT refuses
    (file systems need at least the device's logical block size, 512 bytes or more)."""

    def __init__(self, n_blocks: int, block_size: int):
        self.n_blocks, self.block_size = n_blocks, block_size
        self._map = mmap.mmap(-1, n_blocks * block_size + mmap.PAGESIZE)
        flat = np.frombuffer(self._map, dtype=np.uint8)
        self.array = flat[64 : 64 + n_blocks * block_size].reshape(n_blocks, block_size)
        self.array[:] = 7

    def close(self) -> None:
        del self.array


def test_lmcache_put_that_never_completes_fails_the_run(tmp_path: Path, lmcache: None) -> None:
    """With use_odirect, LMCache's write from a buffer that is not page-aligned fails inside
    its executor and the error is dropped: the put never completes. The driver must turn
    that into a failed job, not wait forever."""
    if _core.probe_o_direct(str(tmp_path)) != "":
        pytest.skip("O_DIRECT does not work here: the unaligned write would not fail")
    from kvtier.bench.errors import BenchError
    from kvtier.bench.peer_lmcache import LmcacheDriver
    from kvtier.bench.workload import JobIds, block_keys, make_jobs, wait_for

    primary = _UnalignedPrimary(8, 256 << 10)
    driver = LmcacheDriver(
        tmp_path, primary, variant="lmcache-disk-odirect", threads=2, direct=True,
        put_stall_s=2.0,
    )  # fmt: skip
    try:
        keys = block_keys(b"unaligned", 0, 8)
        jobs = make_jobs(JobIds().take(8), keys, range(8), 4)
        for job in jobs:
            driver.submit_store(job)
        with pytest.raises(BenchError, match="completed no put for 2 s with 8 outstanding"):
            wait_for(driver, {j.job_id for j in jobs}, "store")
    finally:
        driver.close()
        primary.close()


def test_lmcache_driver_from_several_threads_then_closed_with_loads_queued(
    tmp_path: Path, lmcache: None
) -> None:
    """Stores submitted from several threads at once all complete; closing with load jobs
    still queued returns (the loader thread stops) without hanging."""
    import threading

    from kvtier.bench.peer_lmcache import LmcacheDriver
    from kvtier.bench.workload import PrimaryMemory, block_keys, make_jobs, wait_for

    primary = PrimaryMemory(32, 256 << 10)
    primary.fill(seed=3)
    driver = LmcacheDriver(tmp_path, primary, variant="lmcache-disk", threads=2, direct=False)
    try:
        keys = block_keys(b"threads", 0, 32)
        jobs = make_jobs(1, keys, range(32), 4)
        threads = [
            threading.Thread(target=lambda js=jobs[i::4]: [driver.submit_store(j) for j in js])
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wait_for(driver, {j.job_id for j in jobs}, "store")
        for job in make_jobs(100, keys, range(32), 4):
            driver.submit_load(job)
    finally:
        driver.close()
        primary.close()


def test_lmcache_fs_closed_with_puts_in_flight_unwinds_them_on_their_loop(
    tmp_path: Path, lmcache: None, capfd: pytest.CaptureFixture[str]
) -> None:
    """A run stopped by a failed job closes the driver with the FSConnector's puts in flight.
    Their coroutines must unwind on their own loop: stopped under them, they were destroyed
    later outside any loop and LMCache logged "no running event loop" for each put, which
    read like the cause of the failure. After close no LMCache thread is left running."""
    import threading

    from kvtier.bench.peer_lmcache import LmcacheDriver
    from kvtier.bench.workload import JobIds, PrimaryMemory, block_keys, make_jobs

    primary = PrimaryMemory(32, 2 << 20)
    primary.fill(seed=5)
    driver = LmcacheDriver(tmp_path, primary, variant="lmcache-fs", threads=2, direct=True)
    try:
        keys = block_keys(b"inflight", 0, 32)
        for job in make_jobs(JobIds().take(32), keys, range(32), 16):
            driver.submit_store(job)
    finally:
        driver.close()
    import gc

    gc.collect()  # what destroyed the stranded coroutines before
    err = capfd.readouterr().err
    primary.close()
    assert "no running event loop" not in err
    alive = [t.name for t in threading.enumerate() if t.name.startswith("kvtier-bench-lmcache")]
    assert alive == []


def test_lmcache_fs_get_past_its_blocking_timeout_is_reported_as_such(
    tmp_path: Path, lmcache: None
) -> None:
    """LMCache's RemoteBackend returns None for a get that outlasts blocking_timeout_secs,
    logging only a WARNING: the failed load must say that, not just "no block". The timeout
    is set to 0 on the driver's LMCache config (the only way to make a get outlast it on
    purpose)."""
    from kvtier.bench.errors import BenchError
    from kvtier.bench.peer_lmcache import LmcacheDriver
    from kvtier.bench.workload import JobIds, PrimaryMemory, block_keys, make_jobs, wait_for

    primary = PrimaryMemory(16, 2 << 20)
    primary.fill(seed=6)
    driver = LmcacheDriver(tmp_path, primary, variant="lmcache-fs", threads=2, direct=True)
    try:
        ids = JobIds()
        keys = block_keys(b"timeout", 0, 8)
        stores = make_jobs(ids.take(8), keys, range(8), 8)
        for job in stores:
            driver.submit_store(job)
        wait_for(driver, {j.job_id for j in stores}, "store")
        driver._config.blocking_timeout_secs = 0
        loads = make_jobs(ids.take(8), keys, range(8, 16), 8)
        for job in loads:
            driver.submit_load(job)
        with pytest.raises(BenchError, match=r"past LMCache's blocking_timeout_secs \(0 s\)"):
            wait_for(driver, {j.job_id for j in loads}, "load")
    finally:
        driver.close()
        primary.close()


def test_peer_vllm_runs_on_the_native_path(tmp_path: Path, vllm_native: None) -> None:
    proc, results = _bench(tmp_path, "--peer", "vllm", "--no-fio")
    peer = results["peers"]["vllm"]
    assert peer["io_path_kind"] == "native" and peer["io_path"] == "native (vllm.fs_io_C)"
    assert peer["fs_io_C"] and Path(peer["fs_io_C"]).name.startswith("fs_io_C")
    assert "vLLM peer: vLLM 0.33.0, native (vllm.fs_io_C)" in proc.stdout
    assert "256 KiB vllm fs (native)" in proc.stdout
    tp = results["sizes"][0]["tiers"]["vllm"]["throughput"]
    assert tp["store_gbps"] > 0 and tp["load_gbps"] > 0

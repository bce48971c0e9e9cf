"""The fs tier on real files: layout, durability of the contract across instances and
processes, corruption handling, asynchronous lookup, back-pressure, shutdown, tmp sweep."""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from kvtier import _core
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

CTX = ReqContext("req-0")
SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
WAIT_SECONDS = 60.0


def key(i: int, group: int = 0) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), group)


def job(job_id: int, keys: list[bytes], slots: list[int]) -> JobMetadata:
    return JobMetadata(job_id, keys, np.asarray(slots, dtype=np.int64), False, CTX)


def primary(rows: int = 8, row_bytes: int = 3000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, row_bytes), dtype=np.uint8)


@pytest.fixture
def make_tier(tmp_path, io_engine):
    """Tiers on each I/O engine in turn (conftest's io_engine), shut down at teardown."""
    tiers: list[FileSystemTierManager] = []

    def make(array: np.ndarray, spec: OffloadingSpec = SPEC, **options) -> FileSystemTierManager:
        config = {
            "type": "fs",
            "root_dir": str(tmp_path / "root"),
            "n_read_threads": 2,
            "n_write_threads": 2,
            "io_engine": io_engine,
            **options,
        }
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(array), spec)
        tiers.append(tier)
        return tier

    yield make
    for t in tiers:
        t.shutdown()


def store(tier, collect_results, job_id, keys, slots) -> None:
    tier.submit_store(job(job_id, keys, slots))
    result = collect_results(tier, [job_id])[job_id]
    assert result.success, result.error


def test_store_creates_the_mapped_file_and_load_keeps_it(make_tier, collect_results, tmp_path):
    data = primary()
    tier = make_tier(data)
    k = key(1)
    path = Path(tier.file_mapper.get_file_name(k))
    assert not path.exists()
    assert tier.lookup(k, CTX) is False
    store(tier, collect_results, 1, [k], [0])
    assert path.is_file()
    assert path.is_relative_to(tmp_path / "root")
    # 4096-byte header + payload zero-padded to a multiple of 4096.
    assert path.stat().st_size == _core.HEADER_SIZE + 4096
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert tier.lookup(k, CTX) is True
    tier.submit_load(job(2, [k], [5]))
    assert collect_results(tier, [2])[2].success
    assert path.is_file()
    assert data[5].tobytes() == data[0].tobytes()


def test_layout_namespace_rank_and_fan_out(make_tier, tmp_path):
    tier = make_tier(primary(), spec=OffloadingSpec("org/model-7b", "float16", rank=3))
    mapper = tier.file_mapper
    config = json.loads(Path(mapper.config_path).read_text())
    assert config["fingerprint"] == mapper.fingerprint.hex()
    assert len(mapper.fingerprint) == _core.FINGERPRINT_SIZE
    assert config["block_bytes"] == 3000
    assert config["format_version"] == _core.FORMAT_VERSION
    assert (config["model_name"], config["dtype"]) == ("org/model-7b", "float16")
    paths = [Path(mapper.get_file_name(key(i))) for i in range(2000)]
    rank_dir = Path(mapper.namespace_dir) / "rank-3"
    assert all(p.parent.parent.parent == rank_dir for p in paths)
    # Keys spread over many leaf directories, none holding more than a few of them.
    leaves: dict[Path, int] = {}
    for p in paths:
        leaves[p.parent] = leaves.get(p.parent, 0) + 1
    assert len(leaves) > 1000
    assert max(leaves.values()) < 10


def test_invalid_root_raises_oserror(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(OSError) as e:
        SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root_dir": str(blocker / "root")}, memoryview(primary()), SPEC
        )
    assert e.value.errno is not None


def test_second_instance_finds_blocks(make_tier, collect_results):
    first_data = primary(seed=1)
    first = make_tier(first_data)
    store(first, collect_results, 1, [key(1), key(2)], [0, 1])
    second_data = primary(seed=2)
    second = make_tier(second_data)
    assert second.lookup(key(1), CTX) is True
    assert second.lookup(key(3), CTX) is False
    second.submit_load(job(7, [key(2), key(1)], [6, 7]))
    assert collect_results(second, [7])[7].success
    assert second_data[6].tobytes() == first_data[1].tobytes()
    assert second_data[7].tobytes() == first_data[0].tobytes()


CHILD = textwrap.dedent(
    """
    import json, sys, time
    import numpy as np
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec

    root, out = sys.argv[1], sys.argv[2]
    spec = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
    data = np.zeros((8, 3000), dtype=np.uint8)
    data[4] = 77
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root_dir": root, "n_read_threads": 1, "n_write_threads": 1},
        memoryview(data), spec)
    k = lambda i: make_offload_key(i.to_bytes(32, "big"), 0)
    found = [tier.lookup(k(1), None), tier.lookup(k(9), None)]
    tier.submit_load(JobMetadata(1, [k(1)], np.array([0]), True, ReqContext("c")))
    tier.submit_store(JobMetadata(2, [k(50)], np.array([4]), False, ReqContext("c")))
    tier.drain_jobs()
    results = {r.job_id: r.success for r in tier.get_finished()}
    tier.shutdown()
    np.save(out, data[0])
    print(json.dumps({"found": found, "results": results}))
    """
)


def test_second_process_shares_blocks(make_tier, collect_results, tmp_path):
    data = primary(seed=3)
    tier = make_tier(data)
    store(tier, collect_results, 1, [key(1)], [2])
    out = tmp_path / "loaded.npy"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path / "root"), str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["found"] == [True, False]
    assert report["results"] == {"1": True, "2": True}
    assert np.load(out).tobytes() == data[2].tobytes()
    # ...and this process finds what the other one stored.
    assert tier.lookup(key(50), CTX) is True
    tier.submit_load(job(2, [key(50)], [7]))
    assert collect_results(tier, [2])[2].success
    assert data[7].tobytes() == bytes([77]) * 3000


@pytest.mark.parametrize("damage", ["flip_payload_byte", "flip_header_byte", "truncate"])
def test_damaged_block_fails_its_load_and_is_removed(make_tier, collect_results, damage):
    data = primary()
    tier = make_tier(data)
    store(tier, collect_results, 1, [key(1), key(2)], [0, 1])
    path = Path(tier.file_mapper.get_file_name(key(1)))
    raw = bytearray(path.read_bytes())
    if damage == "flip_payload_byte":
        raw[_core.HEADER_SIZE + 17] ^= 0xFF
    elif damage == "flip_header_byte":
        raw[40] ^= 0xFF
    else:
        raw = raw[: _core.HEADER_SIZE + 100]
    path.write_bytes(bytes(raw))
    before = data[5:7].copy()
    tier.submit_load(job(2, [key(1), key(2)], [5, 6]))
    result = collect_results(tier, [2])[2]
    assert result.success is False
    assert list(result.successful_keys) == [key(2)]
    assert result.error
    assert not path.exists()
    assert data[6].tobytes() == data[1].tobytes()
    assert before.shape == (2, 3000)
    assert tier.lookup(key(1), CTX) is False
    assert tier.lookup(key(2), CTX) is True


def test_failed_job_is_logged(make_tier, collect_results, caplog):
    tier = make_tier(primary())
    with caplog.at_level(logging.WARNING, logger="kvtier.tiering.fs.manager"):
        tier.submit_load(job(42, [key(5)], [0]))
        result = collect_results(tier, [42])[42]
    assert result.success is False
    assert "errno" in result.error
    logged = [r for r in caplog.records if r.getMessage().startswith("Job 42 block I/O failed: ")]
    assert len(logged) == 1 and "errno 2" in logged[0].getMessage()
    assert logged[0].levelno == logging.ERROR


def test_dropped_store_is_logged_at_error_level(make_tier, collect_results, caplog):
    tier = make_tier(primary(), max_queued_store_jobs=0)
    with caplog.at_level(logging.WARNING, logger="kvtier.tiering.fs.manager"):
        tier.submit_store(job(7, [key(7)], [0]))
        assert collect_results(tier, [7])[7].success is False
    logged = [r for r in caplog.records if r.getMessage().startswith("Job 7 block I/O failed: ")]
    assert [r.levelno for r in logged] == [logging.ERROR]


@pytest.mark.parametrize(
    "other",
    [
        OffloadingSpec(model_name="org/model-7b", dtype="bfloat16", kv_layout="NHD"),
        OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="HND"),
        OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD", tp_size=2),
        OffloadingSpec(model_name="org/other", dtype="float16", kv_layout="NHD"),
        None,  # same spec, different row size
    ],
)
def test_other_layout_never_reads_the_first_ones_blocks(make_tier, collect_results, other):
    first = make_tier(primary())
    store(first, collect_results, 1, [key(1)], [0])
    second_data = primary(row_bytes=3000 if other is not None else 2048, seed=5)
    second = make_tier(second_data, spec=other or SPEC)
    assert second.file_mapper.namespace_dir != first.file_mapper.namespace_dir
    assert second.lookup(key(1), CTX) is False
    # Even a file copied into the other namespace is refused: the header's layout
    # fingerprint does not match, so the load fails and the impostor is removed.
    impostor = Path(second.file_mapper.get_file_name(key(1)))
    impostor.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(first.file_mapper.get_file_name(key(1)), impostor)
    second.submit_load(job(2, [key(1)], [3]))
    result = collect_results(second, [2])[2]
    assert result.success is False
    assert "fingerprint" in result.error or "length" in result.error
    assert not impostor.exists()
    assert Path(first.file_mapper.get_file_name(key(1))).exists()


def test_disagreeing_config_json_is_refused(make_tier):
    tier = make_tier(primary())
    config_path = Path(tier.file_mapper.config_path)
    config = json.loads(config_path.read_text())
    config["dtype"] = "int4"
    config_path.write_text(json.dumps(config))
    with pytest.raises(ValueError, match="dtype"):
        make_tier(primary())


def test_async_lookup_answers_none_then_the_truth(make_tier, collect_results):
    before = set(threading.enumerate())
    tier = make_tier(primary(), async_lookup=True)
    writer = make_tier(primary(seed=9))
    store(writer, collect_results, 1, [key(1)], [0])
    assert tier.lookup(key(1), CTX) is None
    assert tier.lookup(key(2), CTX) is None
    answers = {}
    deadline = time.monotonic() + WAIT_SECONDS
    while len(answers) < 2:
        for i in (1, 2):
            if i not in answers and (a := tier.lookup(key(i), CTX)) is not None:
                answers[i] = a
        assert time.monotonic() < deadline, "asynchronous lookup never answered"
        time.sleep(0.002)
    assert answers == {1: True, 2: False}
    assert tier.lookup(key(1), CTX) is True  # a found block stays known
    assert tier.stats()["lookup_unknown"] >= 2
    new_threads = [t for t in set(threading.enumerate()) - before if t.name == "kvtier-lookup"]
    assert new_threads
    tier.shutdown()
    assert not any(t.is_alive() for t in new_threads)


def test_store_queue_limit_drops_excess_stores(make_tier, collect_results):
    tier = make_tier(primary(), max_queued_store_jobs=2)
    for i in range(4):
        tier.submit_store(job(i, [key(i)], [i]))
    # The dropped ones are reported at once, before any I/O is waited for.
    immediately = {r.job_id: r for r in tier.get_finished()}
    assert {2, 3} <= immediately.keys()
    for i in (2, 3):
        assert immediately[i].success is False
        assert "EAGAIN" in immediately[i].error or "errno 11" in immediately[i].error
    rest = collect_results(tier, set(range(4)) - immediately.keys())
    results = {**immediately, **rest}
    assert results[0].success and results[1].success
    assert tier.lookup(key(2), CTX) is False
    assert tier.stats()["dropped_store_jobs"] == 2
    # Once results are collected, the queue has room again.
    store(tier, collect_results, 10, [key(2)], [2])
    # drain_jobs() also frees the queue: drained stores are no longer queued.
    tier.submit_store(job(20, [key(20)], [0]))
    tier.submit_store(job(21, [key(21)], [1]))
    tier.drain_jobs()
    tier.submit_store(job(22, [key(22)], [2]))
    results = collect_results(tier, [20, 21, 22])
    assert all(r.success for r in results.values())
    assert tier.stats()["dropped_store_jobs"] == 2


def test_failure_log_is_rate_limited(make_tier, collect_results, caplog):
    tier = make_tier(primary())
    n = 200
    with caplog.at_level(logging.WARNING, logger="kvtier.tiering.fs.manager"):
        for i in range(n):
            tier.submit_load(job(i, [key(1000 + i)], [0]))
        results = collect_results(tier, range(n))
    assert not any(r.success for r in results.values())
    logged = [r for r in caplog.records if "block I/O failed" in r.getMessage()]
    assert 1 <= len(logged) < n


def test_concurrent_submitters_each_job_reported_once(make_tier, collect_results):
    data = primary(rows=64, row_bytes=512)
    tier = make_tier(data)
    errors: list[BaseException] = []

    def submit(worker: int) -> None:
        try:
            for j in range(8):
                slot = worker * 8 + j
                tier.submit_store(job(slot, [key(slot)], [slot]))
        except Exception as e:  # noqa: BLE001 - surfaced below: a thread cannot fail a test
            errors.append(e)

    threads = [threading.Thread(target=submit, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT_SECONDS)
    assert not errors
    results = collect_results(tier, range(64))
    assert all(r.success for r in results.values())
    assert all(tier.lookup(key(i), CTX) for i in range(64))


SHUTDOWN_CHILD = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec

    def native_threads():
        names = []
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    names.append(f.read().strip())
            except FileNotFoundError:
                pass
        return [n for n in names if n.startswith(("kvtier-load", "kvtier-store"))]

    data = np.ones((64, 65536), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root_dir": sys.argv[1], "n_read_threads": 1, "n_write_threads": 1,
         "async_lookup": True},
        memoryview(data), OffloadingSpec(model_name="m", dtype="f16"))
    # Workers name themselves once they run: give them a moment to appear.
    deadline = time.monotonic() + 30
    while len(native_threads()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    running = len(native_threads())
    k = lambda i: make_offload_key(i.to_bytes(32, "big"), 0)
    n = 0
    for i in range(100):
        tier.submit_store(JobMetadata(n, [k(i * 8 + b) for b in range(8)],
                                      np.arange(8) + (i % 8) * 8, False, ReqContext("r")))
        n += 1
    for i in range(20):
        tier.submit_load(JobMetadata(n, [k(b) for b in range(4)], np.arange(4) + 32, True,
                                     ReqContext("r")))
        n += 1
    tier.shutdown()
    tier.shutdown()
    ids = []
    errors = []
    for _ in range(3):
        for r in tier.get_finished():
            ids.append(r.job_id)
            if not r.success:
                errors.append(r.error)
    try:
        tier.submit_store(JobMetadata(n, [k(0)], np.arange(1), False, ReqContext("r")))
        refused = False
    except RuntimeError:
        refused = True
    print(json.dumps({"submitted": n, "ids": ids, "errors": errors, "running": running,
                      "left": native_threads(), "refused": refused}))
    """
)


def test_shutdown_with_queued_work_reports_every_job_once(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SHUTDOWN_CHILD, str(tmp_path / "root")],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["running"] == 2  # the probe of /proc works: the workers were seen
    assert sorted(report["ids"]) == list(range(report["submitted"]))
    assert report["left"] == []
    assert report["refused"] is True
    # Jobs cut short by the shutdown fail as cancelled, never with another error (loads of
    # blocks whose store was cancelled fail with ENOENT).
    for error in report["errors"]:
        assert "errno 125" in error or "errno 2)" in error, error


def test_tmp_files_of_dead_processes_are_swept(make_tier, tmp_path):
    tier = make_tier(primary())
    final = tier.file_mapper.get_file_name(key(1))
    os.makedirs(os.path.dirname(final), exist_ok=True)
    host = socket.gethostname().split(".")[0]
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=120)  # reaped: its pid is free
    token = "0123456789abcdef"
    dead_tmp = Path(f"{final}.{host}.{dead.pid}.{token}.0.tmp")
    live_tmp = Path(f"{final}.{host}.{dead.pid}.{token}.1.tmp")  # locked: its writer runs
    # Unlocked though its pid runs here: the pid is informational, the lock is liveness.
    unlocked_tmp = Path(f"{final}.{host}.{os.getpid()}.{token}.4.tmp")
    foreign_tmp = Path(f"{final}.otherhost-{host}.{dead.pid}.{token}.2.tmp")
    config_tmp = Path(f"{tier.file_mapper.config_path}.{host}.{dead.pid}.{token}.3.tmp")
    for p in (dead_tmp, live_tmp, unlocked_tmp, foreign_tmp, config_tmp):
        p.write_bytes(b"partial")
    live = os.open(live_tmp, os.O_RDWR)
    try:
        assert _core.lock_tmp_file(live)
        tier.shutdown()
        make_tier(primary())  # a restart of the tier sweeps
        assert live_tmp.exists()
    finally:
        os.close(live)
    assert not dead_tmp.exists()
    assert not config_tmp.exists()
    assert not unlocked_tmp.exists()
    assert foreign_tmp.exists()


def test_stats_include_engine_lookup_and_drop_counts(make_tier, collect_results):
    tier = make_tier(primary())
    store(tier, collect_results, 1, [key(1)], [0])
    tier.lookup(key(1), CTX)
    tier.lookup(key(2), CTX)
    stats = tier.stats()
    assert stats["store_blocks"] == 1
    assert stats["lookups"] == 2
    assert stats["lookup_hits"] == 1
    assert stats["lookup_misses"] == 1
    assert stats["dropped_store_jobs"] == 0


def test_store_of_existing_block_is_a_dedup_success(make_tier, collect_results):
    data = primary()
    tier = make_tier(data)
    store(tier, collect_results, 1, [key(1)], [0])
    store(tier, collect_results, 2, [key(1)], [1])  # other bytes, same key: first one wins
    tier.submit_load(job(3, [key(1)], [2]))
    assert collect_results(tier, [3])[3].success
    assert data[2].tobytes() == data[0].tobytes()
    assert tier.stats()["dedup_skips"] == 1


def test_o_direct_fallback_warns_once(tmp_path, caplog):
    shm = Path("/dev/shm")
    if not shm.is_dir() or _core.probe_o_direct(str(shm)) == "":
        pytest.skip("no file system without O_DIRECT at hand")
    root = Path(shm) / f"kvtier-test-{os.getpid()}-{time.monotonic_ns()}"
    try:
        with caplog.at_level(logging.WARNING):
            tier = SecondaryTierFactory.create_secondary_tier(
                {"type": "fs", "root_dir": str(root), "n_read_threads": 1, "n_write_threads": 1},
                memoryview(primary()),
                SPEC,
            )
        tier.shutdown()
        assert tier.direct_io is False
        assert sum("O_DIRECT" in r.getMessage() for r in caplog.records) == 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("io_engine_name", ["psync", "io_uring"])
def test_after_shutdown_the_volume_unmounts_with_the_tier_still_referenced(
    tmpfs_mount, collect_results, io_uring_refused, io_engine_name
):
    if io_engine_name == "io_uring" and io_uring_refused:
        pytest.skip(f"io_uring refused here: {io_uring_refused}")
    config = {"type": "fs", "root_dir": str(tmpfs_mount / "root"), "io_engine": io_engine_name}
    data = primary()
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(data), SPEC)
    store(tier, collect_results, 1, [key(1), key(2)], [1, 2])
    tier.shutdown()
    # `tier` is still referenced here: shutdown() alone must let go of the volume.
    umount = subprocess.run(["umount", str(tmpfs_mount)], capture_output=True, text=True)
    assert umount.returncode == 0, umount.stderr
    assert tier.file_mapper is not None

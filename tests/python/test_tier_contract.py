"""The SecondaryTierManager contract, run against every built-in tier type."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from kvtier.tiering.base import (
    JobMetadata,
    JobResult,
    ReqContext,
    SecondaryTierManager,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

# The fs tier runs the contract on each I/O engine.
TIER_TYPES = ["example", "fs-psync", "fs-io_uring"]
CTX = ReqContext("req-0")
SPEC = OffloadingSpec(model_name="test/model", dtype="float16")


def key(i: int, group: int = 0) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), group)


def job(job_id: int, keys: list[bytes], slots: list[int], promotion: bool = False) -> JobMetadata:
    return JobMetadata(job_id, keys, np.asarray(slots, dtype=np.int64), promotion, CTX)


@pytest.fixture(params=TIER_TYPES)
def tier_type(request, io_uring_refused) -> str:
    if request.param == "fs-io_uring" and io_uring_refused:
        pytest.skip(f"io_uring refused here: {io_uring_refused}")
    return request.param


@pytest.fixture
def make_tier(tier_type, tmp_path):
    created: list[SecondaryTierManager] = []
    tier_type, _, io_engine = tier_type.partition("-")

    def make(view: memoryview, **options) -> SecondaryTierManager:
        config = {"type": tier_type, **options}
        if tier_type == "fs":
            config.setdefault("root_dir", str(tmp_path / "root"))
            config.setdefault("n_read_threads", 2)
            config.setdefault("n_write_threads", 2)
            config.setdefault("io_engine", io_engine)
        tier = SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
        created.append(tier)
        return tier

    yield make
    for tier in created:
        tier.shutdown()


def random_primary(rows: int = 8, row_bytes: int = 1000, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (rows, row_bytes), dtype=np.uint8)


def test_keys_pack_hash_and_group():
    k = make_offload_key(b"\xab" * 16, 258)
    assert k == b"\xab" * 16 + b"\x00\x00\x01\x02"
    assert get_offload_block_hash(k) == b"\xab" * 16
    assert get_offload_group_idx(k) == 258
    with pytest.raises(ValueError):
        make_offload_key(b"x", -1)


def test_records_are_frozen_and_results_default_optional_fields():
    r = JobResult(3, True)
    assert (r.successful_keys, r.transfer_bytes, r.transfer_time, r.error) == (None,) * 4
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.success = False  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        SPEC.rank = 1  # type: ignore[misc]


def test_spec_validates_fields():
    with pytest.raises(ValueError, match="tokens_per_block"):
        OffloadingSpec("m", "f16", tokens_per_block=0)
    with pytest.raises(ValueError, match="model_name"):
        OffloadingSpec("", "f16")
    assert OffloadingSpec("m", "f16", kv_cache_groups=[1, 2]).kv_cache_groups == (1, 2)


def test_tier_type_and_empty_lookup(make_tier, tier_type):
    tier = make_tier(memoryview(random_primary()))
    assert tier.tier_type == tier_type.partition("-")[0]
    assert tier.lookup(key(1), CTX) is False


def test_store_then_lookup_true_and_reported_once(make_tier, collect_results):
    tier = make_tier(memoryview(random_primary()))
    tier.submit_store(job(1, [key(1), key(2)], [0, 1]))
    results = collect_results(tier, [1])
    assert results[1].success is True
    assert results[1].error is None
    assert tier.lookup(key(1), CTX) is True
    assert tier.lookup(key(2), CTX) is True
    assert tier.lookup(key(3), CTX) is False
    tier.drain_jobs()
    assert tier.get_finished() == []


@pytest.mark.parametrize("dtype", [np.float32, np.int8])
def test_round_trip_is_byte_exact_into_other_slots(make_tier, collect_results, dtype):
    rng = np.random.default_rng(7)
    primary = rng.standard_normal((6, 3, 50)).astype(dtype)  # 150 elements per row
    tier = make_tier(memoryview(primary))
    original = primary[:3].copy()
    tier.submit_store(job(1, [key(10), key(11), key(12)], [0, 1, 2]))
    assert collect_results(tier, [1])[1].success
    primary[3:] = 0
    tier.submit_load(job(2, [key(12), key(10), key(11)], [3, 4, 5], promotion=True))
    result = collect_results(tier, [2])[2]
    assert result.success
    assert result.transfer_bytes == 3 * primary[0].nbytes
    assert primary[3].tobytes() == original[2].tobytes()
    assert primary[4].tobytes() == original[0].tobytes()
    assert primary[5].tobytes() == original[1].tobytes()


def test_load_of_missing_key_fails_once(make_tier, collect_results):
    tier = make_tier(memoryview(random_primary()))
    tier.submit_load(job(5, [key(99)], [0]))
    results = collect_results(tier, [5])
    assert results[5].success is False
    assert results[5].error
    assert list(results[5].successful_keys or []) == []
    assert tier.get_finished() == []


def test_partly_missing_load_reports_the_keys_that_arrived(make_tier, collect_results):
    primary = random_primary()
    tier = make_tier(memoryview(primary))
    tier.submit_store(job(1, [key(1), key(3)], [0, 1]))
    assert collect_results(tier, [1])[1].success
    expected = primary[:2].copy()
    tier.submit_load(job(2, [key(1), key(2), key(3)], [4, 5, 6]))
    result = collect_results(tier, [2])[2]
    assert result.success is False
    assert sorted(result.successful_keys) == sorted([key(1), key(3)])
    assert primary[4].tobytes() == expected[0].tobytes()
    assert primary[6].tobytes() == expected[1].tobytes()


def test_jobs_are_tracked_independently(make_tier, collect_results):
    tier = make_tier(memoryview(random_primary(rows=16)))
    for i in range(4):
        tier.submit_store(job(100 + i, [key(i)], [i]))
    stores = collect_results(tier, range(100, 104))
    assert all(r.success for r in stores.values())
    tier.submit_load(job(200, [key(0)], [8]))
    tier.submit_load(job(201, [key(42)], [9]))
    tier.submit_load(job(202, [key(2), key(3)], [10, 11]))
    loads = collect_results(tier, [200, 201, 202])
    assert {i: r.success for i, r in loads.items()} == {200: True, 201: False, 202: True}


def test_get_finished_jobs_is_an_alias(make_tier, collect_results):
    tier = make_tier(memoryview(random_primary()))
    tier.submit_store(job(1, [key(1)], [0]))
    tier.drain_jobs()
    results = tier.get_finished_jobs()
    assert [r.job_id for r in results] == [1]
    assert tier.get_finished() == []


def test_bad_jobs_raise_synchronously(make_tier):
    tier = make_tier(memoryview(random_primary(rows=4)))
    with pytest.raises(ValueError, match="block_ids"):
        tier.submit_store(job(1, [key(1), key(2)], [0]))
    with pytest.raises(ValueError, match=r"block_ids\[0\] = 4 is out of range"):
        tier.submit_store(job(2, [key(1)], [4]))
    assert tier.get_finished() == []


def test_touch_is_accepted(make_tier):
    tier = make_tier(memoryview(random_primary()))
    assert tier.touch([key(1)], CTX) is None


def test_shutdown_is_idempotent_and_refuses_submits(make_tier, collect_results):
    tier = make_tier(memoryview(random_primary()))
    tier.submit_store(job(1, [key(1)], [0]))
    tier.drain_jobs()
    tier.shutdown()
    tier.shutdown()
    # Results of jobs submitted before shutdown are still handed out.
    assert collect_results(tier, [1])[1].success
    with pytest.raises(RuntimeError, match="shut down"):
        tier.submit_store(job(2, [key(2)], [1]))
    with pytest.raises(RuntimeError, match="shut down"):
        tier.submit_load(job(3, [key(1)], [1]))
    assert tier.get_finished() == []


def test_unaligned_primary_memory_round_trip(make_tier, collect_results):
    rows, row_bytes = 5, 4096 + 24
    raw = bytearray(os.urandom(rows * row_bytes + 1))
    # Starts one byte past an allocation: no tier may assume aligned primary memory.
    primary = np.frombuffer(raw, dtype=np.uint8, offset=1).reshape(rows, row_bytes)
    assert primary.ctypes.data % 2 == 1
    tier = make_tier(memoryview(primary))
    original = primary[0].tobytes()
    tier.submit_store(job(1, [key(1)], [0]))
    assert collect_results(tier, [1])[1].success
    tier.submit_load(job(2, [key(1)], [3]))
    assert collect_results(tier, [2])[2].success
    assert primary[3].tobytes() == original

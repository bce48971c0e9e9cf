"""Failures as vLLM sees them: a missing or corrupted block file is a failed promotion, and the
engine recovers: the key becomes a miss, the blocks that did load are kept, nothing hangs."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from vllm_harness import (
    HAVE_VLLM,
    ROW_BYTES,
    SKIP_REASON,
    Engine,
    random_keys,
    random_rows,
    until,
)
from vllm_harness import tier_config as make_tier_config

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

HEADER_BYTES = 4096  # kvtier block files: a 4096-byte header, then the payload


def corrupt(path: str) -> None:
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 100)
        byte = f.read(1)
        f.seek(HEADER_BYTES + 100)
        f.write(bytes([byte[0] ^ 0xFF]))


def test_corrupted_file_fails_its_promotion_and_keeps_the_others(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(3)
    rows = random_rows(3, seed=10)
    engine.store(keys, rows)
    engine.reset_primary()
    bad = keys[1]
    bad_path = engine.tier.file_mapper.get_file_name(bad)
    corrupt(bad_path)

    ctx = engine.new_request()
    final, seen = engine.lookup_until_final(keys, ctx)
    # One promotion job of three blocks: it fails, but the two good blocks arrived (vLLM's
    # successful_keys) and are served; the corrupted one is a miss to be recomputed.
    assert all(seen[0][k] is LookupResult.HIT_PENDING for k in keys)
    assert final == {keys[0]: LookupResult.HIT, bad: LookupResult.MISS, keys[2]: LookupResult.HIT}
    good = [keys[0], keys[2]]
    np.testing.assert_array_equal(engine.read(good, ctx), rows[[0, 2]])
    stats = engine.tier.stats()
    assert stats["failed_load_jobs"] == 1
    assert stats["corrupt_files_removed"] == 1
    assert not os.path.exists(bad_path), "a block that fails verification is removed"
    # Asked again by the same request, the failed key stays a miss (no promotion loop).
    with engine.manager.lock:
        assert engine.manager.lookup(bad, ctx) is LookupResult.MISS
    engine.finish_request(ctx)
    engine.wait_idle()

    # Another request finds the key absent too, after an asynchronous check.
    other = engine.new_request()
    final, _ = engine.lookup_until_final([bad], other)
    assert final[bad] is LookupResult.MISS
    engine.finish_request(other)


def test_file_missing_at_load_time_fails_the_promotion(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(2)
    engine.store(keys, random_rows(2, seed=11))
    engine.reset_primary()

    ctx = engine.new_request()
    with engine.manager.lock:
        first = {k: engine.manager.lookup(k, ctx) for k in keys}
    assert all(r is LookupResult.HIT_PENDING for r in first.values())
    # The files vanish (another node's cleanup, say) before the promotion is submitted.
    for key in keys:
        os.unlink(engine.tier.file_mapper.get_file_name(key))
    engine.step()  # submits the promotion, which fails

    final, seen = engine.lookup_until_final(keys, ctx)
    assert all(r is LookupResult.MISS for r in final.values())
    assert not any(r is LookupResult.HIT for results in seen for r in results.values())
    assert not any(engine.primary_has(k) for k in keys), "failed slots are released"
    assert engine.tier.stats()["failed_load_jobs"] == 1
    engine.finish_request(ctx)
    engine.wait_idle()


def test_engine_recovers_after_a_failed_promotion(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    (key,) = random_keys(1)
    engine.store([key], random_rows(1, seed=12))
    engine.reset_primary()
    corrupt(engine.tier.file_mapper.get_file_name(key))
    ctx = engine.new_request()
    final, _ = engine.lookup_until_final([key], ctx)
    assert final[key] is LookupResult.MISS
    engine.finish_request(ctx)

    # The block is recomputed and offloaded again; after another reset it promotes cleanly.
    fresh = random_rows(1, seed=13)
    engine.store([key], fresh)
    engine.reset_primary()
    ctx = engine.new_request()
    final, _ = engine.lookup_until_final([key], ctx)
    assert final[key] is LookupResult.HIT
    np.testing.assert_array_equal(engine.read([key], ctx), fresh)
    engine.finish_request(ctx)


def test_load_results_carry_successful_keys_and_bytes(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    # The tier's own answers in vLLM's types, as the tiering manager receives them.
    engine = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(3)
    engine.store(keys, random_rows(3, seed=14))
    tier = engine.tier
    os.unlink(tier.file_mapper.get_file_name(keys[1]))

    ctx = ReqContext(req_id="direct")
    tier.on_new_request(ctx)
    tier.submit_load(
        TransferJob(
            job_id=10_000,
            keys=keys,
            chunk_ids=np.array([5, 6, 7], dtype=np.int32),
            is_promotion=True,
            req_context=ctx,
        )
    )
    tier.drain_jobs()
    (result,) = until(lambda: list(tier.get_finished_jobs()), "the load result")
    assert result.job_id == 10_000
    assert result.success is False
    assert set(result.successful_keys) == {keys[0], keys[2]}
    assert result.transfer_bytes == 2 * ROW_BYTES
    assert result.transfer_time is not None
    assert tier.lookup(keys[1], ctx) is LookupResult.MISS
    tier.on_request_finished(ctx)


def test_jobs_after_shutdown_fail_instead_of_raising(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    tier = engine.tier
    tier.shutdown()
    ctx = ReqContext(req_id="late")
    job = TransferJob(
        job_id=20_000,
        keys=random_keys(1),
        chunk_ids=np.array([0], dtype=np.int32),
        is_promotion=False,
        req_context=ctx,
    )
    tier.submit_store(job)  # must not unwind vLLM's scheduler
    (result,) = list(tier.get_finished_jobs())
    assert (result.job_id, result.success) == (20_000, False)
    assert list(tier.get_finished_jobs()) == []

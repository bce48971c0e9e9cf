"""vLLM's TieringOffloadingManager, with its CPU primary tier over shared memory, drives kvtier.

Blocks stored to the primary tier cascade into kvtier's files; once the primary tier has lost
them (reset or eviction), a lookup promotes them back from kvtier, byte for byte.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from vllm_harness import HAVE_VLLM, ROW_BYTES, SKIP_REASON, Engine, random_keys, random_rows
from vllm_harness import tier_config as make_tier_config

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from kvtier.integrations.vllm import KvtierFileSystemTier
from vllm.v1.kv_offload.base import LookupResult, Medium


def test_manager_built_by_vllm_uses_the_kvtier_tier(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    assert len(engine.manager.secondary_tiers) == 1
    assert isinstance(engine.tier, KvtierFileSystemTier)
    with engine.manager.lock:
        view = engine.manager.primary_tier.get_kv_memoryview()
    assert view.shape == (8, ROW_BYTES)
    assert os.path.exists(engine.shm_path), "the primary tier lives in shared memory"


def test_stored_blocks_cascade_to_files_and_come_back_after_reset(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(5)
    rows = random_rows(5, seed=1)
    engine.store(keys, rows)

    # Each block is a kvtier file, at the path kvtier's mapper gives.
    paths = [engine.tier.file_mapper.get_file_name(k) for k in keys]
    assert all(os.path.isfile(p) for p in paths)
    assert all(p.startswith(str(tmp_path) + os.sep) for p in paths)

    # The primary tier forgets everything and its memory is overwritten.
    engine.reset_primary()
    assert not any(engine.primary_has(k) for k in keys)

    ctx = engine.new_request()
    final, seen = engine.lookup_until_final(keys, ctx)
    assert all(r is LookupResult.HIT for r in final.values())
    # The hits came through a promotion from kvtier, not from the primary tier.
    assert all(seen[0][k] is LookupResult.HIT_PENDING for k in keys)
    np.testing.assert_array_equal(engine.read(keys, ctx), rows)
    engine.finish_request(ctx)


def test_evicted_blocks_are_promoted_back(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)], num_chunks=4)
    first, second = random_keys(4), random_keys(4)
    first_rows, second_rows = random_rows(4, seed=2), random_rows(4, seed=3)
    engine.store(first, first_rows)
    engine.store(second, second_rows)  # a full primary tier: evicts every block of `first`
    assert not any(engine.primary_has(k) for k in first)
    assert all(engine.primary_has(k) for k in second)

    ctx = engine.new_request()
    final, _ = engine.lookup_until_final(first, ctx)
    assert all(r is LookupResult.HIT for r in final.values())
    np.testing.assert_array_equal(engine.read(first, ctx), first_rows)
    engine.finish_request(ctx)


def test_store_of_a_block_already_in_kvtier_is_not_a_failure(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(2)
    engine.store(keys, random_rows(2, seed=4))
    engine.reset_primary()
    # The same blocks offloaded again (recomputed after the reset): the files exist.
    engine.store(keys, random_rows(2, seed=4))
    stats = engine.tier.stats()
    assert stats["failed_store_jobs"] == 0
    assert stats["dedup_skips"] == len(keys), "existing files are kept, not rewritten"
    assert all(engine.primary_has(k) for k in keys)


def test_stored_blocks_are_announced_as_kv_events(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(
        [make_tier_config(tmp_path, enable_kv_events="true", locality="LOCAL")],
        enable_kv_cache_events=True,
    )
    keys = random_keys(3)
    engine.store(keys, random_rows(3, seed=5))
    with engine.manager.lock:
        events = list(engine.manager.take_events())
    storage_events = [e for e in events if e.medium is Medium.STORAGE]
    assert [k for e in storage_events for k in e.keys] == keys
    assert all(not e.removed for e in storage_events)
    assert all(e.locality is not None and e.locality.value == "LOCAL" for e in storage_events)
    with engine.manager.lock:
        assert not [e for e in engine.manager.take_events() if e.medium is Medium.STORAGE]


def test_shutdown_releases_the_primary_region(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    engine.store(random_keys(2), random_rows(2, seed=6))
    engine.close()
    assert not os.path.exists(engine.shm_path)
    assert engine.tier.kvtier_tier.is_shut_down


def test_lookup_never_blocks_and_a_miss_stays_a_miss_for_the_request(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine([make_tier_config(tmp_path)])
    unknown = random_keys(2)
    ctx = engine.new_request()
    with engine.manager.lock:
        # Unknown to this tier: answered at once with RETRY, checked off the scheduler thread.
        assert [engine.manager.lookup(k, ctx) for k in unknown] == [LookupResult.RETRY] * 2
    final, _ = engine.lookup_until_final(unknown, ctx)
    assert all(r is LookupResult.MISS for r in final.values())
    with engine.manager.lock:
        # vLLM re-runs its lookups within a step; the answer must not flip back to RETRY.
        for _ in range(3):
            assert [engine.manager.lookup(k, ctx) for k in unknown] == [LookupResult.MISS] * 2
    engine.finish_request(ctx)

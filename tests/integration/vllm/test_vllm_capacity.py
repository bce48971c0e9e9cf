"""kvtier's capacity through vLLM: evictions become BlockRemoved KV events, and the capacity
counters reach vLLM's offloading metrics (its Prometheus endpoint) through the tier hooks."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from vllm_harness import HAVE_VLLM, ROW_BYTES, SKIP_REASON, Engine, random_keys, random_rows, until
from vllm_harness import tier_config as make_tier_config

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from kvtier.tiering.fs.capacity import block_file_bytes
from vllm.v1.kv_offload.base import Medium

FILE = block_file_bytes(ROW_BYTES)
BUDGET = 48 * FILE


def fill(engine: Engine, n_batches: int) -> list[bytes]:
    keys: list[bytes] = []
    for b in range(n_batches):
        batch = random_keys(8)
        engine.store(batch, random_rows(8, seed=b))
        keys += batch
    return keys


def test_evictions_are_announced_as_block_removed_events(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(
        [make_tier_config(tmp_path, enable_kv_events=True, max_bytes=BUDGET)],
        enable_kv_cache_events=True,
    )
    keys = fill(engine, 16)  # 128 blocks: well past the budget of 48

    removed: list[bytes] = []

    def some_removed() -> bool:
        with engine.manager.lock:
            events = list(engine.manager.take_events())
        removed.extend(
            k for e in events if e.medium is Medium.STORAGE and e.removed for k in e.keys
        )
        return len(removed) > 0

    until(some_removed, "BlockRemoved events")
    assert set(removed) <= set(keys)
    on_disk = {p.name for p in tmp_path.rglob("*.kvb")}
    assert not {f"{k.hex()}.kvb" for k in removed} & on_disk  # removed means gone


def test_capacity_counters_reach_vllm_metrics(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    config = make_tier_config(tmp_path, max_bytes=BUDGET)
    engine = make_engine([config])
    definitions = TieringOffloadingSpec.build_metric_definitions(engine.spec.config.extra_config)
    for name in ("used_bytes", "capacity_bytes", "evicted_blocks", "evicted_bytes"):
        assert f"vllm:kvtier_{name}" in definitions
    fill(engine, 12)
    until(lambda: engine.tier.stats()["evicted_blocks"] > 0, "evictions")
    with engine.manager.lock:
        reduced = engine.manager.get_stats().reduce()
    root = str(tmp_path)
    assert reduced[f"vllm:kvtier_capacity_bytes:('{root}',)"] == BUDGET
    assert 0 < reduced[f"vllm:kvtier_used_bytes:('{root}',)"] <= BUDGET
    assert reduced[f"vllm:kvtier_evicted_blocks:('{root}',)"] > 0
    with engine.manager.lock:
        again = engine.manager.get_stats()
    # Counters report increases: nothing new was evicted in between, so none is reported.
    assert again is None or f"vllm:kvtier_evicted_blocks:('{root}',)" not in again.reduce()

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
    gauges = ("used_bytes", "reserved_bytes", "capacity_bytes")
    stalls = (
        "io_timeouts",
        "watchdog_pauses",
        "degraded_jobs",
        "lookup_timeouts",
        "ledger_close_failures",
    )
    for name in (*gauges, "evicted_blocks", "evicted_bytes", *stalls):
        assert f"vllm:kvtier_{name}" in definitions
    fill(engine, 12)
    until(lambda: engine.tier.stats()["evicted_blocks"] > 0, "evictions")
    with engine.manager.lock:
        reduced = engine.manager.get_stats().reduce()
    root = str(tmp_path)
    assert reduced[f"vllm:kvtier_capacity_bytes:('{root}',)"] == BUDGET
    assert 0 < reduced[f"vllm:kvtier_used_bytes:('{root}',)"] <= BUDGET
    # Reservations are their own gauge, never part of used_bytes (tiers.md, "Capacity").
    reserved = reduced[f"vllm:kvtier_reserved_bytes:('{root}',)"]
    assert 0 <= reserved <= BUDGET
    assert reduced[f"vllm:kvtier_evicted_blocks:('{root}',)"] > 0
    with engine.manager.lock:
        again = engine.manager.get_stats()
    # Counters report increases: nothing new was evicted in between, so none is reported.
    assert again is None or f"vllm:kvtier_evicted_blocks:('{root}',)" not in again.reduce()


def test_capacity_metrics_in_the_prometheus_exposition(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    """What vLLM's /metrics serves: its connector metrics (KVConnectorProm, as its
    PrometheusStatLogger builds them for the OffloadingConnector) observe the manager's stats
    after real evictions, and the registry the endpoint exports holds the kvtier series."""
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families
    from vllm.config import DeviceConfig, KVTransferConfig, VllmConfig
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm
    from vllm.v1.metrics.prometheus import get_prometheus_registry, unregister_vllm_metrics

    config = make_tier_config(tmp_path, max_bytes=BUDGET)
    engine = make_engine([config])
    extra = {"spec_name": "TieringOffloadingSpec", **engine.spec.config.extra_config}
    vllm_config = VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            kv_connector_extra_config=extra,
        ),
    )
    unregister_vllm_metrics()  # as PrometheusStatLogger does before registering its own
    try:
        prom = KVConnectorProm(vllm_config, ["model_name", "engine"], {0: ["kvtier-test", "0"]})
        fill(engine, 12)
        until(lambda: engine.tier.stats()["evicted_blocks"] > 0, "evictions")
        with engine.manager.lock:
            stats = engine.manager.get_stats()
        prom.observe(stats.data, 0)
        text = generate_latest(get_prometheus_registry()).decode()
    finally:
        unregister_vllm_metrics()
    samples = {
        s.name: s
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name.startswith("vllm:kvtier_")
    }
    labels = {"model_name": "kvtier-test", "engine": "0", "root_dir": str(tmp_path)}
    for name in (
        "vllm:kvtier_used_bytes",
        "vllm:kvtier_reserved_bytes",
        "vllm:kvtier_capacity_bytes",
        "vllm:kvtier_evicted_blocks_total",
        "vllm:kvtier_evicted_bytes_total",
    ):
        assert name in samples, f"{name} missing from the exposition:\n{text}"
        assert samples[name].labels == labels
    # Declared, with no series yet: counters report increases, and nothing was refused.
    assert "# TYPE vllm:kvtier_rejected_stores_total counter" in text
    assert "vllm:kvtier_rejected_stores_total" not in samples
    stats_now = engine.tier.stats()
    assert samples["vllm:kvtier_capacity_bytes"].value == BUDGET
    assert 0 < samples["vllm:kvtier_used_bytes"].value <= BUDGET
    assert 0 <= samples["vllm:kvtier_reserved_bytes"].value <= BUDGET
    evicted = samples["vllm:kvtier_evicted_blocks_total"].value
    assert 0 < evicted <= stats_now["evicted_blocks"]
    assert samples["vllm:kvtier_evicted_bytes_total"].value == evicted * FILE

"""kvtier as the secondary tier of a real vLLM 0.33 engine serving prompts on the CPU.

Every engine is vLLM's own (scheduler, OffloadingConnector, CPU primary tier, kvtier's tier
from ``secondary_tiers``), started in its own process by engine_runner.py; only the
GPU<->CPU-tier copy is the test spec's host copy (cpu_offloading_spec.py). Engines are slow
to start (~20 s), so one engine answers several checks: the tests of this module run in
order and share the engines of the module-scoped ``writer`` fixture.
"""

from __future__ import annotations

import random
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from engine_runner import (
    CHUNK_BYTES,
    HAVE_VLLM,
    MAX_TOKENS,
    PREFIX_CHUNKS,
    PREFIX_TOKENS,
    SKIP_REASON,
    EngineProcess,
    EngineSettings,
    kvtier_config,
)

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)


KVTIER = "KvtierFileSystemTier"  # vLLM labels it tier="1:KvtierFileSystemTier"


def block_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.kvb"))


def metric(metrics: dict[str, float], name: str, label: str = "") -> float:
    """A metric's value summed over the series whose labels contain ``label``."""
    return sum(v for k, v in metrics.items() if k.split("{")[0] == name and label in k)


def wait_for(predicate, what: str, timeout: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.2)
    return value


def settled_stats(engine: EngineProcess) -> dict[str, int | str]:
    """kvtier's counters once its stores are on disk: nothing in flight, twice 1 s apart.

    (Its ``queued_store_jobs`` stays up until vLLM collects the finished job in an engine
    step, which an idle engine does not take.)"""

    def idle() -> dict[str, int | str] | None:
        stats = engine.tier_stats()
        busy = stats["jobs_in_flight"] + stats["queued_stores"] + stats["running_stores"]
        return None if busy else stats

    before = wait_for(idle, "kvtier's stores")
    while True:
        time.sleep(1.0)
        after = wait_for(idle, "kvtier's stores")
        if after["store_jobs"] == before["store_jobs"]:
            return after
        before = after


@dataclass
class Served:
    """What one engine did for one round of the prompts."""

    tokens: list[list[int]]
    external_hits: float
    kvtier_read_bytes: float
    kvtier: dict[str, int]  # kvtier's own counters, increases over the round
    kvtier_health: str  # "healthy" unless the root's storage stopped answering


def serve(engine: EngineProcess, prompts: list[list[int]]) -> Served:
    before_m, before_s = engine.metrics(), engine.tier_stats()
    tokens = engine.generate(prompts, MAX_TOKENS)
    after_m, after_s = engine.metrics(), settled_stats(engine)
    return Served(
        tokens=tokens,
        external_hits=metric(after_m, "vllm:external_prefix_cache_hits")
        - metric(before_m, "vllm:external_prefix_cache_hits"),
        kvtier_read_bytes=metric(after_m, "vllm:kv_offload_tiering_read_bytes", KVTIER)
        - metric(before_m, "vllm:kv_offload_tiering_read_bytes", KVTIER),
        # "health" is the one stats value that is not a counter; it is checked, not diffed.
        kvtier={k: v - before_s[k] for k, v in after_s.items() if isinstance(v, int)},
        kvtier_health=str(after_s["health"]),
    )


def assert_served_prefix_from_kvtier(served: Served, reference: list[list[int]]) -> None:
    assert served.tokens == reference, "tokens must not depend on where the KV came from"
    assert served.external_hits >= PREFIX_TOKENS, "the shared prefix came from the connector"
    assert served.kvtier["load_blocks"] >= PREFIX_CHUNKS
    assert served.kvtier["failed_load_blocks"] == 0
    assert served.kvtier_health == "healthy"
    # vLLM's own counter for the kvtier tier: the prefix's KV bytes were read from it.
    assert served.kvtier_read_bytes == served.kvtier["load_bytes"] >= PREFIX_CHUNKS * CHUNK_BYTES


@dataclass
class Writer:
    root: Path
    engine: EngineProcess
    first: Served


@pytest.fixture(scope="module")
def writer(
    model_dir: Path, prompts: list[list[int]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Writer]:
    """A fresh engine on an empty kvtier root that has served the prompts once."""
    root = tmp_path_factory.mktemp("kvtier-root")
    engine = EngineProcess(EngineSettings(str(model_dir), kvtier_config(root)))
    try:
        yield Writer(root, engine, serve(engine, prompts))
    finally:
        engine.close()


def test_fresh_engine_writes_the_prefix_to_kvtier(
    writer: Writer, reference_tokens: list[list[int]]
) -> None:
    assert writer.first.tokens == reference_tokens
    assert writer.first.external_hits == 0, "nothing to serve from an empty root"
    # Only full 128-token chunks are offloaded: the 5 of the shared prefix, once each.
    assert len(block_files(writer.root)) == PREFIX_CHUNKS
    assert writer.first.kvtier["store_blocks"] == PREFIX_CHUNKS
    assert writer.first.kvtier["store_bytes"] >= PREFIX_CHUNKS * CHUNK_BYTES


def test_reset_connector_serves_the_prefix_from_kvtier(
    writer: Writer, prompts: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    # Empties vLLM's prefix cache and its CPU primary tier: only kvtier holds the prefix.
    assert writer.engine.reset()
    served = serve(writer.engine, prompts)
    assert_served_prefix_from_kvtier(served, reference_tokens)


def test_second_engine_on_the_same_root_serves_the_first_ones_prefix(
    writer: Writer, model_dir: Path, prompts: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    # The writer is still running: two engine processes share one root.
    second = EngineProcess(EngineSettings(str(model_dir), kvtier_config(writer.root)))
    try:
        served = serve(second, prompts)
    finally:
        second.close()
    assert_served_prefix_from_kvtier(served, reference_tokens)
    assert served.kvtier["store_blocks"] == 0, "blocks the first engine stored are not rewritten"
    assert len(block_files(writer.root)) == PREFIX_CHUNKS


def test_restarted_engine_serves_the_prefix_from_kvtier(
    writer: Writer, model_dir: Path, prompts: list[list[int]], reference_tokens: list[list[int]]
) -> None:
    writer.engine.close()
    restarted = EngineProcess(EngineSettings(str(model_dir), kvtier_config(writer.root)))
    try:
        served = serve(restarted, prompts)
    finally:
        restarted.close()
    assert_served_prefix_from_kvtier(served, reference_tokens)


def test_corrupted_block_is_recomputed_counted_and_stored_again(
    writer: Writer,
    model_dir: Path,
    prompts: list[list[int]],
    reference_tokens: list[list[int]],
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    shutil.copytree(writer.root, root)
    victim = block_files(root)[0]
    data = bytearray(victim.read_bytes())
    data[4096 + 100] ^= 0x01  # one payload bit (the payload follows a 4 KiB header)
    victim.write_bytes(bytes(data))
    corrupted = bytes(data)

    engine = EngineProcess(EngineSettings(str(model_dir), kvtier_config(root)))
    try:
        served = serve(engine, prompts)
    finally:
        engine.close()

    assert served.tokens == reference_tokens, "a corrupted block is never served"
    assert served.kvtier["failed_load_blocks"] >= 1
    assert served.kvtier["corrupt_files_removed"] == 1
    # Recomputed, then stored again by the same engine: a whole, different file.
    assert served.kvtier["store_blocks"] >= 1
    assert victim.exists()
    assert victim.read_bytes() != corrupted
    assert len(block_files(root)) == PREFIX_CHUNKS


def test_capacity_budget_holds_under_engine_traffic(model_dir: Path, tmp_path: Path) -> None:
    """Today's capacity options (max_bytes, eviction "lru"): prompts worth twice the budget."""
    root = tmp_path / "root"
    block_file_bytes = 4096 + CHUNK_BYTES  # a header and one chunk's KV
    budget = 20 * block_file_bytes
    rng = random.Random(7)
    engine = EngineProcess(
        EngineSettings(str(model_dir), kvtier_config(root, max_bytes=budget, eviction="lru"))
    )
    try:
        for _ in range(8):  # 8 distinct prompts of 5 chunks: 40 block files stored
            prompt = [rng.randrange(3, 1024) for _ in range(PREFIX_TOKENS + 40)]
            engine.generate([prompt], MAX_TOKENS)
            settled_stats(engine)
            on_disk = sum(p.stat().st_size for p in block_files(root))
            assert on_disk <= budget, f"{on_disk} bytes of block files over a {budget} budget"
        stats = wait_for(
            lambda: (s := settled_stats(engine))["evicted_blocks"] and s, "an eviction", 60
        )
        engine.generate([[5, 6, 7]], 2)  # vLLM collects the tier's stats in an engine step
        metrics = engine.metrics()
    finally:
        engine.close()
    assert stats["store_blocks"] == 8 * PREFIX_CHUNKS
    assert stats["rejected_stores"] == 0
    assert stats["capacity_bytes"] == budget
    assert len(block_files(root)) == 8 * PREFIX_CHUNKS - stats["evicted_blocks"]
    # The same counters in vLLM's metrics, labelled by the root.
    assert metric(metrics, "vllm:kvtier_capacity_bytes", str(root)) == budget
    assert metric(metrics, "vllm:kvtier_evicted_blocks", str(root)) > 0

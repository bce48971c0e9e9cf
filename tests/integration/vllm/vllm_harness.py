"""Helpers that drive kvtier through vLLM's own tiered offloading code (vLLM 0.33).

These tests need the real vLLM package. They run in the environment built by
``bash .ci/vllm-env.sh .venv-vllm`` (``.venv-vllm/bin/python -m pytest tests/integration/vllm``);
elsewhere the modules that need vLLM skip with the reason below.

The ``Engine`` helper plays the part of vLLM's scheduler-side connector: it calls the
``TieringOffloadingManager`` that vLLM's ``TieringOffloadingSpec`` builds (CPU primary tier over
a shared-memory region, secondary tiers from ``secondary_tiers``) in the order the scheduler
does, holding the manager's lock, and stands in for the GPU worker only by writing block bytes
into primary rows.
"""

from __future__ import annotations

import importlib.util
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = (
    "vLLM is not installed in this environment; the vLLM integration tests run in their own "
    "venv: bash .ci/vllm-env.sh .venv-vllm && .venv-vllm/bin/python -m pytest "
    "tests/integration/vllm"
)

TIER_TYPE = "KvtierFileSystemTier"
MODULE_PATH = "kvtier.integrations.vllm"
# Bytes one worker stores per block; vLLM pads each primary row to a page (8192 here), so
# the rows kvtier moves are not the size vLLM was given.
WORKER_KV_BYTES_PER_BLOCK = 6000
ROW_BYTES = 8192
TIMEOUT_S = 60.0


def until(predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT_S) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail (never hang) after timeout."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.005)


def tier_config(root_dir: os.PathLike[str] | str, **options: Any) -> dict[str, Any]:
    """A ``secondary_tiers`` entry as a vLLM user writes it."""
    return {"type": TIER_TYPE, "module_path": MODULE_PATH, "root_dir": str(root_dir), **options}


def make_offloading_config(
    tiers: Sequence[dict[str, Any]],
    *,
    num_chunks: int = 8,
    model: str = "kvtier-test/model",
    dtype: str = "float16",
    tp_size: int = 1,
    parallelism_agnostic: bool = False,
    enable_kv_cache_events: bool = False,
    engine_id: str | None = None,
) -> Any:
    """vLLM's normalized offloading configuration for a one-group, one-worker engine."""
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    return OffloadingConfig(
        groups=(
            OffloadingGroupConfig(
                tokens_per_block=16,
                layer_names=("model.layers.0.self_attn", "model.layers.1.self_attn"),
                group_id=0,
            ),
        ),
        worker_kv_bytes_per_block=WORKER_KV_BYTES_PER_BLOCK,
        enable_kv_cache_events=enable_kv_cache_events,
        extra_config={
            "cpu_bytes_to_use": num_chunks * ROW_BYTES,
            "secondary_tiers": [dict(t) for t in tiers],
        },
        engine_id=engine_id or f"kvtier-test-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=tp_size,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=parallelism_agnostic,
        ),
    )


def random_keys(n: int) -> list[bytes]:
    from vllm.v1.kv_offload.base import make_offload_key

    return [make_offload_key(os.urandom(32), 0) for _ in range(n)]


def random_rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, ROW_BYTES), dtype=np.uint8)


@dataclass
class Engine:
    """One vLLM engine's scheduler-side offloading: spec, manager, and a scheduler's calls."""

    spec: Any
    manager: Any
    _requests: int = field(default=0)
    _closed: bool = field(default=False)

    @property
    def tier(self) -> Any:
        return self.manager.secondary_tiers[0]

    @property
    def shm_path(self) -> str:
        return f"/dev/shm/vllm_offload_{self.spec.config.engine_id}.mmap"

    @contextmanager
    def primary_rows(self) -> Iterator[np.ndarray]:
        """The primary tier's memory as (chunks, row bytes) uint8, released on exit."""
        view = self.manager.primary_tier.get_kv_memoryview()
        rows = np.asarray(view).view(np.uint8)
        try:
            yield rows
        finally:
            del rows  # an exported buffer would keep vLLM from unmapping the region

    def new_request(self) -> Any:
        from vllm.v1.kv_offload.base import ReqContext

        self._requests += 1
        ctx = ReqContext(req_id=f"req-{self._requests}")
        with self.manager.lock:
            self.manager.on_new_request(ctx)
        return ctx

    def finish_request(self, ctx: Any) -> None:
        with self.manager.lock:
            self.manager.on_request_finished(ctx)

    def step(self) -> None:
        from vllm.v1.kv_offload.base import ScheduleEndContext

        with self.manager.lock:
            self.manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))

    def wait_idle(self) -> None:
        """Step until no transfer between the primary and a secondary tier is in flight."""

        def idle() -> bool:
            self.step()
            with self.manager.lock:
                return not self.manager.has_pending_work()

        until(idle, "the tiering manager to finish its transfers")

    def store(self, keys: Sequence[bytes], rows: np.ndarray) -> None:
        """What vLLM does when a request's blocks are offloaded: GPU -> primary -> cascade."""
        ctx = self.new_request()
        with self.manager.lock:
            out = self.manager.prepare_store(list(keys), ctx)
        assert out is not None, "the primary tier refused the store"
        assert list(out.keys_to_store) == list(keys)
        with self.primary_rows() as primary:
            primary[out.store_spec.chunk_ids] = rows  # the GPU worker's copy
        with self.manager.lock:
            self.manager.complete_store(list(keys), ctx)  # cascades to secondary tiers
        self.finish_request(ctx)
        self.wait_idle()

    def lookup_until_final(self, keys: Sequence[bytes], ctx: Any) -> tuple[dict, list]:
        """Look keys up once per scheduler step until each is HIT or MISS.

        Returns the final result per key and every intermediate result seen.
        """
        from vllm.v1.kv_offload.base import LookupResult

        final = (LookupResult.HIT, LookupResult.MISS)
        seen: list[dict] = []

        def settled() -> dict | None:
            with self.manager.lock:
                results = {k: self.manager.lookup(k, ctx) for k in keys}
            seen.append(results)
            self.step()  # flushes promotions queued by the lookups, collects finished jobs
            return results if all(r in final for r in results.values()) else None

        return until(settled, "lookups to settle on HIT or MISS"), seen

    def read(self, keys: Sequence[bytes], ctx: Any) -> np.ndarray:
        """Bytes of primary rows that hold ``keys`` (as a GPU load would read them)."""
        with self.manager.lock:
            spec = self.manager.prepare_load(list(keys), ctx)
        with self.primary_rows() as primary:
            data = primary[spec.chunk_ids].copy()
        with self.manager.lock:
            self.manager.complete_load(list(keys), ctx)
        return data

    def reset_primary(self, seed: int = 12345) -> None:
        """Drop everything from the primary tier and overwrite its memory with garbage."""
        with self.manager.lock:
            self.manager.reset_cache()
            self.manager.on_reset_flushed()
        with self.primary_rows() as primary:
            primary[:] = np.random.default_rng(seed).integers(0, 256, primary.shape, dtype=np.uint8)

    def primary_has(self, key: bytes) -> bool:
        from vllm.v1.kv_offload.base import LookupResult, ReqContext

        with self.manager.lock:
            found = self.manager.primary_tier.lookup(key, ReqContext(req_id="probe"))
        return found is LookupResult.HIT

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.manager.shutdown()  # vLLM calls this without the manager lock

"""Fixtures of the vLLM integration tests; the helpers live in vllm_harness.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from vllm_harness import Engine, make_offloading_config


@pytest.fixture
def make_engine() -> Iterator[Callable[..., Engine]]:
    """Build engines from vLLM's TieringOffloadingSpec; shut them down after the test."""
    engines: list[Engine] = []

    def make(tiers: Sequence[dict[str, Any]], **config: Any) -> Engine:
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        spec = TieringOffloadingSpec(make_offloading_config(tiers, **config))
        engine = Engine(spec, spec.get_manager())
        engines.append(engine)
        return engine

    yield make
    for engine in reversed(engines):
        engine.close()


def pytest_configure(config: pytest.Config) -> None:
    # vLLM imports torch.jit-scripted helpers at import time; their deprecation is not ours.
    config.addinivalue_line(
        "filterwarnings", "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
    )

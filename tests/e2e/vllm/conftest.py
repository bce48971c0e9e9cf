"""Fixtures of the vLLM engine tests: the tiny model, the prompts, the reference tokens."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from engine_runner import MAX_TOKENS, PREFIX_TOKENS


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine_runner import build_random_llama

    return build_random_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def prompts() -> list[list[int]]:
    rng = random.Random(21)
    prefix = [rng.randrange(3, 1024) for _ in range(PREFIX_TOKENS)]
    return [prefix + [rng.randrange(3, 1024) for _ in range(40)] for _ in range(3)]


@pytest.fixture(scope="session")
def reference_tokens(model_dir: Path, prompts: list[list[int]]) -> list[list[int]]:
    """The same prompts on an engine without KV offloading."""
    from engine_runner import EngineProcess, EngineSettings

    engine = EngineProcess(EngineSettings(model=str(model_dir)))
    try:
        tokens = engine.generate(prompts, MAX_TOKENS)
    finally:
        engine.close()
    assert all(len(t) == MAX_TOKENS for t in tokens)
    return tokens

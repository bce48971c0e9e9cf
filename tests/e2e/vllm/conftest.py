"""Fixtures of the vLLM engine tests: the tiny model, the prompts, the reference tokens."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path

import pytest

HAVE_VLLM = importlib.util.find_spec("vllm") is not None
SKIP_REASON = (
    "vLLM is not installed in this environment; the vLLM engine tests run in their own venv: "
    "bash .ci/vllm-engine-env.sh .venv-vllm-engine && "
    ".venv-vllm-engine/bin/python -m pytest tests/e2e/vllm"
)

# Three prompts sharing a 640-token prefix (5 offloaded chunks of 128 tokens), each with its
# own 40-token tail (never a full chunk, so never stored).
PREFIX_TOKENS = 640
PREFIX_CHUNKS = 5
MAX_TOKENS = 8
# KV bytes of one chunk of the tiny model: 128 tokens x 2 layers x (K, V) x 2 heads x 64 x bf16.
CHUNK_BYTES = 128 * 2 * 2 * 2 * 64 * 2


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

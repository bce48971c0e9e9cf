"""Fixtures of the SGLang integration tests; the helpers live in sglang_harness.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sglang_harness import create_backend


@pytest.fixture
def make_backend(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Create backends through SGLang's factory; close them after the test."""
    # SGLang's file backend prefers this variable to its configured directory.
    monkeypatch.delenv("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", raising=False)
    backends: list[Any] = []

    def make(*args: Any, **kwargs: Any) -> Any:
        backend = create_backend(*args, **kwargs)
        backends.append(backend)
        return backend

    yield make
    for backend in reversed(backends):
        close = getattr(backend, "close", None)
        if close is not None:
            close()


def pytest_configure(config: pytest.Config) -> None:
    # SGLang's quantization modules warn at import time about GPU-only features.
    config.addinivalue_line("filterwarnings", "ignore::UserWarning:sglang")
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning")

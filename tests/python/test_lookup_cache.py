"""The fs tier's cache of known blocks (kvtier.tiering.fs.lookup.LookupCache): bounded, least
recently asked first out, and invisible to the garbage collector however large it grows."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from kvtier.tiering.base import make_offload_key
from kvtier.tiering.fs import lookup
from kvtier.tiering.fs.lookup import LookupCache


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def _cache(tmp_path: Path) -> LookupCache:
    # No block file exists: a key the cache has forgotten is looked up on disk, and absent.
    return LookupCache(lambda key: str(tmp_path / f"{key.hex()}.kvb"), False, "test-lookup")


def test_the_least_recently_asked_keys_are_forgotten_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lookup, "_MAX_PRESENT", 32)
    cache = _cache(tmp_path)
    try:
        cache.mark_present([_key(i) for i in range(32)])
        assert cache.lookup(_key(0)) is True  # key 0 is now the most recently asked
        cache.mark_present([_key(32)])  # one too many: the oldest sixteenth (2) goes
        answers = {i: cache.lookup(_key(i)) for i in range(33)}
        assert [i for i, known in answers.items() if not known] == [1, 2]
    finally:
        cache.close()


def test_a_million_known_blocks_cost_the_garbage_collector_nothing(tmp_path: Path) -> None:
    """An OrderedDict stays tracked whatever it holds: with a million keys every full
    collection of the engine's process walked it with the GIL held."""
    cache = _cache(tmp_path)
    try:
        cache.mark_present([_key(i) for i in range(100_000)])
        gc.collect()
        assert not gc.is_tracked(cache._present)
        cache.mark_present([_key(i) for i in range(100_000, 100_100)])
        assert cache.lookup(_key(5)) is True
        assert not gc.is_tracked(cache._present)
    finally:
        cache.close()

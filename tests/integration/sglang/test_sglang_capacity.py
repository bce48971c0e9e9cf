"""The SGLang backend honours the root's capacity options (issue 18, item 11): ``max_bytes``,
``min_free_fraction`` and ``eviction`` hold its pages within the budget the fs tier, vLLM and
``kvtier gc`` share, driven through SGLang's own factory and host pools."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sglang_harness import HAVE_SGLANG, KVTIER, PAGE_SIZE, SKIP_REASON, host_pool, page_bytes

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from kvtier.tiering.fs.capacity import block_file_bytes

MakeBackend = Callable[..., Any]
BUDGET = 64 << 10  # "64K": eight page files of this pool
# Attempts at one batch while eviction makes room (a refused set is retried, as SGLang backs a
# page up again later).
ATTEMPTS = 200


def keys_for(n: int, tag: str) -> list[str]:
    return [f"{tag}{i:064x}" for i in range(n)]


def disk_bytes(root: Path) -> int:
    """What the budget counts: block files and their tmp files."""
    return sum(p.stat().st_size for p in root.rglob("*.kvb*") if p.is_file())


def page_file_bytes(pool: Any) -> int:
    return block_file_bytes(len(page_bytes(pool, 0)))


@pytest.mark.parametrize("interface", ["v1", "generic"])
def test_pages_stay_within_max_bytes_with_lru_eviction(
    tmp_path: Path, make_backend: MakeBackend, interface: str
) -> None:
    pool = host_pool("layer_first")
    assert page_file_bytes(pool) * 8 == BUDGET
    backend = make_backend(KVTIER, tmp_path, pool, max_bytes="64K", eviction="lru")
    assert backend.options.max_bytes == BUDGET
    pages = pool.alloc(3 * PAGE_SIZE)
    keys = keys_for(33, "p")
    stored = 0
    for start in range(0, len(keys), 3):
        batch = keys[start : start + 3]
        for _ in range(ATTEMPTS):
            if interface == "v1":
                ok = all(backend.batch_set_v1(batch, pages[: len(batch) * PAGE_SIZE]))
            else:
                starts = pages[::PAGE_SIZE][: len(batch)].tolist()
                ok = backend.batch_set(batch, [pool.get_data_page(s) for s in starts])
            assert disk_bytes(tmp_path) <= BUDGET
            if ok:
                break
            time.sleep(0.05)  # pacing only: the capacity thread evicts meanwhile
        stored += len(batch) if ok else 0
    # 33 pages, four times the budget, went through it: eviction made room, and the root
    # never held more than the budget.
    assert stored == len(keys)
    assert disk_bytes(tmp_path) <= BUDGET
    stats = backend.engine_stats()
    assert stats["capacity_bytes"] == BUDGET and stats["evicted_blocks"] >= 33 - 8
    assert (tmp_path / ".kvtier").is_dir()  # the root's shared capacity state
    # The newest pages survive eviction; the oldest went first.
    assert backend.batch_exists(keys[-3:]) == 3
    assert backend.batch_exists(keys[:1]) == 0


def test_eviction_none_refuses_pages_beyond_the_budget(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(KVTIER, tmp_path, pool, max_bytes=BUDGET, eviction="none")
    pages = pool.alloc(PAGE_SIZE)
    keys = keys_for(12, "n")
    results = [backend.batch_set_v1([k], pages)[0] for k in keys]
    assert results[:8] == [True] * 8 and not any(results[8:])
    assert disk_bytes(tmp_path) <= BUDGET
    assert backend.batch_exists(keys[:8]) == 8  # nothing was deleted
    assert backend.engine_stats()["rejected_stores"] >= 4


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "none", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_min_free_fraction_keeps_free_space(small_tmpfs: Path, make_backend: MakeBackend) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(
        KVTIER, small_tmpfs, pool, min_free_fraction=0.5, eviction="none", o_direct=False
    )
    pages = pool.alloc(PAGE_SIZE)
    results = [backend.batch_set_v1([k], pages)[0] for k in keys_for(256, "f")]  # 2 MiB
    assert any(results) and not all(results)
    st = os.statvfs(small_tmpfs)
    assert st.f_bavail / st.f_blocks > 0.4  # the floor (less the stores it admitted at once)


@pytest.mark.parametrize(
    ("option", "value", "match"),
    [
        ("max_bytes", "lots", r"max_bytes"),
        ("max_bytes", -1, r"max_bytes"),
        ("eviction", "fifo", r"'eviction'.*lru"),
        ("min_free_fraction", 2.0, r"min_free_fraction"),
    ],
)
def test_bad_capacity_options_are_refused(
    tmp_path: Path, make_backend: MakeBackend, option: str, value: Any, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        make_backend(KVTIER, tmp_path, host_pool("layer_first"), **{option: value})

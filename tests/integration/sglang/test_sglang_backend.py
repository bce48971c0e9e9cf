"""kvtier's HiCache storage backend driven by SGLang's own code, next to SGLang's `file` backend.

Backends come from SGLang's StorageBackendFactory (kvtier through the ``dynamic`` config the
docs give), pages live in SGLang's real host pools. Tests where the two backends promise the
same thing run on both, which shows the tests themselves are right.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sglang_harness import (
    FILE,
    HAVE_SGLANG,
    KVTIER,
    PAGE_SIZE,
    SKIP_REASON,
    host_pool,
    page_bytes,
    page_starts,
)

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import torch
from kvtier import _core
from kvtier.integrations.sglang import KvtierHiCacheStorage

LAYOUTS = ["layer_first", "page_first"]
MakeBackend = Callable[..., Any]


def keys_for(n: int, tag: str = "k") -> list[str]:
    # SGLang's keys are hex page hashes; the tag keeps each test's key sets apart.
    return [f"{tag}{i:064x}" for i in range(n)]


def generic_set(backend: Any, pool: Any, keys: list[str], indices: torch.Tensor) -> bool:
    """What SGLang's controller does to back pages up without interface_v1."""
    starts = page_starts(indices)
    return backend.batch_set(keys, [pool.get_data_page(s) for s in starts])


def generic_get(backend: Any, pool: Any, keys: list[str], indices: torch.Tensor) -> int:
    """What SGLang's controller does to prefetch pages without interface_v1: pages copied."""
    dummies = [pool.get_dummy_flat_data_page() for _ in keys]
    got = backend.batch_get(keys, dummies)
    count = 0
    for start, page in zip(page_starts(indices), got):
        if page is None:
            break
        pool.set_from_flat_data_page(start, page)
        count += 1
    return count


def test_factory_creates_the_backend_from_the_dynamic_config(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    backend = make_backend(KVTIER, tmp_path, host_pool("layer_first"))
    assert isinstance(backend, KvtierHiCacheStorage)
    assert backend.options.root_dir == str(tmp_path)
    assert backend.options.n_read_threads == 2


def test_unknown_option_is_rejected_naming_the_valid_ones(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    with pytest.raises(ValueError, match=r"Unknown option 'n_reader_threads'.*Valid options") as e:
        make_backend(KVTIER, tmp_path, host_pool("layer_first"), n_reader_threads=4)
    assert "n_read_threads" in str(e.value)
    assert "async_lookup" not in str(e.value), "the fs tier's queue options do not apply"


def test_bad_option_value_is_rejected_like_the_fs_tier(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    with pytest.raises(ValueError, match=r"'durability'.*one of"):
        make_backend(KVTIER, tmp_path, host_pool("layer_first"), durability="sometimes")


def test_bad_io_engine_is_rejected_naming_the_choices(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    with pytest.raises(ValueError, match=r"'io_engine'.*\['auto', 'io_uring', 'psync'\]"):
        make_backend(KVTIER, tmp_path, host_pool("layer_first"), io_engine="uring")


def test_io_engine_reaches_the_engine_and_is_reported(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    backend = make_backend(KVTIER, tmp_path, host_pool("layer_first"), io_engine="psync")
    assert backend.options.io_engine == "psync"
    assert backend.io_engine == "psync"


def test_refused_io_uring_fails_registration_saying_what_to_use(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    from kvtier.tiering.fs.engine import io_uring_refusal

    if not io_uring_refusal(tmp_path / "probe"):
        pytest.skip("io_uring works here (tests/python/test_io_engine.py refuses it in a child)")
    with pytest.raises(OSError, match=r"SGLang storage backend 'kvtier': .*use io_engine='auto'"):
        make_backend(KVTIER, tmp_path / "kv", host_pool("layer_first"), io_engine="io_uring")


def test_uncreatable_root_dir_is_an_oserror_naming_it(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    with pytest.raises(OSError, match="cannot create kvtier root_dir") as e:
        make_backend(KVTIER, blocker / "kv", host_pool("layer_first"))
    assert e.value.filename == str(blocker / "kv")


def test_storage_metrics_count_pages_per_batch(tmp_path: Path, make_backend: MakeBackend) -> None:
    pool = host_pool("page_first")
    backend = make_backend(KVTIER, tmp_path, pool, metrics=True)
    keys = keys_for(3)
    src = pool.alloc(3 * PAGE_SIZE)
    assert backend.batch_set_v1(keys, src) == [True] * 3
    assert backend.batch_get_v1(keys[:2], src[: 2 * PAGE_SIZE]) == [True, True]
    stats = backend.get_stats()
    assert (stats.backup_pgs, stats.prefetch_pgs) == ([3], [2])
    assert all(bw > 0 for bw in stats.backup_bandwidth + stats.prefetch_bandwidth)
    assert {"io_timeouts", "ledger_close_failures", "health"} <= stats.kvtier_stats.keys()
    assert backend.get_stats().backup_pgs == [], "each call reports what happened since the last"


@pytest.mark.parametrize("is_mla", [False, True], ids=["mha", "mla"])
@pytest.mark.parametrize("layout", [*LAYOUTS, "page_first_direct"])
def test_zero_copy_round_trip_is_byte_exact(
    tmp_path: Path, make_backend: MakeBackend, layout: str, is_mla: bool
) -> None:
    pool = host_pool(layout, is_mla=is_mla)
    backend = make_backend(KVTIER, tmp_path, pool, is_mla=is_mla)
    keys = keys_for(5)
    src = pool.alloc(len(keys) * PAGE_SIZE)
    expected = [page_bytes(pool, s) for s in page_starts(src)]
    assert backend.batch_set_v1(keys, src) == [True] * 5

    dst = pool.alloc(len(keys) * PAGE_SIZE)
    assert [page_bytes(pool, s) for s in page_starts(dst)] != expected
    assert backend.batch_get_v1(keys, dst) == [True] * 5
    assert [page_bytes(pool, s) for s in page_starts(dst)] == expected
    # Pages next to the loaded ones are untouched.
    others = pool.alloc(PAGE_SIZE)
    before = page_bytes(pool, int(others[0]))
    backend.batch_get_v1(keys[:1], dst[:PAGE_SIZE])
    assert page_bytes(pool, int(others[0])) == before


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("kind", [KVTIER, FILE])
def test_generic_round_trip_is_byte_exact(
    tmp_path: Path, make_backend: MakeBackend, kind: str, layout: str
) -> None:
    pool = host_pool(layout)
    backend = make_backend(kind, tmp_path, pool)
    keys = keys_for(4)
    src = pool.alloc(len(keys) * PAGE_SIZE)
    expected = [page_bytes(pool, s) for s in page_starts(src)]
    assert generic_set(backend, pool, keys, src)

    dst = pool.alloc(len(keys) * PAGE_SIZE)
    assert generic_get(backend, pool, keys, dst) == 4
    assert [page_bytes(pool, s) for s in page_starts(dst)] == expected
    assert backend.get(keys[0], pool.get_dummy_flat_data_page()) is not None
    assert backend.get(keys_for(1, "absent")[0], pool.get_dummy_flat_data_page()) is None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generic_and_zero_copy_paths_share_files(
    tmp_path: Path, make_backend: MakeBackend, layout: str
) -> None:
    pool = host_pool(layout)
    backend = make_backend(KVTIER, tmp_path, pool)
    a, b = keys_for(3, "a"), keys_for(3, "b")
    src_a, src_b = pool.alloc(3 * PAGE_SIZE), pool.alloc(3 * PAGE_SIZE)
    expected_a = [page_bytes(pool, s) for s in page_starts(src_a)]
    expected_b = [page_bytes(pool, s) for s in page_starts(src_b)]
    assert backend.batch_set_v1(a, src_a) == [True] * 3
    assert generic_set(backend, pool, b, src_b)

    dst = pool.alloc(3 * PAGE_SIZE)
    assert generic_get(backend, pool, a, dst) == 3
    assert [page_bytes(pool, s) for s in page_starts(dst)] == expected_a
    assert backend.batch_get_v1(b, dst) == [True] * 3
    assert [page_bytes(pool, s) for s in page_starts(dst)] == expected_b


@pytest.mark.parametrize("kind", [KVTIER, FILE])
def test_batch_exists_counts_the_leading_run_of_hits(
    tmp_path: Path, make_backend: MakeBackend, kind: str
) -> None:
    pool = host_pool("page_first")
    backend = make_backend(kind, tmp_path, pool)
    keys = keys_for(5)
    stored = [0, 1, 3]
    src = pool.alloc(len(stored) * PAGE_SIZE)
    assert generic_set(backend, pool, [keys[i] for i in stored], src)
    assert backend.batch_exists(keys) == 2
    assert backend.batch_exists(keys[3:]) == 1
    assert backend.batch_exists(keys[2:]) == 0
    assert backend.batch_exists([keys[0], keys[1], keys[3]]) == 3
    assert backend.exists(keys[3]) and not backend.exists(keys[4])


def corrupt(path: str, how: str) -> None:
    if how == "flipped payload byte":
        with open(path, "r+b") as f:
            f.seek(_core.HEADER_SIZE + 10)
            byte = f.read(1)
            f.seek(_core.HEADER_SIZE + 10)
            f.write(bytes([byte[0] ^ 0xFF]))
    elif how == "truncated":
        os.truncate(path, _core.HEADER_SIZE + 100)
    else:  # a foreign file: raw page bytes, as SGLang's file backend writes them
        with open(path, "wb") as f:
            f.write(os.urandom(os.path.getsize(path) or 8192))


@pytest.mark.parametrize("how", ["flipped payload byte", "truncated", "foreign file"])
@pytest.mark.parametrize("path", ["zero-copy", "generic"])
def test_corrupt_file_is_a_miss_never_wrong_bytes(
    tmp_path: Path, make_backend: MakeBackend, how: str, path: str
) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(KVTIER, tmp_path, pool)
    keys = keys_for(3)
    src = pool.alloc(3 * PAGE_SIZE)
    expected = [page_bytes(pool, s) for s in page_starts(src)]
    assert backend.batch_set_v1(keys, src) == [True] * 3
    victim = backend.file_mapper.get_file_name(keys[1].encode())
    corrupt(victim, how)

    if path == "zero-copy":
        dst = pool.alloc(3 * PAGE_SIZE)
        assert backend.batch_get_v1(keys, dst) == [True, False, True]
        got = [page_bytes(pool, s) for s in page_starts(dst)]
        assert got[0] == expected[0] and got[2] == expected[2]
    else:
        pages = backend.batch_get(keys, [pool.get_dummy_flat_data_page() for _ in keys])
        assert pages[1] is None
        assert pages[0].view(torch.uint8).numpy().tobytes() == expected[0]
    assert not os.path.exists(victim), "a file that fails verification is removed"
    assert backend.batch_exists(keys) == 1


@pytest.mark.parametrize("kind", [KVTIER, FILE])
def test_two_instances_sharing_a_root_see_each_others_pages(
    tmp_path: Path, make_backend: MakeBackend, kind: str
) -> None:
    pool_a, pool_b = host_pool("layer_first", seed=1), host_pool("layer_first", seed=2)
    first = make_backend(kind, tmp_path, pool_a)
    second = make_backend(kind, tmp_path, pool_b)
    keys = keys_for(4)
    src = pool_a.alloc(4 * PAGE_SIZE)
    expected = [page_bytes(pool_a, s) for s in page_starts(src)]
    assert generic_set(first, pool_a, keys, src)

    assert second.batch_exists(keys) == 4
    dst = pool_b.alloc(4 * PAGE_SIZE)
    assert generic_get(second, pool_b, keys, dst) == 4
    assert [page_bytes(pool_b, s) for s in page_starts(dst)] == expected


def test_shared_root_zero_copy_between_instances_of_other_layouts_is_refused_as_miss(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    # Pages of a layer_first pool are stored in another byte order than page_first ones:
    # the two layouts get separate namespaces, so one never reads the other's pages.
    lf, pf = host_pool("layer_first"), host_pool("page_first")
    first = make_backend(KVTIER, tmp_path, lf)
    second = make_backend(KVTIER, tmp_path, pf)
    keys = keys_for(2)
    assert first.batch_set_v1(keys, lf.alloc(2 * PAGE_SIZE)) == [True, True]
    assert second.batch_exists(keys) == 0
    assert first.file_mapper.namespace_dir != second.file_mapper.namespace_dir


@pytest.mark.parametrize("kind", [KVTIER, FILE])
def test_mla_pages_stored_by_the_writer_rank_are_read_by_every_rank(
    tmp_path: Path, make_backend: MakeBackend, kind: str
) -> None:
    pools = [host_pool("layer_first", is_mla=True, seed=r) for r in range(2)]
    ranks = [
        make_backend(kind, tmp_path, pools[r], is_mla=True, tp_rank=r, tp_size=2) for r in range(2)
    ]
    keys = keys_for(3)
    src = pools[0].alloc(3 * PAGE_SIZE)
    expected = [page_bytes(pools[0], s) for s in page_starts(src)]
    assert generic_set(ranks[0], pools[0], keys, src)  # rank 0 is the MLA writer
    dst = pools[1].alloc(3 * PAGE_SIZE)
    assert ranks[1].batch_exists(keys) == 3
    assert generic_get(ranks[1], pools[1], keys, dst) == 3
    assert [page_bytes(pools[1], s) for s in page_starts(dst)] == expected


def test_mla_reader_rank_stores_nothing(tmp_path: Path, make_backend: MakeBackend) -> None:
    pool = host_pool("page_first", is_mla=True)
    reader = make_backend(KVTIER, tmp_path, pool, is_mla=True, tp_rank=1, tp_size=2)
    assert not reader.is_writer
    keys = keys_for(2)
    src = pool.alloc(2 * PAGE_SIZE)
    # Success, as for SGLang's own backends: the writer rank stores the same pages.
    assert reader.batch_set_v1(keys, src) == [True, True]
    assert reader.batch_set(keys, [pool.get_data_page(s) for s in page_starts(src)])
    assert reader.batch_exists(keys) == 0
    assert not any(f.endswith(".kvb") for _, _, fs in os.walk(tmp_path) for f in fs)


def test_mha_tensor_parallel_ranks_keep_their_shards_apart(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    pools = [host_pool("layer_first", seed=r) for r in range(2)]
    ranks = [make_backend(KVTIER, tmp_path, pools[r], tp_rank=r, tp_size=2) for r in range(2)]
    keys = keys_for(2)
    assert ranks[0].batch_set_v1(keys, pools[0].alloc(2 * PAGE_SIZE)) == [True, True]
    assert ranks[0].batch_exists(keys) == 2
    assert ranks[1].batch_exists(keys) == 0


def test_pages_are_kvtier_block_files(tmp_path: Path, make_backend: MakeBackend) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(KVTIER, tmp_path, pool)
    keys = keys_for(1)
    assert backend.batch_set_v1(keys, pool.alloc(PAGE_SIZE)) == [True]
    path = backend.file_mapper.get_file_name(keys[0].encode())
    assert path.startswith(str(tmp_path) + os.sep) and path.endswith(".kvb")
    payload = len(page_bytes(pool, 0))
    padded = -(-payload // _core.ALIGNMENT) * _core.ALIGNMENT
    assert os.path.getsize(path) == _core.HEADER_SIZE + padded
    assert os.path.exists(backend.file_mapper.config_path)
    assert oct(os.stat(path).st_mode & 0o777) == oct(0o600)


def test_concurrent_callers_each_get_their_own_results(
    tmp_path: Path, make_backend: MakeBackend
) -> None:
    pool = host_pool("page_first")
    backend = make_backend(KVTIER, tmp_path, pool)
    n_threads, per_thread = 4, 3  # the pool holds 33 pages
    work = []
    for t in range(n_threads):
        keys = keys_for(per_thread, f"t{t}")
        src = pool.alloc(per_thread * PAGE_SIZE)
        work.append((keys, src, [page_bytes(pool, s) for s in page_starts(src)]))
    errors: list[BaseException] = []
    results: dict[int, list[bytes]] = {}
    barrier = threading.Barrier(n_threads)

    def run(t: int) -> None:
        try:
            keys, src, _ = work[t]
            barrier.wait()
            for _ in range(5):
                assert backend.batch_set_v1(keys, src) == [True] * per_thread
                missing = keys_for(1, f"miss{t}")
                assert backend.batch_get_v1(missing, src[:PAGE_SIZE]) == [False]
            dst = dsts[t]
            assert backend.batch_get_v1(keys, dst) == [True] * per_thread
            results[t] = [page_bytes(pool, s) for s in page_starts(dst)]
        except BaseException as e:  # reported below
            errors.append(e)

    dsts = [pool.alloc(per_thread * PAGE_SIZE) for _ in range(n_threads)]
    threads = [threading.Thread(target=run, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not errors, errors
    assert all(results[t] == work[t][2] for t in range(n_threads))


@pytest.mark.parametrize("kind", [KVTIER, FILE])
def test_clear_removes_stored_pages(tmp_path: Path, make_backend: MakeBackend, kind: str) -> None:
    pool = host_pool("layer_first")
    backend = make_backend(kind, tmp_path, pool)
    keys = keys_for(2)
    assert generic_set(backend, pool, keys, pool.alloc(2 * PAGE_SIZE))
    assert backend.batch_exists(keys) == 2
    backend.clear()
    assert backend.batch_exists(keys) == 0

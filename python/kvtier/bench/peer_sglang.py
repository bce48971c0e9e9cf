"""The SGLang peer: the same pages through SGLang's own `file` backend and through kvtier's.

Imported only for ``--peer sglang``. Both backends are created by SGLang's
StorageBackendFactory and registered with a real SGLang host pool (``layer_first``, SGLang's
default layout) holding random bytes; each is then driven the way SGLang's cache controller
drives it, in batches of SGLang's STORAGE_BATCH_SIZE pages:

- `file` (HiCacheFile): the generic path, as SGLang uses it for this backend: ``batch_set``
  of one flat page tensor per page, ``batch_get`` into SGLang's dummy pages followed by the
  controller's copy into the host pool (``set_from_flat_data_page``).
- kvtier: the zero-copy path SGLang uses with ``interface_v1``: ``batch_set_v1`` /
  ``batch_get_v1`` on host pool indices.

SGLang's `file` backend writes through the page cache and never syncs, so its stores end in
memory while kvtier's (O_DIRECT where the file system has it) reach the device. Before
loading, every page file is synced and dropped from the page cache (posix_fadvise DONTNEED),
outside the timed part, so loads on a disk read the disk; the file system is synced after
each backend so that one backend's write-back does not land in the other's measurement. The
two backends alternate in order across ``repeat`` runs; figures are medians. CPU time is the
whole process's (storage worker threads included), per GiB moved.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

from kvtier.bench.config import GiB
from kvtier.tiering.fs.capacity import format_size

SUPPORTED = "SGLang 0.5.23"
# The page geometry of a Llama-3-8B-like model (32 layers, 8 KV heads of 128, bf16): 128 KiB
# of KV per token. A page of N bytes holds N / 128 KiB tokens.
LAYERS, HEADS, HEAD_DIM = 32, 8, 128
TOKEN_BYTES = 2 * LAYERS * HEADS * HEAD_DIM * 2


def sglang_status() -> dict:
    """Whether SGLang and kvtier's backend can run here: {"available", "version", "reason"}."""
    try:
        from kvtier.integrations import sglang as integration
    except Exception as exc:  # ImportError, or SGLang failing inside its own import
        return {
            "available": False,
            "reason": f"SGLang is not importable in this Python ({type(exc).__name__}: {exc})",
        }
    return {"available": True, "version": integration.SGLANG_VERSION}


def _host_pool(page_tokens: int, pages: int) -> Any:
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

    # A device pool on the CPU only describes the geometry; the host pool holds the pages.
    device = MHATokenToKVPool(
        page_tokens, page_tokens, torch.bfloat16, HEADS, HEAD_DIM, LAYERS, "cpu", False,
        start_layer=0, end_layer=LAYERS - 1,
    )  # fmt: skip
    info = device.get_device_pool_infos()[0].buffer_info
    pool = MHATokenToKVPoolHost(
        info, 0, 0, page_tokens, "layer_first", pin_memory=False, device="cpu",
        device_capacity_tokens=page_tokens, start_layer=0, end_layer=LAYERS - 1,
        host_token_capacity=pages * page_tokens,
    )  # fmt: skip
    raw = pool.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8))
    return pool


def _backend(kind: str, root: Path, pool: Any, threads: tuple[int, int]) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if kind == "kvtier":
        name = "dynamic"
        extra: dict[str, Any] = {
            "backend_name": "kvtier",
            "module_path": "kvtier.integrations.sglang",
            "class_name": "KvtierHiCacheStorage",
            "interface_v1": 1,
            "root_dir": str(root),
            "n_read_threads": threads[0],
            "n_write_threads": threads[1],
        }
    else:
        name, extra = "file", {"file_storage_path": str(root)}
    config = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
        model_name="kvtier-bench", extra_config=extra,
    )  # fmt: skip
    backend = StorageBackendFactory.create_backend(name, config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def _drop_cache(root: Path) -> None:
    """Write back and evict every file under ``root`` (DONTNEED skips dirty pages)."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            with contextlib.suppress(OSError):
                fd = os.open(os.path.join(dirpath, name), os.O_RDONLY)
                try:
                    os.fsync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


def _timed(fn: Callable[[], int], nbytes: int) -> dict:
    wall, cpu = time.perf_counter(), time.process_time()
    ok = fn()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "gbps": nbytes / wall / 1e9,
        "cpu_s_per_gib": cpu / (nbytes / GiB),
        "seconds": wall,
        "pages_ok": ok,
    }


def _run_one(kind: str, root: Path, page_tokens: int, pages: int, threads: tuple[int, int]):
    from sglang.srt.mem_cache.hicache_storage import STORAGE_BATCH_SIZE

    pool = _host_pool(page_tokens, pages)
    backend = _backend(kind, root, pool, threads)
    try:
        page_bytes = pool.get_data_page(0).numel() * pool.dtype.itemsize
        keys = [f"{kind}-{page_tokens}-{i:056x}" for i in range(pages)]
        indices = pool.alloc(pages * page_tokens)
        step = STORAGE_BATCH_SIZE
        batches = [
            (keys[i : i + step], indices[i * page_tokens : (i + step) * page_tokens])
            for i in range(0, pages, step)
        ]

        def store() -> int:
            done = 0
            for ks, idx in batches:
                if kind == "kvtier":
                    done += sum(backend.batch_set_v1(ks, idx))
                else:
                    starts = idx[::page_tokens].tolist()
                    data = [pool.get_data_page(s) for s in starts]
                    done += len(ks) if backend.batch_set(ks, data) else 0
            return done

        def load() -> int:
            done = 0
            for ks, idx in batches:
                if kind == "kvtier":
                    done += sum(backend.batch_get_v1(ks, idx))
                else:
                    dummies = [pool.get_dummy_flat_data_page() for _ in ks]
                    got = backend.batch_get(ks, dummies)
                    for s, page in zip(idx[::page_tokens].tolist(), got):
                        if page is not None:
                            pool.set_from_flat_data_page(s, page)
                            done += 1
            return done

        total = pages * page_bytes
        stored = _timed(store, total)
        _drop_cache(root)
        loaded = _timed(load, total)
        return {"page_bytes": page_bytes, "pages": pages, "store": stored, "load": loaded}
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
        os.sync()


def _median_run(runs: list[dict]) -> dict:
    """Per figure, the median over runs (the first run's other fields)."""
    merged = dict(runs[0])
    for phase in ("store", "load"):
        merged[phase] = {
            key: statistics.median(r[phase][key] for r in runs) for key in runs[0][phase]
        }
    merged["runs"] = len(runs)
    return merged


def run_sglang_peer(
    scratch: Path,
    block_sizes: tuple[int, ...],
    total_bytes: int,
    threads: tuple[int, int],
    stream: TextIO,
    repeat: int = 1,
) -> dict:
    """Both backends on pages of each size, ``repeat`` times; prints and returns the medians."""
    status = sglang_status()
    if not status["available"]:
        print(f"--peer sglang: {status['reason']}; skipping the SGLang peer", file=stream)
        return {**status, "skipped": status["reason"]}
    sizes = []
    for block_size in block_sizes:
        page_tokens = max(1, block_size // TOKEN_BYTES)
        pages = max(8, total_bytes // (page_tokens * TOKEN_BYTES))
        runs: dict[str, list[dict]] = {"file": [], "kvtier": []}
        for rep in range(repeat):
            for kind in ("file", "kvtier") if rep % 2 == 0 else ("kvtier", "file"):
                root = scratch / f"sglang-{kind}-{page_tokens}"
                root.mkdir(parents=True, exist_ok=True)
                print(
                    f"kvtier bench: SGLang {kind} backend, {page_tokens}-token pages "
                    f"(run {rep + 1})",
                    file=stream,
                )
                try:
                    runs[kind].append(_run_one(kind, root, page_tokens, pages, threads))
                finally:
                    shutil.rmtree(root, ignore_errors=True)
        backends = {kind: _median_run(r) for kind, r in runs.items()}
        sizes.append({"page_tokens": page_tokens, "backends": backends})
    result = {**status, "layout": "layer_first", "token_bytes": TOKEN_BYTES, "sizes": sizes}
    print(render_sglang(result), flush=True)
    return result


def render_sglang(result: dict) -> str:
    """The SGLang peer's table: GB/s and CPU s/GiB per backend, and kvtier / file."""
    lines = [
        f"SGLang HiCache storage ({result.get('version')}, {result.get('layout')} host pool, "
        "median of runs):",
        f"{'page':>10} {'backend':>8} {'store GB/s':>11} {'get GB/s':>9} "
        f"{'store CPU s/GiB':>16} {'get CPU s/GiB':>14}",
    ]
    for entry in result.get("sizes", []):
        backends = entry["backends"]
        for kind, r in backends.items():
            lines.append(
                f"{format_size(r['page_bytes']):>10} {kind:>8} {r['store']['gbps']:>11.2f} "
                f"{r['load']['gbps']:>9.2f} {r['store']['cpu_s_per_gib']:>16.3f} "
                f"{r['load']['cpu_s_per_gib']:>14.3f}"
            )
        if "file" in backends and "kvtier" in backends:
            f, k = backends["file"], backends["kvtier"]
            lines.append(
                f"{'':>10} {'x file':>8} {k['store']['gbps'] / f['store']['gbps']:>11.2f} "
                f"{k['load']['gbps'] / f['load']['gbps']:>9.2f}"
            )
    return "\n".join(lines)

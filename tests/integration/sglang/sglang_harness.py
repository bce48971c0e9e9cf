"""Helpers that drive storage backends through SGLang's own HiCache code (SGLang 0.5.23).

These tests need the real SGLang package. They run in the environment built by
``bash .ci/sglang-env.sh .venv-sglang`` (``.venv-sglang/bin/python -m pytest
tests/integration/sglang``); elsewhere the modules that need SGLang skip with the reason below.

Backends are created by SGLang's ``StorageBackendFactory`` from a ``HiCacheStorageConfig``, as
SGLang's cache controller does, and registered with SGLang's real host memory pools (CPU
tensors), whose pages the tests fill with random bytes.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
SKIP_REASON = (
    "SGLang is not installed in this environment; the SGLang integration tests run in their "
    "own venv: bash .ci/sglang-env.sh .venv-sglang && .venv-sglang/bin/python -m pytest "
    "tests/integration/sglang"
)

KVTIER = "kvtier"
FILE = "file"  # SGLang's own HiCacheFile
PAGE_SIZE = 4  # tokens per page
LAYERS = 3
DEVICE_TOKENS = 64  # host pools hold twice as many


def kvtier_extra_config(root: os.PathLike[str] | str, **options: Any) -> dict[str, Any]:
    """The --hicache-storage-backend-extra-config of the docs, as SGLang parses it."""
    return {
        "backend_name": "kvtier",
        "module_path": "kvtier.integrations.sglang",
        "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1,
        "root_dir": os.fspath(root),
        "n_read_threads": 2,
        "n_write_threads": 2,
        **options,
    }


def storage_config(
    extra_config: dict[str, Any],
    *,
    layout: str = "layer_first",
    is_mla: bool = False,
    tp_rank: int = 0,
    tp_size: int = 1,
    model_name: str = "org/test-model",
    metrics: bool = False,
) -> Any:
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

    return HiCacheStorageConfig(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=is_mla,
        enable_storage_metrics=metrics,
        is_page_first_layout=layout == "page_first",
        model_name=model_name,
        extra_config=dict(extra_config),
    )


def host_pool(layout: str, *, is_mla: bool = False, seed: int = 0) -> Any:
    """SGLang's host pool for a small bf16 model, every byte random."""
    import torch
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    common = {
        "pin_memory": False,
        "device": "cpu",
        "device_capacity_tokens": DEVICE_TOKENS,
        "start_layer": 0,
        "end_layer": LAYERS - 1,
    }
    if is_mla:
        device = MLATokenToKVPool(
            DEVICE_TOKENS, PAGE_SIZE, torch.bfloat16, 16, 8, LAYERS, "cpu", False,
            start_layer=0, end_layer=LAYERS - 1,
        )  # fmt: skip
        info = device.get_device_pool_infos()[0].buffer_info
        pool = MLATokenToKVPoolHost(
            info, 2.0, 0, PAGE_SIZE, layout, target_layer_num=LAYERS, **common
        )
    else:
        device = MHATokenToKVPool(
            DEVICE_TOKENS, PAGE_SIZE, torch.bfloat16, 2, 8, LAYERS, "cpu", False,
            start_layer=0, end_layer=LAYERS - 1,
        )  # fmt: skip
        info = device.get_device_pool_infos()[0].buffer_info
        pool = MHATokenToKVPoolHost(info, 2.0, 0, PAGE_SIZE, layout, **common)
    generator = torch.Generator().manual_seed(seed)
    raw = pool.kv_buffer.view(torch.uint8)
    raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    return pool


def create_backend(
    kind: str,
    root: os.PathLike[str] | str,
    pool: Any,
    *,
    is_mla: bool = False,
    tp_rank: int = 0,
    tp_size: int = 1,
    metrics: bool = False,
    **options: Any,
) -> Any:
    """A backend made the way SGLang's cache controller makes it, with ``pool`` registered."""
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    if kind == KVTIER:
        name, extra = "dynamic", kvtier_extra_config(root, **options)
    else:
        name, extra = FILE, {"file_storage_path": os.fspath(root), **options}
    config = storage_config(
        extra,
        layout=pool.layout,
        is_mla=is_mla,
        tp_rank=tp_rank,
        tp_size=tp_size,
        metrics=metrics,
    )
    backend = StorageBackendFactory.create_backend(name, config, pool)
    backend.register_mem_pool_host(pool)
    return backend


def page_bytes(pool: Any, index: int) -> bytes:
    """The bytes of the page at host index ``index``, in SGLang's flat page order."""
    import torch

    return pool.get_data_page(index, flat=True).view(torch.uint8).numpy().tobytes()


def page_starts(indices: Any) -> list[int]:
    return indices[::PAGE_SIZE].tolist()

"""vLLM's SecondaryTierFactory creates the kvtier tier from a user's config entry."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from vllm_harness import HAVE_VLLM, ROW_BYTES, SKIP_REASON, TIER_TYPE, make_offloading_config
from vllm_harness import tier_config as make_tier_config

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from kvtier.integrations.vllm import KvtierFileSystemTier, offloading_spec_from_vllm
from kvtier.tiering.spec import OffloadingSpec
from vllm.v1.kv_offload.base import Locality, Medium
from vllm.v1.kv_offload.tiering.backpressure import EMABackpressureDetector
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec
from vllm.v1.metrics.cache_hit_source import CacheHitSource


@pytest.fixture
def primary_view() -> memoryview:
    # The factory only needs a primary tier's memoryview: rows of ROW_BYTES.
    return memoryview(np.zeros((8, ROW_BYTES), dtype=np.int8))


def vllm_spec(**config: Any) -> TieringOffloadingSpec:
    return TieringOffloadingSpec(make_offloading_config([], **config))


def create(config: dict[str, Any], view: memoryview, **spec_config: Any) -> Any:
    return SecondaryTierFactory.create_secondary_tier(config, view, vllm_spec(**spec_config))


def test_factory_creates_kvtier_tier_from_module_path(
    tmp_path: Path, primary_view: memoryview
) -> None:
    config = make_tier_config(
        tmp_path,
        n_read_threads="2",  # strings as JSON configs carry them
        n_write_threads=3,
        checksum="crc32c",
        locality="REMOTE",
        backpressure={"backpressure_cls": "EMABackpressureDetector"},
    )
    before = copy.deepcopy(config)
    tier = create(config, primary_view)
    try:
        assert config == before, "the factory call must not change the user's config"
        assert isinstance(tier, KvtierFileSystemTier)
        assert isinstance(tier, SecondaryTierManager)
        assert tier.tier_type == TIER_TYPE
        assert tier.medium is Medium.STORAGE
        assert tier.cache_hit_source is CacheHitSource.DISK
        assert tier.locality is Locality.REMOTE
        assert isinstance(tier.bp_detector, EMABackpressureDetector)
        assert tier.block_size_bytes == ROW_BYTES
        options = tier.kvtier_tier.options
        assert (options.n_read_threads, options.n_write_threads) == (2, 3)
        assert options.async_lookup is True, "lookups must not block vLLM's scheduler"
        assert options.root_dir == str(tmp_path)
        # kvtier's namespace for this model's layout exists under root_dir.
        namespace = Path(tier.file_mapper.namespace_dir)
        assert namespace.parent == tmp_path
        recorded = json.loads((namespace / "config.json").read_text())
        assert recorded["model_name"] == "kvtier-test/model"
        assert recorded["block_bytes"] == ROW_BYTES
    finally:
        tier.shutdown()


def test_get_tier_class_resolves_out_of_tree_type(tmp_path: Path) -> None:
    assert SecondaryTierFactory.get_tier_class(make_tier_config(tmp_path)) is KvtierFileSystemTier


def test_unknown_option_is_a_value_error_naming_valid_options(
    tmp_path: Path, primary_view: memoryview
) -> None:
    with pytest.raises(ValueError, match=r"Unknown option 'n_reader_threads'") as info:
        create(make_tier_config(tmp_path, n_reader_threads=4), primary_view)
    message = str(info.value)
    assert TIER_TYPE in message
    for valid in ("root_dir", "n_read_threads", "async_lookup", "locality", "enable_kv_events"):
        assert valid in message


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("n_read_threads", "many"),
        ("checksum", "md5"),
        ("file_mode", "0400"),
        ("async_lookup", "maybe"),
        ("locality", "SIDEWAYS"),
        ("enable_kv_events", "perhaps"),
        ("io_engine", "uring"),
    ],
)
def test_invalid_option_values_are_rejected(
    tmp_path: Path, primary_view: memoryview, option: str, value: Any
) -> None:
    with pytest.raises(ValueError, match=option):
        create(make_tier_config(tmp_path, **{option: value}), primary_view)


@pytest.mark.parametrize("io_engine", ["psync", "auto"])
def test_io_engine_reaches_kvtier_and_the_tier_says_which_runs(
    tmp_path: Path, primary_view: memoryview, io_engine: str
) -> None:
    tier = create(make_tier_config(tmp_path, io_engine=io_engine), primary_view)
    try:
        assert tier.kvtier_tier.options.io_engine == io_engine
        fell_back = bool(tier.kvtier_tier.io_engine_fallback_reason)
        # "auto" runs io_uring unless it fell back, and then says why.
        expected = "psync" if io_engine == "psync" or fell_back else "io_uring"
        assert tier.io_engine == expected
    finally:
        tier.shutdown()


def test_refused_io_uring_fails_start_up_saying_what_to_use(
    tmp_path: Path, primary_view: memoryview
) -> None:
    from kvtier.tiering.fs.engine import io_uring_refusal

    if not io_uring_refusal(tmp_path / "probe"):
        pytest.skip("io_uring works here (tests/python/test_io_engine.py refuses it in a child)")
    with pytest.raises(OSError, match=r"io_engine='io_uring'.*use io_engine='auto'"):
        create(make_tier_config(tmp_path / "kv", io_engine="io_uring"), primary_view)


def test_missing_root_dir_is_rejected(primary_view: memoryview) -> None:
    config = {"type": TIER_TYPE, "module_path": "kvtier.integrations.vllm"}
    with pytest.raises(ValueError, match="root_dir"):
        create(config, primary_view)


def test_unusable_root_dir_raises_oserror(tmp_path: Path, primary_view: memoryview) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(OSError):
        create(make_tier_config(not_a_dir / "kv"), primary_view)


def test_spec_conversion_carries_the_layout() -> None:
    spec = offloading_spec_from_vllm(vllm_spec(tp_size=2, dtype="bfloat16"))
    assert isinstance(spec, OffloadingSpec)
    assert spec.model_name == "kvtier-test/model"
    assert spec.dtype == "bfloat16"
    assert spec.tokens_per_block == 16
    assert spec.blocks_per_file == 1
    assert spec.tp_size == 2
    assert spec.rank == 0
    assert spec.kv_cache_groups == (
        {
            "tokens_per_block": 16,
            "layer_names": ["model.layers.0.self_attn", "model.layers.1.self_attn"],
        },
    )
    # A kvtier spec passes through unchanged.
    assert offloading_spec_from_vllm(spec) is spec


def test_parallelism_agnostic_layouts_share_a_namespace(
    tmp_path: Path, primary_view: memoryview
) -> None:
    def namespace(**spec_config: Any) -> str:
        tier = create(make_tier_config(tmp_path), primary_view, **spec_config)
        try:
            return str(tier.file_mapper.namespace_dir)
        finally:
            tier.shutdown()

    # vLLM certifies the bytes as independent of the parallel layout: TP 1 and TP 4 share.
    assert namespace(tp_size=1, parallelism_agnostic=True) == namespace(
        tp_size=4, parallelism_agnostic=True
    )
    # Otherwise they must not, and neither may another dtype.
    assert namespace(tp_size=1) != namespace(tp_size=4)
    assert namespace(dtype="float16") != namespace(dtype="bfloat16")
    # TP 1 (plain or certified), TP 4, bfloat16: three layouts, three namespaces (beside the
    # root's capacity state directory, .kvtier).
    assert len([n for n in os.listdir(tmp_path) if n != ".kvtier"]) == 3

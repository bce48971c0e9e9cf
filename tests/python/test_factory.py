"""SecondaryTierFactory: registration, lazy loading, aliases, out-of-tree tiers, options."""

from __future__ import annotations

import copy
import logging
import os
import stat
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="test/model", dtype="bfloat16")

# A minimal out-of-tree tier, written to a real module file so importing it is observable.
TIER_MODULE = textwrap.dedent(
    """
    from kvtier.tiering.base import SecondaryTierManager

    class {cls}(SecondaryTierManager):
        def __init__(self, offloading_spec, primary_kv_view, tier_type, foo: int = 1):
            super().__init__(offloading_spec, primary_kv_view, tier_type)
            self.foo = foo

        def lookup(self, key, req_context):
            return False

        def submit_store(self, job):
            pass

        def submit_load(self, job):
            pass

        def get_finished(self):
            return []

    class NotATier:
        def __init__(self, **kwargs):
            pass
    """
)


@pytest.fixture
def view() -> memoryview:
    return memoryview(np.zeros((4, 256), dtype=np.uint8))


@pytest.fixture
def tier_module(tmp_path, monkeypatch) -> tuple[str, str]:
    """(module name, class name) of a fresh tier module importable from sys.path."""
    name = f"kvtier_test_tier_{uuid.uuid4().hex}"
    cls = "OutOfTreeTier"
    (tmp_path / f"{name}.py").write_text(TIER_MODULE.format(cls=cls))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name, cls
    sys.modules.pop(name, None)


@pytest.fixture
def shutdown_after():
    tiers = []
    yield tiers.append
    for t in tiers:
        t.shutdown()


def test_registration_is_lazy(tier_module, view):
    module, cls = tier_module
    tier_type = f"lazy-{uuid.uuid4().hex}"
    SecondaryTierFactory.register_tier(tier_type, module, cls)
    assert module not in sys.modules
    tier = SecondaryTierFactory.create_secondary_tier({"type": tier_type, "foo": 5}, view, SPEC)
    assert module in sys.modules
    assert type(tier).__name__ == cls
    assert tier.tier_type == tier_type
    assert tier.foo == 5


def test_importing_the_factory_imports_no_tier_implementation():
    code = (
        "import sys, kvtier.tiering, kvtier.tiering.factory\n"
        "print(sorted(m for m in sys.modules if m.startswith('kvtier.tiering.')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    ).stdout
    assert "kvtier.tiering.fs" not in out
    assert "kvtier.tiering.example" not in out
    assert "kvtier.tiering.factory" in out


def test_duplicate_registration_raises():
    with pytest.raises(ValueError) as e:
        SecondaryTierFactory.register_tier("example", "anything", "Anything")
    assert str(e.value) == "Tier 'example' is already registered."


def test_missing_type(view):
    with pytest.raises(ValueError) as e:
        SecondaryTierFactory.create_secondary_tier({"custom_param": 1}, view, SPEC)
    assert str(e.value) == "Secondary tier configuration must include 'type'"


def test_unknown_type(view):
    with pytest.raises(ValueError) as e:
        SecondaryTierFactory.create_secondary_tier({"type": "tape"}, view, SPEC)
    message = str(e.value)
    assert message.startswith("Unknown secondary tier type: 'tape'. Supported types: [")
    assert "'example'" in message and "'fs'" in message


def test_config_is_not_mutated(view, tmp_path, shutdown_after):
    config = {"type": "fs", "root_dir": str(tmp_path), "n_read_threads": 1, "n_write_threads": 1}
    before = copy.deepcopy(config)
    shutdown_after(SecondaryTierFactory.create_secondary_tier(config, view, SPEC))
    assert config == before


def test_renamed_type_works_with_a_warning(view, tmp_path, caplog, shutdown_after):
    from kvtier.tiering.fs.manager import FileSystemTierManager

    config = {"type": "fs_python", "root_dir": str(tmp_path), "n_read_threads": 1}
    with caplog.at_level(logging.WARNING), pytest.warns(DeprecationWarning, match="type: fs"):
        tier = SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    shutdown_after(tier)
    assert isinstance(tier, FileSystemTierManager)
    assert tier.tier_type == "fs"
    assert any("type: fs" in r.getMessage() for r in caplog.records)
    assert config["type"] == "fs_python"


def test_out_of_tree_tier_loads_by_module_path(tier_module, view):
    module, cls = tier_module
    config = {"type": cls, "module_path": module, "foo": 3}
    tier = SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    assert type(tier).__name__ == cls
    assert tier.foo == 3
    assert tier.tier_type == cls
    assert "module_path" in config  # not consumed from the caller's dict


def test_out_of_tree_class_must_be_a_tier(tier_module, view):
    module, _ = tier_module
    with pytest.raises(ValueError, match="must subclass"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": "NotATier", "module_path": module}, view, SPEC
        )


@pytest.mark.parametrize(
    ("config", "bad", "valid"),
    [
        ({"type": "example", "bogus": 1}, "bogus", "custom_param"),
        (
            {"type": "fs", "root_dir": "/nonexistent", "n_reader_threads": 4},
            "n_reader_threads",
            "n_read_threads",
        ),
    ],
)
def test_unknown_option_names_tier_key_and_valid_keys(view, config, bad, valid):
    with pytest.raises(ValueError) as e:
        SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    message = str(e.value)
    assert f"'{config['type']}'" in message
    assert bad in message
    assert valid in message


def test_unknown_option_of_an_out_of_tree_tier(tier_module, view):
    module, cls = tier_module
    with pytest.raises(ValueError, match="'bar'.*Valid options: \\['foo'\\]"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": cls, "module_path": module, "bar": 1}, view, SPEC
        )


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("n_read_threads", -1),
        ("n_read_threads", "sixteen"),
        ("n_read_threads", True),
        ("n_write_threads", 5000),
        ("o_direct", "maybe"),
        ("checksum", "md5"),
        ("durability", "sometimes"),
        ("file_mode", 640),  # decimal 640 is 0o1200: almost certainly a typo for 0o640
        ("file_mode", "0999"),
        ("file_mode", "0400"),  # the owner must be able to read and write
        ("async_lookup", "perhaps"),
        ("max_queued_store_jobs", -1),
        ("max_queued_store_jobs", "1.5"),
    ],
)
def test_bad_fs_option_values(view, tmp_path, option, value):
    config = {"type": "fs", "root_dir": str(tmp_path), option: value}
    with pytest.raises(ValueError, match=option):
        SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    assert os.listdir(tmp_path) == []  # refused before touching the root


def test_fs_requires_root_dir(view):
    with pytest.raises(ValueError, match="root_dir"):
        SecondaryTierFactory.create_secondary_tier({"type": "fs"}, view, SPEC)


def test_fs_needs_at_least_one_thread(view, tmp_path):
    config = {"type": "fs", "root_dir": str(tmp_path), "n_read_threads": 0, "n_write_threads": "0"}
    with pytest.raises(ValueError, match="at least 1"):
        SecondaryTierFactory.create_secondary_tier(config, view, SPEC)


def test_example_option_value_checked(view):
    with pytest.raises(ValueError, match="custom_param"):
        SecondaryTierFactory.create_secondary_tier(
            {"type": "example", "custom_param": "x"}, view, SPEC
        )


def test_json_style_option_strings_are_accepted(view, tmp_path, shutdown_after):
    config = {
        "type": "fs",
        "root_dir": str(tmp_path),
        "n_read_threads": "2",
        "n_write_threads": "1",
        "o_direct": "false",
        "checksum": "CRC32C",
        "durability": "data",
        "file_mode": "0640",
        "async_lookup": "false",
        "max_queued_store_jobs": "8",
    }
    tier = SecondaryTierFactory.create_secondary_tier(config, view, SPEC)
    shutdown_after(tier)
    opts = tier.options
    assert (opts.n_read_threads, opts.n_write_threads, opts.max_queued_store_jobs) == (2, 1, 8)
    assert (opts.o_direct, opts.checksum, opts.durability) == (False, "crc32c", "data")
    assert (opts.file_mode, opts.async_lookup) == (0o640, False)
    assert tier.direct_io is False

    # The mode really reaches the block files.
    key = make_offload_key(b"k" * 32, 0)
    tier.submit_store(JobMetadata(1, [key], np.array([0]), False, ReqContext("r")))
    tier.drain_jobs()
    assert [r.success for r in tier.get_finished()] == [True]
    mode = stat.S_IMODE(os.stat(tier.file_mapper.get_file_name(key)).st_mode)
    assert mode == 0o640


def test_example_tier_custom_param(view):
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "example", "custom_param": 7}, view, SPEC
    )
    assert tier.custom_param == 7

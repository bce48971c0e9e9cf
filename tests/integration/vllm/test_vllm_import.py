"""kvtier never imports vLLM; the vLLM adapter fails clearly without a supported vLLM.

These run with or without vLLM installed
(tests/integration/shared/engine_import_checks.py says how).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_import_checks import assert_kvtier_does_not_import, fake_distribution, import_error_of


def test_importing_kvtier_does_not_import_vllm() -> None:
    assert_kvtier_does_not_import(
        "vllm",
        "import kvtier, kvtier.tiering, kvtier.integrations, kvtier.tiering.fs.manager\n"
        "from kvtier.tiering.factory import SecondaryTierFactory",
    )


def test_adapter_without_vllm_names_supported_versions() -> None:
    message = import_error_of("kvtier.integrations.vllm", hide="vllm")
    assert "0.33.x" in message
    assert "not installed" in message


@pytest.mark.parametrize("version", ["0.32.1", "0.34.0", "1.0.0"])
def test_adapter_refuses_unsupported_vllm_version(tmp_path: Path, version: str) -> None:
    # A stand-in vLLM of another version, first on sys.path; the adapter must refuse it before
    # touching any vLLM API.
    message = import_error_of(
        "kvtier.integrations.vllm", extra_path=fake_distribution(tmp_path, "vllm", version)
    )
    assert f"vLLM {version} is installed" in message
    assert "0.33.x" in message

"""kvtier never imports SGLang; the SGLang backend fails clearly without a supported SGLang.

These run with or without SGLang installed
(tests/integration/shared/engine_import_checks.py says how).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_import_checks import assert_kvtier_does_not_import, fake_distribution, import_error_of


def test_importing_kvtier_does_not_import_sglang() -> None:
    assert_kvtier_does_not_import(
        "sglang",
        "import kvtier, kvtier.tiering, kvtier.integrations, kvtier.cli, kvtier.tiering.fs.manager",
    )


def test_backend_without_sglang_names_the_supported_version() -> None:
    message = import_error_of("kvtier.integrations.sglang", hide="sglang")
    assert "0.5.23" in message
    assert "not installed" in message


@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0"])
def test_backend_refuses_unsupported_sglang_version(tmp_path: Path, version: str) -> None:
    # A stand-in SGLang of another version, first on sys.path; the backend must refuse it
    # before touching any SGLang API.
    message = import_error_of(
        "kvtier.integrations.sglang", extra_path=fake_distribution(tmp_path, "sglang", version)
    )
    assert f"SGLang {version} is installed" in message
    assert "0.5.23" in message

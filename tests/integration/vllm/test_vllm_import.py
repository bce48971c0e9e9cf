"""kvtier never imports vLLM; the vLLM adapter fails clearly without a supported vLLM.

These run with or without vLLM installed: each check runs in a fresh interpreter so that what
is imported, and which vLLM is visible, is under the test's control.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TIMEOUT_S = 300


def run_python(code: str, extra_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if extra_path is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(extra_path), env.get("PYTHONPATH")) if p
        )
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )


def test_importing_kvtier_does_not_import_vllm() -> None:
    proc = run_python(
        """
        import sys
        import kvtier, kvtier.tiering, kvtier.integrations
        from kvtier.tiering.factory import SecondaryTierFactory
        import kvtier.tiering.fs.manager
        loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
        assert not loaded, loaded
        print("clean")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def test_adapter_without_vllm_names_supported_versions() -> None:
    # sys.modules["vllm"] = None makes vLLM unimportable in that interpreter, as if absent.
    proc = run_python(
        """
        import sys
        sys.modules["vllm"] = None
        try:
            import kvtier.integrations.vllm
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported without vLLM")
        """
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert "0.33.x" in message
    assert "not installed" in message


@pytest.mark.parametrize("version", ["0.32.1", "0.34.0", "1.0.0"])
def test_adapter_refuses_unsupported_vllm_version(tmp_path: Path, version: str) -> None:
    # A stand-in distribution of another vLLM version, first on sys.path; the adapter must
    # refuse it before touching any vLLM API.
    package = tmp_path / "vllm"
    package.mkdir()
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    dist_info = tmp_path / f"vllm-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    proc = run_python(
        """
        try:
            import kvtier.integrations.vllm
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported an unsupported vLLM")
        """,
        extra_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert f"vLLM {version} is installed" in message
    assert "0.33.x" in message

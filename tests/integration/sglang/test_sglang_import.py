"""kvtier never imports SGLang; the SGLang backend fails clearly without a supported SGLang.

These run with or without SGLang installed: each check runs in a fresh interpreter so that what
is imported, and which SGLang is visible, is under the test's control.
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


def test_importing_kvtier_does_not_import_sglang() -> None:
    proc = run_python(
        """
        import sys
        import kvtier, kvtier.tiering, kvtier.integrations, kvtier.cli
        import kvtier.tiering.fs.manager
        loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
        assert not loaded, loaded
        print("clean")
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def test_backend_without_sglang_names_the_supported_version() -> None:
    # sys.modules["sglang"] = None makes SGLang unimportable in that interpreter, as if absent.
    proc = run_python(
        """
        import sys
        sys.modules["sglang"] = None
        try:
            import kvtier.integrations.sglang
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported without SGLang")
        """
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert "0.5.23" in message
    assert "not installed" in message


@pytest.mark.parametrize("version", ["0.5.22", "0.5.24", "0.6.0"])
def test_backend_refuses_unsupported_sglang_version(tmp_path: Path, version: str) -> None:
    # A stand-in distribution of another SGLang version, first on sys.path; the backend must
    # refuse it before touching any SGLang API.
    package = tmp_path / "sglang"
    package.mkdir()
    (package / "__init__.py").write_text(f'__version__ = "{version}"\n')
    dist_info = tmp_path / f"sglang-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
    )
    proc = run_python(
        """
        try:
            import kvtier.integrations.sglang
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported an unsupported SGLang")
        """,
        extra_path=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert f"SGLang {version} is installed" in message
    assert "0.5.23" in message

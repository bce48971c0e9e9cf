"""The import checks every engine integration passes (tests/integration/<engine>/test_*_import.py).

kvtier never imports an engine; an integration module fails clearly without a supported
version of its engine. Each check runs in a fresh interpreter so that what is imported, and
which engine is visible, is under the test's control; they run with or without the engine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

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


def import_error_of(module: str, *, hide: str | None = None, extra_path: Path | None = None) -> str:
    """The ImportError message of importing ``module``; ``hide`` makes a package unimportable."""
    # sys.modules[hide] = None makes that package unimportable in the interpreter, as if absent.
    hiding = f"sys.modules[{hide!r}] = None" if hide else ""
    proc = run_python(
        f"""
        import sys
        {hiding}
        try:
            import {module}
        except ImportError as e:
            print(e)
        else:
            raise SystemExit("imported {module}")
        """,
        extra_path=extra_path,
    )
    assert proc.returncode == 0, proc.stderr or proc.stdout
    return proc.stdout.strip()


def assert_kvtier_does_not_import(package: str, imports: str) -> None:
    """Running ``imports`` (kvtier modules) loads nothing of ``package``."""
    prefix = package + "."
    proc = run_python(
        "import sys\n"
        f"{imports}\n"
        f"loaded = sorted(m for m in sys.modules if m == {package!r} or m.startswith({prefix!r}))\n"
        "assert not loaded, loaded\n"
        "print('clean')\n"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "clean"


def fake_distribution(root: Path, package: str, version: str) -> Path:
    """A stand-in ``package`` of ``version`` (module and dist-info) under ``root``; returns root."""
    module = root / package
    module.mkdir()
    (module / "__init__.py").write_text(f'__version__ = "{version}"\n')
    dist_info = root / f"{package}-{version}.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n"
    )
    return root

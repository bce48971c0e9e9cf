"""Builds and runs the C++ side from pytest.

1. The C++ unit tests (tests/cpp) through the top-level CMake project with
   KVTIER_BUILD_TESTS=ON, run by ctest.
2. The consumer project (tests/cpp/consumer) against the *installed* package
   (``kvtier.cmake_dir()``): a C++ program that finds kvtier with find_package, stores a
   block and loads it back.

Build trees live under pytest's temporary directories, never in the repository; builds use
at most two parallel jobs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kvtier
import pytest

REPO = Path(__file__).resolve().parents[2]
JOBS = "2"
BUILD_TIMEOUT = 1800  # seconds; a hang guard for slow shared machines, not a timing check


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"'{name}' not found on PATH (pip install {name})")
    return path


def _generator_args() -> list[str]:
    ninja = shutil.which("ninja")
    return ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={ninja}"] if ninja else []


def _run(cmd: list[str], what: str, **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False, **kwargs
    )
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr)[-20000:]
        pytest.fail(
            f"{what} failed (exit {proc.returncode}): {' '.join(cmd)}\n{output}", pytrace=False
        )
    return proc


@pytest.fixture(scope="module")
def cpp_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The C++ unit tests, configured and built in a temporary directory."""
    cmake = _tool("cmake")
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        pytest.skip("no C++ compiler on PATH")
    build = tmp_path_factory.mktemp("cpp-build")
    _run(
        [
            cmake,
            "-S",
            str(REPO),
            "-B",
            str(build),
            *_generator_args(),
            "-DKVTIER_BUILD_TESTS=ON",
            "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
        ],
        "configuring the C++ tests",
    )
    _run([cmake, "--build", str(build), "-j", JOBS], "building the C++ tests")
    return build


def test_cpp_unit_tests(cpp_build: Path, tmp_path: Path) -> None:
    ctest = _tool("ctest")
    listed = _run([ctest, "--test-dir", str(cpp_build), "-N"], "listing the C++ tests")
    assert "Total Tests: 0" not in listed.stdout, "ctest found no C++ tests"
    env = dict(os.environ, TMPDIR=str(tmp_path))  # the tests' scratch directories go here
    proc = subprocess.run(
        [ctest, "--test-dir", str(cpp_build), "--output-on-failure", "-j", "1"],
        capture_output=True,
        text=True,
        timeout=BUILD_TIMEOUT,
        check=False,
        env=env,
    )
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(
            f"C++ unit tests failed (ctest exit {proc.returncode}):\n{output[-30000:]}",
            pytrace=False,
        )
    assert "100% tests passed" in output


def test_consumer_builds_against_installed_package(
    tmp_path_factory: pytest.TempPathFactory, tmp_path: Path
) -> None:
    cmake = _tool("cmake")
    cmake_dir = Path(kvtier.cmake_dir())
    assert (cmake_dir / "kvtierConfig.cmake").is_file(), f"no kvtierConfig.cmake in {cmake_dir}"
    build = tmp_path_factory.mktemp("consumer-build")
    _run(
        [
            cmake,
            "-S",
            str(REPO / "tests" / "cpp" / "consumer"),
            "-B",
            str(build),
            *_generator_args(),
            f"-Dkvtier_DIR={cmake_dir}",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        "configuring the consumer",
    )
    _run([cmake, "--build", str(build), "-j", JOBS], "building the consumer")
    exe = build / "kvtier_consumer"
    assert exe.is_file()
    data = tmp_path / "blocks-root"
    proc = _run([str(exe), str(data)], "running the consumer")
    assert "stored and loaded" in proc.stdout
    # The block really is a file of the documented size: a 4096-byte header + padded payload.
    block = data / "blocks" / "0001"
    assert block.is_file()
    assert block.stat().st_size == 4096 + 4 * 4096

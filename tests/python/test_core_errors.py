"""The native core's errors as Python sees them, and the option contract it exports.

The binding turns each C++ error type into what ``kvtier.errors._from_core(kind, errno,
message, path, where)`` returns, and falls back to the builtin types (OSError subclass by
errno, ValueError, RuntimeError) where that function cannot be had. These tests put their own
``kvtier.errors`` into ``sys.modules`` (or ``None``, which makes the import fail), so they check
the binding alone, whatever the package's own module does. Errors come from real failures:
a root below a regular file, a shut-down engine, a forked child, no CUDA runtime, and the
kernel's refusal of io_uring injected at the system-call boundary (an LD_PRELOAD ``syscall``).
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
from kvtier import _core

WHERE = re.compile(r"^csrc/src/\S+\.cpp:\d+$")


class FakeCoreError(Exception):
    def __init__(self, kind: str, errno_value: int, message: str, path: str, where: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.errno_value = errno_value
        self.message = message
        self.path = path
        self.where = where


def _fake_errors_module() -> types.ModuleType:
    module = types.ModuleType("kvtier.errors")

    def _from_core(kind: str, errno_value: int, message: str, path: str, where: str):
        return FakeCoreError(kind, errno_value, message, path, where)

    module._from_core = _from_core  # type: ignore[attr-defined]
    return module


@pytest.fixture
def fake_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kvtier.errors", _fake_errors_module())


@pytest.fixture(params=["unimportable", "no_from_core"])
def no_errors_module(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """kvtier.errors that cannot be imported (None in sys.modules), or lacks _from_core."""
    module = None if request.param == "unimportable" else types.ModuleType("kvtier.errors")
    monkeypatch.setitem(sys.modules, "kvtier.errors", module)


def _root_below_a_file(tmp_path: Path) -> Path:
    plain = tmp_path / "plain-file"
    plain.write_bytes(b"x")
    return plain / "root"


def _engine(tmp_path: Path, **kwargs) -> _core.Engine:
    kwargs.setdefault("n_read_threads", 1)
    kwargs.setdefault("n_write_threads", 1)
    kwargs.setdefault("io_engine", "psync")
    return _core.Engine(str(tmp_path / "root"), **kwargs)


# ---- kinds through kvtier.errors._from_core -------------------------------------------------


def test_system_error_kind_carries_errno_path_and_place(tmp_path: Path, fake_errors) -> None:
    root = _root_below_a_file(tmp_path)
    with pytest.raises(FakeCoreError) as info:
        _core.Engine(str(root), n_read_threads=1, n_write_threads=0)
    e = info.value
    assert e.kind == "system"
    assert e.errno_value == errno.ENOTDIR
    assert e.path == str(root)
    assert "cannot create root directory" in e.message
    assert os.strerror(errno.ENOTDIR) in e.message  # what() as OSError's strerror had it
    assert WHERE.match(e.where), e.where
    assert "beneath.cpp" in e.where or "fs/" in e.where


def test_invalid_argument_kind(tmp_path: Path, fake_errors) -> None:
    with pytest.raises(FakeCoreError) as info:
        _engine(tmp_path, n_read_threads=0, n_write_threads=0)
    e = info.value
    assert (e.kind, e.errno_value, e.path, e.where) == ("invalid_argument", 0, "", "")
    assert "n_read_threads + n_write_threads" in e.message
    # Also the binding's own argument checks (std::invalid_argument in the binding).
    with pytest.raises(FakeCoreError) as info:
        _engine(tmp_path, o_direct=3)
    assert info.value.kind == "invalid_argument"


def test_shut_down_kind(tmp_path: Path, fake_errors) -> None:
    engine = _engine(tmp_path)
    engine.shutdown()
    with pytest.raises(FakeCoreError) as info:
        engine.submit_store(1, [])
    assert info.value.kind == "shut_down"
    assert "shut down" in info.value.message


def test_pybind_errors_keep_their_builtin_types(tmp_path: Path, fake_errors) -> None:
    """Errors that are not the core's (pybind11's own, std::out_of_range) are not handed to
    _from_core: TypeError, IndexError as before."""
    engine = _engine(tmp_path)
    try:
        buffer = bytearray(8)
        with pytest.raises(TypeError, match="block key must be bytes"):
            engine.submit_store(1, [(str(tmp_path / "root" / "a"), "str-key", id(buffer), 8)])
        layout = _core.BlockLayout([(id(buffer), 8, 1, [(0, 8)], False)])
        with pytest.raises(IndexError):
            layout.segments(5)
    finally:
        engine.shutdown()


def test_from_core_that_raises_propagates(tmp_path: Path, monkeypatch) -> None:
    module = types.ModuleType("kvtier.errors")

    def _from_core(*args):
        raise LookupError("factory broke")

    module._from_core = _from_core  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvtier.errors", module)
    with pytest.raises(LookupError, match="factory broke"):
        _engine(tmp_path, n_read_threads=0, n_write_threads=0)


def test_from_core_returning_a_non_exception_is_a_type_error(tmp_path: Path, monkeypatch) -> None:
    module = types.ModuleType("kvtier.errors")
    module._from_core = lambda *args: "not an exception"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "kvtier.errors", module)
    with pytest.raises(TypeError, match="returned str, not an exception"):
        _engine(tmp_path, n_read_threads=0, n_write_threads=0)


# ---- fallback without kvtier.errors._from_core: exactly the builtin types ---------------------


def test_fallback_system_error_is_the_errno_subclass(tmp_path: Path, no_errors_module) -> None:
    root = _root_below_a_file(tmp_path)
    with pytest.raises(NotADirectoryError) as info:
        _core.Engine(str(root), n_read_threads=1, n_write_threads=0)
    assert info.value.errno == errno.ENOTDIR
    assert info.value.filename == str(root)
    assert info.value.strerror.startswith("cannot create root directory")
    with pytest.raises(FileNotFoundError):
        _core.Engine("/proc/kvtier-no-such/root", n_read_threads=1, n_write_threads=0)


def test_fallback_value_and_runtime_errors(tmp_path: Path, no_errors_module) -> None:
    with pytest.raises(ValueError, match="n_read_threads"):
        _engine(tmp_path, n_read_threads=0, n_write_threads=0)
    engine = _engine(tmp_path)
    engine.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        engine.submit_store(1, [])


# ---- kinds that need a process of their own ------------------------------------------------

_CHILD_PRELUDE = textwrap.dedent(
    """
    import json, os, sys, types
    # The package first (its __init__ imports kvtier.errors itself); the binding looks
    # kvtier.errors up in sys.modules again at each error, so the stand-in below is the one
    # it calls.
    from kvtier import _core
    mode = sys.argv[1]
    if mode == "fake":
        module = types.ModuleType("kvtier.errors")
        class CoreError(Exception):
            pass
        def _from_core(kind, errno_value, message, path, where):
            e = CoreError(message)
            e.info = {"kind": kind, "errno": errno_value, "message": message, "path": path,
                      "where": where}
            return e
        module._from_core = _from_core
        sys.modules["kvtier.errors"] = module
    else:
        sys.modules["kvtier.errors"] = None

    def report(exc):
        info = getattr(exc, "info", None) or {}
        return {"type": type(exc).__name__, "errno": getattr(exc, "errno", None), **info}
    """
)


def _run_child(body: str, mode: str, root: Path, env: dict[str, str] | None = None) -> dict:
    script = _CHILD_PRELUDE + textwrap.dedent(body)
    proc = subprocess.run(
        [sys.executable, "-c", script, mode, str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    import json

    return json.loads(proc.stdout.strip().splitlines()[-1])


_FORKED_BODY = """
engine = _core.Engine(sys.argv[2], n_read_threads=1, n_write_threads=1, io_engine="psync")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        engine.stats()
        out = {"type": "none"}
    except BaseException as exc:
        out = report(exc)
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
os.waitpid(pid, 0)
engine.shutdown()
print(data.decode())
"""


@pytest.mark.parametrize("mode", ["fake", "fallback"])
def test_forked_kind(tmp_path: Path, mode: str) -> None:
    out = _run_child(_FORKED_BODY, mode, tmp_path / "root")
    if mode == "fake":
        assert out["kind"] == "forked"
        assert "forked from it" in out["message"]
        assert (out["errno"], out["path"], out["where"]) == (0, "", "")
    else:
        assert out["type"] == "RuntimeError"


_RUNTIME_BODY = """
try:
    _core.Engine(sys.argv[2], n_read_threads=1, n_write_threads=0, use_cuda=True)
    out = {"type": "none"}
except BaseException as exc:
    out = report(exc)
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["fake", "fallback"])
def test_runtime_kind(tmp_path: Path, mode: str) -> None:
    # No CUDA runtime can be found: KVTIER_CUDART names a file that does not exist.
    env = dict(os.environ, KVTIER_CUDART=str(tmp_path / "no-libcudart.so"))
    out = _run_child(_RUNTIME_BODY, mode, tmp_path / "root", env)
    if mode == "fake":
        assert out["kind"] == "runtime"
        assert "CUDA is unavailable" in out["message"]
    else:
        assert out["type"] == "RuntimeError"


# An LD_PRELOAD syscall() that answers io_uring_setup with EPERM, as kernel.io_uring_disabled=2
# or a container's seccomp profile does.
_REFUSE_IO_URING_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <sys/syscall.h>

long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a[6];
  for (int i = 0; i < 6; ++i) a[i] = va_arg(ap, long);
  va_end(ap);
  if (number == __NR_io_uring_setup) {
    errno = EPERM;
    return -1;
  }
  long (*real)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  return real(number, a[0], a[1], a[2], a[3], a[4], a[5]);
}
"""


@pytest.fixture(scope="module")
def refuse_io_uring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler to build the io_uring refusal shim")
        pytest.skip("no C compiler (cc/gcc/clang) to build the io_uring refusal shim")
    work = tmp_path_factory.mktemp("refuse-io-uring")
    source = work / "refuse_io_uring.c"
    source.write_text(_REFUSE_IO_URING_C)
    out = work / "refuse_io_uring.so"
    build = subprocess.run(
        [cc, "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", str(out), str(source), "-ldl"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    return out


_IO_URING_BODY = """
results = {}
for engine in ("io_uring", "auto"):
    try:
        e = _core.Engine(sys.argv[2], n_read_threads=1, n_write_threads=0, io_engine=engine)
        results[engine] = {"type": "none", "chose": e.io_engine,
                           "reason": e.io_engine_fallback_reason}
        e.shutdown()
    except BaseException as exc:
        results[engine] = report(exc)
print(json.dumps(results))
"""


@pytest.mark.parametrize("mode", ["fake", "fallback"])
def test_io_uring_refused_kind(tmp_path: Path, mode: str, refuse_io_uring: Path) -> None:
    env = dict(os.environ, LD_PRELOAD=str(refuse_io_uring))
    root = tmp_path / "root"
    out = _run_child(_IO_URING_BODY, mode, root, env)
    # The shim really refused io_uring: 'auto' fell back to psync, saying why.
    assert out["auto"]["type"] == "none"
    assert out["auto"]["chose"] == "psync"
    assert "io_uring_setup failed" in out["auto"]["reason"]
    refused = out["io_uring"]
    if mode == "fake":
        assert refused["kind"] == "io_uring_refused"
        assert refused["errno"] == errno.EPERM
        assert refused["path"] == str(root)
        assert "io_engine='io_uring'" in refused["message"]
        assert WHERE.match(refused["where"]), refused["where"]
    else:
        assert refused["type"] == "PermissionError"
        assert refused["errno"] == errno.EPERM


# ---- the option contract: ENGINE_DEFAULTS and ENGINE_LIMITS ----------------------------------


def _keyword_defaults() -> dict[str, str]:
    """Engine's keyword-only parameters and the repr of their defaults, from its signature."""
    doc = _core.Engine.__init__.__doc__
    assert doc is not None
    signature = doc.strip().splitlines()[0]
    keyword_only = signature.split(", *, ", 1)[1].rsplit(") -> None", 1)[0]
    out = {}
    for part in re.split(r", (?=\w+: )", keyword_only):
        name, rest = part.split(": ", 1)
        out[name] = rest.rsplit(" = ", 1)[1]
    return out


def test_engine_defaults_are_the_keyword_defaults() -> None:
    defaults = _core.ENGINE_DEFAULTS
    keywords = _keyword_defaults()
    assert set(keywords) == set(defaults)
    for name, value in defaults.items():
        assert keywords[name] == repr(value), name
    assert defaults["n_read_threads"] is None and defaults["n_write_threads"] is None
    assert defaults["o_direct"] == "auto"
    assert defaults["checksum"] == "crc32c"
    assert defaults["durability"] == "none"
    assert defaults["io_engine"] == "auto"
    assert defaults["file_mode"] == 0o600
    assert (
        defaults["staging_buffer_bytes"] % _core.ENGINE_LIMITS["staging_buffer_bytes_multiple"] == 0
    )


def _refused(tmp_path: Path, **kwargs) -> bool:
    try:
        engine = _engine(tmp_path, **kwargs)
    except ValueError:
        return True
    engine.shutdown()
    return False


def test_engine_limits_are_what_the_engine_checks(tmp_path: Path, no_errors_module) -> None:
    limits = _core.ENGINE_LIMITS
    for name in ("worker_nice", "load_nice"):
        lo, hi = limits[name]
        assert not _refused(tmp_path, **{name: lo}) and not _refused(tmp_path, **{name: hi})
        assert _refused(tmp_path, **{name: lo - 1}) and _refused(tmp_path, **{name: hi + 1})
    for name in ("n_read_threads", "n_write_threads"):
        lo, hi = limits[name]
        assert not _refused(tmp_path, **{name: lo})  # the other direction keeps one worker
        assert _refused(tmp_path, **{name: hi + 1})
    lo, _ = limits["n_threads_total"]
    assert _refused(tmp_path, n_read_threads=lo - 1, n_write_threads=0)
    assert not _refused(tmp_path, n_read_threads=lo, n_write_threads=0)
    lo, hi = limits["max_stores_in_flight_while_loading"]
    assert hi == 2**32 - 1  # no bound but its type's (unsigned): the option parsers refuse more
    assert _refused(tmp_path, max_stores_in_flight_while_loading=lo - 1)
    assert not _refused(tmp_path, max_stores_in_flight_while_loading=lo)
    assert not _refused(tmp_path, max_stores_in_flight_while_loading=hi)
    with pytest.raises(TypeError):  # pybind11's conversion, below every option parser
        _engine(tmp_path, max_stores_in_flight_while_loading=hi + 1)
    multiple = limits["staging_buffer_bytes_multiple"]
    lo, hi = limits["staging_buffer_bytes"]
    assert hi is None and lo == multiple
    assert not _refused(tmp_path, staging_buffer_bytes=lo, staging_bytes_total=lo)
    assert _refused(tmp_path, staging_buffer_bytes=lo - 1, staging_bytes_total=lo)
    assert _refused(tmp_path, staging_buffer_bytes=lo + multiple // 2, staging_bytes_total=4 * lo)
    lo, _ = limits["staging_bytes_total"]
    assert _refused(tmp_path, staging_buffer_bytes=lo, staging_bytes_total=lo - 1)
    lo, hi = limits["file_mode"]
    required = limits["file_mode_required_bits"]
    assert not _refused(tmp_path, file_mode=required) and not _refused(tmp_path, file_mode=hi)
    assert _refused(tmp_path, file_mode=hi + 1)
    assert _refused(tmp_path, file_mode=required & ~0o200)
    lo, hi = limits["fingerprint_length"]
    assert hi == _core.FINGERPRINT_SIZE
    assert not _refused(tmp_path, fingerprint=b"x" * hi)
    assert _refused(tmp_path, fingerprint=b"x" * (hi + 1))

"""kvtier's exception hierarchy (kvtier.errors), each error from a real failure.

Every class is a ``KvtierError`` and the builtin a caller already catches. The failures are
real: a root below a regular file, a namespace owned by another user, the kernel refusing
io_uring (a seccomp filter in a child), a forked child, work submitted after shutdown, a
CUDA engine without CUDA; and the same errors raised from many threads at once.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kvtier
import numpy as np
import pytest
from kvtier import _core
from kvtier.errors import (
    ConfigurationError,
    CoreError,
    ForkedProcessError,
    InvalidArgumentError,
    InvalidTypeError,
    IoUringRefusedError,
    KvtierError,
    ShutDownError,
    StorageError,
)
from kvtier.tiering import JobMetadata, OffloadingSpec, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.manager import FileSystemTierManager

SPEC = OffloadingSpec(model_name="org/model", dtype="float16")
WHERE = re.compile(r"^csrc/\S+\.(cpp|hpp):\d+$")
CTX = ReqContext("r")


def make_tier(root: Path, **options: Any) -> FileSystemTierManager:
    rows = np.random.default_rng(1).integers(0, 256, (4, 4096), dtype=np.uint8)
    config = {"type": "fs", "root_dir": str(root), "n_read_threads": 1, "n_write_threads": 1}
    tier = SecondaryTierFactory.create_secondary_tier({**config, **options}, memoryview(rows), SPEC)
    assert isinstance(tier, FileSystemTierManager)
    return tier


def below_a_file(tmp_path: Path) -> Path:
    plain = tmp_path / "plain-file"
    plain.write_bytes(b"x")
    return plain / "root"


def engine_args() -> dict[str, Any]:
    return {"n_read_threads": 1, "n_write_threads": 1, "io_engine": "psync"}


# ---- the hierarchy itself ---------------------------------------------------------------------

HIERARCHY = [
    (StorageError, OSError),
    (IoUringRefusedError, StorageError),
    (InvalidArgumentError, ValueError),
    (ConfigurationError, InvalidArgumentError),
    (InvalidTypeError, TypeError),
    (ShutDownError, RuntimeError),
    (ForkedProcessError, RuntimeError),
    (CoreError, RuntimeError),
]


@pytest.mark.parametrize("cls,builtin", HIERARCHY, ids=[c.__name__ for c, _ in HIERARCHY])
def test_every_class_is_a_kvtier_error_and_its_builtin(cls: type, builtin: type) -> None:
    assert issubclass(cls, KvtierError) and issubclass(cls, builtin)
    assert getattr(kvtier, cls.__name__) is cls and cls.__name__ in kvtier.__all__
    assert kvtier.KvtierError is KvtierError


# ---- system: an unusable root ----------------------------------------------------------------


def test_unusable_root_is_a_storage_error_and_not_a_directory_error(tmp_path: Path) -> None:
    root = below_a_file(tmp_path)
    with pytest.raises(NotADirectoryError) as info:
        make_tier(root)
    e = info.value
    assert isinstance(e, StorageError) and isinstance(e, KvtierError)
    assert not isinstance(e, IoUringRefusedError)
    assert e.errno == errno.ENOTDIR and e.filename and str(root).startswith(e.filename)


def test_core_storage_error_says_where_in_the_core_it_was_thrown(tmp_path: Path) -> None:
    root = below_a_file(tmp_path)
    with pytest.raises(StorageError) as info:
        _core.Engine(str(root), **engine_args())
    e = info.value
    assert isinstance(e, NotADirectoryError) and isinstance(e, OSError)
    assert (e.errno, e.filename) == (errno.ENOTDIR, str(root))
    assert "cannot create root directory" in e.strerror
    assert WHERE.match(e.where), e.where
    assert e.where not in str(e)  # the message stays the user's; the place is an attribute
    if sys.version_info >= (3, 11):
        assert any(e.where in note for note in e.__notes__)


def test_storage_error_pickles_with_its_type_errno_path_and_place(tmp_path: Path) -> None:
    with pytest.raises(StorageError) as info:
        _core.Engine(str(below_a_file(tmp_path)), **engine_args())
    e = info.value
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is type(e) and isinstance(back, NotADirectoryError)
    assert (back.errno, back.strerror, back.filename) == (e.errno, e.strerror, e.filename)
    assert back.where == e.where
    # Made directly, the errno picks the builtin subclass as OSError(...) does.
    assert isinstance(StorageError(errno.ENOENT, "gone", "/x"), FileNotFoundError)
    assert type(StorageError(errno.ENOSPC, "full")) is StorageError


def test_namespace_of_another_user_is_a_permission_error(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to give the namespace to another user")
    root = tmp_path / "root"
    first = make_tier(root)
    first.shutdown()
    namespace = Path(first.file_mapper.namespace_dir)
    os.chown(namespace, 65534, 65534)  # nobody
    with pytest.raises(PermissionError) as info:
        make_tier(root)
    e = info.value
    assert isinstance(e, StorageError) and e.errno == errno.EPERM
    assert e.filename == str(namespace) and "file_mode" in e.strerror


# ---- io_uring refused (seccomp in a child) ------------------------------------------------------

_IO_URING_CHILD = """
import errno, json, sys
import numpy as np
import kvtier.errors as E
from kvtier import _core
from kvtier.tiering.fs.engine import io_uring_refusal
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

root = sys.argv[1]

CLASSES = {"IoUringRefusedError": E.IoUringRefusedError, "StorageError": E.StorageError,
           "KvtierError": E.KvtierError, "OSError": OSError, "PermissionError": PermissionError}

def facts(e):
    return {"type": type(e).__name__, "errno": e.errno, "strerror": e.strerror,
            "where": getattr(e, "where", ""), "cause": type(e.__cause__).__name__,
            **{name: isinstance(e, cls) for name, cls in CLASSES.items()}}

out = {"reason": io_uring_refusal(root + "/probe")}
try:
    _core.Engine(root + "/core", n_read_threads=1, n_write_threads=1, io_engine="io_uring")
except OSError as e:
    out["core"] = facts(e)
rows = np.zeros((2, 4096), dtype=np.uint8)
try:
    SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root_dir": root + "/tier", "io_engine": "io_uring"},
        memoryview(rows), OffloadingSpec(model_name="m", dtype="f16"))
except OSError as e:
    out["tier"] = facts(e)
# Not every OSError under io_engine="io_uring" is a refusal of io_uring: an unusable root.
open(root + "/file", "w").close()
try:
    _core.Engine(root + "/file/x", n_read_threads=1, n_write_threads=1, io_engine="io_uring")
except OSError as e:
    out["root"] = facts(e)
print(json.dumps(out))
"""


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOSYS], ids=["EPERM", "ENOSYS"])
def test_refused_io_uring_is_an_io_uring_refused_error(
    tmp_path: Path, code: int, seccomp_io_uring: Callable[[int], str]
) -> None:
    script = seccomp_io_uring(code) + textwrap.dedent(_IO_URING_CHILD)
    proc = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert os.strerror(code) in out["reason"]  # kvtier info's answer: the kernel's refusal
    for where in ("core", "tier"):
        e = out[where]
        assert e["type"] == "IoUringRefusedError" and e["errno"] == code, e
        assert e["IoUringRefusedError"] and e["StorageError"] and e["KvtierError"] and e["OSError"]
        assert e["PermissionError"] is (code == errno.EPERM)  # the errno's builtin, as before
        assert WHERE.match(e["where"]), e["where"]
    # The tier adds what to do instead, and keeps the core's error as the cause.
    tier = out["tier"]
    assert "io_engine='auto'" in tier["strerror"] and "'psync'" in tier["strerror"]
    assert tier["cause"] == "IoUringRefusedError"
    root = out["root"]
    assert root["StorageError"] and not root["IoUringRefusedError"]
    assert root["errno"] == errno.ENOTDIR


# ---- invalid arguments: options, jobs, the core's own checks -----------------------------------


def test_bad_options_are_configuration_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="'worker_nice'") as info:
        make_tier(tmp_path / "root", worker_nice=20)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KvtierError)
    with pytest.raises(ConfigurationError, match="Unknown option 'n_reader_threads'"):
        make_tier(tmp_path / "root", n_reader_threads=2)
    with pytest.raises(ConfigurationError, match="must include 'type'"):
        SecondaryTierFactory.create_secondary_tier({}, memoryview(bytearray(8)), SPEC)
    with pytest.raises(ConfigurationError, match="dtype"):
        OffloadingSpec(model_name="m", dtype="")
    assert not (tmp_path / "root").exists()  # refused before anything was made


def test_bad_jobs_are_invalid_type_and_invalid_argument_errors(tmp_path: Path) -> None:
    tier = make_tier(tmp_path / "root")
    try:
        key = make_offload_key(b"\x01" * 32, 0)
        with pytest.raises(InvalidTypeError, match="job_id") as info:
            tier.submit_store(JobMetadata("1", [key], np.array([0]), False, CTX))  # type: ignore[arg-type]
        assert isinstance(info.value, TypeError) and isinstance(info.value, KvtierError)
        with pytest.raises(InvalidArgumentError, match="out of range") as value:
            tier.submit_store(JobMetadata(1, [key], np.array([9]), False, CTX))
        assert isinstance(value.value, ValueError)
        assert not isinstance(value.value, ConfigurationError)
    finally:
        tier.shutdown()


def test_core_invalid_argument_is_an_invalid_argument_error(tmp_path: Path) -> None:
    # Straight to the engine, past Python's option checks: the core's own refusal.
    with pytest.raises(InvalidArgumentError, match="load_nice") as info:
        _core.Engine(str(tmp_path / "root"), **engine_args(), load_nice=-1)
    assert isinstance(info.value, ValueError) and isinstance(info.value, KvtierError)


# ---- shut down ---------------------------------------------------------------------------------


def test_submit_after_shutdown_is_a_shut_down_error(tmp_path: Path) -> None:
    key = make_offload_key(b"\x02" * 32, 0)
    tier = make_tier(tmp_path / "tier")
    tier.shutdown()
    with pytest.raises(ShutDownError, match="shut down") as info:
        tier.submit_load(JobMetadata(1, [key], np.array([0]), False, CTX))
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, KvtierError)

    engine = _core.Engine(str(tmp_path / "engine"), **engine_args())
    engine.shutdown()
    with pytest.raises(ShutDownError, match="shut down"):
        engine.submit_store(1, [])


def test_transfer_after_shutdown_is_a_shut_down_error(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch", reason="GPUStorageTransfer takes torch tensors")
    from kvtier.gpu import GPUStorageTransfer

    xfer = GPUStorageTransfer([torch.zeros(4, 4096)], SPEC, str(tmp_path / "root"), **engine_args())
    xfer.shutdown()
    with pytest.raises(ShutDownError, match="GPUStorageTransfer is shut down") as info:
        xfer.store(1, [0], [make_offload_key(b"\x03" * 32, 0)])
    assert isinstance(info.value.__cause__, ShutDownError)  # the engine's own refusal


# ---- a forked child ----------------------------------------------------------------------------

_FORK_CHILD = """
import json, os, sys
import numpy as np
from kvtier import _core
from kvtier.errors import ForkedProcessError, KvtierError
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

root = sys.argv[1]
rows = np.zeros((2, 4096), dtype=np.uint8)
tier = SecondaryTierFactory.create_secondary_tier(
    {"type": "fs", "root_dir": root + "/tier", "n_read_threads": 1, "n_write_threads": 1},
    memoryview(rows), OffloadingSpec(model_name="m", dtype="f16"))
engine = _core.Engine(root + "/engine", n_read_threads=1, n_write_threads=1, io_engine="psync")

def attempt(call):
    try:
        call()
    except BaseException as e:
        return {"type": type(e).__name__, "forked": isinstance(e, ForkedProcessError),
                "kvtier": isinstance(e, KvtierError), "runtime": isinstance(e, RuntimeError),
                "message": str(e)}
    return None

r, w = os.pipe()
pid = os.fork()
if pid == 0:
    out = {"tier": attempt(tier.get_finished), "engine": attempt(engine.stats)}
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
data = b""
while chunk := os.read(r, 65536):
    data += chunk
os.waitpid(pid, 0)
out = json.loads(data)
out["parent"] = attempt(tier.get_finished)  # the parent's tier goes on
tier.shutdown()
engine.shutdown()
print(json.dumps(out))
"""


def test_use_in_a_forked_child_is_a_forked_process_error(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_FORK_CHILD), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for who in ("tier", "engine"):  # the Python guard and the core's
        e = out[who]
        assert e is not None, f"{who} worked in a forked child"
        assert e["type"] == "ForkedProcessError" and e["kvtier"] and e["runtime"], e
        assert "forked" in e["message"]
    assert out["parent"] is None


# ---- anything else from the core ---------------------------------------------------------------


def test_other_core_failures_are_core_errors(tmp_path: Path) -> None:
    if _core.cuda_available():
        pytest.skip("CUDA is available here: use_cuda does not fail")
    with pytest.raises(CoreError, match="CUDA") as info:
        _core.Engine(str(tmp_path / "root"), **engine_args(), use_cuda=True)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, KvtierError)


# ---- many threads at once ----------------------------------------------------------------------


def test_errors_raised_from_many_threads_at_once_keep_their_types(tmp_path: Path) -> None:
    """Threads raise core and Python errors together (the engine constructor releases the
    GIL): each error has its type, and an errno's class is one class, not one per race."""
    bad_root = str(below_a_file(tmp_path))
    closed = make_tier(tmp_path / "closed")
    closed.shutdown()
    key = make_offload_key(b"\x04" * 32, 0)
    threads, rounds = 8, 25
    barrier = threading.Barrier(threads)
    seen: list[tuple[str, type, bool]] = []
    failures: list[BaseException] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        try:
            barrier.wait()
            for n in range(rounds):
                kind = (i + n) % 3
                try:
                    if kind == 0:
                        _core.Engine(bad_root, **engine_args())
                    elif kind == 1:
                        closed.submit_store(JobMetadata(n, [key], np.array([0]), False, CTX))
                    else:
                        closed._check_job(JobMetadata(n, [key], np.array([0.5]), False, CTX))
                except KvtierError as e:
                    ok = {
                        0: isinstance(e, NotADirectoryError) and isinstance(e, StorageError),
                        1: isinstance(e, ShutDownError) and isinstance(e, RuntimeError),
                        2: isinstance(e, InvalidTypeError) and isinstance(e, TypeError),
                    }[kind]
                    with lock:
                        seen.append((str(kind), type(e), ok))
                else:
                    raise AssertionError(f"kind {kind} raised nothing")
        except BaseException as e:  # noqa: BLE001  (reported below, with its thread)
            failures.append(e)

    pool = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in pool), "a thread hung"
    assert not failures, failures
    assert len(seen) == threads * rounds and all(ok for _, _, ok in seen)
    by_kind: dict[str, set[type]] = {}
    for kind, cls, _ in seen:
        by_kind.setdefault(kind, set()).add(cls)
    assert {k: len(v) for k, v in by_kind.items()} == {"0": 1, "1": 1, "2": 1}

"""A root that other users, containers or a hostile process can write to (docs/tiers.md,
"Sharing a root"): links, special files, other users' namespaces, modes, PID namespaces, and
file systems that refuse O_DIRECT after creating a file.

Each tier runs in a child process (hard timeout: a hang is a failure, not a stuck suite),
as another real user where the test is about users.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from kvtier import _core
from kvtier.errors import StorageError
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs import file_mapper
from kvtier.tiering.fs.file_mapper import (
    CONFIG_FILE_NAME,
    FileMapper,
    host_label,
    parse_tmp_file_name,
    pid_alive,
    tmp_file_name,
)
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
ROW = 3000  # row bytes, also in the child scripts
CHILD_TIMEOUT_S = 120
FAULTS = Path(__file__).resolve().parent / "faults"

# One tier in a child process: builds the tier, runs the ops one after the other, prints
# one JSON line. Rows hold seeded random bytes; a load is checked against them.
TIER_CHILD = textwrap.dedent(
    """
    import json, os, sys
    import numpy as np
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec
    import kvtier.tiering.fs.manager  # everything imported before privileges are dropped

    rows = np.random.default_rng(7).integers(0, 256, (16, 3000), dtype=np.uint8)
    spec = json.loads(sys.argv[1])
    os.umask(spec["umask"])
    if spec["user"] is not None:  # the interpreter itself may not be readable by that user
        uid, gid = spec["user"]
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    data = rows.copy()
    out = {"error": None, "results": []}
    try:
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root_dir": spec["root"], "n_read_threads": 2,
             "n_write_threads": 2, **spec.get("options", {})},
            memoryview(data),
            OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD"),
        )
    except Exception as e:
        out["error"] = {"type": type(e).__name__, "errno": getattr(e, "errno", None),
                        "message": str(e), "filename": getattr(e, "filename", None),
                        "classes": [c.__name__ for c in type(e).__mro__]}
        print(json.dumps(out))
        sys.exit(0)
    key = lambda i: make_offload_key(i.to_bytes(32, "big"), 0)
    for n, (kind, ids) in enumerate(spec["ops"]):
        if kind == "lookup":
            out["results"].append([tier.lookup(key(i), ReqContext("t")) for i in ids])
            continue
        if kind == "load":
            data[ids] = 0
        job = JobMetadata(n, [key(i) for i in ids], np.asarray(ids, dtype=np.int64), False,
                          ReqContext("t"))
        (tier.submit_store if kind == "store" else tier.submit_load)(job)
        tier.drain_jobs()
        (r,) = tier.get_finished()
        ok = [bool((data[i] == rows[i]).all()) for i in ids] if kind == "load" else None
        out["results"].append({"success": r.success, "error": r.error, "data_ok": ok})
    tier.shutdown()
    print(json.dumps(out))
    """
)


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def run_tier(
    root: Path,
    ops: list[tuple[str, list[int]]],
    options: dict[str, Any] | None = None,
    user: str | None = None,
    env: dict[str, str] | None = None,
    umask: int = 0o022,
    prefix: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Runs ``ops`` on a tier in a child process (``prefix`` before it: a command that puts
    it in namespaces of its own, as another host); the child's JSON report."""
    account = None if user is None else pwd.getpwnam(user)
    spec = {
        "root": str(root),
        "ops": ops,
        "options": options or {},
        "umask": umask,
        "user": None if account is None else [account.pw_uid, account.pw_gid],
    }
    proc = subprocess.run(
        [*prefix, sys.executable, "-c", TIER_CHILD, json.dumps(spec)],
        check=False,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
        env=env,
        cwd="/",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def mapper(root: Path) -> FileMapper:
    return FileMapper(str(root), SPEC, ROW)


def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root (creates users, mounts, PID namespaces)")


# --------------------------------------------------------------------------------------------
# links below the root


def test_symlinked_fan_out_directory_is_never_written_through(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    leaf = Path(mapper(root).get_file_name(key(1))).parent
    leaf.parent.mkdir(parents=True)
    leaf.symlink_to(outside, target_is_directory=True)
    out = run_tier(root, [("store", [1]), ("lookup", [1])])
    store = out["results"][0]
    assert not store["success"]
    assert "errno 40" in store["error"] and str(leaf) in store["error"], store["error"]
    assert "links below root_dir are never followed" in store["error"]
    assert list(outside.iterdir()) == []
    assert out["results"][1] == [False]


def test_symlinked_block_file_is_not_loaded_nor_present(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    assert run_tier(root, [("store", [1])])["results"][0]["success"]
    block = Path(mapper(root).get_file_name(key(1)))
    outside.mkdir()
    moved = outside / "planted.kvb"
    block.rename(moved)  # a valid block of the right key and layout, now outside the root
    block.symlink_to(moved)
    out = run_tier(root, [("lookup", [1]), ("load", [1]), ("store", [1])])
    assert out["results"][0] == [False]
    load = out["results"][1]
    assert not load["success"] and load["data_ok"] == [False]
    assert "errno 40" in load["error"] and str(block) in load["error"]
    assert not out["results"][2]["success"]  # a store over the link is not a dedup
    assert moved.exists() and block.is_symlink()
    assert _core.paths_exist([str(block)], str(mapper(root).rank_dir)) == [False]
    assert _core.paths_exist([str(block)]) == [False]


def test_paths_outside_the_root_are_absent(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    elsewhere = tmp_path / "elsewhere.kvb"
    elsewhere.write_bytes(b"x")
    inside = root / "a.kvb"
    inside.write_bytes(b"x")
    found = _core.paths_exist([str(elsewhere), str(inside), f"{root}/../elsewhere.kvb"], str(root))
    assert found == [False, True, False]


# --------------------------------------------------------------------------------------------
# special files at block paths


def _make_special(kind: str, path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        cwd = os.getcwd()
        os.chdir(path.parent)  # a relative name: the full path exceeds sun_path
        try:
            s.bind(path.name)
        finally:
            os.chdir(cwd)
        return s
    elif kind == "directory":
        path.mkdir()
        (path / "inner").write_bytes(b"x")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a device needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))  # like /dev/null
    return None


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "dangling", "device"])
def test_special_file_at_a_block_path_fails_the_block_without_hanging(
    tmp_path: Path, kind: str
) -> None:
    root = tmp_path / "root"
    block = Path(mapper(root).get_file_name(key(1)))
    keep = _make_special(kind, block)
    try:
        # sync and async lookups, a load, a store over it, drain, shutdown: all return.
        out = run_tier(root, [("lookup", [1]), ("load", [1]), ("store", [1]), ("store", [2])])
        again = run_tier(root, [("lookup", [1])], {"async_lookup": True})
    finally:
        if keep is not None:
            keep.close()
    assert out["error"] is None, out["error"]
    assert out["results"][0] == [False]
    load, store_over, store_other = out["results"][1:]
    assert not load["success"] and str(block) in load["error"]
    assert not store_over["success"] and str(block) in store_over["error"]
    assert store_other["success"], store_other["error"]  # the tier keeps working
    assert again["results"][0] in ([None], [False])
    assert os.path.lexists(block)  # not ours to remove


# --------------------------------------------------------------------------------------------
# users, modes, adoption


@contextlib.contextmanager
def _users() -> Iterator[dict[str, str]]:
    """kvt-a and kvt-b share group kvt-share; kvt-c is in a group of its own."""
    needs_root()
    if shutil.which("useradd") is None or shutil.which("groupadd") is None:
        pytest.skip("useradd/groupadd not installed")
    suffix = f"{os.getpid() % 100000}"
    share = f"kvts{suffix}"
    users = {"a": f"kvta{suffix}", "b": f"kvtb{suffix}", "c": f"kvtc{suffix}"}
    created: list[str] = []
    try:
        subprocess.run(["groupadd", share], check=True, capture_output=True)
        for name, user in users.items():
            group = ["-N", "-g", share] if name in "ab" else ["-U"]
            subprocess.run(["useradd", "-M", *group, user], check=True, capture_output=True)
            created.append(user)
        yield {**users, "share": share}
    finally:
        for user in created:
            subprocess.run(["userdel", user], check=False, capture_output=True)
        subprocess.run(["groupdel", share], check=False, capture_output=True)


@pytest.fixture
def shared_root() -> Iterator[Path]:
    """A world-writable sticky directory (like /tmp) that every test user can reach."""
    parent = Path(tempfile.mkdtemp(prefix="kvtier-shared-", dir="/tmp"))
    parent.chmod(0o1777)
    try:
        yield parent / "root"
    finally:
        shutil.rmtree(parent, ignore_errors=True)


def _modes(root: Path) -> dict[str, int]:
    m = mapper(root)
    block = Path(m.get_file_name(key(1)))
    paths = {
        "root": root,
        "namespace": Path(m.namespace_dir),
        "rank": Path(m.rank_dir),
        "fan_out_1": block.parent.parent,
        "fan_out_2": block.parent,
        "config": Path(m.config_path),
        "block": block,
    }
    return {name: stat.S_IMODE(p.stat().st_mode) for name, p in paths.items()}


@pytest.mark.parametrize("file_mode,dir_mode", [(0o600, 0o700), (0o660, 0o770), (0o666, 0o777)])
def test_every_created_directory_and_file_follows_file_mode(
    tmp_path: Path, file_mode: int, dir_mode: int
) -> None:
    root = tmp_path / "new" / "root"
    out = run_tier(root, [("store", [1])], {"file_mode": file_mode}, umask=0o022)
    assert out["results"][0]["success"], out["results"][0]["error"]
    modes = _modes(root)
    assert modes.pop("config") == file_mode
    assert modes.pop("block") == file_mode
    assert modes == dict.fromkeys(modes, dir_mode)
    assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == dir_mode
    assert _core.directory_mode(file_mode) == dir_mode


@pytest.mark.parametrize("file_mode,second", [(0o660, "b"), (0o666, "c")])
def test_two_users_share_one_root(shared_root: Path, file_mode: int, second: str) -> None:
    with _users() as users:
        opts = {"file_mode": file_mode}
        first = run_tier(shared_root, [("store", [1])], opts, user=users["a"])
        assert first["error"] is None, first["error"]
        assert first["results"][0]["success"], first["results"][0]["error"]
        other = run_tier(shared_root, [("load", [1]), ("store", [2])], opts, user=users[second])
        assert other["error"] is None, other["error"]
        load, store = other["results"]
        assert load["success"] and load["data_ok"] == [True], load["error"]
        assert store["success"], store["error"]
        back = run_tier(shared_root, [("load", [2])], opts, user=users["a"])
        assert back["results"][0]["data_ok"] == [True], back["results"][0]["error"]


@pytest.mark.parametrize("file_mode", [0o600, 0o660])
def test_another_users_namespace_is_refused(shared_root: Path, file_mode: int) -> None:
    with _users() as users:
        # kvt-c plants a namespace (and blocks) in the world-writable root.
        planted = run_tier(shared_root, [("store", [1])], {"file_mode": 0o666}, user=users["c"])
        assert planted["results"][0]["success"], planted["results"][0]["error"]
        victim = run_tier(shared_root, [("load", [1])], {"file_mode": file_mode}, user=users["a"])
        error = victim["error"]
        assert error is not None, "a namespace owned by another user was adopted"
        assert error["type"] == "StorageError" and error["errno"] == errno.EPERM
        assert "PermissionError" in error["classes"]  # caught as before
        assert users["c"] in error["message"] and "file_mode" in error["message"]
        assert error["filename"] == mapper(shared_root).namespace_dir


# --------------------------------------------------------------------------------------------
# tmp files of live writers in another PID namespace

WRITER = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec

    data = np.ones((16, 3000), dtype=np.uint8)
    tier = SecondaryTierFactory.create_secondary_tier(
        # psync: the interposer slows its pwrite (io_uring writes through the ring)
        {"type": "fs", "root_dir": sys.argv[1], "n_read_threads": 1, "n_write_threads": 4,
         "o_direct": False, "io_engine": "psync"},
        memoryview(data), OffloadingSpec(model_name="org/model-7b", dtype="float16",
                                          kv_layout="NHD"))
    print(json.dumps({"pid": os.getpid()}), flush=True)
    for i in range(12):
        key = make_offload_key(i.to_bytes(32, "big"), 0)
        tier.submit_store(JobMetadata(i, [key], np.asarray([i], dtype=np.int64), False,
                                      ReqContext("t")))
    tier.drain_jobs()
    results = tier.get_finished()
    tier.shutdown()
    print(json.dumps({"errors": [r.error for r in results if not r.success],
                      "n": len(results)}), flush=True)
    """
)


def test_sweep_spares_live_writers_in_another_pid_namespace(
    tmp_path: Path, interposer: Path
) -> None:
    needs_root()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    root = tmp_path / "root"
    env = dict(
        os.environ,
        LD_PRELOAD=str(interposer),
        KVTIER_FAULT="slow_pwrite",
        KVTIER_FAULT_MATCH=".tmp",
        KVTIER_FAULT_DELAY_MS="1500",
    )
    # Burn some pids first, so the writer's pid (in its namespace) is not one the sweep's
    # namespace has alive, as pid 1 and 2 usually are.
    shell = 'for i in $(seq 200); do /bin/true; done; "$0" -c "$1" "$2"'
    writer = subprocess.Popen(
        ["unshare", "--pid", "--fork", "sh", "-c", shell, sys.executable, WRITER, str(root)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert writer.stdout is not None
        inner_pid = json.loads(writer.stdout.readline())["pid"]
        if pid_alive(inner_pid):
            pytest.skip(f"pid {inner_pid} of the writer's namespace also runs here")
        rank = Path(mapper(root).rank_dir)
        deadline = time.monotonic() + 60
        while not list(rank.rglob("*.tmp")):
            assert time.monotonic() < deadline, "the writer never made a tmp file"
            time.sleep(0.05)
        tmp_before = list(rank.rglob("*.tmp"))
        assert all(f".{inner_pid}." in p.name for p in tmp_before)
        # A second tier starting on the same root, same host name, sweeps: twice, while the
        # writer's stores are in flight.
        for _ in range(2):
            assert run_tier(root, [], {"o_direct": False})["error"] is None
        out, err = writer.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if writer.poll() is None:
            writer.kill()
            writer.wait()
    assert writer.returncode == 0, err[-4000:]
    report = json.loads(out.strip().splitlines()[-1])
    assert report == {"errors": [], "n": 12}
    assert list(Path(mapper(root).rank_dir).rglob("*.tmp")) == []


# --------------------------------------------------------------------------------------------
# file systems that create the file, then refuse O_DIRECT


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    needs_root()
    mount = tmp_path / "ramfs"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "ramfs", "ramfs", str(mount)], check=False, capture_output=True, text=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount ramfs: {done.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_ramfs_root_works_buffered_with_one_warning_and_nothing_left(
    ramfs: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert _core.probe_o_direct(str(ramfs)) != ""  # what makes this file system interesting
    assert list(ramfs.iterdir()) == []  # and the probe left nothing behind
    root = ramfs / "root"
    data = np.random.default_rng(3).integers(0, 256, (4, ROW), dtype=np.uint8)
    with caplog.at_level(logging.WARNING):
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root_dir": str(root), "o_direct": "auto"}, memoryview(data), SPEC
        )
    try:
        ids = np.asarray([0, 1, 2], dtype=np.int64)
        tier.submit_store(JobMetadata(1, [key(i) for i in range(3)], ids, False, ReqContext("t")))
        tier.drain_jobs()
        (stored,) = tier.get_finished()
        assert stored.success, stored.error
        expected = data[:3].copy()
        data[:3] = 0
        tier.submit_load(JobMetadata(2, [key(i) for i in range(3)], ids, False, ReqContext("t")))
        tier.drain_jobs()
        (loaded,) = tier.get_finished()
        assert loaded.success, loaded.error
        assert (data[:3] == expected).all()
        assert tier.direct_io is False
    finally:
        tier.shutdown()
    assert sum("O_DIRECT" in r.getMessage() for r in caplog.records) == 1
    leftovers = [p for p in ramfs.rglob("*") if p.name.endswith(".tmp") or "probe" in p.name]
    assert leftovers == []


def test_tmp_file_names_round_trip_through_the_shared_pattern() -> None:
    first, second = tmp_file_name("abc.kvb"), tmp_file_name("abc.kvb")
    parsed = parse_tmp_file_name(first)
    assert parsed is not None and parsed[:3] == ("abc.kvb", host_label(), os.getpid())
    assert parse_tmp_file_name(second).n != parsed.n
    assert parse_tmp_file_name("abc.kvb") is None
    assert len(parsed.token) == 16 and parse_tmp_file_name(second).token == parsed.token
    name = f"config.json.{host_label()}.12.00ff00ff00ff00ff.3.tmp"
    assert parse_tmp_file_name(name) == ("config.json", host_label(), 12, "00ff00ff00ff00ff", 3)
    # The form before the token: not a name any writer of this format makes.
    assert parse_tmp_file_name(f"config.json.{host_label()}.12.3.tmp") is None


def test_a_forked_child_draws_its_own_tmp_name_token() -> None:
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.write(write, tmp_file_name("x.kvb").encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        theirs = parse_tmp_file_name(pipe.read())
    os.waitpid(child, 0)
    ours = parse_tmp_file_name(tmp_file_name("x.kvb"))
    assert theirs is not None and ours is not None
    assert theirs.pid == child and theirs.token != ours.token


# Run before TIER_CHILD: with KVTIER_TEST_LINK_GATE set, the tier's config.json tmp file is
# made (and locked) and then the link into place waits until the gate path exists, so a test
# can hold one process in the middle of creating config.json.
LINK_PAUSE = textwrap.dedent(
    """
    import os, time
    _gate = os.environ.get("KVTIER_TEST_LINK_GATE")
    if _gate:
        _real_link = os.link
        def _paused_link(*args, **kwargs):
            open(os.environ["KVTIER_TEST_LINK_READY"], "w").close()
            while not os.path.exists(_gate):
                time.sleep(0.01)
            return _real_link(*args, **kwargs)
        os.link = _paused_link
    """
)


def test_containers_of_one_host_name_create_config_at_once(tmp_path: Path) -> None:
    # Two containers with one host name: own UTS and PID namespaces, each tier is pid 1.
    needs_root()
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) not installed")
    root, gate, ready = tmp_path / "root", tmp_path / "gate", tmp_path / "ready"
    spec = {"root": str(root), "ops": [("store", [1]), ("load", [1])], "options": {},
            "umask": 0o022, "user": None}  # fmt: skip
    container = ["unshare", "--uts", "--pid", "--fork", "--mount-proc", "--kill-child",
                 "sh", "-c", 'hostname same && exec "$@"', "sh", sys.executable, "-c"]  # fmt: skip
    first = subprocess.Popen(
        [*container, LINK_PAUSE + TIER_CHILD, json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, KVTIER_TEST_LINK_GATE=str(gate), KVTIER_TEST_LINK_READY=str(ready)),
        cwd="/",
    )
    try:
        deadline = time.monotonic() + CHILD_TIMEOUT_S
        while not ready.exists():
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline, "the first container never made config.json"
            time.sleep(0.02)
        namespace = Path(mapper(root).namespace_dir)
        (held,) = [parse_tmp_file_name(p.name) for p in namespace.glob("config.json.*.tmp")]
        assert held is not None and held.host == "same" and held.pid == 1
        second = subprocess.run(
            [*container, TIER_CHILD, json.dumps(spec)],
            check=False,
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            cwd="/",
        )
        gate.touch()
        out, err = first.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert second.returncode == 0, second.stderr[-4000:]
    assert first.returncode == 0, err[-4000:]
    for result in (
        json.loads(second.stdout.strip().splitlines()[-1]),
        json.loads(out.strip().splitlines()[-1]),
    ):
        assert result["error"] is None, result["error"]
        assert result["results"][1]["data_ok"] == [True], result["results"]
    assert list(namespace.glob("config.json.*")) == []


def test_a_config_that_cannot_be_created_is_named_by_its_full_path(tmp_path: Path) -> None:
    root = tmp_path / "root"
    namespace = Path(mapper(root).namespace_dir)
    namespace.mkdir(parents=True, mode=0o700)
    # A file in the way of this process's next tmp name: what a collision would meet.
    parsed = parse_tmp_file_name(tmp_file_name(CONFIG_FILE_NAME))
    assert parsed is not None
    name = f"{parsed.final}.{parsed.host}.{parsed.pid}.{parsed.token}.{parsed.n + 1}.tmp"
    (namespace / name).write_bytes(b"{")
    with pytest.raises(StorageError) as caught:
        FileMapper(str(root), SPEC, ROW).prepare(0o600)
    assert caught.value.errno == errno.EEXIST
    assert caught.value.filename == str(namespace / name)


@pytest.mark.parametrize("removals", [1, 3])
def test_a_config_tmp_swept_before_its_lock_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, removals: int
) -> None:
    # Another process's sweep sees a fresh tmp file without a lock (the instant between its
    # open and its lock) and removes it: the writer sees its file unlinked and takes a new name.
    root = tmp_path / "root"
    namespace = Path(mapper(root).namespace_dir)
    real_lock = _core.lock_tmp_file
    swept: list[str] = []

    def swept_first(fd: int) -> bool:
        if len(swept) < removals:
            (tmp,) = namespace.glob("config.json.*.tmp")
            tmp.unlink()  # what the other process's sweep does
            swept.append(tmp.name)
        return real_lock(fd)

    monkeypatch.setattr(file_mapper._core, "lock_tmp_file", swept_first)
    FileMapper(str(root), SPEC, ROW).prepare(0o600)
    assert len(set(swept)) == removals
    assert json.loads((namespace / CONFIG_FILE_NAME).read_text())
    assert list(namespace.glob("config.json.*")) == []


def test_a_config_tmp_swept_every_time_fails_with_enoent_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    namespace = Path(mapper(root).namespace_dir)
    real_lock = _core.lock_tmp_file

    def always_swept(fd: int) -> bool:
        for tmp in namespace.glob("config.json.*.tmp"):
            tmp.unlink()
        return real_lock(fd)

    monkeypatch.setattr(file_mapper._core, "lock_tmp_file", always_swept)
    with pytest.raises(StorageError) as caught:
        FileMapper(str(root), SPEC, ROW).prepare(0o600)
    assert caught.value.errno == errno.ENOENT
    assert "removed by a sweep before locked" in str(caught.value)
    assert list(namespace.glob("config.json*")) == []

"""The sharing tests of test_shared_root.py (users and modes, another user's namespace) and
ranks, run across two hosts: each tier in a process on its host (own UTS and PID namespaces),
working on that host's mount of one GlusterFS volume. The tier child and the user helpers are
test_shared_root's own, so both files test the same thing."""

from __future__ import annotations

import errno
import json
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gluster import CHILD_TIMEOUT_S, Volume, host_prefix, volume_fixture
from test_shared_root import _modes, _users, mapper, run_tier

A, B = "hostA", "hostB"


@pytest.fixture(scope="session")
def gluster() -> Iterator[Volume]:
    yield from volume_fixture()


def run_on_host(
    host: str,
    root: Path,
    ops: list[tuple[str, list[int]]],
    options: dict[str, Any] | None = None,
    user: str | None = None,
    umask: int = 0o022,
) -> dict[str, Any]:
    """test_shared_root.run_tier, on ``host``."""
    return run_tier(root, ops, options, user, umask=umask, prefix=tuple(host_prefix(host)))


@pytest.fixture
def shared_root(gluster: Volume, request: pytest.FixtureRequest) -> dict[str, Path]:
    """A world-writable sticky directory on the volume (as /tmp), each host's path to it."""
    d = gluster.fresh_dir(f"share-{request.node.name}".replace("[", "-").replace("]", ""))
    d[A].chmod(0o1777)
    return {h: p / "root" for h, p in d.items()}


@pytest.mark.parametrize("file_mode,second", [(0o660, "b"), (0o666, "c")])
def test_two_users_on_two_hosts_share_one_root(
    shared_root: dict[str, Path], file_mode: int, second: str
) -> None:
    with _users() as users:
        opts = {"file_mode": file_mode}
        first = run_on_host(A, shared_root[A], [("store", [1])], opts, user=users["a"])
        assert first["error"] is None, first["error"]
        assert first["results"][0]["success"], first["results"][0]["error"]
        other = run_on_host(
            B, shared_root[B], [("load", [1]), ("store", [2])], opts, user=users[second]
        )
        assert other["error"] is None, other["error"]
        load, store = other["results"]
        assert load["success"] and load["data_ok"] == [True], load["error"]
        assert store["success"], store["error"]
        back = run_on_host(A, shared_root[A], [("load", [2])], opts, user=users["a"])
        assert back["results"][0]["data_ok"] == [True], back["results"][0]["error"]


@pytest.mark.parametrize("file_mode", [0o600, 0o660])
def test_another_users_namespace_from_another_host_is_refused(
    shared_root: dict[str, Path], file_mode: int
) -> None:
    with _users() as users:
        planted = run_on_host(
            A, shared_root[A], [("store", [1])], {"file_mode": 0o666}, user=users["c"]
        )
        assert planted["results"][0]["success"], planted["results"][0]["error"]
        victim = run_on_host(
            B, shared_root[B], [("load", [1])], {"file_mode": file_mode}, user=users["a"]
        )
        error = victim["error"]
        assert error is not None, "a namespace owned by another user was adopted"
        assert error["type"] == "StorageError" and error["errno"] == errno.EPERM
        assert users["c"] in error["message"] and "file_mode" in error["message"]
        assert error["filename"] == mapper(shared_root[B]).namespace_dir


@pytest.mark.parametrize("file_mode,dir_mode", [(0o600, 0o700), (0o660, 0o770), (0o666, 0o777)])
def test_modes_made_on_one_host_are_seen_on_the_other(
    shared_root: dict[str, Path], file_mode: int, dir_mode: int
) -> None:
    out = run_on_host(A, shared_root[A], [("store", [1])], {"file_mode": file_mode})
    assert out["results"][0]["success"], out["results"][0]["error"]
    modes = _modes(shared_root[B])
    assert modes.pop("config") == file_mode
    assert modes.pop("block") == file_mode
    assert modes == dict.fromkeys(modes, dir_mode)
    again = run_on_host(B, shared_root[B], [("load", [1])], {"file_mode": file_mode})
    assert again["results"][0]["data_ok"] == [True], again["results"][0]["error"]


# Ranks: one tensor-parallel pair, rank 0 on host A and rank 1 on host B, storing the same
# keys with different bytes: one namespace, a rank directory each, each rank loads its own.
RANK_CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec

    root, rank, op = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    rows = np.random.default_rng(100 + rank).integers(0, 256, (4, 3000), dtype=np.uint8)
    data = rows.copy() if op == "store" else np.zeros_like(rows)
    tier = SecondaryTierFactory.create_secondary_tier(
        {"type": "fs", "root_dir": root}, memoryview(data),
        OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD",
                       tp_size=2, rank=rank))
    keys = [make_offload_key(i.to_bytes(32, "big"), 0) for i in range(4)]
    job = JobMetadata(1, keys, np.arange(4, dtype=np.int64), False, ReqContext("t"))
    (tier.submit_store if op == "store" else tier.submit_load)(job)
    tier.drain_jobs()
    (r,) = tier.get_finished()
    tier.shutdown()
    print(json.dumps({"success": r.success, "error": r.error,
                      "data_ok": bool((data == rows).all()),
                      "rank_dir": tier.file_mapper.rank_dir}))
    """
)


def _rank(host: str, root: Path, rank: int, op: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*host_prefix(host), sys.executable, "-c", RANK_CHILD, str(root), str(rank), op],
        check=False,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def test_ranks_on_two_hosts_share_a_namespace_not_their_blocks(gluster: Volume) -> None:
    d = gluster.fresh_dir("share-ranks")
    r0 = _rank(A, d[A], 0, "store")
    r1 = _rank(B, d[B], 1, "store")
    assert r0["success"] and r1["success"], (r0["error"], r1["error"])
    dir0, dir1 = Path(r0["rank_dir"]), Path(r1["rank_dir"])
    assert dir0.parent.name == dir1.parent.name and dir0.name != dir1.name
    for host, rank in ((B, 0), (A, 1)):  # each rank's blocks, loaded on the other host
        got = _rank(host, d[host], rank, "load")
        assert got["success"] and got["data_ok"], got["error"]
    assert stat.S_ISDIR((d[A] / dir0.parent.name / dir1.name).stat().st_mode)


def test_container_of_the_same_host_name_creating_config_does_not_fail_a_start(
    gluster: Volume,
) -> None:
    d = gluster.fresh_dir("share-same-host")
    namespace = Path(mapper(d[A]).namespace_dir)
    namespace.mkdir(parents=True, mode=0o700)
    # What the other container (host A, pid 1, its first tmp file) has open right now: the
    # name its process really draws.
    proc = subprocess.run(
        [*host_prefix(A), sys.executable, "-c",
         "from kvtier import _core; print(_core.tmp_file_name('config.json'))"],
        check=True, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S,
    )  # fmt: skip
    theirs = proc.stdout.strip()
    assert theirs.startswith("config.json.hostA.1."), theirs
    (namespace / theirs).write_bytes(b"{")
    out = run_on_host(A, d[A], [("store", [1]), ("load", [1])])
    assert out["error"] is None, out["error"]
    assert out["results"][1]["data_ok"] == [True], out["results"]

"""The native workers: how many there are by default, and their CPU priorities (loads above
stores), also for a process that may not lower a nice value (non-root)."""

from __future__ import annotations

import json
import logging
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from kvtier import _core
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")


def _tier_threads(root: Path, caplog: pytest.LogCaptureFixture, **options) -> tuple[int, int]:
    """The (read, write) worker counts an fs tier on ``root`` reports when it starts."""
    array = np.zeros((4, 4096), dtype=np.uint8)
    config = {"type": "fs", "root_dir": str(root), **options}
    with caplog.at_level(logging.INFO, logger="kvtier.tiering.fs.manager"):
        caplog.clear()
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(array), SPEC)
        tier.shutdown()
    lines = [r.getMessage() for r in caplog.records if "write threads" in r.getMessage()]
    assert len(lines) == 1, caplog.text
    words = lines[0].split(" read + ")
    return int(words[0].rsplit(" ", 1)[1]), int(words[1].split(" ", 1)[0])


def test_fs_tier_default_thread_counts_are_sized_by_the_machine(tmp_path, caplog):
    root = tmp_path / "root"
    want = _core.machine_thread_counts(str(root))
    assert _tier_threads(root, caplog) == want
    cores = len(os.sched_getaffinity(0))
    # At least a worker per core per direction, within the engine's bounds.
    assert all(min(max(cores, 2), 32) <= n <= 32 for n in want)


def test_explicit_thread_counts_win(tmp_path, caplog):
    assert _tier_threads(tmp_path / "a", caplog, n_read_threads=3, n_write_threads=1) == (3, 1)
    cores = len(os.sched_getaffinity(0))
    _, default_write = _core.machine_thread_counts(str(tmp_path))
    read, write = _tier_threads(tmp_path / "b", caplog, n_read_threads=0)
    assert (read, write) == (0, default_write) and default_write >= min(cores, 32)


@pytest.mark.parametrize("options", [{"n_read_threads": 0, "n_write_threads": 0}])
def test_thread_count_validation_is_unchanged(tmp_path, options):
    array = np.zeros((4, 4096), dtype=np.uint8)
    config = {"type": "fs", "root_dir": str(tmp_path), **options}
    with pytest.raises(ValueError, match="n_read_threads \\+ n_write_threads must be at least 1"):
        SecondaryTierFactory.create_secondary_tier(config, memoryview(array), SPEC)


@pytest.fixture
def tmpfs_root(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)])
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    yield mount
    # Lazy: a dropped tier's engine may still hold the root open until it is collected.
    subprocess.run(["umount", "-l", str(mount)], check=True)


def test_tmpfs_has_no_device_queue_so_one_worker_per_core(tmpfs_root, caplog):
    per_direction = min(max(len(os.sched_getaffinity(0)), 2), 32)
    assert _tier_threads(tmpfs_root / "root", caplog) == (per_direction, per_direction)


# Runs in a fresh process (so that the only kvtier threads are this engine's): stores and
# loads one block, then prints each kvtier worker thread's name, nice value and EEVDF slice
# (se.slice in /proc, shown by kernels built with scheduler debugging), and the caller's slice.
_PRIORITY_SCRIPT = textwrap.dedent(
    """
    import ctypes, json, os, sys
    from kvtier import _core

    root, kwargs, user = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    if user is not None:  # dropped after the import: the venv may not be readable by that user
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])
    engine = _core.Engine(root, fingerprint=b"f", **kwargs)
    data = ctypes.create_string_buffer(bytes(range(256)) * 32)
    back = ctypes.create_string_buffer(len(data))
    engine.submit_store(1, [(root + "/b", b"k", ctypes.addressof(data), len(data))])
    engine.drain()
    engine.submit_load(2, [(root + "/b", b"k", ctypes.addressof(back), len(back))])
    engine.drain()
    ok = all(c.success for c in engine.pop_completions()) and back.raw == data.raw
    threads = []
    for tid in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{tid}/comm") as f:
            name = f.read().strip()
        with open(f"/proc/self/task/{tid}/stat") as f:
            nice = int(f.read().rsplit(")", 1)[1].split()[16])
        with open(f"/proc/self/task/{tid}/sched") as f:  # se.slice: kernels with sched debug
            slices = [int(line.split()[-1]) for line in f if line.startswith("se.slice ")]
        if name.startswith("kvtier-"):
            threads.append([name, nice, slices[0] if slices else None])
        elif int(tid) == os.getpid():
            caller_slice = slices[0] if slices else None
    engine.shutdown()
    print(json.dumps({"ok": ok, "threads": threads, "uid": os.getuid(),
                      "caller_slice": caller_slice}))
    """
)


def _worker_threads(
    root: Path, prefix: list[str], user: tuple[int, int] | None = None, **kwargs
) -> dict[str, object]:
    """What _PRIORITY_SCRIPT printed, in a child started with `prefix` (e.g. `nice -n 10`)
    that runs as `user` (uid, gid) once kvtier is imported."""
    proc = subprocess.run(
        [
            *prefix,
            sys.executable,
            "-c",
            _PRIORITY_SCRIPT,
            str(root),
            json.dumps(kwargs),
            json.dumps(user),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ok"], "the store or load failed"
    if user is not None:
        assert out["uid"] == user[0], "the child did not drop root"
    return out


def _worker_nices(
    root: Path, prefix: list[str], user: tuple[int, int] | None = None, **kwargs
) -> dict[str, set[int]]:
    """The nice values of the engine's worker threads, by thread name (see _worker_threads)."""
    nices: dict[str, set[int]] = {}
    for name, nice, _slice in _worker_threads(root, prefix, user, **kwargs)["threads"]:
        nices.setdefault(name, set()).add(nice)
    return nices


def test_load_workers_run_above_store_workers(tmp_path):
    # The intake thread (it queues what a submit could not, Scheduler::submit) keeps the
    # caller's priority: it must never wait behind the store workers.
    caller = os.getpriority(os.PRIO_PROCESS, 0)
    nices = _worker_nices(tmp_path, [], n_read_threads=2, n_write_threads=3, load_nice=5)
    assert nices == {"kvtier-load": {5}, "kvtier-store": {19}, "kvtier-intake": {caller}}
    # Without store-first workers the load-first ones take stores too, at the store priority.
    assert _worker_nices(tmp_path, [], n_read_threads=2, n_write_threads=0) == {
        "kvtier-load": {19},
        "kvtier-intake": {caller},
    }


@pytest.fixture
def unprivileged() -> tuple[int, int] | None:
    """The (uid, gid) of user nobody, a process that may not lower nice; None when the tests
    already run unprivileged."""
    if os.geteuid() != 0:
        return None
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no user nobody to drop to")
    return nobody.pw_uid, nobody.pw_gid


def test_priorities_work_unprivileged(unprivileged):
    # The default load_nice (0) never asks to lower a priority, and raising one needs no
    # privilege: an unprivileged process gets the same split, and under `nice -n 10` (which
    # it cannot undo) the load workers keep the inherited 10, still above the stores.
    # The child inherits this process's nice value (CI may itself run under `nice`).
    inherited = os.getpriority(os.PRIO_PROCESS, 0)
    root = Path(tempfile.mkdtemp(prefix="kvtier-nice-"))
    try:
        root.chmod(0o777)
        assert _worker_nices(root / "a", [], unprivileged, n_read_threads=2, n_write_threads=2) == {
            "kvtier-load": {max(inherited, 0)},
            "kvtier-store": {19},
            "kvtier-intake": {inherited},
        }
        niced = [shutil.which("nice") or "nice", "-n", "10"]
        assert _worker_nices(
            root / "b", niced, unprivileged, n_read_threads=2, n_write_threads=2
        ) == {
            "kvtier-load": {min(max(inherited, 0) + 10, 19)},
            "kvtier-store": {19},
            "kvtier-intake": {min(inherited + 10, 19)},
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


# The slice the engine asks for its store workers (worker.cpp, kStoreWorkerSliceNs).
_STORE_WORKER_SLICE_NS = 20_000_000


def _slices(out: dict[str, object]) -> dict[str, set[int]]:
    if out["caller_slice"] is None:
        pytest.skip("this kernel does not show se.slice in /proc/<tid>/sched")
    if tuple(int(p) for p in os.uname().release.split(".")[:2]) < (6, 12):
        pytest.skip("custom EEVDF slices need Linux 6.12")
    slices: dict[str, set[int]] = {}
    for name, _nice, slice_ns in out["threads"]:
        slices.setdefault(name, set()).add(slice_ns)
    return slices


def test_store_workers_ask_for_a_long_slice_so_that_any_waking_thread_preempts_them(
    tmp_path, unprivileged
):
    # Without it a waking caller or load worker waits for a running store worker's slice to
    # end, up to a tick (docs/PERFORMANCE.md section 18). Load workers keep the caller's
    # default slice; asking needs no privilege.
    for user in (None, unprivileged):
        root = Path(tempfile.mkdtemp(prefix="kvtier-slice-"))
        try:
            root.chmod(0o777)
            out = _worker_threads(root / "a", [], user, n_read_threads=2, n_write_threads=3)
            assert _slices(out) == {
                "kvtier-load": {out["caller_slice"]},
                "kvtier-store": {_STORE_WORKER_SLICE_NS},
                "kvtier-intake": {out["caller_slice"]},
            }
            # Without store-first workers the load-first ones take stores too: loads are what
            # a request waits for, so they keep the default slice.
            out = _worker_threads(root / "b", [], user, n_read_threads=2, n_write_threads=0)
            assert _slices(out) == {
                "kvtier-load": {out["caller_slice"]},
                "kvtier-intake": {out["caller_slice"]},
            }
        finally:
            shutil.rmtree(root, ignore_errors=True)


def _record_engine_kwargs(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """The keyword arguments of every ``_core.Engine`` the fs tier opens from now on."""
    from kvtier.tiering.fs import engine as engine_module

    seen: list[dict] = []

    class Recording(_core.Engine):
        def __init__(self, *args, **kwargs):
            seen.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(engine_module._core, "Engine", Recording)
    return seen


@pytest.mark.parametrize("cap", [None, 3])
def test_the_store_cap_while_loading_reaches_the_engine(tmp_path, monkeypatch, cap):
    """``max_stores_in_flight_while_loading`` is the engine's (tests/cpp/test_engine_priority
    checks the engine keeps it): the fs tier passes what it is given, and the engine's own
    default when it is given nothing."""
    seen = _record_engine_kwargs(monkeypatch)
    array = np.zeros((4, 4096), dtype=np.uint8)
    config = {"type": "fs", "root_dir": str(tmp_path)}
    if cap is not None:
        config["max_stores_in_flight_while_loading"] = cap
    SecondaryTierFactory.create_secondary_tier(config, memoryview(array), SPEC).shutdown()
    want = _core.ENGINE_DEFAULTS["max_stores_in_flight_while_loading"] if cap is None else cap
    assert [k["max_stores_in_flight_while_loading"] for k in seen] == [want]


def test_kvtier_bench_hands_the_store_cap_to_every_engine_it_opens(tmp_path, monkeypatch, capsys):
    """`kvtier bench --max-stores-in-flight-while-loading 3`: every tier the bench opens has
    its engine opened with 3, and the results record it."""
    from kvtier.cli import main

    seen = _record_engine_kwargs(monkeypatch)
    out = tmp_path / "bench.json"
    args = ["bench", "--root", str(tmp_path), "--sizes", "64K", "--total", "1M",
            "--read-threads", "1", "--write-threads", "1", "--latency-samples", "2",
            "--loop-seconds", "0.05", "--repeat", "1", "--no-fio", "--quiet",
            "--max-stores-in-flight-while-loading", "3", "--json", str(out)]  # fmt: skip
    assert main(args) == 0
    assert seen and all(k["max_stores_in_flight_while_loading"] == 3 for k in seen)
    assert json.loads(out.read_text())["config"]["max_stores_in_flight_while_loading"] == 3
    assert main(["bench", "--from-json", str(out)]) == 0  # the report says what the run set
    assert "kvtier options: max_stores_in_flight_while_loading=3" in capsys.readouterr().out

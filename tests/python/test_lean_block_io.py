"""What the lean psync block path (issue 13: fewer system calls and copies per block) must
keep: dedup without a stat before the write, tmp files a sweep removed before they were
locked, pids in tmp names after fork, links and moved directories below the root, bad files
replaced while being read, and host segments written from and read into the caller's memory.

Through the public binding (``kvtier._core``); faults through the LD_PRELOAD interposer in
child processes, whose engines use io_engine="psync" (io_uring's writes and renames go
through the ring, out of the interposer's sight; its faults are injected at the ring in
tests/cpp/test_uring_faults.cpp). No timing or system-call counts are asserted here (those
are measured by bench/syscalls_per_block.py).
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from block_files import skip_on_memory_fs
from kvtier import _core as core

PAGE = 4096
CHILD_TIMEOUT_S = 120
ROW = 3 * PAGE + 777


def finished(engine: Any) -> Any:
    """The completion of the one job submitted since the last call (drain waits for it)."""
    engine.drain()
    (c,) = engine.pop_completions()
    return c


def rows(n: int, size: int, seed: int) -> tuple[np.ndarray, int]:
    """Page-aligned memory (an anonymous mapping, which the array keeps alive) of n rows of
    seeded random bytes, and its address."""
    owner = mmap.mmap(-1, n * size)
    array = np.frombuffer(owner, dtype=np.uint8).reshape(n, size)
    array[:] = np.random.default_rng(seed).integers(0, 256, array.shape, dtype=np.uint8)
    return array, core.buffer_address(owner, True)


def tmp_files(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.name.endswith(".tmp")]


def fault_env(interposer: Path, fault: str, **settings: str) -> dict[str, str]:
    """Environment for a child under the interposer: KVTIER_FAULT and KVTIER_FAULT_<NAME>s."""
    env = {"LD_PRELOAD": str(interposer), "KVTIER_FAULT": fault}
    env.update({f"KVTIER_FAULT_{name.upper()}": value for name, value in settings.items()})
    return env


def run_child(script: str, args: list[str], env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-c", script, *args],
        check=False,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["injected"] = [line for line in proc.stderr.splitlines() if line.startswith("kvtier-fault")]
    return out


# --------------------------------------------------------------------------------------------
# dedup without a stat before the write

# Store A of a key is held in its first write (gated) while store B of the same key runs to
# the end; A's rename then finds B's file.
RACE = textwrap.dedent(
    """
    import json, mmap, sys, time
    from pathlib import Path
    import numpy as np
    from kvtier import _core
    root, gate, row = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mem = mmap.mmap(-1, 2 * row)
    data = np.frombuffer(mem, dtype=np.uint8)
    data[:row], data[row:] = 1, 2
    base = _core.buffer_address(mem, True)
    e = _core.Engine(
        root, n_read_threads=0, n_write_threads=2, o_direct=False, io_engine="psync"
    )
    path = root + "/ab/block.kvb"
    def wait(job):
        deadline = time.monotonic() + 60
        while True:
            for c in e.pop_completions():
                if c.job_id == job:
                    return c
            assert time.monotonic() < deadline, job
            time.sleep(0.002)
    e.submit_store(1, [(path, b"k", base, row)])
    deadline = time.monotonic() + 60
    while not list(Path(root).rglob("*.tmp")):
        assert time.monotonic() < deadline, "store 1 never made its tmp file"
        time.sleep(0.002)
    e.submit_store(2, [(path, b"k", base + row, row)])
    second = wait(2)
    Path(gate).touch()
    first = wait(1)
    stats = e.stats()
    e.shutdown()
    print(json.dumps({
        "first": [first.success, first.bytes, first.error],
        "second": [second.success, second.bytes, second.error],
        "dedup_skips": stats["dedup_skips"], "store_bytes": stats["store_bytes"],
        "payload_is_second": Path(path).read_bytes()[4096:4096 + row] == bytes([2]) * row,
    }))
    """
)


def test_a_duplicate_found_at_rename_is_a_dedup_that_moved_no_bytes(
    interposer: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    # Store A's write, the process's first tmp name, waits for the gate file.
    env = fault_env(
        interposer, "pwrite", match=".0.tmp", errno="0", times="1", gate=str(tmp_path / "gate")
    )
    out = run_child(RACE, [str(root), str(tmp_path / "gate"), str(ROW)], env)
    assert len(out["injected"]) == 1, out
    assert out["second"] == [True, ROW, None]
    assert out["first"] == [True, 0, None]  # a success, and no bytes: the file was there
    assert out["dedup_skips"] == 1
    assert out["store_bytes"] == ROW  # what the capacity ledger counts as new files
    assert out["payload_is_second"]  # the first rename won, nothing was replaced
    assert tmp_files(root) == []


def test_without_rename_noreplace_an_existing_entry_is_kept(
    interposer: Path, tmp_path: Path
) -> None:
    """NFS has no RENAME_NOREPLACE: the fallback rename() must not replace what is there."""
    root = tmp_path / "root"
    (root / "ab").mkdir(parents=True)
    fifo = root / "ab" / "fifo.kvb"
    os.mkfifo(fifo)
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from kvtier import _core
        root, row = sys.argv[1], int(sys.argv[2])
        data = np.arange(2 * row, dtype=np.uint32).astype(np.uint8)
        base = data.ctypes.data
        e = _core.Engine(
            root, n_read_threads=1, n_write_threads=1, o_direct=False, io_engine="psync"
        )
        out = []
        for job, (name, key, offset, kind) in enumerate([
            ("blk", b"k0", 0, "store"), ("blk", b"k1", row, "store"),
            ("blk", b"k0", 0, "load"), ("fifo", b"k0", 0, "store")]):
            submit = e.submit_store if kind == "store" else e.submit_load
            submit(job, [(f"{root}/ab/{name}.kvb", key, base + offset, row)])
            e.drain()
            (c,) = e.pop_completions()
            out.append([c.success, c.bytes, c.errno])
        out.append(e.stats()["dedup_skips"])
        e.shutdown()
        print(json.dumps({"jobs": out}))
        """
    )
    env = fault_env(interposer, "renameat2", match=str(root), errno=str(errno.EINVAL))
    out = run_child(script, [str(root), str(ROW)], env)
    assert out["injected"], "renameat2 was never refused"
    first, second, load, over_fifo, dedups = out["jobs"]
    assert first == [True, ROW, 0]
    assert second == [True, 0, 0]  # a dedup: the block of key k0 stays
    assert load == [True, ROW, 0]  # and loads as key k0
    assert over_fifo[0] is False and over_fifo[2] == errno.EINVAL
    assert dedups == 1
    assert stat.S_ISFIFO(fifo.lstat().st_mode)  # not replaced, not removed
    assert tmp_files(root) == []


# --------------------------------------------------------------------------------------------
# tmp files: removed before the lock, pids after fork


@pytest.mark.parametrize("removal", ["unlink_created", "rename_created"])
def test_a_tmp_file_removed_before_it_was_locked_is_written_under_a_new_name(
    interposer: Path, tmp_path: Path, removal: str
) -> None:
    """A sweep in another PID namespace removed the tmp name between create and lock: an
    unlink (seen by the writer's fstat) or, on NFS, a rename of the open file (seen at the
    final rename). Either way the block is written again under a new name."""
    root = tmp_path / "root"
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from kvtier import _core
        root, row = sys.argv[1], int(sys.argv[2])
        src = np.random.default_rng(5).integers(0, 256, row, dtype=np.uint8)
        dst = np.zeros(row, dtype=np.uint8)
        e = _core.Engine(
            root, n_read_threads=1, n_write_threads=1, o_direct=False, io_engine="psync"
        )
        path = root + "/ab/block.kvb"
        out = []
        for job, (kind, buf) in enumerate([("store", src), ("load", dst)]):
            submit = e.submit_store if kind == "store" else e.submit_load
            submit(job, [(path, b"k", buf.ctypes.data, row)])
            e.drain()
            (c,) = e.pop_completions()
            out.append([c.success, c.error])
        e.shutdown()
        print(json.dumps({"jobs": out, "same": bool((src == dst).all())}))
        """
    )
    env = fault_env(interposer, removal, match=".tmp", times="1")
    out = run_child(script, [str(root), str(ROW)], env)
    assert len(out["injected"]) == 1 and ".tmp" in out["injected"][0], out
    assert out["jobs"] == [[True, None], [True, None]]
    assert out["same"]
    assert tmp_files(root) == []
    moved = [p.name for p in root.rglob("*.moved")]
    assert len(moved) == (removal == "rename_created"), moved  # where "NFS" put the first


def test_a_forked_child_names_tmp_files_with_its_own_pid() -> None:
    def pid_of(name: str) -> int:
        return int(name.rsplit(".", 4)[1])

    assert pid_of(core.tmp_file_name("x.kvb")) == os.getpid()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        try:
            os.write(write, str(pid_of(core.tmp_file_name("x.kvb"))).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        named = int(pipe.read())
    os.waitpid(child, 0)
    assert named == child
    assert pid_of(core.tmp_file_name("x.kvb")) == os.getpid()


# --------------------------------------------------------------------------------------------
# directories swapped after the engine used them


@pytest.mark.parametrize("openat2", [True, False], ids=["openat2", "per-component"])
@pytest.mark.parametrize("replacement", ["symlink", "nothing"])
def test_a_used_directory_moved_out_of_the_root_is_never_followed(
    interposer: Path, tmp_path: Path, openat2: bool, replacement: str
) -> None:
    """Another tenant moves a fan-out directory the engine has just used out of the root
    (same file system) and leaves a link to it, or nothing, in its place: the same engine's
    next store and load must neither write nor read outside the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    script = textwrap.dedent(
        """
        import json, os, sys
        import numpy as np
        from kvtier import _core
        root, outside, replacement = sys.argv[1:4]
        row = 8192
        src = np.random.default_rng(9).integers(0, 256, 3 * row, dtype=np.uint8)
        dst = np.zeros(3 * row, dtype=np.uint8)
        e = _core.Engine(
            root, n_read_threads=1, n_write_threads=1, o_direct=False, io_engine="psync"
        )
        leaf = root + "/ns/ab"
        def job(n, kind, name, i, buf):
            submit = e.submit_store if kind == "store" else e.submit_load
            submit(n, [(f"{leaf}/{name}.kvb", name.encode(), buf.ctypes.data + i * row, row)])
            e.drain()
            (c,) = e.pop_completions()
            return [c.success, c.errno, c.error]
        out = [job(1, "store", "a", 0, src), job(2, "load", "a", 0, dst)]
        os.rename(leaf, outside + "/ab")  # the directory and block a, now outside the root
        if replacement == "symlink":
            os.symlink(outside + "/ab", leaf)
        out += [job(3, "load", "a", 1, dst), job(4, "store", "b", 2, src)]
        e.shutdown()
        print(json.dumps({"jobs": out, "loaded_outside": bool((dst[row:2 * row] != 0).any())}))
        """
    )
    env = fault_env(interposer, "") if openat2 else fault_env(interposer, "openat2", errno="38")
    out = run_child(script, [str(root), str(outside), replacement], env)
    stored, loaded, load_after, store_after = out["jobs"]
    assert stored[0] and loaded[0], out
    assert not load_after[0] and not out["loaded_outside"]
    assert sorted(p.name for p in (outside / "ab").iterdir()) == ["a.kvb"]  # nothing new
    if replacement == "symlink":
        assert load_after[1] == errno.ELOOP and str(root / "ns" / "ab") in load_after[2]
        assert not store_after[0] and store_after[1] == errno.ELOOP
        assert "links below root_dir are never followed" in store_after[2]
    else:
        assert load_after[1] == errno.ENOENT
        assert store_after[0], store_after  # a fresh directory inside the root
        assert (root / "ns" / "ab" / "b.kvb").is_file()


# --------------------------------------------------------------------------------------------
# a bad file replaced by a good one while the load read it


def test_a_bad_file_is_not_removed_once_a_good_block_took_its_name(
    interposer: Path, tmp_path: Path
) -> None:
    root = tmp_path / "root"
    gate = tmp_path / "gate"
    script = textwrap.dedent(
        """
        import json, os, sys, time
        from pathlib import Path
        import numpy as np
        from kvtier import _core
        root, gate, row = sys.argv[1], sys.argv[2], int(sys.argv[3])
        src = np.random.default_rng(3).integers(0, 256, row, dtype=np.uint8)
        dst = np.zeros(row, dtype=np.uint8)
        e = _core.Engine(
            root, n_read_threads=1, n_write_threads=1, o_direct=False, io_engine="psync"
        )
        path = root + "/ab/block.kvb"
        def wait():
            deadline = time.monotonic() + 60
            while True:
                done = e.pop_completions()
                if done:
                    return [done[0].success, done[0].errno]
                assert time.monotonic() < deadline
                time.sleep(0.002)
        e.submit_store(1, [(path, b"k", src.ctypes.data, row)])
        out = [wait()]
        good = Path(path).read_bytes()
        bad = bytearray(good)
        bad[4096] ^= 0xFF
        Path(path).write_bytes(bad)
        e.submit_load(2, [(path, b"k", dst.ctypes.data, row)])
        # The load has opened the bad file and waits in its read: a writer renames a good
        # block over the name meanwhile.
        deadline = time.monotonic() + 60
        while not os.path.exists(gate + ".reading"):
            assert time.monotonic() < deadline
            time.sleep(0.002)
        Path(path + ".new").write_bytes(good)
        os.rename(path + ".new", path)
        Path(gate).touch()
        out.append(wait())
        out.append(Path(path).read_bytes() == good)
        dst[:] = 0
        e.submit_load(3, [(path, b"k", dst.ctypes.data, row)])
        out.append(wait())
        out.append(bool((dst == src).all()))
        out.append(e.stats()["corrupt_files_removed"])
        e.shutdown()
        print(json.dumps({"out": out}))
        """
    )
    env = fault_env(interposer, "pread", match="block.kvb", errno="0", times="1", gate=str(gate))
    # The interposer's log line on stderr says when the read is held; the child waits for
    # "<gate>.reading", which a watcher thread here creates once that line appeared.
    proc = subprocess.Popen(
        [sys.executable, "-c", script, str(root), str(gate), str(ROW)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )
    with proc:
        try:
            assert proc.stderr is not None
            for line in proc.stderr:
                if line.startswith("kvtier-fault: pread"):
                    Path(str(gate) + ".reading").touch()
                    break
            stdout, stderr = proc.communicate(timeout=CHILD_TIMEOUT_S)
        except BaseException:
            proc.kill()  # a child held at the gate would otherwise outlive the test
            raise
    assert proc.returncode == 0, stderr[-4000:]
    stored, bad_load, kept, good_load, same, removed = json.loads(stdout.splitlines()[-1])["out"]
    assert stored == [True, 0]
    assert bad_load == [False, errno.EBADMSG]  # what was read did not verify
    assert kept  # but the good block that took the name stays
    assert good_load == [True, 0] and same
    assert removed == 0


# --------------------------------------------------------------------------------------------
# host segments go to the file in place


def layout(address: int, n_blocks: int, runs: list[tuple[int, int]], stride: int) -> Any:
    return core.BlockLayout([(address, stride, n_blocks, runs, False)])


SEGMENT_CASES = {
    # name: (runs of one block as (offset, length), block stride)
    "aligned_pages": ([(0, 2 * PAGE), (3 * PAGE, PAGE), (5 * PAGE, PAGE + 100)], 8 * PAGE),
    "unaligned": ([(1, 1000), (2000, 3), (5000, 7000)], 4 * PAGE),
    "over_iov_max": ([(i * 64, 48) for i in range(1500)], 1500 * 64),
}


@pytest.mark.parametrize("case", sorted(SEGMENT_CASES))
@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "direct"])
def test_host_segments_round_trip_and_write_the_same_file_as_contiguous_bytes(
    tmp_path: Path, case: str, o_direct: bool
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    if o_direct and core.probe_o_direct(str(root)):
        pytest.skip(f"no O_DIRECT on {root}: {core.probe_o_direct(str(root))}")
    runs, stride = SEGMENT_CASES[case]
    n = 3
    src, src_addr = rows(1, n * stride, seed=11)
    dst, dst_addr = rows(1, n * stride, seed=12)
    flat, flat_addr = rows(1, sum(length for _, length in runs), seed=13)
    engine = core.Engine(str(root), n_read_threads=1, n_write_threads=1, o_direct=o_direct)
    try:
        paths = [str(root / "seg" / f"{b}.kvb") for b in range(n)]
        keys = [b"seg-%d" % b for b in range(n)]
        STORE, LOAD = core.Direction.STORE, core.Direction.LOAD
        engine.submit_blocks(
            1, STORE, paths, keys, list(range(n)), layout(src_addr, n, runs, stride)
        )
        c = finished(engine)
        assert c.success, c.error
        engine.submit_blocks(
            2, LOAD, paths, keys, list(range(n)), layout(dst_addr, n, runs, stride)
        )
        c = finished(engine)
        assert c.success, c.error
        for b in range(n):
            for offset, length in runs:
                at = b * stride + offset
                assert (dst[0, at : at + length] == src[0, at : at + length]).all(), (b, offset)
        # The file is the one a contiguous store of the same payload writes.
        at = 0
        for offset, length in runs:
            flat[0, at : at + length] = src[0, offset : offset + length]
            at += length
        engine.submit_store(3, [(str(root / "flat.kvb"), keys[0], flat_addr, at)])
        assert finished(engine).success
        assert Path(paths[0]).read_bytes() == (root / "flat.kvb").read_bytes()
        # And the checksum covers the segments: a flipped payload byte fails the load.
        data = bytearray(Path(paths[1]).read_bytes())
        data[PAGE + at - 1] ^= 0x01
        Path(paths[1]).write_bytes(data)
        engine.submit_blocks(4, LOAD, paths[1:2], keys[1:2], [1], layout(dst_addr, n, runs, stride))
        c = finished(engine)
        assert not c.success and c.errno == errno.EBADMSG
        assert not Path(paths[1]).exists()
    finally:
        engine.shutdown()


# One block's host segments as (offset, length) in its row: odd offsets and lengths, and runs
# that cross the 256 KiB pieces a file of memory is read in (the first piece also holds the
# 4 KiB header), so that a piece covers several segments and a segment several pieces.
SCATTER_RUNS = [(1, 1000), (2000, 3), (5003, 300_001), (305_111, 9), (305_200, 400_017)]
SCATTER_STRIDE = 706_000


@pytest.mark.parametrize("o_direct", [False, True], ids=["buffered", "direct"])
@pytest.mark.parametrize("io_timeout_s", [10.0, 0.0], ids=["deadline", "no deadline"])
@pytest.mark.parametrize("where", ["disk", "tmpfs"])
def test_host_segments_load_exactly_and_nothing_around_them_is_written(
    request: pytest.FixtureRequest, tmp_path: Path, where: str, io_timeout_s: float,
    o_direct: bool
) -> None:  # fmt: skip
    """Loads into host segments that start and end mid cache line, on each load path: on a
    disk under the deadline, the copy out of the worker's arena (crc32c_copy_uncached, its
    CRC taken on the way); on a disk without one, the read in place; on a tmpfs, the reads in
    256 KiB pieces straight into the segments, each piece's CRC taken as it lands; with
    O_DIRECT and no deadline, the staging buffers. Every segment arrives whole, no byte between
    or around them changes, and a byte flipped near the payload's end fails its block."""
    if where == "tmpfs":
        root = request.getfixturevalue("tmpfs_mount")
    else:
        root = tmp_path / "root"
        root.mkdir()
        skip_on_memory_fs(root)
    if o_direct and (reason := core.probe_o_direct(str(root))):
        pytest.skip(f"no O_DIRECT on {root}: {reason}")
    n = 2
    raw_src = np.random.default_rng(21).integers(0, 256, n * SCATTER_STRIDE + 64, dtype=np.uint8)
    raw_dst = np.full(n * SCATTER_STRIDE + 64, 0x5C, dtype=np.uint8)
    # Rows that start 3 bytes past a 64-byte line, so no segment's copy starts on a line.
    src, dst = (a[(-a.ctypes.data) % 64 + 3 :] for a in (raw_src, raw_dst))
    untouched = dst.copy()

    def layout(buf: np.ndarray) -> Any:
        return core.BlockLayout([(buf.ctypes.data, SCATTER_STRIDE, n, SCATTER_RUNS, False)])

    paths = [str(root / "seg" / f"{b}.kvb") for b in range(n)]
    keys = [b"scatter-%d" % b for b in range(n)]
    engine = core.Engine(str(root), n_read_threads=1, n_write_threads=1,
                         io_timeout_s=io_timeout_s, o_direct=o_direct)  # fmt: skip
    try:
        STORE, LOAD = core.Direction.STORE, core.Direction.LOAD
        engine.submit_blocks(1, STORE, paths, keys, [0, 1], layout(src))
        assert finished(engine).success
        engine.submit_blocks(2, LOAD, paths, keys, [0, 1], layout(dst))
        c = finished(engine)
        assert c.success, c.error
        for b in range(n):
            for offset, length in SCATTER_RUNS:
                at = b * SCATTER_STRIDE + offset
                assert np.array_equal(dst[at : at + length], src[at : at + length]), (b, offset)
                untouched[at : at + length] = src[at : at + length]
        assert np.array_equal(dst[: n * SCATTER_STRIDE], untouched[: n * SCATTER_STRIDE])
        if where == "disk":
            assert engine.stats()["memory_fs_loads"] == 0  # the disk's paths, not memory's

        payload = sum(length for _, length in SCATTER_RUNS)
        with open(paths[0], "r+b") as f:
            f.seek(PAGE + payload - 5)
            byte = f.read(1)
            f.seek(PAGE + payload - 5)
            f.write(bytes([byte[0] ^ 0x01]))
        engine.submit_blocks(3, LOAD, paths, keys, [0, 1], layout(dst))
        c = finished(engine)
        assert list(c.block_errnos) == [errno.EBADMSG, 0]
        assert c.operation == "verify" and not Path(paths[0]).exists()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("call", ["pwrite", "pread"])
def test_host_segments_continue_short_transfers(
    interposer: Path, tmp_path: Path, call: str
) -> None:
    """Short writes and reads over more iovecs than one system call takes (IOV_MAX)."""
    root = tmp_path / "root"
    script = textwrap.dedent(
        """
        import json, sys
        import numpy as np
        from kvtier import _core
        root = sys.argv[1]
        runs = [(i * 64, 40) for i in range(1100)]
        src = np.random.default_rng(2).integers(0, 256, 1100 * 64, dtype=np.uint8)
        dst = np.zeros_like(src)
        e = _core.Engine(
            root, n_read_threads=1, n_write_threads=1, o_direct=False, io_engine="psync"
        )
        out = []
        for job, (d, buf) in enumerate([(_core.Direction.STORE, src),
                                        (_core.Direction.LOAD, dst)]):
            lay = _core.BlockLayout([(buf.ctypes.data, 1100 * 64, 1, runs, False)])
            e.submit_blocks(job, d, [root + "/ab/b.kvb"], [b"k"], [0], lay)
            e.drain()
            (c,) = e.pop_completions()
            out.append([c.success, c.error])
        e.shutdown()
        same = all((src[o:o + n] == dst[o:o + n]).all() for o, n in runs)
        print(json.dumps({"jobs": out, "same": bool(same)}))
        """
    )
    env = fault_env(interposer, call, match="b.kvb", short="1000")
    out = run_child(script, [str(root)], env)
    assert len(out["injected"]) > 40, len(out["injected"])  # 44 KiB in 1000-byte pieces
    assert out["jobs"] == [[True, None], [True, None]]
    assert out["same"]

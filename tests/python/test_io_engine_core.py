"""The I/O engine of the native core (`_core.Engine`): ``io_engine="auto" | "io_uring" | "psync"``.

Where the kernel refuses io_uring (sysctl ``kernel.io_uring_disabled``, a seccomp filter, no
io_uring at all), ``auto`` falls back to psync and keeps the kernel's reason, and ``io_uring``
raises an OSError with the kernel's errno. Each refusal is made real in a child process: the
sysctl (root; restored afterwards) or a seccomp filter installed in the child.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from kvtier import _core as core
from kvtier.tiering.fs.engine import io_uring_refusal

ROW = 64 * 1024 + 100  # not a multiple of the page: exercises the padded last page


def _round_trip(root: Path, io_engine: str, payload: np.ndarray, name: str) -> bytes:
    """Stores `payload` as block `name` with `io_engine`, loads it back; returns the file."""
    engine = core.Engine(str(root), n_read_threads=1, n_write_threads=1, io_engine=io_engine)
    try:
        path = root / "d" / name
        engine.submit_store(1, [(str(path), b"key", payload.ctypes.data, payload.size)])
        engine.drain()
        (c,) = engine.pop_completions()
        assert c.success, c.error
        back = np.zeros_like(payload)
        engine.submit_load(2, [(str(path), b"key", back.ctypes.data, back.size)])
        engine.drain()
        (c,) = engine.pop_completions()
        assert c.success, c.error
        assert np.array_equal(back, payload)
        return path.read_bytes()
    finally:
        engine.shutdown()


def test_auto_uses_io_uring_where_the_kernel_allows_it(tmp_path: Path) -> None:
    reason = io_uring_refusal(tmp_path / "probe")
    if reason:
        pytest.skip(f"io_uring is refused here: {reason}")
    engine = core.Engine(str(tmp_path / "root"), n_read_threads=1, n_write_threads=1)
    try:
        assert engine.io_engine == "io_uring"
        assert engine.io_engine_fallback_reason == ""
    finally:
        engine.shutdown()
    psync = core.Engine(
        str(tmp_path / "root"), n_read_threads=1, n_write_threads=1, io_engine="psync"
    )
    try:
        assert psync.io_engine == "psync"
        assert psync.io_engine_fallback_reason == ""  # chosen, not a fallback
    finally:
        psync.shutdown()


def test_both_engines_write_the_same_file_and_read_each_others(tmp_path: Path) -> None:
    if reason := io_uring_refusal(tmp_path / "probe"):
        pytest.skip(f"io_uring is refused here: {reason}")
    payload = np.random.default_rng(3).integers(0, 256, size=ROW, dtype=np.uint8)
    root = tmp_path / "root"
    by_uring = _round_trip(root, "io_uring", payload, "u")
    by_psync = _round_trip(root, "psync", payload, "p")
    assert by_uring == by_psync
    # Each engine loads what the other wrote.
    for io_engine, name in (("psync", "u"), ("io_uring", "p")):
        engine = core.Engine(str(root), n_read_threads=1, n_write_threads=0, io_engine=io_engine)
        try:
            back = np.zeros_like(payload)
            engine.submit_load(3, [(str(root / "d" / name), b"key", back.ctypes.data, back.size)])
            engine.drain()
            (c,) = engine.pop_completions()
            assert c.success, c.error
            assert np.array_equal(back, payload)
        finally:
            engine.shutdown()


# Run in a child: tries both settings and reports what happened, one line each.
_CHILD = textwrap.dedent(
    """
    import json, sys
    {prelude}
    import numpy as np
    from kvtier import _core as core

    root = sys.argv[1]
    out = {{}}
    engine = core.Engine(root, n_read_threads=1, n_write_threads=1)
    out["auto"] = [engine.io_engine, engine.io_engine_fallback_reason]
    payload = np.arange(8192, dtype=np.uint8)
    engine.submit_store(1, [(root + "/b", b"k", payload.ctypes.data, payload.size)])
    engine.drain()
    back = np.zeros_like(payload)
    engine.submit_load(2, [(root + "/b", b"k", back.ctypes.data, back.size)])
    engine.drain()
    out["fallback_works"] = all(c.success for c in engine.pop_completions()) and bool(
        (back == payload).all()
    )
    engine.shutdown()
    try:
        core.Engine(root, n_read_threads=1, n_write_threads=1, io_engine="io_uring")
        out["io_uring"] = None
    except OSError as e:
        out["io_uring"] = [e.errno, str(e)]
    print(json.dumps(out))
    """
)


def _run_child(root: Path, prelude: str = "") -> dict:
    import json

    proc = subprocess.run(
        [sys.executable, "-c", _CHILD.format(prelude=prelude), str(root)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _check_refused(result: dict, code: int) -> None:
    engine, reason = result["auto"]
    assert engine == "psync"
    assert os.strerror(code) in reason, reason
    assert result["fallback_works"]
    assert result["io_uring"] is not None, "io_engine='io_uring' did not raise"
    err, message = result["io_uring"]
    assert err == code, message
    assert "io_uring" in message


SYSCTL = Path("/proc/sys/kernel/io_uring_disabled")


def test_sysctl_io_uring_disabled_falls_back_and_io_uring_raises(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to set kernel.io_uring_disabled")
    if not SYSCTL.exists():
        pytest.skip("this kernel has no kernel.io_uring_disabled (Linux < 6.6)")
    if reason := io_uring_refusal(tmp_path / "probe"):
        pytest.skip(f"io_uring is refused here already: {reason}")
    old = SYSCTL.read_text().strip()
    try:
        SYSCTL.write_text("2")  # io_uring_setup fails with EPERM for every process
        result = _run_child(tmp_path)
    finally:
        SYSCTL.write_text(old)
    _check_refused(result, errno.EPERM)
    assert "io_uring_disabled" in result["auto"][1]


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOSYS])
def test_seccomp_refusal_falls_back_and_io_uring_raises(
    tmp_path: Path, code: int, seccomp_io_uring: Callable[[int], str]
) -> None:
    result = _run_child(tmp_path, seccomp_io_uring(code))
    _check_refused(result, code)


# Stores and loads 16 blocks as the adapters hand them over: 16 host layers per block through
# a BlockLayout ("segments"), or unaligned rows under O_DIRECT, which move through a staging
# buffer ("staged"). os.uname() marks the measured part in the trace.
_RING_CHILD = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    from kvtier import _core as core

    root, layout, io_engine = sys.argv[1:4]
    n, size, layers = 16, 64 * 1024, 16
    rows = np.random.default_rng(5).integers(0, 256, size=(n + 1) * size, dtype=np.uint8)
    back = np.zeros_like(rows)
    # io_timeout_s=0: segments and staging reach the I/O engine only without a deadline (with
    # one, every payload goes through the worker's own contiguous buffer).
    engine = core.Engine(root, n_read_threads=1, n_write_threads=1, io_engine=io_engine,
                         o_direct=layout == "staged", io_timeout_s=0)
    assert engine.io_engine == io_engine
    paths = [f"{root}/{i:02d}.kvb" for i in range(n)]
    keys = [b"k%d" % i for i in range(n)]

    def run(direction, memory, job):
        base = memory.ctypes.data
        if layout == "segments":
            part = size // layers
            regions = [(base + r * n * part, part, n, [(0, part)], False) for r in range(layers)]
            engine.submit_blocks(job, direction, paths, keys, list(range(n)),
                                 core.BlockLayout(regions))
        else:
            blocks = [(p, k, base + 1 + i * size, size)
                      for i, (p, k) in enumerate(zip(paths, keys))]
            store = direction == core.Direction.STORE
            (engine.submit_store if store else engine.submit_load)(job, blocks)
        engine.drain()
        (c,) = engine.pop_completions()
        assert c.success, c.error

    os.uname()
    run(core.Direction.STORE, rows, 1)
    run(core.Direction.LOAD, back, 2)
    os.uname()
    engine.shutdown()
    span = slice(1, 1 + n * size) if layout == "staged" else slice(0, n * size)
    assert np.array_equal(back[span], rows[span])
    print("ok")
    """
)


# A system call's name, and an io_uring_register's opcode as strace decodes it.
_CALL = re.compile(r"\d+ +(?:io_uring_register\(\d+, )?(\w+)\(?")


@pytest.mark.parametrize("layout", ["segments", "staged"])
def test_segmented_and_staged_blocks_go_through_the_ring(tmp_path: Path, layout: str) -> None:
    """Under io_uring neither kind of block takes the psync path: loads read in io_uring_enter
    (staged ones into registered buffers), stores write there too or, where the write would
    block, once from the worker; psync moves them with pwritev/preadv."""
    if shutil.which("strace") is None:
        pytest.skip("needs strace (apt-get install strace)")
    if reason := io_uring_refusal(tmp_path / "probe"):
        pytest.skip(f"io_uring is refused here: {reason}")
    root = tmp_path / "root"
    root.mkdir()
    if layout == "staged" and (why := core.probe_o_direct(str(root))):
        pytest.skip(f"staging needs O_DIRECT, which {root} refuses: {why}")
    data_calls = {"pwritev", "preadv", "pwrite64", "pread64", "pwritev2", "preadv2"}
    traced = ",".join(sorted(data_calls | {"io_uring_enter", "io_uring_register", "uname"}))
    counts = {}
    for io_engine in ("psync", "io_uring"):
        trace = tmp_path / f"{io_engine}.trace"
        for stale in root.iterdir():
            stale.unlink()
        proc = subprocess.run(
            [
                "strace", "-f", "-o", str(trace),
                "-e", "trace=" + traced,
                sys.executable, "-c", _RING_CHILD, str(root), layout, io_engine,
            ],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]
        lines = trace.read_text().splitlines()
        marks = [i for i, line in enumerate(lines) if " uname(" in line]
        assert len(marks) >= 2, lines[-20:]
        # "pid name(args" (a call split by another thread's also has a "<... name resumed>"
        # line, not counted again).
        calls = [m.group(1) for m in map(_CALL.match, lines[marks[-2] : marks[-1]]) if m]
        counts[io_engine] = {name: calls.count(name) for name in set(calls)}
    psync, uring = counts["psync"], counts["io_uring"]
    assert psync.get("pwritev", 0) >= 16 and psync.get("preadv", 0) >= 16, psync
    # Loads read in io_uring_enter. A store's write goes on the ring with RWF_NOWAIT: where the
    # file system cannot write a new file without blocking (ext4, tmpfs) it comes back and the
    # worker makes it with one pwritev (io_uring_engine.cpp), else it completes in the ring.
    assert not (data_calls - {"pwritev"}) & uring.keys(), uring
    assert uring.get("pwritev", 0) in (0, 16), uring
    assert uring.get("io_uring_enter", 0) >= 4, uring  # batches of at most 8 blocks
    # Staging buffers registered as fixed buffers, segments need none.
    assert (uring.get("IORING_REGISTER_BUFFERS_UPDATE", 0) > 0) == (layout == "staged"), uring

"""kvtier's CUDA code path without a GPU: the engine loads a stand-in CUDA runtime
(tests/cuda_standin/fake_cudart.cpp) through the same run-time loader as the real libcudart.

In the stand-in, "device memory" is host memory, streams are host threads that run their work
in order, events complete when their stream reaches them and copies are memcpy; tests inject
errors into named functions and read call counts. It has as many devices as
``KVTIER_FAKE_CUDA_DEVICES`` says, with the real runtime's per-thread current device and its
refusal to record an event on another device's stream. kvtier loads the runtime once per process,
so every configuration runs in a child process with ``KVTIER_CUDART`` set; the child prints
its observations as JSON and the assertions are made here.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "tests" / "cuda_standin" / "fake_cudart.cpp"
CHILD_TIMEOUT = 120
HEADER_SIZE = 4096
NO_BATCH_VERSION = 12000  # a runtime without cudaMemcpyBatchAsync: one copy per run
BATCH_VERSION = 13000


@pytest.fixture(scope="session")
def fake_cudart(tmp_path_factory) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        pytest.skip("no C++ compiler (g++/c++) to build the CUDA stand-in runtime")
    out = tmp_path_factory.mktemp("cuda_standin") / "libfake_cudart.so"
    proc = subprocess.run(
        [cxx, "-std=c++17", "-O1", "-shared", "-fPIC", "-pthread", "-o", str(out), str(SOURCE)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"building the stand-in failed:\n{proc.stderr}"
    return out


# Shared by every child: the stand-in's controls, an engine over a root dir, layouts of numpy
# arrays posing as device memory, and a bounded wait for completions.
PRELUDE = r'''
import ctypes, json, os, sys, time
import numpy as np
from kvtier import _core

ROOT = sys.argv[1]
lib = ctypes.CDLL(os.environ["KVTIER_CUDART"])  # the instance kvtier loaded
lib.kvtier_fake_fail.argtypes = [ctypes.c_char_p, ctypes.c_long, ctypes.c_int]
lib.kvtier_fake_calls.argtypes = [ctypes.c_char_p]
lib.kvtier_fake_calls.restype = ctypes.c_long
lib.kvtier_fake_registered_bytes.restype = ctypes.c_long
lib.kvtier_fake_pageable_copies.restype = ctypes.c_long
lib.kvtier_fake_kernel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_size_t]
lib.kvtier_fake_read_kernel.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_size_t]
lib.cudaStreamCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
lib.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
lib.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
lib.cudaEventDestroy.argtypes = [ctypes.c_void_p]

def current_device():
    d = ctypes.c_int()
    assert lib.cudaGetDevice(ctypes.byref(d)) == 0
    return d.value

def set_device(d):
    assert lib.cudaSetDevice(d) == 0

def kernel(stream, delay_ms, address, value, n):
    assert lib.kvtier_fake_kernel(stream, delay_ms, address, value, n) == 0

def calls(name):
    return lib.kvtier_fake_calls(name.encode())

def fail(name, error=700, nth=1):
    lib.kvtier_fake_fail(name.encode(), nth, error)

def new_stream():
    s = ctypes.c_void_p()
    assert lib.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    return s.value

def engine(**kw):
    # These tests count the staging pool's pieces, which carry device payloads without a
    # deadline; with io_timeout_s each payload moves whole through the worker's own pinned
    # buffer (tests/cpp/test_device_staging.cpp covers that path).
    args = dict(n_read_threads=2, n_write_threads=2, use_cuda=True, staging_buffer_bytes=8192,
                staging_bytes_total=4 * 8192, io_timeout_s=0)
    args.update(kw)
    return _core.Engine(ROOT, **args)

def kv_pairs(layers, num_blocks, run, seed=0):
    """[2, num_blocks, run] uint8 arrays: block b of layer l is runs (0, b) and (1, b)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (2, num_blocks, run), dtype=np.uint8) for _ in range(layers)]

def pair_layout(arrays, device=True):
    return _core.BlockLayout([(a.ctypes.data, a.strides[1], a.shape[1],
                               [(0, a.shape[2]), (a.strides[0], a.shape[2])], device)
                              for a in arrays])

def block(arrays, b):
    return b"".join(a[:, b].tobytes() for a in arrays)

def path(name):
    return os.path.join(ROOT, name)

def run(e, job_id, direction, names, block_ids, layout, stream=0, timeout=60):
    e.submit_blocks(job_id, direction, [path(n) for n in names], [n.encode() for n in names],
                    block_ids, layout, stream)
    return wait(e, [job_id], timeout)[job_id]

def wait(e, job_ids, timeout=60):
    done, deadline = {}, time.monotonic() + timeout
    while set(job_ids) - done.keys():
        for c in e.pop_completions():
            done[c.job_id] = c
        assert time.monotonic() < deadline, f"jobs {set(job_ids) - done.keys()} never finished"
        time.sleep(0.002)
    return done

def summary(c):
    return {"success": c.success, "error": c.error, "errnos": list(c.block_errnos),
            "bytes": c.bytes}

STORE, LOAD = _core.Direction.STORE, _core.Direction.LOAD

def emit(**facts):
    print("RESULT " + json.dumps(facts))
'''


def run_child(fake: Path | str, root: Path, body: str, **env: str) -> dict:
    """Runs PRELUDE + body in a fresh interpreter with the stand-in as its CUDA runtime."""
    root.mkdir(parents=True, exist_ok=True)
    full_env = {**os.environ, "KVTIER_CUDART": str(fake), **env}
    proc = subprocess.run(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(body), str(root)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, f"child failed (rc {proc.returncode}):\n{proc.stdout}{proc.stderr}"
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, proc.stdout + proc.stderr
    return json.loads(lines[0][len("RESULT ") :])


def pieces(run_lengths: list[int], buffer_bytes: int) -> list[int]:
    """How many segment pieces each staging piece of a block touches."""
    total = sum(run_lengths)
    out, start = [], 0
    while start < total:
        end = min(start + buffer_bytes, total)
        pos, touched = 0, 0
        for length in run_lengths:
            if pos < end and pos + length > start:
                touched += 1
            pos += length
        out.append(touched)
        start = end
    return out


# ---- loading the runtime ----------------------------------------------------------------------


def test_standin_runtime_is_found_and_used(fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        available, reason = _core.cuda_available(), _core.cuda_unavailable_reason()
        e = engine(numa_bind=True)
        host = _core.Engine(ROOT, n_read_threads=1, n_write_threads=1)
        emit(available=available, reason=reason, enabled=e.cuda_enabled, numa=e.numa_node,
             host_enabled=host.cuda_enabled, versions=calls("cudaRuntimeGetVersion"))
        e.shutdown(); host.shutdown()
    """,
    )
    assert facts["available"] is True
    assert facts["reason"] == ""
    assert facts["enabled"] is True
    assert facts["host_enabled"] is False
    assert facts["numa"] == -1  # the stand-in's PCI bus id has no NUMA node: binding is off
    assert facts["versions"] == 1  # loaded once per process


def run_child_bare(lib: Path, root: Path, **env: str) -> dict:
    """For runtimes that kvtier must refuse: no stand-in controls are loaded in the child."""
    root.mkdir(parents=True, exist_ok=True)
    code = textwrap.dedent("""
        import json, sys
        from kvtier import _core
        ROOT = sys.argv[1]
        try:
            _core.Engine(ROOT, n_read_threads=1, n_write_threads=1, use_cuda=True)
            error = None
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        host = _core.Engine(ROOT, n_read_threads=1, n_write_threads=1)  # still works
        print("RESULT " + json.dumps(dict(
            available=_core.cuda_available(), reason=_core.cuda_unavailable_reason(),
            error=error, host_enabled=host.cuda_enabled)))
        host.shutdown()
    """)
    full_env = {**os.environ, "KVTIER_CUDART": str(lib), **env}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(root)],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


@pytest.mark.parametrize("case", ["no-runtime-library", "no-device"])
def test_use_cuda_without_a_usable_runtime_is_a_clear_error(case, fake_cudart, tmp_path):
    if case == "no-runtime-library":
        lib, env, reason = tmp_path / "nowhere" / "libcudart.so.13", {}, "no CUDA runtime library"
    else:
        lib, env, reason = fake_cudart, {"KVTIER_FAKE_CUDA_DEVICES": "0"}, "no CUDA device"
    facts = run_child_bare(lib, tmp_path / "root", **env)
    assert facts["available"] is False
    assert reason in facts["reason"]
    assert str(lib) in facts["reason"]  # which library was tried
    assert facts["error"] is not None
    assert facts["error"].startswith("CoreError: use_cuda is set but CUDA is unavailable")
    assert reason in facts["error"]
    assert facts["host_enabled"] is False


def test_cuda_device_out_of_range_is_rejected(fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        errors = {}
        for device in (2, 5):
            try:
                engine(cuda_device=device)
                errors[device] = None
            except Exception as exc:
                errors[device] = f"{type(exc).__name__}: {exc}"
        # Device 1 exists: the workers select it before creating their streams.
        e = engine(cuda_device=1)
        arrays = kv_pairs(1, 2, 100)
        c = run(e, 1, STORE, ["k"], [0], pair_layout(arrays))
        emit(errors=errors, enabled=e.cuda_enabled, store=summary(c),
             set_device=calls("cudaSetDevice"))
        e.shutdown()
    """,
        KVTIER_FAKE_CUDA_DEVICES="2",
    )
    for device in ("2", "5"):
        assert facts["errors"][device] is not None
        assert facts["errors"][device].startswith("InvalidArgumentError: cuda_device")
        assert "does not exist" in facts["errors"][device]
    assert facts["enabled"] is True
    assert facts["store"]["success"], facts["store"]["error"]
    assert facts["set_device"] >= 1


def test_device_layout_needs_a_cuda_engine(tmp_path):
    # No runtime is loaded for this: the engine refuses before any copy.
    import numpy as np
    from kvtier import _core

    a = np.zeros((4, 64), dtype=np.uint8)
    layout = _core.BlockLayout([(a.ctypes.data, a.strides[0], 4, [(0, 64)], True)])
    assert layout.has_device_memory
    e = _core.Engine(str(tmp_path), n_read_threads=1, n_write_threads=1)
    try:
        with pytest.raises(ValueError, match="device memory needs an engine created with use_cuda"):
            e.submit_blocks(1, _core.Direction.STORE, [str(tmp_path / "k")], [b"k"], [0], layout)
        assert e.pop_completions() == []
        assert not (tmp_path / "k").exists()
    finally:
        e.shutdown()


# ---- ordering -------------------------------------------------------------------------------


@pytest.mark.parametrize("caller_stream", ["created", "legacy"])
def test_store_waits_for_the_kernel_queued_on_the_callers_stream(
    caller_stream, fake_cudart, tmp_path
):
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(2, 6, 3000)
        for a in arrays:
            a[:] = 0
        layout = pair_layout(arrays)
        stream = new_stream() if {caller_stream == "created"!r} else 0
        # Fake kernels that sleep, then write blocks 1 and 2 of layer 0 (both runs) and block 2
        # of layer 1. A store submitted right after must see their bytes, not the zeros.
        a0, a1 = arrays
        writes = [(a0, 1, 0x11, 300), (a0, 2, 0x22, 50), (a1, 2, 0x33, 50)]
        for a, b, value, delay in writes:
            for half in range(2):
                kernel(stream, delay, a[half, b].ctypes.data, value, a.shape[2])
        e = engine()
        store = run(e, 1, STORE, ["b1", "b2"], [1, 2], layout, stream)
        expected = {{name: block(arrays, b).hex() for name, b in (("b1", 1), ("b2", 2))}}
        files = {{name: open(path(name), "rb").read()[4096:4096 + layout.payload_length].hex()
                  for name in ("b1", "b2")}}
        for a in arrays:
            a[:, 4:] = 0
        load = run(e, 2, LOAD, ["b1", "b2"], [4, 5], layout)
        emit(store=summary(store), load=summary(load), files_match=files == expected,
             b1=[int(a0[0, 4, 0]), int(a0[1, 4, -1]), int(a1[0, 4, 0])],
             b2=[int(a0[0, 5, 0]), int(a0[1, 5, -1]), int(a1[0, 5, 0]), int(a1[1, 5, -1])],
             events=[calls("cudaEventCreateWithFlags"), calls("cudaEventRecord"),
                     calls("cudaEventDestroy"), calls("cudaStreamWaitEvent")])
        e.shutdown()
    """,
    )
    assert facts["store"]["success"], facts["store"]["error"]
    assert facts["load"]["success"], facts["load"]["error"]
    assert facts["files_match"], "the stored payload is not the kernels' bytes"
    assert facts["b1"] == [0x11, 0x11, 0]
    assert facts["b2"] == [0x22, 0x22, 0x33, 0x33]
    created, recorded, destroyed, waited = facts["events"]
    # One event per job (the store and the load), recorded on the caller's stream, waited on by
    # each block's worker, destroyed with the job.
    assert (created, recorded, destroyed) == (2, 2, 2)
    assert waited == 4


def test_loads_are_complete_when_reported(fake_cudart, tmp_path):
    # A load reports only after its copies finished: the bytes are there at once, every time.
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        arrays = kv_pairs(3, 8, 5000, seed=4)
        layout = pair_layout(arrays)
        e = engine(n_read_threads=4)
        names = [f"k{b}" for b in range(4)]
        assert run(e, 1, STORE, names, [0, 1, 2, 3], layout).success
        expected = [block(arrays, b) for b in range(4)]
        mismatches, records_before = 0, calls("cudaEventRecord")
        for i in range(20):
            for a in arrays:
                a[:, 4:] = 0
            c = run(e, 10 + i, LOAD, names, [4, 5, 6, 7], layout)
            assert c.success, c.error
            mismatches += sum(block(arrays, 4 + b) != expected[b] for b in range(4))
        emit(mismatches=mismatches, records=calls("cudaEventRecord") - records_before)
        e.shutdown()
    """,
    )
    assert facts["mismatches"] == 0
    assert facts["records"] == 20  # each load is ordered after the caller's stream


@pytest.mark.parametrize("caller_stream", ["created", "legacy"])
def test_load_waits_for_kernels_still_reading_the_blocks(caller_stream, fake_cudart, tmp_path):
    # Kernels queued on the caller's stream still read blocks 1 and 2 when loads into those
    # blocks are submitted: the loads must not overwrite them before the kernels ran.
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(2, 6, 3000, seed=9)
        layout = pair_layout(arrays)
        e = engine()
        assert run(e, 1, STORE, ["s4", "s5"], [4, 5], layout).success
        stored = {{b: block(arrays, b) for b in (4, 5)}}
        old = {{b: block(arrays, b) for b in (1, 2)}}
        stream = new_stream() if {caller_stream == "created"!r} else 0
        # Each kernel sleeps, then copies what it reads of a block into a snapshot.
        snapshots = {{}}
        for b, delay in ((1, 300), (2, 50)):
            for li, a in enumerate(arrays):
                for half in range(2):
                    snap = np.empty(a.shape[2], dtype=np.uint8)
                    snapshots[(b, li, half)] = snap
                    assert lib.kvtier_fake_read_kernel(stream, delay, snap.ctypes.data,
                                                       a[half, b].ctypes.data, a.shape[2]) == 0
        load = run(e, 2, LOAD, ["s4", "s5"], [1, 2], layout, stream)
        seen = {{b: b"".join(snapshots[(b, li, h)].tobytes() for li in range(2) for h in range(2))
                 for b in (1, 2)}}
        emit(load=summary(load), kernels_saw_old=[seen[b] == old[b] for b in (1, 2)],
             loaded=[block(arrays, 1) == stored[4], block(arrays, 2) == stored[5]])
        e.shutdown()
    """,
    )
    assert facts["load"]["success"], facts["load"]["error"]
    assert facts["kernels_saw_old"] == [True, True], "a load overwrote a block a kernel still read"
    assert facts["loaded"] == [True, True]


# ---- several devices ------------------------------------------------------------------------


def test_standin_refuses_an_event_recorded_on_another_devices_stream(fake_cudart, tmp_path):
    # What the multi-device tests below rely on: the stand-in, like the real runtime, refuses
    # to record an event of one device on a stream (or the legacy stream) of another.
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        ev = ctypes.c_void_p()
        assert lib.cudaEventCreateWithFlags(ctypes.byref(ev), 2) == 0  # on device 0
        set_device(1)
        other = new_stream()
        legacy_of_1 = lib.cudaEventRecord(ev, 0)
        set_device(0)
        emit(other=lib.cudaEventRecord(ev, other), legacy_of_1=legacy_of_1,
             own=lib.cudaEventRecord(ev, 0), kernel_elsewhere=lib.kvtier_fake_kernel(
                 other, 0, None, 0, 0))
        lib.cudaEventDestroy(ev)
    """,
        KVTIER_FAKE_CUDA_DEVICES="2",
    )
    assert facts == {"other": 400, "legacy_of_1": 400, "own": 0, "kernel_elsewhere": 400}


@pytest.mark.parametrize("caller_stream", ["created", "legacy"])
def test_jobs_on_a_second_device_from_a_thread_on_the_first(caller_stream, fake_cudart, tmp_path):
    """The engine moves device 1's memory; the submitting thread has device 0 current (as a
    process driving several GPUs from one thread does). The job's event must be made on
    device 1 and recorded on the caller's stream of device 1 (a created stream, or device 1's
    legacy stream for a null one), and the thread's current device must stay 0."""
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(2, 6, 3000, seed=10)
        for a in arrays:
            a[:] = 0
        layout = pair_layout(arrays)
        e = engine(cuda_device=1)
        set_device(1)
        stream = new_stream() if {caller_stream == "created"!r} else 0
        # Kernels on device 1's stream write block 1; a store submitted at once must see them.
        for a in arrays:
            for half in range(2):
                kernel(stream, 200, a[half, 1].ctypes.data, 0x5A, a.shape[2])
        set_device(0)
        errors, results = {{}}, {{}}
        try:
            results["store"] = run(e, 1, STORE, ["k"], [1], layout, stream)
        except Exception as exc:
            errors["store"] = f"{{type(exc).__name__}}: {{exc}}"
        device_after_store = current_device()
        stored = block(arrays, 1)
        set_device(1)
        snap = np.empty(arrays[0].shape[2], dtype=np.uint8)
        assert lib.kvtier_fake_read_kernel(stream, 200, snap.ctypes.data,
                                           arrays[0][0, 3].ctypes.data, snap.size) == 0
        set_device(0)
        try:
            results["load"] = run(e, 2, LOAD, ["k"], [3], layout, stream)
        except Exception as exc:
            errors["load"] = f"{{type(exc).__name__}}: {{exc}}"
        emit(errors=errors, results={{k: summary(v) for k, v in results.items()}},
             device_after_store=device_after_store, device_after_load=current_device(),
             stored_kernel_bytes=stored == bytes([0x5A]) * layout.payload_length,
             loaded=block(arrays, 3) == stored, kernel_saw_old=not snap.any())
        e.shutdown()
    """,
        KVTIER_FAKE_CUDA_DEVICES="2",
    )
    assert facts["errors"] == {}
    for name in ("store", "load"):
        assert facts["results"][name]["success"], facts["results"][name]["error"]
    assert facts["stored_kernel_bytes"], "the store did not wait for device 1's stream"
    assert facts["loaded"]
    assert facts["kernel_saw_old"], "the load did not wait for device 1's stream"
    assert facts["device_after_store"] == facts["device_after_load"] == 0


@pytest.mark.parametrize("devices", ["1", "2"])
def test_staging_is_pinned_for_the_engines_device(devices, fake_cudart, tmp_path):
    # Worker threads start with device 0 current; staging memory they pin must count as pinned
    # for the engine's device, else every copy goes through the runtime's pageable path.
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(2, 8, 20000, seed=11)
        layout = pair_layout(arrays)
        e = engine(cuda_device={int(devices) - 1}, n_read_threads=2, n_write_threads=2)
        names = [f"k{{b}}" for b in range(4)]
        store = run(e, 1, STORE, names, [0, 1, 2, 3], layout)
        load = run(e, 2, LOAD, names, [4, 5, 6, 7], layout)
        emit(ok=store.success and load.success,
             exact=[block(arrays, b) == block(arrays, b + 4) for b in range(4)],
             copies=calls("cudaMemcpyBatchAsync") + calls("cudaMemcpyAsync"),
             pageable=lib.kvtier_fake_pageable_copies())
        e.shutdown()
    """,
        KVTIER_FAKE_CUDA_DEVICES=devices,
    )
    assert facts["ok"] and facts["exact"] == [True] * 4
    assert facts["copies"] > 0
    assert facts["pageable"] == 0


# ---- copies ---------------------------------------------------------------------------------


@pytest.mark.parametrize("version", [BATCH_VERSION, NO_BATCH_VERSION])
@pytest.mark.parametrize(
    ("layers", "run_bytes"),
    [(2, 3000), (1, 20000), (3, 100)],
    ids=["4-runs-2-pieces", "2-big-runs", "6-small-runs"],
)
def test_batched_or_per_run_copies(version, layers, run_bytes, fake_cudart, tmp_path):
    buffer_bytes = 8192
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs({layers}, 4, {run_bytes}, seed=1)
        layout = pair_layout(arrays)
        e = engine(staging_buffer_bytes={buffer_bytes}, n_read_threads=1, n_write_threads=1)
        def counts():
            return [calls(f) for f in ("cudaMemcpyBatchAsync", "cudaMemcpyAsync",
                                       "cudaStreamSynchronize")]
        c0 = counts()
        store = run(e, 1, STORE, ["k"], [3], layout)
        c1 = counts()
        load = run(e, 2, LOAD, ["k"], [0], layout)
        c2 = counts()
        emit(store=summary(store), load=summary(load),
             store_calls=[b - a for a, b in zip(c0, c1)],
             load_calls=[b - a for a, b in zip(c1, c2)],
             exact=block(arrays, 0) == block(arrays, 3))
        e.shutdown()
    """,
        KVTIER_FAKE_CUDART_VERSION=str(version),
    )
    assert facts["store"]["success"], facts["store"]["error"]
    assert facts["load"]["success"], facts["load"]["error"]
    assert facts["exact"]
    per_piece = pieces([run_bytes] * (2 * layers), buffer_bytes)
    if version >= BATCH_VERSION:
        # One batched call for each piece that spans several runs; a single run is one copy.
        expected = [sum(n > 1 for n in per_piece), sum(n == 1 for n in per_piece), len(per_piece)]
    else:
        expected = [0, sum(per_piece), len(per_piece)]
    assert facts["store_calls"] == expected
    assert facts["load_calls"] == expected


@pytest.mark.parametrize("version", [BATCH_VERSION, NO_BATCH_VERSION])
def test_large_blocks_stream_through_small_staging_both_ways(version, fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        # Three device layers of [2, 8, 10007] plus one host layer: 65,042-byte blocks
        # through 8192-byte staging buffers, device and host runs mixed within pieces.
        arrays = kv_pairs(3, 8, 10007, seed=2)
        host = np.random.default_rng(3).integers(0, 256, (8, 5000), dtype=np.uint8)
        regions = [(a.ctypes.data, a.strides[1], 8, [(0, 10007), (a.strides[0], 10007)], True)
                   for a in arrays]
        regions.insert(1, (host.ctypes.data, host.strides[0], 8, [(0, 5000)], False))
        layout = _core.BlockLayout(regions)
        def whole(b):
            parts = [arrays[0][:, b].tobytes(), host[b].tobytes()]
            return b"".join(parts + [a[:, b].tobytes() for a in arrays[1:]])
        e = engine(n_read_threads=3, n_write_threads=3, staging_bytes_total=2 * 8192)
        names = [f"k{b}" for b in range(4)]
        before = [whole(b) for b in range(8)]
        store = run(e, 1, STORE, names, [0, 1, 2, 3], layout)
        files = [open(path(n), "rb").read() for n in names]
        load = run(e, 2, LOAD, names, [7, 6, 5, 4], layout)
        after = [whole(b) for b in range(8)]
        emit(store=summary(store), load=summary(load), payload=layout.payload_length,
             segments=len(layout.segments(0)),
             files_exact=[f[4096:4096 + layout.payload_length] == before[b]
                          for b, f in enumerate(files)],
             file_sizes=[len(f) for f in files],
             loaded_exact=[after[7 - b] == before[b] for b in range(4)],
             sources_kept=after[:4] == before[:4],
             registered=lib.kvtier_fake_registered_bytes())
        e.shutdown()
    """,
        KVTIER_FAKE_CUDART_VERSION=str(version),
    )
    payload = 3 * 2 * 10007 + 5000
    assert facts["payload"] == payload and facts["segments"] == 7
    assert facts["store"]["success"], facts["store"]["error"]
    assert facts["load"]["success"], facts["load"]["error"]
    assert facts["store"]["bytes"] == facts["load"]["bytes"] == 4 * payload
    assert facts["files_exact"] == [True] * 4
    assert facts["file_sizes"] == [HEADER_SIZE + -(-payload // 4096) * 4096] * 4
    assert facts["loaded_exact"] == [True] * 4
    assert facts["sources_kept"]
    assert 0 < facts["registered"] <= 2 * 8192  # capped by staging_bytes_total


# ---- errors ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("function", "direction", "version", "nth"),
    [
        ("cudaMemcpyBatchAsync", "STORE", BATCH_VERSION, 1),
        ("cudaMemcpyBatchAsync", "LOAD", BATCH_VERSION, 2),
        ("cudaMemcpyAsync", "STORE", NO_BATCH_VERSION, 3),
        ("cudaMemcpyAsync", "LOAD", NO_BATCH_VERSION, 1),
        ("cudaStreamSynchronize", "STORE", BATCH_VERSION, 2),
        ("cudaStreamSynchronize", "LOAD", BATCH_VERSION, 1),
        ("cudaStreamWaitEvent", "STORE", BATCH_VERSION, 1),
        ("cudaStreamWaitEvent", "LOAD", BATCH_VERSION, 1),
        ("cudaStreamCreateWithFlags", "LOAD", BATCH_VERSION, 1),
    ],
    ids=lambda v: str(v),
)
def test_cuda_errors_fail_the_job_with_the_error_name(
    function, direction, version, nth, fake_cudart, tmp_path
):
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(2, 4, 3000, seed=5)
        layout = pair_layout(arrays)
        stream = new_stream()
        setup = engine()
        assert run(setup, 1, STORE, ["present"], [0], layout).success
        setup.shutdown()
        # One worker, so jobs run in order; its first device copy is in job 2.
        e = engine(n_read_threads=0, n_write_threads=1)
        before = [block(arrays, b) for b in range(4)]
        fail({function!r}, error=700, nth={nth})
        direction = {direction!r}
        def submit(job_id, name, block_id):
            d = STORE if direction == "STORE" else LOAD
            e.submit_blocks(job_id, d, [path(name)], [name.encode()], [block_id], layout, stream)
        # Job 3 follows on the same (only) worker: the fault was one-shot, so it must succeed.
        if direction == "STORE":
            submit(2, "broken", 1)
            submit(3, "after", 1)
        else:
            submit(2, "present", 2)
            submit(3, "present", 3)
        e.drain()
        done = wait(e, [2, 3])
        leftovers = sorted(n for n in os.listdir(ROOT) if n not in ("present", "after"))
        if direction == "STORE":
            with open(path("after"), "rb") as f:
                again_exact = f.read()[4096:4096 + layout.payload_length] == before[1]
        else:
            again_exact = block(arrays, 3) == before[0]
        emit(failed=summary(done[2]), again=summary(done[3]), leftovers=leftovers,
             again_exact=again_exact, source_kept=block(arrays, 1) == before[1])
        e.shutdown()
    """,
        KVTIER_FAKE_CUDART_VERSION=str(version),
    )
    failed = facts["failed"]
    assert failed["success"] is False
    assert failed["errnos"] == [errno.EIO]
    operation = "cudaStreamCreate" if function == "cudaStreamCreateWithFlags" else function
    assert operation in failed["error"]
    assert "cudaErrorIllegalAddress: an illegal memory access was encountered" in failed["error"]
    assert facts["again"]["success"], facts["again"]["error"]
    assert facts["again_exact"]
    assert facts["source_kept"]
    if direction == "STORE":
        assert facts["leftovers"] == []  # neither the failed block nor a tmp file


def test_failed_device_store_leaves_no_work_behind(fake_cudart, tmp_path):
    """A store whose copy fails returns at once. Nothing it queued on the worker's stream may
    outlive it: the job's event is destroyed when the job is popped, and its staging buffer
    goes to the next block. The stand-in frees an event at cudaEventDestroy even while a
    stream still waits on it, so a wait left queued by the failed store hangs that stream;
    each round ends with a shutdown, which joins the worker streams, and so hangs too."""
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        import faulthandler
        faulthandler.dump_traceback_later(20, exit=True)  # a hang fails with a traceback
        arrays = kv_pairs(1, 4, 3000)
        layout = pair_layout(arrays)
        stream = new_stream()
        failed = 0
        for i in range(50):
            e = engine(n_read_threads=1, n_write_threads=1, staging_bytes_total=8192)
            fail("cudaMemcpyBatchAsync")
            if i % 2:  # the caller's stream is still busy when the job fails and is popped
                kernel(stream, 20, arrays[0].ctypes.data, 1, 1)
            e.submit_blocks(1, STORE, [path(f"k{i}")], [b"k"], [1], layout, stream)
            e.drain()
            failed += sum(not c.success for c in e.pop_completions())  # destroys the job
            print(f"round {i}: store failed as injected; shutting down", flush=True)
            e.shutdown()
        faulthandler.cancel_dump_traceback_later()
        emit(failed=failed)
    """,
    )
    assert facts["failed"] == 50


@pytest.mark.parametrize("function", ["cudaEventRecord", "cudaEventCreateWithFlags"])
def test_event_errors_at_submit_raise(function, fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        f"""
        arrays = kv_pairs(1, 2, 100)
        layout = pair_layout(arrays)
        e = engine()
        stream = new_stream()
        fail({function!r}, error=2)
        try:
            e.submit_blocks(1, STORE, [path("k")], [b"k"], [0], layout, stream)
            error = None
        except Exception as exc:
            error = f"{{type(exc).__name__}}: {{exc}}"
        e.drain()
        leaked = e.pop_completions()
        # The id was not taken: the same job id is accepted and works.
        retry = run(e, 1, STORE, ["k"], [0], layout, stream)
        emit(error=error, leaked=len(leaked), retry=summary(retry),
             events=[calls("cudaEventCreateWithFlags"), calls("cudaEventDestroy")])
        e.shutdown()
    """,
    )
    assert facts["error"] is not None
    assert facts["error"].startswith("CoreError: cannot record the submitting stream's event")
    assert "cudaErrorMemoryAllocation" in facts["error"]
    assert facts["leaked"] == 0
    assert facts["retry"]["success"], facts["retry"]["error"]
    created, destroyed = facts["events"]
    assert destroyed == created - (function == "cudaEventCreateWithFlags")


def test_failed_pinning_still_copies(fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        arrays = kv_pairs(2, 4, 6000, seed=6)
        layout = pair_layout(arrays)
        e = engine(n_read_threads=1, n_write_threads=1, staging_bytes_total=8192)
        fail("cudaHostRegister", error=2)
        store = run(e, 1, STORE, ["k"], [1], layout)
        load = run(e, 2, LOAD, ["k"], [2], layout)
        emit(store=summary(store), load=summary(load), exact=block(arrays, 1) == block(arrays, 2),
             registered=lib.kvtier_fake_registered_bytes())
        e.shutdown()
    """,
    )
    assert facts["store"]["success"], facts["store"]["error"]
    assert facts["load"]["success"], facts["load"]["error"]
    assert facts["exact"]
    assert facts["registered"] == 0  # unpinned memory is slower, not wrong


# ---- staging memory -------------------------------------------------------------------------


def test_staging_is_pinned_on_first_use_and_released_at_shutdown(fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        arrays = kv_pairs(2, 8, 20000, seed=7)
        layout = pair_layout(arrays)
        e = engine(n_read_threads=4, n_write_threads=4, staging_bytes_total=3 * 8192)
        idle = lib.kvtier_fake_registered_bytes()
        names = [f"k{b}" for b in range(8)]
        for i, n in enumerate(names):
            e.submit_blocks(i, STORE, [path(n)], [n.encode()], [i], layout, 0)
        stores = wait(e, range(8))
        running = lib.kvtier_fake_registered_bytes()
        loads = run(e, 100, LOAD, names, list(reversed(range(8))), layout)
        e.shutdown()
        after = lib.kvtier_fake_registered_bytes()
        emit(idle=idle, running=running, after=after,
             ok=all(c.success for c in stores.values()) and loads.success,
             registers=calls("cudaHostRegister"), unregisters=calls("cudaHostUnregister"))
    """,
    )
    assert facts["ok"]
    assert facts["idle"] == 0  # allocated on first use
    assert facts["running"] > 0
    assert facts["running"] % 8192 == 0 and facts["running"] <= 3 * 8192
    assert facts["after"] == 0
    assert facts["registers"] == facts["unregisters"] >= 1


def test_host_only_engine_never_touches_the_runtime(fake_cudart, tmp_path):
    facts = run_child(
        fake_cudart,
        tmp_path,
        """
        arrays = kv_pairs(2, 4, 6000, seed=8)
        layout = pair_layout(arrays, device=False)
        e = engine(use_cuda=False)
        store = run(e, 1, STORE, ["k"], [0], layout)
        load = run(e, 2, LOAD, ["k"], [3], layout)
        emit(ok=store.success and load.success, exact=block(arrays, 0) == block(arrays, 3),
             registered=calls("cudaHostRegister"),
             copies=calls("cudaMemcpyAsync") + calls("cudaMemcpyBatchAsync"),
             streams=calls("cudaStreamCreateWithFlags"))
        e.shutdown()
    """,
    )
    assert facts["ok"] and facts["exact"]
    assert facts["registered"] == 0
    assert facts["copies"] == 0
    assert facts["streams"] == 0

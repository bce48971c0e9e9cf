"""The io_engine option ("auto", "io_uring", "psync") through the fs tier and
GPUStorageTransfer: validation, what runs, and the fallback of "auto" where io_uring is refused.

The refusal is real, not mocked: a child process installs a seccomp filter that makes the
io_uring system calls fail with EPERM (what a container runtime's profile or
``kernel.io_uring_disabled`` does to a process), so the engine meets the kernel's refusal. In a
build without the io_uring engine the engine refuses by itself, which the same tests cover.
"""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.options import FsTierOptions
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16")
FALLBACK_MESSAGE = "io_uring is not usable"


def make(tmp_path, **options):
    config = {"type": "fs", "root_dir": str(tmp_path / "root"), "n_read_threads": 1}
    config["n_write_threads"] = 1
    rows = np.zeros((4, 4096), dtype=np.uint8)
    return SecondaryTierFactory.create_secondary_tier({**config, **options}, memoryview(rows), SPEC)


@pytest.mark.parametrize("value", ["uring", "libaio", "", 1, None, True])
def test_bad_io_engine_is_a_value_error_naming_the_choices(tmp_path, value):
    with pytest.raises(ValueError) as info:
        make(tmp_path, io_engine=value)
    text = str(info.value)
    assert "'io_engine'" in text and "secondary tier 'fs'" in text
    assert "['auto', 'io_uring', 'psync']" in text
    assert not (tmp_path / "root").exists()  # refused before anything was created


def test_io_engine_defaults_to_auto_and_accepts_any_case():
    assert FsTierOptions.parse("fs", {"root_dir": "/x"}).io_engine == "auto"
    parsed = FsTierOptions.parse("fs", {"root_dir": "/x", "io_engine": " PSync "})
    assert parsed.io_engine == "psync"
    assert parsed.engine_kwargs()["io_engine"] == "psync"


def test_the_tier_reports_the_engine_it_runs(tmp_path, io_engine):
    tier = make(tmp_path, io_engine=io_engine)
    try:
        assert tier.io_engine == io_engine
        assert tier.io_engine_fallback_reason == ""
    finally:
        tier.shutdown()


def test_auto_reports_io_uring_or_why_it_fell_back(tmp_path, io_uring_refused):
    tier = make(tmp_path)
    try:
        if io_uring_refused:
            assert (tier.io_engine, bool(tier.io_engine_fallback_reason)) == ("psync", True)
        else:
            assert (tier.io_engine, tier.io_engine_fallback_reason) == ("io_uring", "")
    finally:
        tier.shutdown()


def test_refused_io_uring_fails_construction_saying_what_to_use(tmp_path, io_uring_refused):
    if not io_uring_refused:
        pytest.skip("io_uring works here; the refusal is tested in a seccomp child below")
    with pytest.raises(OSError) as info:
        make(tmp_path, io_engine="io_uring")
    assert info.value.errno in (errno.ENOSYS, errno.EPERM, errno.EACCES, errno.EINVAL)
    assert "io_uring" in info.value.strerror
    assert "io_engine='auto'" in info.value.strerror and "'psync'" in info.value.strerror


# The child: io_uring's system calls fail with EPERM from here on (seccomp, through prctl),
# then several tiers and a GPUStorageTransfer on CPU tensors open with io_engine="auto".
SECCOMP_CHILD = textwrap.dedent(
    """
    import ctypes, json, logging, struct, sys
    import numpy as np

    # io_uring_setup / _enter / _register: 425-427 on every architecture (the unified table).
    IO_URING_CALLS = (425, 426, 427)
    BPF_LD_W_ABS, BPF_JEQ_K, BPF_RET_K = 0x20, 0x15, 0x06
    SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO, EPERM = 0x7FFF0000, 0x00050000, 1
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2

    def insn(code, jt, jf, k):
        return struct.pack("HBBI", code, jt, jf, k)

    n = len(IO_URING_CALLS)
    prog = insn(BPF_LD_W_ABS, 0, 0, 0)  # seccomp_data.nr
    for i, nr in enumerate(IO_URING_CALLS):
        prog += insn(BPF_JEQ_K, n - i, 0, nr)  # to the EPERM return
    prog += insn(BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW)
    prog += insn(BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM)

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = SockFprog(len(prog) // 8, ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong,
                           ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0 or libc.prctl(
            PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0) != 0:
        print(json.dumps({"seccomp": ctypes.get_errno()}))
        sys.exit(0)
    # The filter is live: io_uring_setup itself now fails with EPERM.
    setup = ctypes.CDLL(None, use_errno=True).syscall
    setup.restype = ctypes.c_long
    params = ctypes.create_string_buffer(120)  # struct io_uring_params
    refused = (setup(ctypes.c_long(425), ctypes.c_long(1), params) == -1
               and ctypes.get_errno() == EPERM)

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    logging.getLogger("kvtier").addHandler(Keep())
    logging.getLogger("kvtier").setLevel(logging.WARNING)

    import torch
    from kvtier.gpu import GPUStorageTransfer
    from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
    from kvtier.tiering.factory import SecondaryTierFactory
    from kvtier.tiering.spec import OffloadingSpec

    root = sys.argv[1]
    spec = OffloadingSpec(model_name="m", dtype="f16")
    engines, reasons = [], []
    rows = np.random.default_rng(0).integers(0, 256, (4, 4096), dtype=np.uint8)
    for i in range(3):
        tier = SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root_dir": f"{root}/t{i}", "n_read_threads": 1,
             "n_write_threads": 1}, memoryview(rows), spec)
        engines.append(tier.io_engine)
        reasons.append(tier.io_engine_fallback_reason)
        # The fallback moves bytes: a store and a load round trip.
        k = make_offload_key(bytes(32), 0)
        tier.submit_store(JobMetadata(1, [k], np.array([0]), False, ReqContext("r")))
        tier.drain_jobs()
        tier.submit_load(JobMetadata(2, [k], np.array([3]), True, ReqContext("r")))
        tier.drain_jobs()
        ok = all(r.success for r in tier.get_finished())
        assert ok and rows[3].tobytes() == rows[0].tobytes()
        tier.shutdown()
    transfer = GPUStorageTransfer([torch.zeros(4, 4096)], spec, f"{root}/g", n_read_threads=1,
                                  n_write_threads=1)
    engines.append(transfer.io_engine)
    transfer.shutdown()
    try:
        SecondaryTierFactory.create_secondary_tier(
            {"type": "fs", "root_dir": f"{root}/x", "io_engine": "io_uring"},
            memoryview(rows), spec)
        explicit = None
    except OSError as e:
        explicit = [e.errno, e.strerror]
    print(json.dumps({"refused": refused, "engines": engines, "reasons": reasons,
                      "warnings": records, "explicit": explicit}))
    """
)


def test_auto_falls_back_to_psync_with_one_warning_where_the_kernel_refuses(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SECCOMP_CHILD, str(tmp_path)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    if "seccomp" in report:
        pytest.skip(f"cannot install a seccomp filter here (errno {report['seccomp']})")
    assert report["refused"] is True  # the filter really refuses io_uring_setup
    assert report["engines"] == ["psync"] * 4
    reason = report["reasons"][0]
    assert reason and report["reasons"] == [reason] * 3
    # One warning for the process, naming the reason, though four engines fell back.
    fallbacks = [w for w in report["warnings"] if FALLBACK_MESSAGE in w]
    assert len(fallbacks) == 1, report["warnings"]
    assert reason in fallbacks[0] and "psync" in fallbacks[0]
    # Asked for explicitly, io_uring is refused at construction with the way out.
    errno_, message = report["explicit"]
    assert errno_ in (errno.EPERM, errno.ENOSYS)
    assert "io_engine='auto'" in message


def test_probes_and_engines_from_several_threads_at_once(tmp_path, io_uring_refused):
    # The new entry points (the io_uring probe, machine_thread_counts, engines choosing their
    # io_engine) called from 8 threads together agree with a single call; the engines are
    # dropped with a store queued and without shutdown().
    import gc
    import threading

    from kvtier import _core
    from kvtier.tiering.fs.engine import io_uring_refusal

    want_counts = _core.machine_thread_counts(str(tmp_path))
    results: list[tuple[str, tuple[int, int], str]] = []
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def probe(i: int) -> None:
        try:
            start.wait()
            root = tmp_path / f"t{i}"
            refusal = io_uring_refusal(root / "probe")
            counts = _core.machine_thread_counts(str(root))
            data = np.full(8192, i, dtype=np.uint8)
            engine = _core.Engine(str(root), n_read_threads=1, n_write_threads=1)
            engine.keep_alive([data])
            engine.submit_store(1, [(str(root / "b"), b"k", data.ctypes.data, data.size)])
            results.append((refusal, counts, engine.io_engine))
            del engine  # a queued store and no shutdown(): the binding stops the workers
        except BaseException as e:  # reported below, with the thread's traceback
            errors.append(e)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    gc.collect()
    assert not errors, errors
    assert len(results) == 8
    engine_in_use = "psync" if io_uring_refused else "io_uring"
    assert set(results) == {(io_uring_refused, want_counts, engine_in_use)}

"""GPUStorageTransfer on real files: byte-exact round trips for several KV layouts, interop with
the fs tier in both directions, failed loads, validation, and the CUDA-free build.

Every test runs on CPU tensors (the same native code path, with host copies). The tests
parametrized over ``device`` also run on CUDA tensors where torch sees a GPU; those carry the
``gpu`` mark, so ``tests/gpu/run.sh`` (``pytest -m gpu``) runs them on the GPU machine.
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
except ImportError:  # CI installs torch; a bare checkout without it skips this module
    pytest.skip(
        "torch is not installed: GPUStorageTransfer takes torch tensors (pip install torch)",
        allow_module_level=True,
    )

import kvtier
from kvtier import _core
from kvtier.gpu import GPUStorageTransfer, cuda_available
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.fs.capacity import controller as capacity_controller
from kvtier.tiering.spec import OffloadingSpec

CTX = ReqContext("req-0")
SPEC = OffloadingSpec(model_name="org/model-7b", dtype="bfloat16", kv_layout="NHD")
NUM_BLOCKS = 8
PAGE = 4096

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="torch sees no CUDA device"),
        ],
    ),
]


def key(i: int, group: int = 0) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), group)


def rand(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A CPU tensor of random bytes (any bit pattern: the tests compare bytes, not values)."""
    g = torch.Generator().manual_seed(seed)
    itemsize = torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (math.prod(shape) * itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(shape)


def block_bytes(kv: list[torch.Tensor], block_dim: int, b: int) -> bytes:
    """The payload the issue defines: the C-order bytes of each tensor's slice, in order."""
    return b"".join(
        t.select(block_dim, b).contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
        for t in kv
    )


def snapshot(kv: list[torch.Tensor], block_dim: int) -> list[bytes]:
    n = kv[0].shape[block_dim]
    return [block_bytes(kv, block_dim, b) for b in range(n)]


@dataclass(frozen=True)
class Layout:
    """KV tensors built on CPU, moved to the device, then viewed (so views keep their strides)."""

    name: str
    bases: tuple[tuple[tuple[int, ...], torch.dtype], ...]
    block_dim: int
    view: Callable[[torch.Tensor], torch.Tensor] = lambda t: t

    def make(self, device: str, seed: int = 0) -> list[torch.Tensor]:
        return [
            self.view(rand(shape, dtype, seed + i).to(device))
            for i, (shape, dtype) in enumerate(self.bases)
        ]


N = NUM_BLOCKS
LAYOUTS = [
    # Contiguous blocks, several layers; 7680-byte blocks stream through 4096-byte staging.
    Layout("dim0-bf16-3layers", tuple(((N, 16, 2, 40), torch.bfloat16) for _ in range(3)), 0),
    # [2, num_blocks, ...] K/V pairs: two runs per layer and block.
    Layout("dim1-fp16-kv-pairs", tuple(((2, N, 16, 3, 32), torch.float16) for _ in range(2)), 1),
    # One large int8 block (21003 bytes, not a page multiple): six staging pieces.
    Layout("dim0-int8-large", (((N, 3, 7001), torch.int8),), 0),
    # A transposed outer dim: [2, N, ...] viewed as [N, 2, ...]; not contiguous, still valid.
    Layout(
        "transposed-outer",
        tuple(((2, N, 8, 64), torch.bfloat16) for _ in range(2)),
        0,
        lambda t: t.transpose(0, 1),
    ),
    # Block dim in the middle: eight 24-byte runs per block; runs straddle staging pieces.
    Layout("dim2-many-small-runs", (((2, 4, N, 24), torch.int8),), 2),
    # Layers of different dtypes and sizes; a negative block_dim.
    Layout(
        "mixed-dtypes-negative-dim",
        (((N, 100), torch.bfloat16), ((N, 33), torch.int8), ((N, 50), torch.float16)),
        -2,
    ),
]
LAYOUT_IDS = [layout.name for layout in LAYOUTS]


@pytest.fixture
def make_transfer(tmp_path, io_engine):
    """Transfers on each I/O engine in turn (conftest's io_engine), shut down at teardown."""
    made: list[GPUStorageTransfer] = []

    def make(kv: list[torch.Tensor], block_dim: int = 0, **options) -> GPUStorageTransfer:
        options = {
            "n_read_threads": 2,
            "n_write_threads": 2,
            "io_engine": io_engine,
            "staging_buffer_bytes": PAGE,
            "staging_bytes_total": 2 * PAGE,
            **options,
        }
        transfer = GPUStorageTransfer(kv, SPEC, str(tmp_path / "root"), block_dim, **options)
        made.append(transfer)
        return transfer

    yield make
    for t in made:
        t.shutdown()


@pytest.fixture
def make_fs_tier(tmp_path):
    tiers = []

    def make(rows: np.ndarray):
        config = {
            "type": "fs",
            "root_dir": str(tmp_path / "root"),
            "n_read_threads": 2,
            "n_write_threads": 2,
        }
        tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), SPEC)
        tiers.append(tier)
        return tier

    yield make
    for t in tiers:
        t.shutdown()


def run_job(transfer, collect_results, submit, job_id: int, block_ids, keys):
    submit(job_id, block_ids, keys)
    return collect_results(transfer, [job_id])[job_id]


def fs_job(job_id: int, keys: list[bytes], slots: list[int]) -> JobMetadata:
    return JobMetadata(job_id, keys, np.asarray(slots, dtype=np.int64), False, CTX)


# ---- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=LAYOUT_IDS)
def test_round_trip_into_other_blocks_is_byte_exact(layout, device, make_transfer, collect_results):
    kv = layout.make(device)
    t = make_transfer(kv, layout.block_dim)
    before = snapshot(kv, layout.block_dim)
    assert t.num_blocks == NUM_BLOCKS
    assert t.block_bytes == len(before[0])

    src, dst = [1, 3, 6], [0, 4, 7]
    keys = [key(b) for b in src]
    stored = run_job(t, collect_results, t.store, 1, src, keys)
    assert stored.success, stored.error
    assert stored.transfer_bytes == 3 * t.block_bytes
    for k in keys:
        path = Path(t.file_mapper.get_file_name(k))
        # Header page + payload padded to a page multiple, as the fs tier writes it.
        assert path.stat().st_size == _core.HEADER_SIZE + -(-t.block_bytes // PAGE) * PAGE
    assert snapshot(kv, layout.block_dim) == before  # a store never writes the tensors

    loaded = run_job(t, collect_results, t.load, 2, dst, keys)
    assert loaded.success, loaded.error
    assert loaded.transfer_bytes == 3 * t.block_bytes
    after = snapshot(kv, layout.block_dim)
    expected = list(before)
    for s, d in zip(src, dst, strict=True):
        expected[d] = before[s]
    assert [a == e for a, e in zip(after, expected, strict=True)] == [True] * NUM_BLOCKS
    assert t.stats()["store_blocks"] == 3 and t.stats()["load_blocks"] == 3


def test_bytes_in_the_file_are_the_c_order_slices(make_transfer, collect_results):
    layout = LAYOUTS[1]  # [2, num_blocks, ...]: the slice is two runs per tensor
    kv = layout.make("cpu")
    t = make_transfer(kv, layout.block_dim, checksum="none", o_direct=False)
    result = run_job(t, collect_results, t.store, 1, [5], [key(5)])
    assert result.success, result.error
    data = Path(t.file_mapper.get_file_name(key(5))).read_bytes()
    payload = data[_core.HEADER_SIZE : _core.HEADER_SIZE + t.block_bytes]
    assert payload == block_bytes(kv, layout.block_dim, 5)
    assert data[_core.HEADER_SIZE + t.block_bytes :] == bytes(
        len(data) - _core.HEADER_SIZE - t.block_bytes
    )


@pytest.mark.parametrize(
    "staging",
    [(PAGE, PAGE), (2 * PAGE, 2 * PAGE), (PAGE, 4 * PAGE)],
    ids=["one-4k-buffer", "one-8k-buffer", "four-4k-buffers"],
)
def test_small_staging_streams_many_blocks_in_pieces(staging, make_transfer, collect_results):
    # More workers than staging buffers: workers wait for a buffer instead of failing.
    buffer_bytes, total = staging
    kv = [rand((16, 2, 9000), torch.int8, 7), rand((16, 5000), torch.int8, 8)]
    t = make_transfer(
        kv,
        0,
        n_read_threads=4,
        n_write_threads=4,
        staging_buffer_bytes=buffer_bytes,
        staging_bytes_total=total,
    )
    before = snapshot(kv, 0)
    keys = [key(100 + b) for b in range(8)]
    for b in range(8):
        t.store(10 + b, [b], [keys[b]])
    stores = collect_results(t, range(10, 18))
    assert all(r.success for r in stores.values()), [r.error for r in stores.values()]
    for tensor in kv:
        tensor[8:].zero_()
    t.load(20, list(range(8, 16)), keys)
    result = collect_results(t, [20])[20]
    assert result.success, result.error
    assert snapshot(kv, 0)[8:] == before[:8]


@pytest.mark.parametrize(
    "options",
    [{"checksum": "none"}, {"o_direct": False}, {"durability": "full", "file_mode": 0o640}],
    ids=["no-checksum", "buffered", "durable-0640"],
)
def test_storage_options_apply(options, make_transfer, collect_results):
    kv = LAYOUTS[0].make("cpu")
    t = make_transfer(kv, 0, **options)
    result = run_job(t, collect_results, t.store, 1, [2], [key(2)])
    assert result.success, result.error
    path = Path(t.file_mapper.get_file_name(key(2)))
    assert path.stat().st_mode & 0o777 == options.get("file_mode", 0o600)
    before = block_bytes(kv, 0, 2)
    result = run_job(t, collect_results, t.load, 2, [5], [key(2)])
    assert result.success, result.error
    assert block_bytes(kv, 0, 5) == before


# ---- interop with the fs tier ---------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [LAYOUTS[1], LAYOUTS[3]], ids=[LAYOUTS[1].name, LAYOUTS[3].name])
def test_transfer_store_is_loaded_by_the_fs_tier(
    layout, device, make_transfer, make_fs_tier, collect_results
):
    kv = layout.make(device)
    t = make_transfer(kv, layout.block_dim)
    keys = [key(b) for b in (2, 5)]
    result = run_job(t, collect_results, t.store, 1, [2, 5], keys)
    assert result.success, result.error

    rows = np.zeros((4, t.block_bytes), dtype=np.uint8)
    fs = make_fs_tier(rows)
    assert fs.file_mapper.namespace_dir == t.file_mapper.namespace_dir
    assert [fs.file_mapper.get_file_name(k) for k in keys] == [
        t.file_mapper.get_file_name(k) for k in keys
    ]
    assert all(fs.lookup(k, CTX) for k in keys)
    fs.submit_load(fs_job(2, keys, [3, 1]))
    loaded = collect_results(fs, [2])[2]
    assert loaded.success, loaded.error
    assert rows[3].tobytes() == block_bytes(kv, layout.block_dim, 2)
    assert rows[1].tobytes() == block_bytes(kv, layout.block_dim, 5)
    assert not rows[0].any() and not rows[2].any()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[4]], ids=[LAYOUTS[0].name, LAYOUTS[4].name])
def test_fs_tier_store_is_loaded_by_the_transfer(
    layout, device, make_transfer, make_fs_tier, collect_results
):
    kv = layout.make(device)
    t = make_transfer(kv, layout.block_dim)
    rows = np.random.default_rng(3).integers(0, 256, (4, t.block_bytes), dtype=np.uint8)
    fs = make_fs_tier(rows)
    keys = [key(10), key(11)]
    fs.submit_store(fs_job(1, keys, [0, 3]))
    stored = collect_results(fs, [1])[1]
    assert stored.success, stored.error

    before = snapshot(kv, layout.block_dim)
    result = run_job(t, collect_results, t.load, 2, [6, 1], keys)
    assert result.success, result.error
    after = snapshot(kv, layout.block_dim)
    assert after[6] == rows[0].tobytes()
    assert after[1] == rows[3].tobytes()
    assert [after[b] == before[b] for b in range(NUM_BLOCKS) if b not in (1, 6)] == [True] * (
        NUM_BLOCKS - 2
    )


# ---- failures -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_load_of_missing_key_fails_and_leaves_its_block_untouched(
    device, make_transfer, collect_results
):
    layout = LAYOUTS[1]
    kv = layout.make(device)
    t = make_transfer(kv, layout.block_dim)
    present, missing = key(1), key(99)
    result = run_job(t, collect_results, t.store, 1, [1], [present])
    assert result.success, result.error
    before = snapshot(kv, layout.block_dim)

    result = run_job(t, collect_results, t.load, 2, [4, 6], [present, missing])
    assert not result.success
    assert list(result.successful_keys) == [present]
    assert result.error and "No such file" in result.error, result.error
    after = snapshot(kv, layout.block_dim)
    assert after[4] == before[1]
    assert after[6] == before[6]  # the missing key's block is untouched
    # The transfer keeps working after a failed job.
    result = run_job(t, collect_results, t.load, 3, [7], [present])
    assert result.success, result.error
    assert snapshot(kv, layout.block_dim)[7] == before[1]


def test_failed_job_is_logged_at_error_level(make_transfer, collect_results, caplog):
    t = make_transfer(LAYOUTS[0].make("cpu"), 0)
    with caplog.at_level(logging.WARNING, logger="kvtier.gpu.transfer"):
        assert not run_job(t, collect_results, t.load, 5, [0], [key(123)]).success
    logged = [r for r in caplog.records if r.getMessage().startswith("Job 5 block I/O failed: ")]
    assert [r.levelno for r in logged] == [logging.ERROR]


def test_load_of_a_block_stored_for_another_layout_fails(tmp_path, make_transfer, collect_results):
    small = [rand((4, 256), torch.int8, 1)]
    t_small = make_transfer(small, 0)
    assert run_job(t_small, collect_results, t_small.store, 1, [0], [key(0)]).success
    big = [rand((4, 512), torch.int8, 2)]
    t_big = make_transfer(big, 0)
    # Another block size is another namespace: the key is simply absent there.
    assert t_big.file_mapper.namespace_dir != t_small.file_mapper.namespace_dir
    before = snapshot(big, 0)
    result = run_job(t_big, collect_results, t_big.load, 2, [1], [key(0)])
    assert not result.success
    assert snapshot(big, 0) == before


def test_job_argument_errors(make_transfer, collect_results):
    t = make_transfer(LAYOUTS[0].make("cpu"), 0)
    with pytest.raises(ValueError, match="out of range"):
        t.store(1, [NUM_BLOCKS], [key(0)])
    with pytest.raises(ValueError, match="out of range"):
        t.load(1, [-1], [key(0)])
    with pytest.raises(ValueError, match="1 keys but 2 block_ids"):
        t.store(1, [0, 1], [key(0)])
    assert t.get_finished() == []
    t.store(1, [0], [key(0)])
    with pytest.raises(ValueError, match="already in flight"):
        t.store(1, [1], [key(1)])
    results = collect_results(t, [1])
    assert results[1].success, results[1].error
    t.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        t.store(2, [0], [key(0)])


# ---- layout validation ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.zeros(8, 4, 6)[:, :, ::2],
        lambda: torch.zeros(8, 4, 6).transpose(1, 2),
        lambda: torch.zeros(4, 8).t(),
    ],
    ids=["strided-last-dim", "swapped-inner-dims", "block-dim-innermost"],
)
def test_innermost_dim_not_contiguous_is_rejected(make, tmp_path):
    with pytest.raises(
        ValueError, match="innermost dimension of a block slice is not contiguous"
    ) as e:
        GPUStorageTransfer([torch.zeros(8, 12), make()], SPEC, str(tmp_path), 0)
    assert "kv_caches[1]" in str(e.value)


def test_mismatched_kv_caches_are_rejected(tmp_path):
    root = str(tmp_path)
    with pytest.raises(ValueError, match=re.escape("disagree on the number of blocks")):
        GPUStorageTransfer([torch.zeros(8, 16), torch.zeros(6, 16)], SPEC, root)
    with pytest.raises(ValueError, match="one device"):
        GPUStorageTransfer([torch.zeros(8, 16), torch.zeros(8, 16, device="meta")], SPEC, root)
    with pytest.raises(ValueError, match="kv_caches is empty"):
        GPUStorageTransfer([], SPEC, root)
    with pytest.raises(ValueError, match="block_dim 2 is out of range"):
        GPUStorageTransfer([torch.zeros(8, 16)], SPEC, root, block_dim=2)
    with pytest.raises(ValueError, match="holds no block bytes"):
        GPUStorageTransfer([torch.zeros(8, 0)], SPEC, root)
    with pytest.raises(ValueError, match="is a scalar"):
        GPUStorageTransfer([torch.tensor(1.0)], SPEC, root)


# ---- options ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"n_reader_threads": 2},
            "Unknown option 'n_reader_threads' for GPUStorageTransfer. Valid options:",
        ),
        ({"staging_buffer_bytes": 5000}, "'staging_buffer_bytes'.*a multiple of 4096"),
        ({"staging_buffer_bytes": 2048}, "'staging_buffer_bytes'.*an integer >= 4096"),
        (
            {"staging_buffer_bytes": 8192, "staging_bytes_total": 4096},
            "'staging_bytes_total'.*an integer >= 8192",
        ),
        ({"staging_bytes_total": "lots"}, "'staging_bytes_total'"),
        ({"staging_buffer_bytes": True}, "'staging_buffer_bytes'"),
        ({"checksum": "md5"}, "'checksum'.*one of"),
        ({"n_read_threads": 0, "n_write_threads": 0}, "at least 1"),
        ({"numa_bind": "maybe"}, "'numa_bind'"),
        (
            {"io_engine": "uring"},
            r"'io_engine' of GPUStorageTransfer.*\['auto', 'io_uring', 'psync'\]",
        ),
    ],
    ids=[
        "unknown",
        "buffer-not-page-multiple",
        "buffer-too-small",
        "total-below-buffer",
        "total-not-int",
        "buffer-bool",
        "checksum",
        "no-threads",
        "numa-bind",
        "io-engine",
    ],
)
def test_invalid_options_are_rejected_before_anything_is_created(options, message, tmp_path):
    root = tmp_path / "root"
    with pytest.raises(ValueError, match=message):
        GPUStorageTransfer([torch.zeros(8, 16)], SPEC, str(root), **options)
    assert not root.exists()


def test_options_are_parsed(make_transfer):
    t = make_transfer(
        [torch.zeros(8, 16)],
        0,
        staging_buffer_bytes="8192",
        staging_bytes_total=3 * 8192,
        numa_bind=True,
        o_direct=False,
    )
    assert t.options.staging_buffer_bytes == 8192
    assert t.options.staging_bytes_total == 3 * 8192
    assert t.options.numa_bind is True
    assert t._engine.cuda_enabled is False  # CPU tensors never touch CUDA


def test_transfer_reports_the_io_engine_it_runs(make_transfer, io_engine):
    t = make_transfer([torch.zeros(8, 16)], 0, io_engine=io_engine.upper())
    assert t.options.io_engine == io_engine
    assert (t.io_engine, t.io_engine_fallback_reason) == (io_engine, "")


def test_transfer_refusing_io_uring_says_what_to_use(tmp_path, io_uring_refused):
    if not io_uring_refused:
        pytest.skip("io_uring works here (test_io_engine.py covers the refusal in a child)")
    with pytest.raises(OSError, match=r"GPUStorageTransfer: .*io_engine='auto'"):
        GPUStorageTransfer([torch.zeros(8, 16)], SPEC, str(tmp_path / "r"), io_engine="io_uring")


# ---- no CUDA needed -----------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a usable CUDA device")
def test_cuda_is_not_available_here():
    assert cuda_available() is False
    assert _core.cuda_unavailable_reason()


def test_package_imports_and_works_without_any_cuda_runtime(tmp_path):
    # KVTIER_CUDART names the only runtime kvtier may load: pointing it at nothing is a
    # machine without CUDA, whatever this one has.
    code = (
        "import sys, torch, kvtier, kvtier.gpu\n"
        "from kvtier.tiering.spec import OffloadingSpec\n"
        "assert kvtier.gpu.cuda_available() is False\n"
        "print('reason:', kvtier._core.cuda_unavailable_reason())\n"
        "kv = [torch.arange(64, dtype=torch.int8).reshape(4, 16)]\n"
        "t = kvtier.gpu.GPUStorageTransfer(kv, OffloadingSpec('m', 'int8'), sys.argv[1],\n"
        "                                  n_read_threads=1, n_write_threads=1)\n"
        "t.store(1, [1], [b'k' * 36]); t.drain(); r = t.get_finished()\n"
        "assert r[0].success, r[0].error\n"
        "t.load(2, [3], [b'k' * 36]); t.drain(); r = t.get_finished()\n"
        "assert r[0].success, r[0].error\n"
        "assert torch.equal(kv[0][3], kv[0][1])\n"
        "t.shutdown()\n"
    )
    env = {**os.environ, "KVTIER_CUDART": str(tmp_path / "no-such-libcudart.so")}
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "root")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no-such-libcudart.so" in proc.stdout


def _native_files() -> list[Path]:
    core_module = Path(_core.__file__).resolve()
    # libkvtier_core.so.MAJOR.MINOR: the versioned SONAME is the file itself in the wheel.
    libraries = sorted(Path(kvtier.cmake_dir()).resolve().parents[1].glob("libkvtier_core.so*"))
    assert libraries, f"libkvtier_core.so* not found next to {kvtier.cmake_dir()}"
    return [core_module, *libraries]


@pytest.mark.skipif(shutil.which("ldd") is None, reason="ldd is not installed")
def test_built_binaries_do_not_link_cuda():
    for path in _native_files():
        proc = subprocess.run(["ldd", str(path)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "libc.so" in proc.stdout  # ldd did resolve something
        cuda = [
            line
            for line in proc.stdout.splitlines()
            if re.search(r"cuda|cudart|nvrtc|nvidia", line, re.IGNORECASE)
        ]
        assert cuda == [], f"{path.name} links CUDA libraries: {cuda}"


@pytest.mark.skipif(shutil.which("nm") is None, reason="nm (binutils) is not installed")
def test_built_binaries_have_no_undefined_cuda_symbols():
    for path in _native_files():
        proc = subprocess.run(
            ["nm", "-D", "--undefined-only", str(path)], capture_output=True, text=True, timeout=60
        )
        assert proc.returncode == 0, proc.stderr
        symbols = [line.split()[-1] for line in proc.stdout.splitlines() if line.strip()]
        assert symbols, f"nm found no undefined symbols in {path.name}"  # nm did read it
        cuda = [s for s in symbols if re.match(r"cuda|cu[A-Z]", s)]  # runtime or driver API
        assert cuda == [], f"{path.name} needs CUDA symbols at link time: {cuda}"


def test_transfer_takes_capacity_options(make_transfer, collect_results):
    """GPUStorageTransfer shares the root's budget: with eviction "none" a store past
    max_bytes fails with ENOSPC, and blocks already stored still load."""
    kv = [rand((8, 4096), torch.uint8, seed=5)]
    file_bytes = 4096 + 4096  # header + one page of payload
    transfer = make_transfer(kv, max_bytes=3 * file_bytes, eviction="none", min_free_fraction=0)
    ok = run_job(transfer, collect_results, transfer.store, 1, [0, 1, 2], [key(0), key(1), key(2)])
    assert ok.success, ok.error
    refused = run_job(transfer, collect_results, transfer.store, 2, [3], [key(3)])
    assert not refused.success and "errno 28" in refused.error
    assert transfer.stats()["rejected_stores"] == 1
    kv[0][5].zero_()
    loaded = run_job(transfer, collect_results, transfer.load, 3, [5], [key(0)])
    assert loaded.success and torch.equal(kv[0][5], kv[0][0])


def test_store_waiting_for_budget_does_not_hold_the_callers_thread(
    make_transfer, collect_results, monkeypatch
):
    """With the budget full and eviction not yet able to make room, store() returns at
    once (the store waits on the capacity thread, as the fs tier's does); once eviction
    makes room the store is submitted from there and reported exactly once."""
    room = threading.Event()
    evicting = threading.Event()
    real_evict = capacity_controller.evict

    def evict_once_room_is_allowed(*args, **kwargs):
        evicting.set()
        assert room.wait(60), "the test never let eviction make room"
        return real_evict(*args, **kwargs)

    monkeypatch.setattr(capacity_controller, "evict", evict_once_room_is_allowed)
    kv = [rand((8, 4096), torch.uint8, seed=7)]
    file_bytes = 4096 + 4096  # header + one page of payload
    transfer = make_transfer(kv, max_bytes=3 * file_bytes, eviction="lru", min_free_fraction=0)
    keys = [key(0), key(1), key(2)]
    full = run_job(transfer, collect_results, transfer.store, 1, [0, 1, 2], keys)
    assert full.success, full.error
    assert evicting.wait(60), "a full budget asked for no eviction"
    transfer.store(2, [3], [key(3)])  # the budget has no room until `room` is set
    returned_before_room = not room.is_set()
    assert transfer.get_finished() == []  # not refused: waiting for room
    room.set()
    assert returned_before_room
    stored = collect_results(transfer, [2])[2]
    assert stored.success, stored.error
    transfer.drain()
    assert transfer.get_finished() == []  # reported once


def test_stores_written_but_not_collected_are_not_evicted(make_transfer, collect_results, tmp_path):
    """A store the engine has written but get_finished() has not handed out yet still counts
    as in flight: its files are no eviction candidates (evicting them frees nothing in the
    count, and the evictor would empty the cache). Once collected, eviction brings the cache
    down to its watermark."""
    files = 6
    file_bytes = 4096 + 4096  # header + one page of payload
    kv = [rand((files, 4096), torch.uint8, seed=9)]
    transfer = make_transfer(
        kv, max_bytes=files * file_bytes + file_bytes // 2, eviction="lru", min_free_fraction=0
    )
    for i in range(files):
        transfer.store(100 + i, [i], [key(i)])
    deadline = time.monotonic() + 60
    while transfer.stats()["store_blocks"] < files:  # written, not collected
        assert time.monotonic() < deadline, "the engine never wrote every block"
        time.sleep(0.05)
    capacity = transfer._capacity
    for _ in range(3):  # passes asked for and run while the stores are uncollected
        capacity.request_eviction()
        assert capacity.wait_idle(60), "the capacity thread never went idle"
    assert transfer.stats()["evicted_blocks"] == 0
    assert len(list((tmp_path / "root").rglob("*.kvb"))) == files
    results = collect_results(transfer, [100 + i for i in range(files)])
    assert all(r.success for r in results.values())
    capacity.request_eviction()
    assert capacity.wait_idle(60)
    assert 0 < len(list((tmp_path / "root").rglob("*.kvb"))) < files

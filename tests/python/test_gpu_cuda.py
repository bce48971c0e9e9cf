"""GPUStorageTransfer on a real CUDA device: round trips from CUDA tensors, ordering of stores
and loads after the caller's stream, a second GPU driven from a thread on the first (where
there are two), interop with the fs tier, and a short bandwidth measurement (printed and,
with ``$KVTIER_GPU_RESULTS`` set, written there as JSON; never asserted).

Run on a GPU machine by ``tests/gpu/run.sh``; everywhere else the module is skipped.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

import numpy as np
import pytest

try:
    import torch
except ImportError:
    pytest.skip("torch is not installed (the GPU tests need CUDA torch)", allow_module_level=True)

if not torch.cuda.is_available():
    pytest.skip(
        "torch sees no CUDA device (these tests run on a GPU machine: tests/gpu/run.sh)",
        allow_module_level=True,
    )

from kvtier import _core
from kvtier.gpu import GPUStorageTransfer, cuda_available
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

pytestmark = pytest.mark.gpu

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="bfloat16", kv_layout="NHD")
CTX = ReqContext("req-0")
N = 8
WAIT_SECONDS = 120.0


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Same-size integer view: compares bytes, so NaN patterns and -0.0 count exactly."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def rand_cuda(shape: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def block_cpu_bytes(kv: list[torch.Tensor], block_dim: int, b: int) -> bytes:
    return b"".join(
        bits(t.select(block_dim, b))
        .contiguous()
        .cpu()
        .reshape(-1)
        .view(torch.uint8)
        .numpy()
        .tobytes()
        for t in kv
    )


def wait(transfer, job_ids, timeout: float = WAIT_SECONDS) -> dict:
    wanted, done = set(job_ids), {}
    deadline = time.monotonic() + timeout
    while wanted - done.keys():
        for r in transfer.get_finished():
            assert r.job_id not in done, f"job {r.job_id} reported twice"
            done[r.job_id] = r
        assert time.monotonic() < deadline, f"jobs not finished: {wanted - done.keys()}"
        time.sleep(0.001)
    return done


@pytest.fixture
def make_transfer(tmp_path):
    made: list[GPUStorageTransfer] = []

    def make(kv, block_dim=0, **options):
        options = {"n_read_threads": 4, "n_write_threads": 4, **options}
        t = GPUStorageTransfer(kv, SPEC, str(tmp_path / "root"), block_dim, **options)
        made.append(t)
        return t

    yield make
    for t in made:
        t.shutdown()


def test_kvtier_uses_the_cuda_runtime_torch_loaded(make_transfer):
    assert cuda_available(), _core.cuda_unavailable_reason()
    assert _core.cuda_unavailable_reason() == ""
    t = make_transfer([torch.zeros((N, 64), device="cuda")], numa_bind=True)
    assert t._engine.cuda_enabled
    print(f"engine NUMA node: {t._engine.numa_node}")


LAYOUTS = {
    # name: (factory(seed) -> tensors, block_dim)
    "dim0-bf16-4layers": (
        lambda s: [rand_cuda((N, 16, 8, 128), torch.bfloat16, s + i) for i in range(4)],
        0,
    ),
    "dim1-bf16-kv-pairs": (
        lambda s: [rand_cuda((2, N, 16, 8, 128), torch.bfloat16, s + i) for i in range(3)],
        1,
    ),
    "transposed-outer-fp16": (
        lambda s: [
            rand_cuda((2, N, 16, 4, 64), torch.float16, s + i).transpose(0, 1) for i in range(2)
        ],
        0,
    ),
    "dim2-bf16-many-runs": (lambda s: [rand_cuda((2, 8, N, 40), torch.bfloat16, s)], 2),
}


@pytest.mark.parametrize("staging_buffer_bytes", [8192, 8 << 20], ids=["8k-pieces", "8m"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_round_trip_from_cuda_tensors(name, staging_buffer_bytes, make_transfer):
    build, block_dim = LAYOUTS[name]
    kv = build(0)
    t = make_transfer(
        kv,
        block_dim,
        staging_buffer_bytes=staging_buffer_bytes,
        staging_bytes_total=4 * staging_buffer_bytes,
    )
    before = [bits(x).clone() for x in kv]
    src, dst = [0, 2, 5], [7, 1, 4]
    keys = [key(b) for b in src]
    t.store(1, src, keys)
    r = wait(t, [1])[1]
    assert r.success, r.error
    for x in kv:
        x.zero_()  # every block: the untouched ones must stay zero
    t.load(2, dst, keys)
    r = wait(t, [2])[2]
    assert r.success, r.error
    for x, b in zip(kv, before, strict=True):
        xb = bits(x)
        for s, d in zip(src, dst, strict=True):
            assert torch.equal(xb.select(block_dim, d), b.select(block_dim, s)), (name, s, d)
        others = [i for i in range(N) if i not in dst]
        assert not xb.index_select(block_dim, torch.tensor(others, device="cuda")).any()


@pytest.mark.parametrize("side_stream", [False, True], ids=["current-stream", "side-stream"])
def test_store_right_after_a_kernel_sees_its_data(side_stream, make_transfer):
    kv = [torch.zeros((N, 256, 1024), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    t = make_transfer(kv)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream() if side_stream else None
    with torch.cuda.stream(stream):  # None: the current stream stays
        for i in range(3):
            torch.cuda._sleep(200_000_000)  # keeps the stream busy (~0.1 s) before the write
            for layer, x in enumerate(kv):
                x[3 + i].fill_(float(1 + i + 10 * layer))
            t.store(10 + i, [3 + i], [key(3 + i)])  # at once: no synchronize in between
    stored = wait(t, [10, 11, 12])
    assert all(r.success for r in stored.values()), [r.error for r in stored.values()]
    torch.cuda.synchronize()
    t.load(20, [0, 1, 2], [key(3), key(4), key(5)])
    r = wait(t, [20])[20]
    assert r.success, r.error
    for i in range(3):
        for layer, x in enumerate(kv):
            got = x[i].float()
            assert bool((got == float(1 + i + 10 * layer)).all()), (i, layer, got.unique()[:8])


@pytest.mark.parametrize("side_stream", [False, True], ids=["current-stream", "side-stream"])
def test_load_waits_for_kernels_still_reading_the_blocks(side_stream, make_transfer):
    kv = [torch.zeros((N, 256, 1024), dtype=torch.bfloat16, device="cuda") for _ in range(2)]
    t = make_transfer(kv)
    for layer, x in enumerate(kv):
        x[0].fill_(float(7 + layer))
    t.store(1, [0], [key(0)])
    assert wait(t, [1])[1].success
    for x in kv:
        x[3].fill_(-1.0)
    torch.cuda.synchronize()
    stream = torch.cuda.Stream() if side_stream else None
    with torch.cuda.stream(stream):
        torch.cuda._sleep(200_000_000)  # the stream is busy (~0.1 s) before the kernel reads
        seen = [x[3].clone() for x in kv]  # queued: reads block 3 after the sleep
        t.load(2, [3], [key(0)])  # at once: the load must not overwrite block 3 before that
    r = wait(t, [2])[2]
    assert r.success, r.error
    torch.cuda.synchronize()
    for layer, (x, snap) in enumerate(zip(kv, seen, strict=True)):
        assert bool((snap.float() == -1.0).all()), "the load overwrote a block still being read"
        assert bool((x[3].float() == float(7 + layer)).all())


def test_transfer_on_a_second_gpu_from_a_thread_on_the_first(make_transfer):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    torch.cuda.set_device(0)
    kv = [torch.zeros((N, 64, 1024), dtype=torch.bfloat16, device="cuda:1") for _ in range(2)]
    t = make_transfer(kv)
    with torch.cuda.device(1):
        torch.cuda._sleep(200_000_000)
        for x in kv:
            x[2].fill_(3.0)
    assert torch.cuda.current_device() == 0
    t.store(1, [2], [key(2)])  # ordered after cuda:1's current stream, submitted from device 0
    assert torch.cuda.current_device() == 0
    r = wait(t, [1])[1]
    assert r.success, r.error
    t.load(2, [5], [key(2)])
    r = wait(t, [2])[2]
    assert r.success, r.error
    assert torch.cuda.current_device() == 0
    torch.cuda.synchronize(1)
    assert all(bool((x[5].float() == 3.0).all()) for x in kv)


def test_cuda_store_and_fs_tier_interop(make_transfer, tmp_path):
    build, block_dim = LAYOUTS["dim1-bf16-kv-pairs"]
    kv = build(3)
    t = make_transfer(kv, block_dim)
    t.store(1, [2, 6], [key(2), key(6)])
    r = wait(t, [1])[1]
    assert r.success, r.error

    rows = np.zeros((4, t.block_bytes), dtype=np.uint8)
    fs = SecondaryTierFactory.create_secondary_tier(
        {
            "type": "fs",
            "root_dir": str(tmp_path / "root"),
            "n_read_threads": 2,
            "n_write_threads": 2,
        },
        memoryview(rows),
        SPEC,
    )
    try:
        # GPU -> files -> fs tier rows.
        fs.submit_load(
            JobMetadata(1, [key(2), key(6)], np.array([1, 3], dtype=np.int64), False, CTX)
        )
        r = wait(fs, [1])[1]
        assert r.success, r.error
        assert rows[1].tobytes() == block_cpu_bytes(kv, block_dim, 2)
        assert rows[3].tobytes() == block_cpu_bytes(kv, block_dim, 6)
        # fs tier rows -> files -> GPU.
        rows[0] = np.random.default_rng(9).integers(0, 256, t.block_bytes, dtype=np.uint8)
        fs.submit_store(JobMetadata(2, [key(40)], np.array([0], dtype=np.int64), False, CTX))
        r = wait(fs, [2])[2]
        assert r.success, r.error
    finally:
        fs.shutdown()
    t.load(2, [5], [key(40)])
    r = wait(t, [2])[2]
    assert r.success, r.error
    assert block_cpu_bytes(kv, block_dim, 5) == rows[0].tobytes()


def _fs_type(path: Path) -> str:
    best, fs_type = "", "unknown"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            mount, kind = line.split()[1:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, fs_type = mount, kind
    except OSError:
        pass
    return fs_type


def _gbps(nbytes: int, seconds: float) -> float:
    return round(nbytes / seconds / 1e9, 2)


def test_measure_device_file_bandwidth(make_transfer, tmp_path):
    """1 GiB of KV in 2 MiB blocks (32 layers of [2, blocks, 16, 8, 128] bf16)."""
    layers, blocks, jobs_of = 32, 512, 32
    kv = [
        torch.randn((2, blocks, 16, 8, 128), device="cuda").to(torch.bfloat16)
        for _ in range(layers)
    ]
    total = sum(x.numel() * x.element_size() for x in kv)
    t = make_transfer(kv, 1, n_read_threads=16, n_write_threads=16)
    assert t.block_bytes == 2 << 20

    # Warm-up: staging buffers pinned, directories created, worker streams made.
    warm = [key(10_000 + b) for b in range(16)]
    t.store(0, list(range(16)), warm)
    assert wait(t, [0])[0].success
    t.load(1, list(range(16)), warm)
    assert wait(t, [1])[1].success
    reference = [bits(x).clone() for x in kv]
    torch.cuda.synchronize()

    def run(submit, first_id):
        ids = []
        t0 = time.perf_counter()
        for j, start in enumerate(range(0, blocks, jobs_of)):
            block_ids = list(range(start, start + jobs_of))
            submit(first_id + j, block_ids, [key(b) for b in block_ids])
            ids.append(first_id + j)
        results = wait(t, ids)
        seconds = time.perf_counter() - t0
        assert all(r.success for r in results.values()), [r.error for r in results.values()]
        return seconds

    store_s = run(t.store, 100)
    for x in kv:
        x.zero_()
    torch.cuda.synchronize()
    load_s = run(t.load, 200)
    torch.cuda.synchronize()
    assert all(torch.equal(bits(x), r) for x, r in zip(kv, reference, strict=True))

    # The plain copy of the same bytes: device <-> pinned host, one cudaMemcpyAsync each.
    src = torch.empty(total, dtype=torch.uint8, device="cuda")
    host = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    host.copy_(src)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    host.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    d2h_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    src.copy_(host, non_blocking=True)
    torch.cuda.synchronize()
    h2d_s = time.perf_counter() - t0

    figures = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "python": platform.python_version(),
        "layout": f"{layers} layers x [2, {blocks}, 16, 8, 128] bf16, block_dim=1",
        "total_bytes": total,
        "block_bytes": t.block_bytes,
        "blocks_per_job": jobs_of,
        "threads": [t.options.n_read_threads, t.options.n_write_threads],
        "staging": [t.options.staging_buffer_bytes, t.options.staging_bytes_total],
        "checksum": t.options.checksum,
        "o_direct": bool(t._engine.direct_io),
        "file_system": _fs_type(tmp_path),
        "device_to_file_gbps": _gbps(total, store_s),
        "file_to_device_gbps": _gbps(total, load_s),
        "device_to_pinned_host_gbps": _gbps(total, d2h_s),
        "pinned_host_to_device_gbps": _gbps(total, h2d_s),
        "note": (
            "O_DIRECT: the page cache is bypassed"
            if t._engine.direct_io
            else "buffered I/O: files go through the page cache (durability none)"
        ),
    }
    print("\nKVTIER_GPU_RESULTS " + json.dumps(figures, indent=2))
    out = os.environ.get("KVTIER_GPU_RESULTS")
    if out:
        Path(out).write_text(json.dumps(figures, indent=2) + "\n")
    assert figures["device_to_file_gbps"] > 0 and figures["file_to_device_gbps"] > 0

"""Memory the caller hands over is used only as it really is laid out and protected.

Strided buffers are refused with a ValueError saying that C-contiguous memory is required
(never read as if contiguous); host tensors in read-only pages are refused for loads (never
written, which would kill the process).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from kvtier import _core
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="caller-memory", dtype="uint8")


def strided() -> np.ndarray:
    return np.arange(8 * 2 * 4096, dtype=np.uint32).reshape(8, 2, 4096)[:, 0, :]


@pytest.mark.parametrize(
    "call",
    [
        lambda b: _core.crc32c(b),
        lambda b: _core.buffer_address(b),
        lambda b: _core.buffer_address(b, True),
    ],
    ids=["crc32c", "buffer_address", "buffer_address-writable"],
)
@pytest.mark.parametrize("wrap", [lambda a: a, memoryview], ids=["ndarray", "memoryview"])
def test_binding_helpers_refuse_strided_buffers(call, wrap):
    with pytest.raises(ValueError, match=r"must be a C-contiguous buffer, got shape \(8, 4096\)"):
        call(wrap(strided()))


def test_binding_helpers_take_contiguous_buffers_of_any_format():
    data = np.ascontiguousarray(strided())
    assert _core.crc32c(data) == _core.crc32c(data.tobytes())
    assert _core.buffer_address(memoryview(data), True) == data.ctypes.data


def one_row_with_a_step() -> memoryview:
    # A slice with a step keeps strides[0] = 2 rows: a single row still counts as
    # C-contiguous, but rows of strides[0] bytes would reach past the end of the memory.
    return memoryview(bytearray(8 * 4096)).cast("B", (8, 4096))[7:8:2]


@pytest.mark.parametrize(
    "view",
    [lambda: memoryview(strided()), one_row_with_a_step],
    ids=["column-slice", "one-row-step"],
)
def test_fs_tier_refuses_a_primary_view_that_is_not_packed_rows(tmp_path, view):
    with pytest.raises(ValueError, match="C-contiguous"):
        FileSystemTierManager(SPEC, view(), root_dir=str(tmp_path))
    assert not any(tmp_path.iterdir()), "nothing is created for a refused view"


def test_transfer_refuses_tensors_whose_elements_share_memory(tmp_path):
    torch = pytest.importorskip("torch")
    from kvtier.gpu.transfer import GPUStorageTransfer

    row = torch.zeros(1, 4096, dtype=torch.uint8)
    for kv, what in [(row.expand(8, 4096), "blocks"), (torch.zeros(8, 1).expand(8, 64), "bytes")]:
        with pytest.raises(ValueError, match="stride 0"):
            GPUStorageTransfer([kv], SPEC, str(tmp_path / what))


READ_ONLY_CHILD = """
import mmap, sys, warnings
import numpy as np, torch
from kvtier.gpu.transfer import GPUStorageTransfer
from kvtier.tiering.spec import OffloadingSpec

root, how = sys.argv[1:3]
spec = OffloadingSpec(model_name="read-only", dtype="uint8")
source = torch.randint(0, 256, (4, 4096), dtype=torch.uint8)
writer = GPUStorageTransfer([source], spec, root)
writer.store(1, [0, 1], [b"a", b"b"])
writer.drain()
assert all(r.success for r in writer.get_finished())

warnings.simplefilter("ignore")  # torch warns that the memory is not writable
if how == "memmap":
    path = root + "/ro.bin"
    open(path, "wb").write(bytes(4 * 4096))
    kv = torch.from_numpy(np.memmap(path, mode="r", dtype=np.uint8, shape=(4, 4096)))
else:
    kv = torch.frombuffer(mmap.mmap(-1, 4 * 4096, prot=mmap.PROT_READ), dtype=torch.uint8)
    kv = kv.view(4, 4096)
reader = GPUStorageTransfer([kv], spec, root)
reader.store(2, [2], [b"c"])  # reading read-only memory is fine
reader.drain()
assert all(r.success for r in reader.get_finished())
try:
    reader.load(3, [0, 1], [b"a", b"b"])
except ValueError as e:
    print("refused:", e)
else:
    reader.drain()
    print("loaded:", reader.get_finished())
"""


@pytest.mark.parametrize("how", ["memmap", "mmap-prot-read"])
def test_transfer_over_read_only_host_memory_refuses_loads(tmp_path, how):
    pytest.importorskip("torch")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(READ_ONLY_CHILD), str(tmp_path), how],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{proc.stderr[-4000:]}"
    assert proc.stdout.startswith(
        "refused: GPUStorageTransfer cannot load: kv_caches[0] lies in read-only memory"
    ), proc.stdout

"""The CRC32C the Python module runs: every implementation, forced by KVTIER_CRC32C_IMPL, for
the checksum alone (crc32c) and fused with a copy (crc32c_copy).

The library reads KVTIER_CRC32C_IMPL once, so each implementation is tried in a child
interpreter; its checksums are compared with a table CRC written here from the definition.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from kvtier import _core


def _table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = _table()


def reference_crc32c(data: bytes, crc: int = 0) -> int:
    c = crc ^ 0xFFFFFFFF
    for b in data:
        c = (c >> 8) ^ TABLE[(c ^ b) & 0xFF]
    return c ^ 0xFFFFFFFF


if platform.machine() in ("x86_64", "AMD64"):
    NAMES = ["avx512-vpclmul", "avx2-vpclmul", "sse42", "table"]
elif platform.machine() in ("aarch64", "arm64"):
    NAMES = ["armv8-pmull", "armv8-crc", "table"]
else:
    NAMES = ["table"]

# Lengths around each kernel's steps (16-byte chunks, 64-byte registers, 256-byte rounds, the
# crc32 path's 12 KiB rounds), at odd offsets, from 0 and from a previous CRC.
CHILD = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from kvtier import _core
    data = np.random.default_rng(3).integers(0, 256, 70000, dtype=np.uint8).tobytes()
    spans = [(o, n) for o in (0, 1, 13) for n in (0, 1, 15, 16, 63, 64, 65, 255, 256, 257,
             1000, 4095, 4096, 4097, 12289, 65536 + 7)]
    copy_crcs, copies_equal = [], []
    for o, n in spans:
        # The destination misaligned against the source: dst starts at offset 3 of its buffer.
        dst = bytearray(n + 3)
        copy_crcs.append(_core.crc32c_copy(memoryview(dst)[3:], data[o:o + n],
                                           0x12345678 * (n % 2)))
        copies_equal.append(dst[3:] == data[o:o + n] and dst[:3] == bytes(3))
    out = {"implementation": _core.crc32c_implementation(),
           "hardware": _core.crc32c_is_hardware(),
           "crcs": [_core.crc32c(data[o:o + n], 0x12345678 * (n % 2)) for o, n in spans],
           "copy_crcs": copy_crcs, "copies_equal": copies_equal,
           "spans": spans}
    print(json.dumps(out))
    """
)


def run_child(impl: str | None) -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items() if k != "KVTIER_CRC32C_IMPL"}
    if impl is not None:
        env["KVTIER_CRC32C_IMPL"] = impl
    done = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout), done.stderr


@pytest.fixture(scope="module")
def automatic() -> dict:
    result, stderr = run_child(None)
    assert stderr == ""
    return result


@pytest.fixture(scope="module")
def data() -> bytes:
    return np.random.default_rng(3).integers(0, 256, 70000, dtype=np.uint8).tobytes()


def check_crcs(result: dict, data: bytes) -> None:
    spans = result["spans"]
    for (offset, n), got, copied, equal in zip(
        spans, result["crcs"], result["copy_crcs"], result["copies_equal"], strict=True
    ):
        want = reference_crc32c(data[offset : offset + n], 0x12345678 * (n % 2))
        where = f"{result['implementation']}: {n} bytes at offset {offset}"
        assert got == want, where
        assert copied == want, f"crc32c_copy, {where}"
        assert equal, f"crc32c_copy did not copy exactly, {where}"


def test_automatic_choice_is_one_of_the_names(automatic: dict, data: bytes) -> None:
    assert automatic["implementation"] in NAMES
    assert automatic["hardware"] == (automatic["implementation"] != "table")
    check_crcs(automatic, data)


@pytest.mark.parametrize("impl", NAMES)
def test_each_implementation_when_forced(impl: str, automatic: dict, data: bytes) -> None:
    result, stderr = run_child(impl)
    if result["implementation"] == impl:
        assert stderr == ""
    else:
        # Not on this CPU: reported, and the automatic choice runs, the fastest the CPU has, so
        # the one asked for must be a faster (wider) one.
        assert f"KVTIER_CRC32C_IMPL={impl} is not a CRC32C implementation this CPU runs" in stderr
        assert result["implementation"] == automatic["implementation"]
        assert NAMES.index(impl) < NAMES.index(automatic["implementation"])
    check_crcs(result, data)


def test_unknown_name_is_reported_and_ignored(automatic: dict, data: bytes) -> None:
    result, stderr = run_child("crc-of-the-future")
    assert "KVTIER_CRC32C_IMPL=crc-of-the-future is not a CRC32C implementation" in stderr
    assert "supported here: auto, " in stderr
    assert result["implementation"] == automatic["implementation"]
    check_crcs(result, data)


def test_chunks_hook_xors_the_chunk_crcs(data: bytes) -> None:
    buf = np.frombuffer(data, dtype=np.uint8)
    for chunk in (1, 7, 4096, 65536, len(data), len(data) + 1):
        want = 0
        for at in range(0, len(data), chunk):
            want ^= _core.crc32c(data[at : at + chunk])
        assert _core._crc32c_chunks(buf, chunk) == want
        # An even number of passes cancels out; an odd one does not.
        assert _core._crc32c_chunks(buf, chunk, 2) == 0
        assert _core._crc32c_chunks(buf, chunk, 3) == want
    with pytest.raises(ValueError, match="chunk_bytes must be at least 1"):
        _core._crc32c_chunks(buf, 0)
    with pytest.raises((BufferError, ValueError)):  # numpy refuses a strided view
        _core._crc32c_chunks(np.zeros((64, 2), dtype=np.uint8)[:, 0], 8)


def test_concurrent_calls_agree(data: bytes) -> None:
    want = reference_crc32c(data)
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda _: _core.crc32c(data), range(64)))
    assert got == [want] * 64


def test_copy_of_a_large_buffer_between_numpy_arrays(data: bytes) -> None:
    src = np.random.default_rng(5).integers(0, 256, (4 << 20) + 5, dtype=np.uint8)
    dst = np.zeros_like(src)
    want = _core.crc32c(src)
    assert _core.crc32c_copy(dst, src) == want
    assert np.array_equal(dst, src)
    # Continued from a previous CRC, like crc32c(crc=...).
    head = _core.crc32c(data)
    assert _core.crc32c_copy(dst, src, head) == _core.crc32c(src, head)


def test_copy_refuses_what_memcpy_cannot_do() -> None:
    src = np.arange(256, dtype=np.uint8)
    with pytest.raises(ValueError, match="dst has 255 bytes and src 256"):
        _core.crc32c_copy(np.zeros(255, dtype=np.uint8), src)
    with pytest.raises(ValueError, match="dst and src overlap"):
        _core.crc32c_copy(src[8:136], src[:128])
    with pytest.raises((BufferError, TypeError)):  # bytes are read-only
        _core.crc32c_copy(bytes(256), src)
    with pytest.raises((BufferError, ValueError)):  # numpy refuses a strided view
        _core.crc32c_copy(np.zeros((256, 2), dtype=np.uint8)[:, 0], src)
    # Adjacent but not overlapping is a valid copy.
    buf = np.zeros(512, dtype=np.uint8)
    buf[:256] = src
    assert _core.crc32c_copy(buf[256:], buf[:256]) == _core.crc32c(src)
    assert np.array_equal(buf[256:], src)
    assert _core.crc32c_copy(bytearray(), b"") == 0


def test_copy_chunks_hook_modes(data: bytes) -> None:
    src = np.frombuffer(data, dtype=np.uint8)
    for chunk in (1, 4096, 65536, len(data) + 1):
        want = _core._crc32c_chunks(src, chunk)
        for mode in ("crc", "memcpy+crc", "fused", "fused-uncached"):
            dst = np.zeros_like(src)
            assert _core._crc32c_copy_chunks(dst, src, chunk, 1, mode) == want, mode
            if mode != "crc":
                assert np.array_equal(dst, src), mode
            else:
                assert not dst.any(), "the 'crc' mode must not write dst"
        dst = np.zeros_like(src)
        assert _core._crc32c_copy_chunks(dst, src, chunk, 3, "memcpy") == 0
        assert np.array_equal(dst, src)
    with pytest.raises(ValueError, match="mode must be"):
        _core._crc32c_copy_chunks(np.zeros_like(src), src, 4096, 1, "copy")
    with pytest.raises(ValueError, match="chunk_bytes must be at least 1"):
        _core._crc32c_copy_chunks(np.zeros_like(src), src, 0)
    with pytest.raises(ValueError, match="same length"):
        _core._crc32c_copy_chunks(np.zeros(10, dtype=np.uint8), src, 4096)


def test_concurrent_copies_agree(data: bytes) -> None:
    want = reference_crc32c(data)

    def copy(_: int) -> tuple[int, bool]:
        dst = bytearray(len(data))
        return _core.crc32c_copy(dst, data), dst == data

    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(copy, range(32)))
    assert got == [(want, True)] * 32

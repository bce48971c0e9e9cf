"""Job arguments are checked at submit, the same way by the fs tier and GPUStorageTransfer.

A mistake is refused there with a TypeError or ValueError naming the bad element and its
index; whatever a job contained, get_finished() never raises and reports every job once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from kvtier import _core
from kvtier.tiering.base import JobMetadata, ReqContext
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

ROWS = 8
ROW = 4096
SPEC = OffloadingSpec(model_name="validation", dtype="uint8")


class FsHolder:
    """The fs tier behind the same small interface as the transfer."""

    def __init__(self, root: str, **options: Any) -> None:
        self.primary = np.random.default_rng(1).integers(0, 256, (ROWS, ROW), dtype=np.uint8)
        self.tier = FileSystemTierManager(SPEC, memoryview(self.primary), root_dir=root, **options)

    def store(self, job_id: Any, block_ids: Any, keys: Any) -> None:
        self.tier.submit_store(JobMetadata(job_id, keys, block_ids, False, ReqContext("r")))

    def load(self, job_id: Any, block_ids: Any, keys: Any) -> None:
        self.tier.submit_load(JobMetadata(job_id, keys, block_ids, False, ReqContext("r")))

    def drain(self) -> None:
        self.tier.drain_jobs()

    def get_finished(self) -> list:
        return self.tier.get_finished()

    def row(self, b: int) -> bytes:
        return self.primary[b].tobytes()

    def shutdown(self) -> None:
        self.tier.shutdown()


class TransferHolder(FsHolder):
    def __init__(self, root: str, **options: Any) -> None:
        torch = pytest.importorskip("torch")
        from kvtier.gpu.transfer import GPUStorageTransfer

        self.kv = torch.randint(0, 256, (ROWS, ROW), dtype=torch.uint8)
        self.tier = GPUStorageTransfer([self.kv], SPEC, root, **options)

    def store(self, job_id: Any, block_ids: Any, keys: Any) -> None:
        self.tier.store(job_id, block_ids, keys)

    def load(self, job_id: Any, block_ids: Any, keys: Any) -> None:
        self.tier.load(job_id, block_ids, keys)

    def drain(self) -> None:
        self.tier.drain()

    def row(self, b: int) -> bytes:
        return self.kv[b].numpy().tobytes()


@pytest.fixture(params=["fs", "transfer"])
def make_holder(request, tmp_path) -> Iterator[Callable[..., FsHolder]]:
    made: list[FsHolder] = []

    def make(**options: Any) -> FsHolder:
        cls = FsHolder if request.param == "fs" else TransferHolder
        holder = cls(str(tmp_path / f"root{len(made)}"), **options)
        made.append(holder)
        return holder

    yield make
    for holder in made:
        holder.shutdown()


def finished(holder: FsHolder) -> dict[int, Any]:
    holder.drain()
    results = holder.get_finished()
    ids = [r.job_id for r in results]
    assert len(ids) == len(set(ids)), f"a job reported twice: {ids}"
    return {r.job_id: r for r in results}


def test_bytes_like_keys_are_copied_to_bytes_at_submit(make_holder):
    holder = make_holder()
    keys = [bytearray(b"key-one!"), memoryview(b"key-two!"), b"key-three"]
    holder.store(1, [0, 1, 2], keys)
    holder.store(2, [3], [b"unrelated"])
    results = finished(holder)  # never raises because of what a job contained
    assert sorted(results) == [1, 2]
    assert all(r.success for r in results.values()), results
    # The blocks are stored under the keys' bytes: loading them by bytes finds them.
    holder.load(3, [5, 6], [b"key-one!", b"key-two!"])
    result = finished(holder)[3]
    assert result.success, result.error
    assert holder.row(5) == holder.row(0)
    assert holder.row(6) == holder.row(1)


def test_fs_tier_store_counter_drops_back_after_bytearray_keys(tmp_path):
    holder = FsHolder(str(tmp_path))
    holder.store(1, [0], [bytearray(b"key")])
    assert sorted(finished(holder)) == [1]
    assert holder.tier.stats()["queued_store_jobs"] == 0
    holder.shutdown()


@pytest.mark.parametrize(
    "keys,error,pattern",
    [
        ([b"ok", 4], TypeError, r"keys\[1\] must be bytes .* got int 4"),
        ([b"ok", "text"], TypeError, r"keys\[1\] must be bytes .* got str"),
        ([None], TypeError, r"keys\[0\] must be bytes .* got NoneType"),
        (b"a-key", TypeError, "keys must be a sequence of keys"),
        ([b"ok", b""], ValueError, r"keys\[1\] is 0 bytes long"),
        ([b"x" * (_core.MAX_KEY_SIZE + 1)], ValueError, r"keys\[0\] is \d+ bytes long"),
    ],
)
def test_bad_keys_are_refused_at_submit(make_holder, keys, error, pattern):
    holder = make_holder()
    ids = list(range(len(keys))) if isinstance(keys, list) else [0]
    with pytest.raises(error, match=pattern):
        holder.store(1, ids, keys)
    with pytest.raises(error, match=pattern):
        holder.load(2, ids, keys)
    assert finished(holder) == {}


@pytest.mark.parametrize(
    "block_ids,error,pattern",
    [
        ([0, 1.9], TypeError, r"block_ids\[1\] must be an integer, got float 1.9"),
        (np.array([1.0, 2.0]), TypeError, r"block_ids\[0\] must be an integer, got float 1.0"),
        ([True, 1], TypeError, r"block_ids\[0\] must be an integer, got bool"),
        (np.array([False, True]), TypeError, r"block_ids\[0\] must be an integer, got bool"),
        (["0", 1], TypeError, r"block_ids\[0\] must be an integer, got str"),
        ([0, ROWS], ValueError, rf"block_ids\[1\] = {ROWS} is out of range \[0, {ROWS}\)"),
        (np.array([-1, 0]), ValueError, r"block_ids\[0\] = -1 is out of range"),
        ([0], ValueError, "2 keys but 1 block_ids"),
    ],
)
def test_bad_block_ids_are_refused_at_submit(make_holder, block_ids, error, pattern):
    holder = make_holder()
    keys = [b"key-a", b"key-b"]
    with pytest.raises(error, match=pattern):
        holder.store(1, block_ids, keys)
    with pytest.raises(error, match=pattern):
        holder.load(2, block_ids, keys)
    assert finished(holder) == {}


def test_numpy_integer_ids_are_accepted(make_holder):
    holder = make_holder()
    holder.store(np.int64(7), np.array([1, 2], dtype=np.uint32), [b"a", b"b"])
    holder.store(8, [np.int16(3)], [b"c"])
    results = finished(holder)
    assert sorted(results) == [7, 8]
    assert all(r.success for r in results.values())


@pytest.mark.parametrize("job_id", ["1", 1.0, True, None])
def test_bad_job_ids_are_refused(make_holder, job_id):
    holder = make_holder()
    with pytest.raises(TypeError, match="job_id must be an int"):
        holder.store(job_id, [0], [b"key"])
    assert finished(holder) == {}


def test_job_id_is_refused_until_its_result_is_handed_out(make_holder):
    holder = make_holder()
    holder.store(1, [0], [b"first"])
    with pytest.raises(ValueError, match="Job 1 is already in flight"):
        holder.store(1, [1], [b"second"])
    holder.drain()  # finished, not yet handed out
    with pytest.raises(ValueError, match="Job 1 is already in flight"):
        holder.load(1, [1], [b"first"])
    results = holder.get_finished()
    assert [r.job_id for r in results] == [1] and results[0].success
    holder.load(1, [2], [b"first"])  # handed out: the id is free again
    result = finished(holder)[1]
    assert result.success, result.error
    assert holder.row(2) == holder.row(0)


def test_store_dropped_with_eagain_keeps_its_id_until_reported(tmp_path):
    holder = FsHolder(str(tmp_path), max_queued_store_jobs=0)
    holder.store(1, [0], [b"dropped"])
    with pytest.raises(ValueError, match="Job 1 is already in flight"):
        holder.store(1, [1], [b"dropped-again"])
    (result,) = holder.get_finished()
    assert result.job_id == 1 and not result.success
    assert "EAGAIN" in result.error or "errno 11" in result.error
    holder.store(1, [1], [b"dropped-again"])  # reported: the id may be used again
    assert [r.job_id for r in holder.get_finished()] == [1]
    holder.shutdown()


@pytest.mark.parametrize("bad", ["text", bytearray(b"key"), 4])
def test_engine_binding_refuses_keys_that_are_not_bytes(tmp_path, bad):
    engine = _core.Engine(str(tmp_path))
    buffer = np.zeros(ROW, dtype=np.uint8)
    with pytest.raises(TypeError, match="block key must be bytes, got"):
        engine.submit_store(1, [(str(tmp_path / "b.kvb"), bad, buffer.ctypes.data, ROW)])
    engine.shutdown()
    assert engine.pop_completions() == []

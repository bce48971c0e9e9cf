"""Every consumer entry point from many threads at once, drain() under traffic, and
read-after-write per key, through each public layer: the engine binding
(``_core.Engine``), the fs tier and ``kvtier.gpu.GPUStorageTransfer`` (CPU tensors).

The concurrency scenarios run in a subprocess: a consumer race used to abort the process
("double free or corruption"), and a drain() that holds the GIL or never returns must end as
a failure, not a stuck test run. Nothing here asserts a timing; the deadlines are hang guards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

LAYERS = ["core", "fs", "gpu"]
HARD_TIMEOUT_S = 240  # the subprocess's own hang guards fire well before this

# The three layers behind one small interface, for the scripts below. Rows of 3000 bytes
# (fs, core) or blocks of 2 x 64 x 4-byte floats (gpu); keys from integers.
_PRELUDE = r"""
import json, os, sys, threading, time
import numpy as np
from kvtier import _core
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.factory import SecondaryTierFactory
from kvtier.tiering.spec import OffloadingSpec

LAYER, ROOT = sys.argv[1], sys.argv[2]
SPEC = OffloadingSpec(model_name="org/model", dtype="float32", kv_layout="NHD")
SLOTS, ROW = 64, 3000
CTX = ReqContext("r")
OPTIONS = {"n_read_threads": 2, "n_write_threads": 2, "o_direct": False}


def key(i):
    return make_offload_key(i.to_bytes(32, "big"), 0)


class Layer:
    def __init__(self):
        if LAYER == "core":
            self.rows = np.zeros((SLOTS, ROW), dtype=np.uint8)
            self.obj = _core.Engine(ROOT, **OPTIONS)
        elif LAYER == "fs":
            self.rows = np.zeros((SLOTS, ROW), dtype=np.uint8)
            config = {"type": "fs", "root_dir": ROOT, **OPTIONS}
            self.obj = SecondaryTierFactory.create_secondary_tier(
                config, memoryview(self.rows), SPEC)
        else:
            import torch
            from kvtier.gpu import GPUStorageTransfer

            self.kv = [torch.zeros(2, SLOTS, 64, dtype=torch.float32)]
            self.obj = GPUStorageTransfer(self.kv, SPEC, ROOT, block_dim=1, **OPTIONS)

    def path(self, i):
        if LAYER == "core":
            return os.path.join(ROOT, "blocks", str(i))
        return self.obj.file_mapper.get_file_name(key(i))

    def submit(self, job_id, i, load, slot=0):
        if LAYER == "core":
            addr = self.rows.__array_interface__["data"][0] + slot * ROW
            blocks = [(self.path(i), key(i), addr, ROW)]
            (self.obj.submit_load if load else self.obj.submit_store)(job_id, blocks)
        elif LAYER == "fs":
            job = JobMetadata(job_id, [key(i)], np.array([slot]), False, CTX)
            (self.obj.submit_load if load else self.obj.submit_store)(job)
        else:
            (self.obj.load if load else self.obj.store)(job_id, [slot], [key(i)])

    def submit_empty(self, job_id):  # a job without blocks completes inside submit
        if LAYER == "core":
            self.obj.submit_store(job_id, [])
        elif LAYER == "fs":
            self.obj.submit_store(JobMetadata(job_id, [], np.array([], dtype=np.int64), False, CTX))
        else:
            self.obj.store(job_id, [], [])

    def finished(self):
        if LAYER == "core":
            return [(c.job_id, c.success) for c in self.obj.pop_completions()]
        return [(r.job_id, r.success) for r in self.obj.get_finished()]

    def drain(self):
        if LAYER == "core":
            self.obj.drain()
        elif LAYER == "fs":
            self.obj.drain_jobs()
        else:
            self.obj.drain()

    def shutdown(self):
        self.obj.shutdown()
"""

_CONSUMERS = r"""
# Rounds: the main thread queues a batch of jobs (mostly without blocks: they complete at
# once), then all consumers start popping at the same moment, so that several of them are in
# the native pop at once with many completions to take.
layer = Layer()
rounds, per_round, n_consumers = 40, 400, 6
total = rounds * per_round
seen = [[] for _ in range(n_consumers)]
count = [0]
count_lock = threading.Lock()
start = threading.Barrier(n_consumers + 1, timeout=120)  # timeouts: hang guards
done = threading.Barrier(n_consumers + 1, timeout=120)


def consume(c):
    for r in range(rounds):
        start.wait()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            got = layer.finished()
            seen[c].extend(job_id for job_id, _ in got)
            with count_lock:
                count[0] += len(got)
                if count[0] >= (r + 1) * per_round:
                    break
        done.wait()


threads = [threading.Thread(target=consume, args=(c,)) for c in range(n_consumers)]
for t in threads:
    t.start()
for r in range(rounds):
    for j in range(r * per_round, (r + 1) * per_round):
        if j % 8:
            layer.submit_empty(j)
        else:
            layer.submit(j, j % 40, load=False, slot=j % SLOTS)
    start.wait()
    done.wait()
for t in threads:
    t.join()
layer.shutdown()
print(json.dumps({"seen": [j for ids in seen for j in ids], "rest": layer.finished()}))
"""

_DRAIN = r"""
# The submitter stores continuously and keeps a "gate" load in flight at every moment: a
# load of a FIFO blocks a worker in open() until a writer appears, and the submitter adds the
# next gate before it opens the previous one. So the engine is never idle while drain()
# waits. Bounded: it stops when drain() has returned, or at its hang guard.
layer = Layer()
drained = threading.Event()
state = {"submitted": 0, "gave_up": False}


def submitter():
    deadline = time.monotonic() + 60
    job_id, previous = 0, None
    while not drained.is_set():
        if time.monotonic() > deadline:
            state["gave_up"] = True
            break
        gate = layer.path(10**6 + job_id)
        os.makedirs(os.path.dirname(gate), exist_ok=True)
        os.mkfifo(gate)
        layer.submit(job_id, 10**6 + job_id, load=True, slot=1)
        job_id += 1
        if previous is not None:
            release(previous)
        previous = gate
        layer.submit(job_id, job_id % 200, load=False, slot=0)
        job_id += 1
        state["submitted"] = job_id
        time.sleep(0.0005)  # pacing only: keeps the backlog (and the FIFO count) small
    if previous is not None:
        release(previous)


def release(gate):
    # O_RDWR never blocks on a FIFO and counts as a writer: a load blocked in open() goes on
    # (then fails: a FIFO cannot be pread); one that has not opened it yet finds no file.
    os.close(os.open(gate, os.O_RDWR | os.O_NONBLOCK))
    os.unlink(gate)


t = threading.Thread(target=submitter)
t.start()
while state["submitted"] < 100 and t.is_alive():
    time.sleep(0.001)
before = state["submitted"]
layer.drain()
drained.set()
got = layer.finished()
t.join()
layer.drain()
layer.shutdown()
print(json.dumps({"before": before, "got": got, "gave_up": state["gave_up"]}))
"""


_ID_REUSE = r"""
# Submitters on several threads reuse each of their job ids as soon as a consumer thread has
# popped it, while workers run stores: freeing an id (the consumer) and taking it again (a
# submitter) race with the workers' bookkeeping on every round.
layer = Layer()
n_submitters, ids_each, rounds = 4, 4, 150
reported = {}
popped = {}
errors = []
stop = threading.Event()


def consumer():
    while not stop.is_set():
        for job_id, _ok in layer.finished():
            reported[job_id] = reported.get(job_id, 0) + 1
            popped[job_id].set()
        time.sleep(0.0002)


def submitter(t):
    ids = [t * ids_each + k for k in range(ids_each)]
    for r in range(rounds):
        for job_id in ids:
            popped[job_id] = threading.Event()
            try:
                if (r + job_id) % 3:
                    layer.submit_empty(job_id)
                else:
                    layer.submit(job_id, job_id, load=False, slot=job_id % SLOTS)
            except Exception as e:  # an id still in flight after it was popped
                errors.append(f"{job_id}: {e!r}")
                return
        for job_id in ids:
            if not popped[job_id].wait(120):  # hang guard
                errors.append(f"{job_id}: never reported")
                return


for job_id in range(n_submitters * ids_each):
    reported[job_id] = 0
c = threading.Thread(target=consumer)
c.start()
threads = [threading.Thread(target=submitter, args=(t,)) for t in range(n_submitters)]
for t in threads:
    t.start()
for t in threads:
    t.join()
stop.set()
c.join()
layer.drain()
rest = layer.finished()
layer.shutdown()
print(json.dumps({"errors": errors, "reported": reported, "rest": rest, "rounds": rounds}))
"""


def _run(script: str, layer: str, root: Path) -> dict:
    if layer == "gpu":
        pytest.importorskip("torch", reason="GPUStorageTransfer needs torch")
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_PRELUDE + script), layer, str(root)],
        capture_output=True,
        text=True,
        timeout=HARD_TIMEOUT_S,
    )
    assert proc.returncode == 0, f"rc {proc.returncode}\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("layer", LAYERS)
def test_consumers_on_many_threads_get_each_job_exactly_once(tmp_path: Path, layer: str) -> None:
    out = _run(_CONSUMERS, layer, tmp_path / "root")
    ids = out["seen"] + [job_id for job_id, _ in out["rest"]]
    assert len(ids) == len(set(ids)), "a job was reported twice"
    assert sorted(ids) == list(range(40 * 400))


@pytest.mark.parametrize("layer", LAYERS)
def test_ids_popped_on_one_thread_are_reused_at_once_on_others(tmp_path: Path, layer: str) -> None:
    out = _run(_ID_REUSE, layer, tmp_path / "root")
    assert out["errors"] == []
    assert out["rest"] == [], "a job was reported after its id was already reused"
    assert set(out["reported"].values()) == {out["rounds"]}, "a job was lost or reported twice"


@pytest.mark.parametrize("layer", LAYERS)
def test_drain_returns_while_another_thread_keeps_storing(tmp_path: Path, layer: str) -> None:
    out = _run(_DRAIN, layer, tmp_path / "root")
    assert not out["gave_up"], "drain() did not return while another thread kept submitting"
    done = {job_id: ok for job_id, ok in out["got"]}
    missing = [j for j in range(out["before"]) if j not in done]
    assert missing == [], f"jobs submitted before drain() not complete after it: {missing[:10]}"
    # Odd ids are stores (even ids are the gate loads, which fail by design).
    assert all(done[j] for j in range(1, out["before"], 2))


# ---- read-after-write, in process ---------------------------------------------------------

SPEC = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
CTX = ReqContext("req-0")


def _key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


@pytest.mark.parametrize(("readers", "writers"), [(1, 0), (2, 2), (0, 1)])
def test_fs_tier_load_right_after_store_sees_the_stored_bytes(
    tmp_path: Path, collect_results, readers: int, writers: int
) -> None:
    # No drain between the two submits: the load must wait for the pending stores of its
    # keys. With one load-first worker the loads would otherwise run first and miss.
    n = 16
    rows = np.random.default_rng(3).integers(0, 256, (2 * n, 5000), dtype=np.uint8)
    rows[n:] = 0
    config = {
        "type": "fs",
        "root_dir": str(tmp_path / "root"),
        "n_read_threads": readers,
        "n_write_threads": writers,
    }
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), SPEC)
    try:
        keys = [_key(i) for i in range(n)]
        tier.submit_store(JobMetadata(1, keys, np.arange(n), False, CTX))
        tier.submit_load(JobMetadata(2, keys, np.arange(n, 2 * n), True, CTX))
        results = collect_results(tier, [1, 2])
        assert results[1].success, results[1].error
        assert results[2].success, results[2].error
        assert (rows[n:] == rows[:n]).all()
    finally:
        tier.shutdown()

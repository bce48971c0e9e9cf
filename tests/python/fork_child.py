"""A process that forks while its tier (or transfer) has a job in flight, for test_fork.py.

Run under LD_PRELOAD=faultinject.so with KVTIER_FAULT=open, KVTIER_FAULT_ERRNO=0,
KVTIER_FAULT_MATCH=.kvb and KVTIER_FAULT_GATE=<gate> (as faults/teardown_child.py): every
open of a block file waits until the gate file exists, so a store is held in flight across
the fork in every run.

argv: holder locks root gate
  holder  fs (FileSystemTierManager) or gpu (GPUStorageTransfer over a CPU tensor), both with
          a byte budget, so the capacity thread and the budget lease exist too
  locks   held or free: whether, before forking, another thread takes kvtier's module-level
          locks (the capacity registry, the io-engine
          warnings) and holds them across the fork, as a thread creating a tier would

The forked child checks that the inherited
holder refuses work and needs no teardown, makes a holder of its own on the same root (which
takes those locks), stores and loads with it, and exits through the interpreter's normal
finalization with the inherited holder still referenced. Each process prints one JSON line:
the child's first ("child": its checks), then the parent's ("parent": the child's exit
status, its own held job, its budget lease).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 16
ROW = 64 * 1024
BUDGET = "64MiB"
CHILD_WAIT_S = 120.0
WAIT_S = 60.0
FORK_MESSAGE = "cannot be used in a process forked from it"


def make_holder(kind: str, memory: np.ndarray, root: str) -> Any:
    from kvtier.tiering.spec import OffloadingSpec

    spec = OffloadingSpec("fork", "uint8")
    # One worker: the gated store holds it, so the rest of the job stays queued.
    options = {"n_read_threads": 1, "n_write_threads": 0, "max_bytes": BUDGET}
    if kind == "fs":
        from kvtier.tiering.fs.manager import FileSystemTierManager

        return FileSystemTierManager(spec, memoryview(memory), root_dir=root, **options)
    import torch
    from kvtier.gpu.transfer import GPUStorageTransfer

    return GPUStorageTransfer([torch.from_numpy(memory)], spec, root, **options)


def keys(first: int) -> list[bytes]:
    return [b"fork-%d" % i for i in range(first, first + ROWS)]


def submit(holder: Any, job_id: int, store: bool, first_key: int) -> None:
    if hasattr(holder, "submit_store"):
        from kvtier.tiering.base import JobMetadata, ReqContext

        job = JobMetadata(job_id, keys(first_key), np.arange(ROWS), False, ReqContext("r"))
        (holder.submit_store if store else holder.submit_load)(job)
    else:
        (holder.store if store else holder.load)(job_id, list(range(ROWS)), keys(first_key))


def wait_for(holder: Any, job_id: int) -> Any:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for result in holder.get_finished():
            if result.job_id == job_id:
                return result
        time.sleep(0.002)
    raise SystemExit(f"timed out waiting for job {job_id}")


def refusal(call: Any) -> str:
    """'refused' when ``call`` raises the fork error, else what happened instead."""
    try:
        call()
    except RuntimeError as e:
        return "refused" if FORK_MESSAGE in str(e) else f"other RuntimeError: {e}"
    except Exception as e:  # noqa: BLE001 - reported to the test, which names it
        return f"{type(e).__name__}: {e}"
    return "not refused"


def hold_module_locks(held: threading.Event, release: threading.Event) -> None:
    from kvtier.tiering.fs import engine
    from kvtier.tiering.fs.capacity import controller

    # (The capacity ledger keeps no process-wide locks or descriptors: OFD locks belong to
    # each descriptor.)
    locks = [controller._registry_lock, engine._warned_lock]
    for lock in locks:
        lock.acquire()
    held.set()
    release.wait()
    for lock in locks:
        lock.release()


def child(kind: str, inherited: Any, memory: np.ndarray, root: str) -> dict[str, Any]:
    checks: dict[str, Any] = {}
    checks["submit"] = refusal(lambda: submit(inherited, 3, True, 1000))
    checks["get_finished"] = refusal(inherited.get_finished)
    checks["stats"] = refusal(inherited.stats)
    if kind == "fs":
        checks["lookup"] = refusal(lambda: inherited.lookup(keys(0)[0]))
        checks["drain"] = refusal(inherited.drain_jobs)
        checks["is_shut_down"] = inherited.is_shut_down
    else:
        checks["drain"] = refusal(inherited.drain)
    inherited.shutdown()  # returns at once: nothing of it runs here
    # A holder of the child's own, on the same root: takes the locks the parent's thread held.
    own = make_holder(kind, memory, root)
    memory[:] = np.arange(memory.size, dtype=np.uint64).reshape(memory.shape).astype(np.uint8)
    expected = memory.copy()
    submit(own, 10, True, 2000)
    checks["own_store"] = wait_for(own, 10).success
    memory[:] = 0
    submit(own, 11, False, 2000)
    checks["own_load"] = wait_for(own, 11).success
    checks["own_bytes_exact"] = bool(np.array_equal(memory, expected))
    own.shutdown()
    return checks


def wait_child(pid: int) -> str:
    deadline = time.monotonic() + CHILD_WAIT_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFSIGNALED(status):
                return f"signal {os.WTERMSIG(status)}"
            return f"exit {os.WEXITSTATUS(status)}"
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung (killed)"


def main() -> int:
    kind, locks, root, gate_arg = sys.argv[1:5]
    gate = Path(gate_arg)
    gate.touch()
    memory = np.zeros((ROWS, ROW), dtype=np.uint8)
    holder = make_holder(kind, memory, root)
    submit(holder, 1, True, 0)
    assert wait_for(holder, 1).success
    gate.unlink()
    submit(holder, 2, True, 100)  # held at the gate across the fork
    deadline = time.monotonic() + WAIT_S
    while holder.stats()["running_stores"] < 1:
        if time.monotonic() > deadline:
            raise SystemExit("the held store never started")
        time.sleep(0.002)

    held, release = threading.Event(), threading.Event()
    locker = threading.Thread(target=hold_module_locks, args=(held, release))
    if locks == "held":
        locker.start()
        held.wait()
    pid = os.fork()
    if pid == 0:
        print(json.dumps({"child": child(kind, holder, memory, root)}), flush=True)
        global kept  # the inherited holder is torn down by the interpreter's exit
        kept = holder
        sys.exit(0)
    release.set()
    if locker.is_alive():
        locker.join()
    gate.touch()
    report: dict[str, Any] = {"child_status": wait_child(pid)}
    # The child's exit must not have handed back the parent's budget lease (read before the
    # parent's own next reservation could write it again).
    from kvtier.tiering.fs.capacity.ledger import UsageLedger

    writer = holder._capacity._slot.id
    report["lease_kept"] = writer in UsageLedger(os.path.abspath(root)).read().writers
    report["held_job"] = wait_for(holder, 2).success
    submit(holder, 4, True, 200)
    report["stores_after"] = wait_for(holder, 4).success
    holder.shutdown()
    print(json.dumps({"parent": report}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

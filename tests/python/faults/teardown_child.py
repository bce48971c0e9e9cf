"""Child process for the teardown tests: a tier or transfer dropped with block operations in
flight, without shutdown().

Run under LD_PRELOAD=faultinject.so with KVTIER_FAULT=open, KVTIER_FAULT_ERRNO=0,
KVTIER_FAULT_MATCH=.kvb and KVTIER_FAULT_GATE=<gate>: every open of a block (or block tmp)
file waits until the gate file exists, which holds one block operation in flight for as long
as the child wants.

argv: scenario holder kind root gate
  scenario  drop: drop the holder and collect it, then map memory again and check that
                  nothing writes into it; prints "ok"
            exit: leave the holder in a global with the job queued and let the interpreter
                  exit; prints "ok" first
            exit-daemon: the same, the holder referenced by a daemon thread that never ends
            exit-drop-daemon: the same, the last reference dropped by a daemon thread while
                  the interpreter exits (the engine is destroyed beside the exit hook)
            gil:  drop the holder while a Python thread runs; prints JSON saying whether that
                  thread ran during the destruction
  holder    fs (FileSystemTierManager) or gpu (GPUStorageTransfer over a CPU tensor)
  kind      store or load: the job in flight

The primary memory is an anonymous mmap, unmapped as soon as its last reference goes, and
starts one byte past a page (so block bytes go through staging copies): a worker that touched
it after that would fault at once instead of scribbling unnoticed.
"""

from __future__ import annotations

import gc
import json
import mmap
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROWS = 32
ROW = 64 * 1024
SIZE = ROWS * ROW + mmap.PAGESIZE
SENTINEL = 0xA5
WAIT_S = 60.0


def spec() -> Any:
    from kvtier.tiering.spec import OffloadingSpec

    return OffloadingSpec("teardown", "uint8")


def make_holder(holder: str, memory: mmap.mmap, root: str) -> Any:
    # One worker (it takes stores too when no load waits): exactly one block operation runs.
    threads = {"n_read_threads": 1, "n_write_threads": 0}
    if holder == "fs":
        from kvtier.tiering.fs.manager import FileSystemTierManager

        view = memoryview(memory)[1 : 1 + ROWS * ROW].cast("B", (ROWS, ROW))
        return FileSystemTierManager(spec(), view, root_dir=root, **threads)
    import torch
    from kvtier.gpu.transfer import GPUStorageTransfer

    tensor = torch.frombuffer(memory, dtype=torch.uint8)[1 : 1 + ROWS * ROW].view(ROWS, ROW)
    return GPUStorageTransfer([tensor], spec(), root, **threads)


def keys() -> list[bytes]:
    return [b"teardown-%d" % i for i in range(ROWS)]


def submit(holder: Any, job_id: int, kind: str) -> None:
    if hasattr(holder, "submit_store"):
        from kvtier.tiering.base import JobMetadata, ReqContext

        job = JobMetadata(job_id, keys(), np.arange(ROWS), False, ReqContext("r"))
        (holder.submit_store if kind == "store" else holder.submit_load)(job)
    else:
        (holder.store if kind == "store" else holder.load)(job_id, list(range(ROWS)), keys())


def wait_until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.002)


def start_held_job(holder: Any, kind: str, gate: Path) -> None:
    """Stores every row (gate open) when the held job is a load, then closes the gate and
    submits the job; returns once one of its block operations is held at the gate."""
    if kind == "load":
        submit(holder, 1, "store")
        finished: list = []
        wait_until(lambda: finished.extend(holder.get_finished()) or finished, "the store")
        assert finished[0].success, finished[0].error
    gate.unlink()
    submit(holder, 2, kind)
    running = "running_loads" if kind == "load" else "running_stores"
    wait_until(lambda: holder.stats()[running] >= 1, "a block operation in flight")


def open_gate_later(gate: Path, seconds: float) -> subprocess.Popen:
    # Another process, so the gate opens even while this one is stuck holding the GIL. Its own
    # session and no inherited pipes: killing it ends its sleep too, and the test's wait for
    # this child's output never waits for it.
    return subprocess.Popen(
        ["sh", "-c", f"sleep {seconds}; touch '{gate}'"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def run_gil(box: list[Any], gate: Path) -> int:
    """Drops the holder (the only reference is in ``box``) while a Python thread counts and
    then opens the gate."""
    opener = open_gate_later(gate, 15)  # lets a broken build finish, late
    state = {"counter": 0, "opened_by_python": False}
    go, stop = threading.Event(), threading.Event()

    def spin() -> None:
        go.wait()
        time.sleep(0.3)  # the main thread is inside the destruction by now
        if not gate.exists():
            state["opened_by_python"] = True
            gate.touch()
        while not stop.is_set():
            state["counter"] += 1

    thread = threading.Thread(target=spin, daemon=True)
    thread.start()
    go.set()
    before = state["counter"]
    box.clear()
    gc.collect()
    during = state["counter"] - before
    stop.set()
    thread.join()
    os.killpg(opener.pid, signal.SIGKILL)
    opener.wait()
    print(json.dumps({**state, "advanced_during_destruction": during}), flush=True)
    return 0


def hold_forever(holder: Any) -> None:
    threading.Event().wait()  # `holder` stays referenced by this frame


def main() -> int:
    scenario, holder_kind, kind, root, gate_arg = sys.argv[1:6]
    gate = Path(gate_arg)
    gate.touch()
    memory = mmap.mmap(-1, SIZE)
    holder = make_holder(holder_kind, memory, root)
    start_held_job(holder, kind, gate)

    if scenario == "gil":
        # The memory stays referenced here: this scenario is about the GIL alone.
        box = [holder]
        del holder
        return run_gil(box, gate)

    del memory  # from here on only the holder keeps the memory mapped
    if scenario == "exit":
        global kept  # a module global, torn down by the interpreter's exit
        kept = holder
        open_gate_later(gate, 0.3)
        print("ok", flush=True)
        return 0
    if scenario == "exit-daemon":
        # A daemon thread's frame is never torn down: the holder is never collected, so only
        # the exit hook stops its engine.
        threading.Thread(target=hold_forever, args=(holder,), daemon=True).start()
        del holder
        open_gate_later(gate, 0.3)
        print("ok", flush=True)
        return 0

    if scenario == "exit-drop-daemon":
        import atexit

        exiting = threading.Event()

        def drop_when_exiting(box: list[Any]) -> None:
            exiting.wait()
            box.clear()  # the last reference: the engine is destroyed on this daemon thread

        box = [holder]
        del holder
        threading.Thread(target=drop_when_exiting, args=(box,), daemon=True).start()
        del box
        # Registered after kvtier's own exit hook, so it runs first (atexit is last in,
        # first out): the daemon thread drops the engine as the interpreter exits.
        atexit.register(exiting.set)
        open_gate_later(gate, 0.3)
        print("ok", flush=True)
        return 0

    opener = open_gate_later(gate, 0.5)
    del holder
    gc.collect()
    # The memory is gone; map the same amount again (the kernel tends to reuse the range)
    # and make sure that no worker writes into it once the held operation is let go.
    again = mmap.mmap(-1, SIZE)
    again.write(bytes([SENTINEL]) * SIZE)
    opener.wait()
    time.sleep(0.3)
    assert again[:] == bytes([SENTINEL]) * SIZE, "a worker wrote into freed memory"
    print("ok", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

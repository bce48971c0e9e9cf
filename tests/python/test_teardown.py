"""A tier or transfer dropped without shutdown() never lets a worker touch freed memory, and
its destruction never holds the GIL while workers finish.

Each case runs faults/teardown_child.py under the fault interposer, whose gate holds a block
operation in flight (see the child's docstring); a crash shows as a negative exit status.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

FAULTS = Path(__file__).resolve().parent / "faults"
CHILD_TIMEOUT_S = 120
HOLDERS = ["fs", "gpu"]


def run_child(
    gated_env: Callable[[Path], dict], tmp_path: Path, scenario: str, holder: str, kind: str
) -> subprocess.CompletedProcess:
    if holder == "gpu":
        pytest.importorskip("torch")
    tmp_path.mkdir(parents=True, exist_ok=True)
    gate = tmp_path / "gate"
    env = gated_env(gate)
    args = [scenario, holder, kind, str(tmp_path / "root"), str(gate)]
    return subprocess.run(
        [sys.executable, str(FAULTS / "teardown_child.py"), *args],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=CHILD_TIMEOUT_S,
    )


def assert_clean(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"child exited {proc.returncode}\n{proc.stderr[-4000:]}"
    # The gate really held a block operation: the interposer logs every open it gated.
    assert "kvtier-fault: open " in proc.stderr


# The transfer (slow to start: it imports torch) with a load only: its stores read the same
# memory through the same staging copies.
@pytest.mark.parametrize("holder,kind", [("fs", "store"), ("fs", "load"), ("gpu", "load")])
def test_dropped_holder_stops_its_workers_before_freeing_memory(gated_env, tmp_path, holder, kind):
    proc = run_child(gated_env, tmp_path, "drop", holder, kind)
    assert_clean(proc)
    assert proc.stdout.split() == ["ok"]


# The fs tier five times over, as the defect showed 5 of 5; the transfer (slow to start: it
# imports torch) once.
@pytest.mark.parametrize("holder,runs", [("fs", 5), ("gpu", 1)])
def test_interpreter_exit_with_stores_queued_is_clean(gated_env, tmp_path, holder, runs):
    for run in range(runs):
        proc = run_child(gated_env, tmp_path / str(run), "exit", holder, "store")
        assert_clean(proc)
        assert proc.stdout.split() == ["ok"]
        assert_exit_finished_the_running_store(tmp_path / str(run))


# Blocks one worker runs as a unit: psync takes one; io_uring up to 8 of a job at once
# (kvtier::detail::kMaxBatchBlocks), all started before the gate holds the first.
MAX_BATCH_BLOCKS = 8


def assert_exit_finished_the_running_store(tmp_path: Path) -> None:
    # One store batch was running (held at the gate) and finished; the queued ones were
    # cancelled.
    root = tmp_path / "root"
    assert 1 <= len(list(root.rglob("*.kvb"))) <= MAX_BATCH_BLOCKS
    assert list(root.rglob("*.tmp")) == []


def test_engine_dropped_by_a_daemon_thread_during_exit(gated_env, tmp_path):
    # Its destructor stops the engine with the GIL released; waiting for the GIL again while
    # the interpreter finalizes would end the thread with a forced unwind (std::terminate).
    for run in range(3):
        proc = run_child(gated_env, tmp_path / str(run), "exit-drop-daemon", "fs", "store")
        assert_clean(proc)
        assert proc.stdout.split() == ["ok"]
        assert_exit_finished_the_running_store(tmp_path / str(run))


def test_interpreter_exit_stops_an_engine_that_is_never_collected(gated_env, tmp_path):
    proc = run_child(gated_env, tmp_path, "exit-daemon", "fs", "store")
    assert_clean(proc)
    assert proc.stdout.split() == ["ok"]
    assert_exit_finished_the_running_store(tmp_path)


@pytest.mark.parametrize("holder", HOLDERS)
def test_python_threads_run_while_an_engine_is_destroyed(gated_env, tmp_path, holder):
    proc = run_child(gated_env, tmp_path, "gil", holder, "store")
    assert_clean(proc)
    state = json.loads(proc.stdout)
    # The held block operation ends only once the gate opens: a Python thread opened it, and
    # counted on, while the main thread was inside the destruction.
    assert state["opened_by_python"], state
    assert state["advanced_during_destruction"] > 0, state


_EXIT_AFTER_AN_EARLIER_FINALIZER = """
import sys, tempfile, time, weakref

class Anything:
    pass

# A finalizer made before kvtier is imported (tempfile, torch and others make them): weakref's
# atexit hook then runs after kvtier's, and the tier below is closed from it.
keep = Anything()
weakref.finalize(keep, lambda: None)

import numpy as np
from kvtier.tiering.fs.capacity import controller
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

close = controller.CapacityController.close

def reporting_close(self, *args, **kwargs):
    close(self, *args, **kwargs)
    print("capacity thread finished:", self._exited.is_set(), flush=True)

controller.CapacityController.close = reporting_close
buf = np.zeros((2, 4096), dtype=np.uint8)
tier = FileSystemTierManager(
    OffloadingSpec(model_name="org/x", dtype="float16", kv_layout="NHD"), memoryview(buf), "fs",
    root_dir=sys.argv[1], max_bytes="1GiB", n_read_threads=1, n_write_threads=1,
)
assert tier._capacity.admit(1) is None  # its record now has a store to settle at close
print("exiting", flush=True)
"""


def test_a_tier_closed_by_a_finalizer_after_the_exit_hook_finishes_its_capacity_thread(tmp_path):
    """The capacity thread's last record (a CRC through the core, GIL released) is written
    while atexit hooks still run: taking the GIL back there must not park the thread, or
    close() waits out its deadline (11 s by default) and the record is lost."""
    proc = subprocess.run(
        [sys.executable, "-c", _EXIT_AFTER_AN_EARLIER_FINALIZER, str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.split("\n")[:2] == ["exiting", "capacity thread finished: True"], (
        proc.stdout + proc.stderr[-2000:]
    )

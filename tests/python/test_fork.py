"""fork() in a process using kvtier: the child inherits tiers but none of their threads.

Before, a child that merely exited with a tier alive died of SIGSEGV (the engine's destructor
joined worker threads that do not exist in a child), its exit handed the parent's budget lease
back, and a child making a tier of its own hung on a lock another thread held at the fork.
Each case runs fork_child.py (a crash or hang shows in its report); see its docstring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
TIMEOUT_S = 300


def run_fork_child(
    gated_env: Callable[[Path], dict], tmp_path: Path, holder: str, locks: str
) -> tuple[dict, dict]:
    gate = tmp_path / "gate"
    env = gated_env(gate)
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "fork_child.py"),
            holder,
            locks,
            str(tmp_path / "root"),
            str(gate),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    reports = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            reports.update(json.loads(line))
    assert "child" in reports, f"the child printed no report\n{proc.stderr[-4000:]}"
    assert "parent" in reports, proc.stderr[-4000:]
    return reports["child"], reports["parent"]


# "held": another thread holds kvtier's module locks across the fork (the child hung);
# "free": it does not (the child crashed at exit, after handing the parent's lease back).
@pytest.mark.parametrize("locks", ["held", "free"])
@pytest.mark.parametrize("holder", ["fs", "gpu"])
def test_forked_child_refuses_inherited_holder_and_makes_its_own(
    gated_env, tmp_path, holder, locks
):
    if holder == "gpu":
        pytest.importorskip("torch")
    child, parent = run_fork_child(gated_env, tmp_path, holder, locks)
    for call in ("submit", "get_finished", "stats", "drain") + (
        ("lookup",) if holder == "fs" else ()
    ):
        assert child[call] == "refused", (call, child[call])
    if holder == "fs":
        assert child["is_shut_down"] is True
    # Its own holder on the same root works, although another thread of the parent held the
    # module locks when it forked.
    assert child["own_store"] and child["own_load"] and child["own_bytes_exact"], child
    # It exited through finalization with the inherited holder alive: no crash, no hang.
    assert parent["child_status"] == "exit 0", parent
    # The parent goes on: the store held across the fork completes, its lease is its own.
    assert parent["held_job"] and parent["stores_after"], parent
    assert parent["lease_kept"], parent


def test_fork_while_engines_are_made_and_dropped(tmp_path):
    """The native engine registry's lock, taken whenever an engine is made or dropped, is
    never inherited locked: children forked while other threads churn engines each make and
    drop an engine of their own and exit (probabilistic: the lock is held only briefly)."""
    from kvtier import _core

    stop = threading.Event()

    def churn(i: int) -> None:
        n = 0
        while not stop.is_set():
            _core.Engine(str(tmp_path / f"churn{i}-{n % 4}"), n_read_threads=1, n_write_threads=1)
            n += 1

    threads = [threading.Thread(target=churn, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    statuses = []
    try:
        for k in range(40):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    _core.Engine(str(tmp_path / f"child{k}"), n_read_threads=1, n_write_threads=1)
                    code = 0
                finally:
                    os._exit(code)
            statuses.append(wait_or_kill(pid))
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert statuses == ["exit 0"] * len(statuses)


def wait_or_kill(pid: int, seconds: float = 60.0) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return (
                f"signal {os.WTERMSIG(status)}"
                if os.WIFSIGNALED(status)
                else f"exit {os.WEXITSTATUS(status)}"
            )
        time.sleep(0.005)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung (killed)"

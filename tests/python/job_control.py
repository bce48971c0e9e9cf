"""Stopping a process with SIGSTOP and knowing that it has stopped: the signal is delivered
asynchronously, so a test that must act while a process is frozen waits for the kernel to
report the state ``T`` (stopped) in ``/proc/PID/stat`` first."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

STOP_WAIT_SECONDS = 10.0  # a hang guard: a stopped process is reported within milliseconds


def is_stopped(pid: int) -> bool:
    """Whether ``pid`` is stopped by a signal or a tracer (False once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def stop(pid: int, timeout: float = STOP_WAIT_SECONDS) -> None:
    """SIGSTOPs ``pid`` and returns once it is stopped."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while not is_stopped(pid):
        if time.monotonic() > deadline:
            raise TimeoutError(f"process {pid} did not stop")
        time.sleep(0.001)

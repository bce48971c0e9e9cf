"""A hang guard for calls that must return while storage is stalled: the call runs on a
daemon thread, and the test fails (instead of hanging the run) if it has not returned in
time. A guard for a frozen mount, never a timing check."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from typing import Any

from stallfs import WAIT_SECONDS


def guarded(fn: Callable[[], Any], what: str, timeout: float = WAIT_SECONDS) -> Any:
    """Runs ``fn`` on a thread; returns its result, raises its exception, or fails the test
    if it does not return within ``timeout`` seconds."""
    box: list[Any] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            box.append(fn())
        except BaseException as e:  # handed to the test's thread
            errors.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout)
    assert not thread.is_alive(), f"{what} blocked"
    if errors:
        raise errors[0]
    return box[0] if box else None


def expect_line(child: subprocess.Popen[str], expected: str, what: str) -> None:
    """The child's next line of output is ``expected``, under the hang guard; if it is not, the
    failure shows the child's stderr once it has exited (else the line it wrote)."""
    assert child.stdout is not None
    line = guarded(child.stdout.readline, what)
    assert line == expected, (
        child.stderr.read() if child.poll() is not None and child.stderr else line
    )


def prompt(child: subprocess.Popen[str]) -> None:
    """Lets the child go past its next ``sys.stdin.readline()``."""
    assert child.stdin is not None
    child.stdin.write("\n")
    child.stdin.flush()

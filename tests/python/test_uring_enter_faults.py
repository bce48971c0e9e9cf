"""io_uring_enter errors on a tier whose rings are set up and in use (issue 19).

A child process (uring_faults.py, faults/uring_enter_child.py) runs an fs tier on
io_engine="io_uring" with one read and one write worker. After a warm-up store and load, a
seccomp filter makes its io_uring_enter calls fail with one errno, and the child stores,
loads and shuts down.

What the engine does (io_uring_engine.cpp, complete()): EINTR, EAGAIN and EBUSY are reaped
and retried with a bounded back-off; a ring whose io_uring_enter keeps failing (twelve times
in a row), or fails with anything else (ENOMEM, EBADF, ...), is given up: the blocks the
kernel never took run again on pread/pwrite, the worker stays on psync, one warning is
logged and stats()["io_uring_rings_retired"] counts it. Before this, every one of these
errors ended the process with SIGABRT (exit status 134) except EINTR, which spun for ever.
"""

from __future__ import annotations

import errno

import pytest

TRANSIENT = [errno.EINTR, errno.EAGAIN, errno.EBUSY]
FATAL = [errno.ENOMEM, errno.EBADF]


def _assert_lived_and_reported(run) -> None:
    assert run.exit_status == 0, run.describe()
    assert run.events["warm"]["success"], run.describe()
    assert run.events["store"]["success"], run.describe()
    assert run.events["load"]["success"], run.describe()
    assert run.events["load"]["data_ok"], run.describe()
    assert run.events["shutdown"]["error"] is None, run.describe()
    # Every job (warm-up store and load, the store, the load) reported exactly once.
    assert run.events["done"]["reports"] == {"1": 1, "2": 1, "3": 1, "4": 1}, run.describe()


@pytest.mark.parametrize("times", [1, 3])
@pytest.mark.parametrize("arm_before", ["store", "load"])
@pytest.mark.parametrize("err", TRANSIENT, ids=errno.errorcode.get)
def test_a_transient_error_is_retried_on_the_ring(
    uring_enter_fault, err, arm_before, times
) -> None:
    run = uring_enter_fault(err, times, arm_before=arm_before)
    _assert_lived_and_reported(run)
    assert run.events["done"]["injected"] == times, run.describe()  # the fault did fire
    # A few failures in a row are retried: the ring stays, nothing is said.
    assert run.events["done"]["rings_retired"] == 0, run.describe()
    assert run.events["done"]["ring_warnings"] == 0, run.describe()


@pytest.mark.parametrize("arm_before", ["store", "load"])
@pytest.mark.parametrize("err", TRANSIENT + FATAL, ids=errno.errorcode.get)
def test_a_ring_that_keeps_failing_is_retired_for_psync(uring_enter_fault, err, arm_before) -> None:
    run = uring_enter_fault(err, None, arm_before=arm_before)
    _assert_lived_and_reported(run)
    done = run.events["done"]
    assert done["injected"] > 0, run.describe()
    # Retired: the ring of each worker that met the fault; a worker takes the other queue's
    # jobs when its own is empty, so the load may run on either, but a retired worker never
    # enters io_uring again: after a store, one or both rings; after a load, one.
    assert done["rings_retired"] in ((1, 2) if arm_before == "store" else (1,)), run.describe()
    assert done["ring_warnings"] == 1, run.describe()  # one warning, however many rings
    # Transient errors are retried (a bounded number of times) before the ring goes; others
    # retire it at the first failure. Either way a retired ring is never entered again.
    per_ring = done["injected"] / done["rings_retired"]
    assert per_ring == (12 if err in TRANSIENT else 1), run.describe()
    assert done["calls"] == done["injected"], run.describe()


def test_a_failure_once_the_batch_completed_is_retried_quietly(uring_enter_fault) -> None:
    # ENOMEM once: the ring goes at its first failure, the blocks run on psync, the rest of the
    # run goes through the other worker's ring (the load), which is never faulted again.
    run = uring_enter_fault(errno.ENOMEM, 1, arm_before="store")
    _assert_lived_and_reported(run)
    assert run.events["done"]["rings_retired"] == 1, run.describe()
    assert run.events["done"]["ring_warnings"] == 1, run.describe()


def test_the_filter_hits_io_uring_enter_only(uring_enter_fault) -> None:
    # The same filter on a psync tier: no call matches, and every job works.
    run = uring_enter_fault(errno.EAGAIN, None, options={"io_engine": "psync"})
    assert run.exit_status == 0, run.describe()
    assert run.events["store"]["success"] and run.events["load"]["data_ok"], run.describe()
    assert run.events["done"]["calls"] == 0 and run.events["done"]["injected"] == 0, run.describe()

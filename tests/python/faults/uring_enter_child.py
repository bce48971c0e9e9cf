"""Child process of the io_uring_enter fault harness (tests/python/uring_faults.py).

argv[1] is a JSON spec: {"lib": path of seccomp_errno.so, "root": str, "errno": int,
"times": int | null, "blocks": int, "row_bytes": int, "job_timeout": float,
"arm_before": "store" | "load", "options": {more fs tier options}}.

It makes an fs tier on io_engine="io_uring" with one read and one write thread, and stores and
loads one block so the workers' rings are set up and used. Then every io_uring_enter of the
process fails with the errno (the first `times` calls, or always), and it stores `blocks`
blocks, loads them back and shuts down; with arm_before "load" the fault starts after that
store, so it hits the loads only. Each step prints one JSON line as soon as it happens
({"event": name, ...}), so a parent sees how far the child got even if it dies or hangs. A
job not reported within job_timeout prints "unreported" and ends the child with exit status
3 (its workers may be stuck, so shutdown is not tried). The last line ("done") says how
often get_finished() reported each job id, the engine's io_uring_rings_retired and how many
"io_uring_enter kept failing" warnings were logged.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key  # noqa: E402
from kvtier.tiering.factory import SecondaryTierFactory  # noqa: E402
from kvtier.tiering.spec import OffloadingSpec  # noqa: E402
from seccomp_errno import IO_URING_ENTER, SyscallFault  # noqa: E402

CTX = ReqContext("req-0")
UNREPORTED_EXIT = 3
FAULT: SyscallFault | None = None


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def key(i: int) -> bytes:
    return make_offload_key(i.to_bytes(32, "big"), 0)


REPORTS: Counter[int] = Counter()  # how often get_finished() reported each job


def wait(tier, job_id: int, timeout: float):
    deadline = time.monotonic() + timeout
    found = None
    while found is None and time.monotonic() < deadline:
        for result in tier.get_finished():
            REPORTS[result.job_id] += 1
            if result.job_id == job_id:
                found = result
        if found is None:
            time.sleep(0.002)
    if found is not None:
        return found
    emit("unreported", job_id=job_id, timeout=timeout, calls=FAULT.calls if FAULT else 0)
    os._exit(UNREPORTED_EXIT)


def report(event: str, result, **more: object) -> None:
    emit(
        event,
        success=bool(result.success),
        error=None if result.error is None else str(result.error),
        successful_keys=None if result.successful_keys is None else len(result.successful_keys),
        **more,
    )


WARNINGS: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        WARNINGS.append(record.getMessage())


def main() -> int:
    logging.getLogger("kvtier").addHandler(_Collect(logging.WARNING))
    spec = json.loads(sys.argv[1])
    n = spec["blocks"]
    rows = np.random.default_rng(5).integers(0, 256, (2 * n + 2, spec["row_bytes"]), np.uint8)
    config = {
        "type": "fs",
        "root_dir": spec["root"],
        "n_read_threads": 1,
        "n_write_threads": 1,
        "io_engine": "io_uring",
        **spec.get("options", {}),
    }
    spec_model = OffloadingSpec(model_name="org/model-7b", dtype="float16", kv_layout="NHD")
    tier = SecondaryTierFactory.create_secondary_tier(config, memoryview(rows), spec_model)

    # Warm-up: both workers' rings set up and through one batch each.
    warm = key(10_000)
    tier.submit_store(JobMetadata(1, [warm], np.array([2 * n], np.int64), False, CTX))
    stored = wait(tier, 1, spec["job_timeout"])
    tier.submit_load(JobMetadata(2, [warm], np.array([2 * n + 1], np.int64), False, CTX))
    loaded = wait(tier, 2, spec["job_timeout"])
    emit("warm", success=bool(stored.success and loaded.success))

    global FAULT
    fault = FAULT = SyscallFault(Path(spec["lib"]))

    def arm() -> None:
        fault.install(IO_URING_ENTER, spec["errno"], spec["times"])
        emit("armed", errno=spec["errno"], times=spec["times"])

    arm_before = spec.get("arm_before", "store")
    if arm_before not in ("store", "load"):
        raise SystemExit(f"arm_before must be 'store' or 'load', got {arm_before!r}")
    if arm_before == "store":
        arm()
    keys = [key(i) for i in range(n)]
    tier.submit_store(JobMetadata(3, keys, np.arange(n, dtype=np.int64), False, CTX))
    report("store", wait(tier, 3, spec["job_timeout"]), calls=fault.calls)
    if arm_before == "load":
        arm()
    tier.submit_load(JobMetadata(4, keys, np.arange(n, 2 * n, dtype=np.int64), False, CTX))
    result = wait(tier, 4, spec["job_timeout"])
    report("load", result, data_ok=bool(np.array_equal(rows[:n], rows[n : 2 * n])))
    rings_retired = tier.stats()["io_uring_rings_retired"]
    try:
        tier.shutdown()
        emit("shutdown", error=None)
    except Exception as e:  # the harness reports it; the test decides
        emit("shutdown", error=f"{type(e).__name__}: {e}")
    for late in tier.get_finished():  # anything reported twice, or never asked for
        REPORTS[late.job_id] += 1
    emit(
        "done",
        calls=fault.calls,
        injected=fault.injected,
        reports={str(k): v for k, v in sorted(REPORTS.items())},
        rings_retired=rings_retired,
        ring_warnings=sum("io_uring_enter kept failing" in m for m in WARNINGS),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

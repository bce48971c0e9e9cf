"""Child process for the fault-injection tests (run under LD_PRELOAD=faultinject.so).

argv[1] is a JSON spec:
  {"root": str, "engine": {Engine keyword options}, "memory": "aligned" | "unaligned",
   "row_size": int, "rows": int,
   "jobs": [{"id": int, "kind": "store" | "load", "blocks": [[path, row], ...]}, ...]}
Block keys are derived from the row. Jobs run one after the other. Stores copy from a source
buffer filled with random bytes, loads go to a zeroed destination buffer and are compared
with the source row. Prints one JSON line with what happened; a crash shows as a non-zero
exit status.
"""

from __future__ import annotations

import json
import mmap
import sys
import time

import numpy as np
from kvtier import _core as core

PAGE = 4096


def buffer(memory: str, size: int) -> tuple[object, np.ndarray]:
    if memory == "aligned":
        owner: object = mmap.mmap(-1, size)
        return owner, np.frombuffer(owner, dtype=np.uint8)
    owner = bytearray(size + PAGE + 2)
    base = np.frombuffer(owner, dtype=np.uint8)
    start = 1 if (base.ctypes.data + 1) % PAGE else 2
    return owner, base[start : start + size]


def main() -> int:
    spec = json.loads(sys.argv[1])
    row_size, n_rows = spec["row_size"], spec["rows"]
    out: dict = {"construct_error": None, "completions": [], "stats": None}
    try:
        engine = core.Engine(spec["root"], **spec.get("engine", {}))
    except OSError as e:
        out["construct_error"] = {
            "type": type(e).__name__,
            "errno": e.errno,
            "filename": e.filename,
            "message": str(e),
        }
        print(json.dumps(out))
        return 0
    out["direct_io"] = engine.direct_io
    out["fallback_reason"] = engine.o_direct_fallback_reason

    _src_owner, src = buffer(spec.get("memory", "aligned"), row_size * n_rows)
    _dst_owner, dst = buffer(spec.get("memory", "aligned"), row_size * n_rows)
    src[:] = np.random.default_rng(1234).integers(0, 256, size=src.size, dtype=np.uint8)
    dst[:] = 0

    for job in spec["jobs"]:
        target = src if job["kind"] == "store" else dst
        blocks = [
            (path, b"key-%d" % row, target.ctypes.data + row * row_size, row_size)
            for path, row in job["blocks"]
        ]
        (engine.submit_store if job["kind"] == "store" else engine.submit_load)(job["id"], blocks)
        deadline = time.monotonic() + 60
        done = []
        while not done:
            done = engine.pop_completions()
            if not done:
                if time.monotonic() > deadline:
                    raise SystemExit(f"job {job['id']} not reported within 60s")
                time.sleep(0.002)
        (c,) = done
        record = {
            "job_id": c.job_id,
            "success": c.success,
            "errno": c.errno,
            "operation": c.operation,
            "path": c.path,
            "message": c.message,
            "error": c.error,
            "block_errnos": list(c.block_errnos),
            "bytes": c.bytes,
        }
        if job["kind"] == "load":
            record["data_ok"] = [
                bool(
                    np.array_equal(
                        dst[row * row_size : (row + 1) * row_size],
                        src[row * row_size : (row + 1) * row_size],
                    )
                )
                for _path, row in job["blocks"]
            ]
        out["completions"].append(record)
    out["stats"] = engine.stats()
    engine.shutdown()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

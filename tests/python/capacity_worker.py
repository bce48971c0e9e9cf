"""A process that stores (and loads back) blocks through an fs tier with a capacity budget.

Run by test_capacity.py: ``python capacity_worker.py ROOT JSON_ARGS``. Block bytes are a
function of the key, so any process can check any loaded block. Prints one JSON summary.
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np
from kvtier.tiering.base import JobMetadata
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

SPEC = OffloadingSpec(model_name="org/capacity", dtype="float16", kv_layout="NHD")


def key(i: int) -> bytes:
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


def payload(i: int, row_bytes: int) -> np.ndarray:
    return np.random.default_rng(i).integers(0, 256, row_bytes, dtype=np.uint8)


def wait(tier: FileSystemTierManager, job_id: int) -> object:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for r in tier.get_finished():
            if r.job_id == job_id:
                return r
            raise AssertionError(f"unexpected job {r.job_id}")
        time.sleep(0.001)
    raise AssertionError(f"job {job_id} did not finish")


def main() -> None:
    root, raw = sys.argv[1], json.loads(sys.argv[2])
    row = raw["row_bytes"]
    first, count = raw["first"], raw["count"]
    buf = np.zeros((2, row), dtype=np.uint8)
    tier = FileSystemTierManager(SPEC, memoryview(buf), "fs", root_dir=root, **raw["options"])
    stored, refused, errors = [], 0, []
    job_id = 0
    # load_only: the blocks are there already; loading them is the use (no store reserves
    # budget, which in a small root could make an eviction pass take them first).
    for i in range(first, first + count) if not raw.get("load_only") else ():
        buf[0] = payload(i, row)
        job_id += 1
        tier.submit_store(JobMetadata(job_id, [key(i)], np.array([0], np.int64), False, None))
        r = wait(tier, job_id)
        if r.success:
            stored.append(i)
        elif "errno 28" in (r.error or ""):
            refused += 1
        else:
            errors.append(r.error)
        time.sleep(raw.get("pause", 0.0))
    if raw.get("load_only"):
        stored = list(range(first, first + count))
    loaded = missing = 0
    for i in stored:
        job_id += 1
        tier.submit_load(JobMetadata(job_id, [key(i)], np.array([1], np.int64), True, None))
        r = wait(tier, job_id)
        if r.success:
            assert bytes(buf[1]) == bytes(payload(i, row)), f"block {i}: wrong bytes"
            loaded += 1
        else:
            assert "errno 2)" in (r.error or "") or "No such file" in (r.error or ""), r.error
            missing += 1
    stats = tier.stats()
    tier.shutdown()
    print(
        json.dumps(
            {
                "stored": len(stored),
                "refused": refused,
                "errors": errors,
                "loaded": loaded,
                "missing": missing,
                "evicted_blocks": stats["evicted_blocks"],
                "rejected_stores": stats["rejected_stores"],
            }
        )
    )


if __name__ == "__main__":
    main()

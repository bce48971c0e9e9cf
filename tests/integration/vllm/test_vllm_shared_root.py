"""Two vLLM engines on one root_dir: the second finds and loads what the first stored."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from vllm_harness import HAVE_VLLM, SKIP_REASON, Engine, random_keys, random_rows
from vllm_harness import tier_config as make_tier_config

if not HAVE_VLLM:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from vllm.v1.kv_offload.base import LookupResult

SUBPROCESS_TIMEOUT_S = 300


def test_second_engine_loads_what_the_first_stored(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    first = make_engine([make_tier_config(tmp_path)])
    second = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(4)
    rows = random_rows(4, seed=20)
    first.store(keys, rows)

    ctx = second.new_request()
    final, seen = second.lookup_until_final(keys, ctx)
    # The second engine has never seen these keys: its first answer is RETRY (the existence
    # check runs off the scheduler thread), then the blocks are found and promoted.
    assert all(seen[0][k] is LookupResult.RETRY for k in keys)
    assert all(r is LookupResult.HIT for r in final.values())
    np.testing.assert_array_equal(second.read(keys, ctx), rows)
    second.finish_request(ctx)


def test_engine_of_another_layout_does_not_see_the_blocks(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    first = make_engine([make_tier_config(tmp_path)], dtype="float16")
    other = make_engine([make_tier_config(tmp_path)], dtype="bfloat16")
    keys = random_keys(2)
    first.store(keys, random_rows(2, seed=21))

    ctx = other.new_request()
    final, seen = other.lookup_until_final(keys, ctx)
    assert all(r is LookupResult.MISS for r in final.values())
    assert not any(r is LookupResult.HIT_PENDING for step in seen for r in step.values())
    other.finish_request(ctx)


ENGINE_PROCESS = """
import json, sys
sys.path.insert(0, {harness_dir!r})
from vllm_harness import Engine, make_offloading_config, tier_config
from vllm.v1.kv_offload.base import LookupResult
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

keys = [bytes.fromhex(k) for k in json.loads(sys.argv[1])]
spec = TieringOffloadingSpec(make_offloading_config([tier_config({root!r})]))
engine = Engine(spec, spec.get_manager())
try:
    ctx = engine.new_request()
    final, _ = engine.lookup_until_final(keys, ctx)
    results = [final[k].name for k in keys]
    rows = engine.read(keys, ctx).tolist() if all(r == "HIT" for r in results) else None
    engine.finish_request(ctx)
    print("RESULT", json.dumps({{"results": results, "rows": rows}}), flush=True)
finally:
    engine.close()
"""


def test_engine_in_another_process_loads_what_this_one_stored(
    tmp_path: Path, make_engine: Callable[..., Engine]
) -> None:
    first = make_engine([make_tier_config(tmp_path)])
    keys = random_keys(3)
    rows = random_rows(3, seed=22)
    first.store(keys, rows)

    code = textwrap.dedent(
        ENGINE_PROCESS.format(harness_dir=os.path.dirname(__file__), root=str(tmp_path))
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps([k.hex() for k in keys])],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT_S,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["results"] == ["HIT"] * 3
    np.testing.assert_array_equal(np.array(out["rows"], dtype=np.uint8), rows)

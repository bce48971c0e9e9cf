"""`kvtier bench --peer sglang`: SGLang's file backend and kvtier's, side by side."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sglang_harness import HAVE_SGLANG, SKIP_REASON

if not HAVE_SGLANG:
    pytest.skip(SKIP_REASON, allow_module_level=True)


def test_peer_sglang_runs_both_backends_on_the_same_pages(tmp_path: Path) -> None:
    out = tmp_path / "out.json"
    root = tmp_path / "root"
    root.mkdir()
    proc = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "kvtier", "bench", "--root", str(root),
         "--sizes", "128K,256K", "--total", "2M", "--repeat", "1",
         "--read-threads", "2", "--write-threads", "2",
         "--latency-samples", "5", "--loop-seconds", "0.05", "--no-fio", "--peer", "sglang",
         "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "SGLang HiCache storage (0.5.23" in proc.stdout
    result = json.loads(out.read_text())["sglang"]
    assert [e["page_tokens"] for e in result["sizes"]] == [1, 2]
    for entry in result["sizes"]:
        assert list(entry["backends"]) == ["file", "kvtier"]
        for backend in entry["backends"].values():
            # Every page stored was read back: the figures are of working backends.
            assert backend["store"]["pages_ok"] == backend["load"]["pages_ok"] == backend["pages"]
            assert backend["store"]["gbps"] > 0 and backend["load"]["cpu_s_per_gib"] > 0
    assert not list(root.iterdir()), "the scratch directory is removed"

"""bench/disk_load_trace.py's reading of a tracefs block trace (the figures of issue #23)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "disk_load_trace.py"

# Lines as tracefs prints them with record-tgid (taken from a real trace, shortened): process
# 500 reads two 1 MiB bios, each split into 1016 KiB + 8 KiB; the first small request is
# refused by the device (requeued) and issued again by kblockd; process 900 reads elsewhere.
TRACE = """\
# tracer: nop
p-501 (500) [0] ..... 10.000000: block_bio_queue: 254,0 RS 1000 + 2048 [p]
p-501 (500) [0] ..... 10.000010: block_split: 254,0 RS 1000 / 3032 [p]
p-501 (500) [0] ..... 10.000020: block_rq_issue: 254,0 RS 1040384 () 1000 + 2032 be,0,4 [p]
p-501 (500) [0] ..... 10.000030: block_rq_issue: 254,0 RS 8192 () 3032 + 16 be,0,4 [p]
p-501 (500) [0] ..... 10.000040: block_rq_requeue: 254,0 RS () 3032 + 16 be,0,4 [0]
o-901 (900) [1] ..... 10.000050: block_bio_queue: 254,0 RS 90000 + 8 [other]
o-901 (900) [1] ..... 10.000060: block_rq_issue: 254,0 RS 4096 () 90000 + 8 be,0,4 [other]
c-7 (7) [1] ..s.. 10.001020: block_rq_complete: 254,0 RS () 1000 + 2032 be,0,4 [0]
kworker/1:1H-44 (44) [1] ..... 10.001030: block_rq_issue: 254,0 RS 8192 () 3032 + 16 be,0,4 [kw]
c-7 (7) [1] ..s.. 10.001530: block_rq_complete: 254,0 RS () 3032 + 16 be,0,4 [0]
c-7 (7) [1] ..s.. 10.002000: block_rq_complete: 254,0 RS () 90000 + 8 be,0,4 [0]
p-502 (500) [0] ..... 10.002010: block_bio_queue: 254,0 WS 5000 + 8 [p]
"""


@pytest.fixture(scope="module")
def trace_module():
    spec = importlib.util.spec_from_file_location("disk_load_trace", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)


def test_requests_of_this_process_requeues_and_depth(trace_module):
    t = trace_module.analyse_trace(TRACE, tgid=500)
    assert t["bios"] == 1  # the other process's bio and the write are not ours
    assert t["splits"] == 1
    assert t["requests"] == 2  # the requeued issue does not count twice
    assert t["request_kib"] == {1016: 1, 8: 1}
    assert t["requeues"] == 1
    assert t["service_ms"]["n"] == 2
    # Ours: two in flight until the requeue; the disk also holds the other process's request.
    assert t["depth_mine"]["max"] == 2
    assert t["depth_disk"]["max"] == 2
    assert t["depth_disk"]["mean"] > t["depth_mine"]["mean"]


def test_writes_are_analysed_separately(trace_module):
    t = trace_module.analyse_trace(TRACE, tgid=500, op="W")
    assert t["bios"] == 1
    assert t["requests"] == 0


def test_tier_specs(trace_module):
    spec = trace_module.parse_tier("kv=kvtier:io_uring,checksum=none,worker_nice=0,KVTIER_X=1")
    assert (spec.label, spec.kind, spec.engine) == ("kv", "kvtier", "io_uring")
    assert spec.options == {"checksum": "none", "worker_nice": 0}
    assert spec.env == {"KVTIER_X": "1"}
    with pytest.raises(trace_module.BenchError):
        trace_module.parse_tier("kv=lmcache")


def test_paired_ratios_take_each_run_against_the_peers_run_of_the_same_repetition(trace_module):
    """The run-by-run ratio, not the ratio of the medians: repetition 0 is slow for both."""
    mine = [{"load_gbps": 1.0, "store_gbps": 2.0}, {"load_gbps": 3.0, "store_gbps": 2.0}]
    peer = [{"load_gbps": 2.0, "store_gbps": 1.0}, {"load_gbps": 2.0, "store_gbps": 4.0}]
    line = trace_module.paired_line("k", mine, peer)
    assert line.startswith("k ")
    assert "load 1.00x (0.50-1.50, above 1.0 in 1/2)" in line
    assert "store 1.25x (0.50-2.00, above 1.0 in 1/2)" in line

"""`kvtier bench`: measure KV offload on your storage, side by side with fio and the peers.

Modules, one concept each:
  config        what a run measures (sizes, volume, threads) and size parsing
  workload      primary memory, keys, jobs, and the driver over kvtier's `fs` tier
  throughput    store then load: GB/s and CPU seconds per GiB
  interference  a pure-Python scheduler loop, idle vs. while stores stream
  latency       4-block load jobs, idle vs. under a store flood
  ceiling       fio on the same directory, block size and parallelism (and load ceilings)
  peer_vllm     the same workload through vLLM's own `fs` tier (native or pure Python)
  peer_lmcache  the same workload through LMCache's LocalDiskBackend and FSConnector
  peer_sglang   SGLang's file backend and kvtier's SGLang backend
  machine       CPU, cores, kernel, file system and device
  targets       the issue's targets evaluated on a run (informational)
  report, plot, progress   output
  runner        orchestration
"""

from kvtier.bench.config import BenchConfig, parse_block_sizes, parse_size
from kvtier.bench.errors import BenchError
from kvtier.bench.runner import run_bench

__all__ = ["BenchConfig", "BenchError", "parse_block_sizes", "parse_size", "run_bench"]

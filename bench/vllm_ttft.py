"""Time to first token of a real vLLM 0.33 engine on the CPU: recomputed, or from storage.

For the same long prompts (random tokens, one length), three ways to get their KV:
  recompute   an engine without KV offloading prefills every token,
  kvtier      an engine restarted (new process) on a kvtier root an earlier engine filled,
  vllm-fs     the same on vLLM's own fs secondary tier.
TTFT is the wall time of a one-token ``generate`` of one prompt, measured in the engine's
process (tests/e2e/vllm/engine_runner.py runs each engine in its own process, with the
test-only CPU copy spec of tests/e2e/vllm/cpu_offloading_spec.py). Each engine first serves a
short unrelated prompt (warm-up); the reported figure is the median over the prompts.

Runs in the environment of .ci/vllm-engine-env.sh:
    .venv-vllm-engine/bin/python bench/vllm_ttft.py --tokens 4096 --prompts 3
Block files are read back through the page cache unless --drop-caches (root; it drops the
whole machine's clean caches before each restarted engine).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e" / "vllm"))

from engine_runner import (  # noqa: E402
    KVTIER_TIER,
    EngineProcess,
    EngineSettings,
    build_random_llama,
    kv_transfer_config,
)


def drop_caches() -> None:
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("3\n")


def block_files(root: Path) -> int:
    return sum(1 for p in root.rglob("*") if p.is_file() and p.suffix in (".kvb", ".bin"))


def wait_stored(engine: EngineProcess, root: Path, expected: int, timeout: float = 600.0) -> int:
    """Wait until the tier holds ``expected`` block files and they stop changing.

    vLLM hands finished requests' blocks to its tiers in the next engine step, so each poll
    makes the engine take one (a one-token request)."""
    deadline = time.monotonic() + timeout
    last = -1
    while time.monotonic() < deadline:
        engine.generate([[5, 6, 7]], 1)
        time.sleep(2.0)
        n = block_files(root)
        if n == last and n >= expected:
            return n
        last = n
    raise RuntimeError(f"{root}: {last} block files, expected at least {expected}")


def ttfts(engine: EngineProcess, prompts: list[list[int]]) -> list[float]:
    engine.generate([[5, 6, 7, 8]], 1)  # warm-up
    out = []
    for prompt in prompts:
        start = time.perf_counter()
        engine.generate([prompt], 1)
        out.append(time.perf_counter() - start)
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="vllm-ttft-", dir=args.dir))
    model = build_random_llama(
        work / "model",
        hidden=args.hidden,
        layers=args.layers,
        heads=args.hidden // 64,
        intermediate=args.hidden * 4,
        max_positions=args.tokens + 64,
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 1024) for _ in range(args.tokens)] for _ in range(args.prompts)]
    settings = {"max_model_len": args.tokens + 64}
    chunks = args.prompts * (args.tokens // 128)
    cpu_bytes = args.cpu_mib << 20
    results: dict[str, Any] = {}

    engine = EngineProcess(EngineSettings(str(model), **settings))
    try:
        results["recompute"] = ttfts(engine, prompts)
    finally:
        engine.close()

    tiers = {
        "kvtier": {**KVTIER_TIER, "root_dir": str(work / "kvtier")},
        "vllm-fs": {"type": "fs", "root_dir": str(work / "vllm-fs")},
    }
    for name, tier in tiers.items():
        config = kv_transfer_config(tier, cpu_bytes)
        writer = EngineProcess(EngineSettings(str(model), config, **settings))
        try:
            writer.generate(prompts, 1)
            wait_stored(writer, Path(tier["root_dir"]), chunks)
        finally:
            writer.close()
        if args.drop_caches:
            drop_caches()
        restarted = EngineProcess(EngineSettings(str(model), config, **settings))
        try:
            results[name] = ttfts(restarted, prompts)
        finally:
            restarted.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=4096, help="prompt length (tokens)")
    parser.add_argument("--prompts", type=int, default=3, help="prompts (runs) per way")
    parser.add_argument("--hidden", type=int, default=512, help="model width (head_dim 64)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--cpu-mib", type=int, default=1024, help="CPU primary tier (MiB)")
    parser.add_argument("--dir", default=None, help="where the model and the roots go")
    parser.add_argument("--drop-caches", action="store_true")
    parser.add_argument("--json", help="write the raw figures here")
    args = parser.parse_args()
    results = run(args)
    base = statistics.median(results["recompute"])
    print(f"TTFT, {args.tokens}-token prompt, median of {args.prompts} (s):")
    for name, values in results.items():
        median = statistics.median(values)
        runs = " ".join(f"{v:.3f}" for v in values)
        print(f"  {name:10s} {median:8.3f}   x{base / median:5.2f} vs recompute   runs: {runs}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "ttft_s": results}, indent=1))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""The table of bench/side_by_side_builds.sh: per thread count, block size and build, the
medians over the rounds of kvtier's and the peer's figures and of their ratio in each run.

    python bench/side_by_side_builds.py OUTDIR
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def main() -> int:
    runs: dict[tuple[str, str, str], list[tuple[dict, dict]]] = collections.defaultdict(list)
    for path in sorted(Path(sys.argv[1]).glob("*.json")):
        who, threads, _round = path.stem.split("-")
        for size in json.loads(path.read_text())["sizes"]:
            tiers = size["tiers"]
            peer = next(name for name in tiers if name != "kvtier")
            pair = (tiers["kvtier"]["throughput"], tiers[peer]["throughput"])
            runs[(threads, size["label"], who)].append(pair)
    print(
        "threads block build runs | load GB/s kvtier, peer, ratio | load CPU s/GiB kvtier, peer "
        "| store GB/s ratio | store CPU s/GiB kvtier, peer"
    )
    for (threads, label, who), pairs in sorted(runs.items()):
        kv, peer = [k for k, _ in pairs], [v for _, v in pairs]

        def ratio(key: str, pairs: list[tuple[dict, dict]] = pairs) -> str:
            return _spread([k[key] / v[key] for k, v in pairs])

        print(
            f"{threads} {label} {who} {len(pairs)} | "
            f"{_spread([r['load_gbps'] for r in kv])}, {_spread([r['load_gbps'] for r in peer])}, "
            f"{ratio('load_gbps')}x | {_spread([r['load_cpu_s_per_gib'] for r in kv])}, "
            f"{_spread([r['load_cpu_s_per_gib'] for r in peer])} | {ratio('store_gbps')}x | "
            f"{_spread([r['store_cpu_s_per_gib'] for r in kv])}, "
            f"{_spread([r['store_cpu_s_per_gib'] for r in peer])}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""The table of bench/side_by_side_builds.sh. Beside a peer: per thread count, block size and
build, the medians over the rounds of kvtier's and the peer's figures and of their ratio in
each run. Alone (PEER=none): per thread count and block size, each build's medians over the
rounds and the median (min-max) of the ratio after/before taken round by round.

    python bench/side_by_side_builds.py OUTDIR
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
from pathlib import Path


def _first_load(k: dict, key: str) -> float:
    """The first load pass's figure. A build whose bench predates the two load passes
    (docs/PERFORMANCE.md section 34) timed only that pass, as ``load_*``."""
    tp = k["throughput"]
    return tp.get(f"first_{key}", tp[key])


# kvtier alone: the figures compared, and how each is read out of a block size's result.
_ALONE = {
    "store GB/s": lambda k: k["throughput"]["store_gbps"],
    "load GB/s": lambda k: k["throughput"]["load_gbps"],
    "store CPU s/GiB": lambda k: k["throughput"]["store_cpu_s_per_gib"],
    "load CPU s/GiB": lambda k: k["throughput"]["load_cpu_s_per_gib"],
    # The same kind of pass in both builds whatever their bench: compare these when one of
    # them predates the two load passes (main() says so).
    "1st load GB/s": lambda k: _first_load(k, "load_gbps"),
    "1st load CPU s/GiB": lambda k: _first_load(k, "load_cpu_s_per_gib"),
    "loop kept": lambda k: k["interference"]["ratio"],
    "load p95 idle ms": lambda k: k["latency"]["idle"]["p95_ms"],
    "load p95 flood ms": lambda k: k["latency"]["flood"]["p95_ms"],
    "p95 flood/idle": lambda k: k["latency"]["p95_ratio"],
    # The caller's time to submit every store job of the loop measurement, while the workers
    # already run the first ones: what a submit waiting for the scheduler's mutex shows in.
    "store submits ms": lambda k: (
        1000 * statistics.median(r["submit_seconds"] for r in k["interference"]["runs"])
    ),
}


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})"


def _beside_a_peer(runs: dict[tuple[str, str, str], list[tuple[dict, dict]]]) -> None:
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


def _alone(runs: dict[tuple[str, str], dict[tuple[str, str], dict]]) -> None:
    print("| threads, block | build | " + " | ".join(_ALONE) + " |")
    print("|---|---|" + "---|" * len(_ALONE))
    for (threads, label), by_run in sorted(runs.items()):
        rounds = sorted({r for r, _ in by_run})
        for who in ("before", "after"):
            mine = [by_run[(r, who)] for r in rounds if (r, who) in by_run]
            cells = []
            for name, figure in _ALONE.items():
                value = statistics.median(figure(k) for k in mine)
                cells.append(f"{value:.0%}" if name == "loop kept" else f"{value:.2f}")
            print(f"| {threads}+{threads}, {label} | {who} | " + " | ".join(cells) + " |")
        paired = [r for r in rounds if (r, "before") in by_run and (r, "after") in by_run]
        cells = [
            _spread([figure(by_run[(r, "after")]) / figure(by_run[(r, "before")]) for r in paired])
            for figure in _ALONE.values()
        ]
        print(f"| | after/before, {len(paired)} rounds | " + " | ".join(cells) + " |")


def main() -> int:
    with_peer: dict[tuple[str, str, str], list[tuple[dict, dict]]] = collections.defaultdict(list)
    alone: dict[tuple[str, str], dict[tuple[str, str], dict]] = collections.defaultdict(dict)
    passes: dict[str, set[bool]] = collections.defaultdict(set)  # build: two load passes?
    for path in sorted(Path(sys.argv[1]).glob("*.json")):
        who, threads, round_ = path.stem.split("-")
        for size in json.loads(path.read_text())["sizes"]:
            tiers = size["tiers"]
            passes[who].add("first_load_gbps" in tiers["kvtier"]["throughput"])
            peer = next((name for name in tiers if name != "kvtier"), None)
            if peer is None:
                alone[(threads[1:], size["label"])][(round_, who)] = tiers["kvtier"]
            else:
                pair = (tiers["kvtier"]["throughput"], tiers[peer]["throughput"])
                with_peer[(threads, size["label"], who)].append(pair)
    if len(set().union(*passes.values())) > 1:
        print(
            "note: one build's bench timed a single load pass (the first), the other's the "
            "second of two: compare the '1st load' figures between builds, not 'load'\n"
        )
    if with_peer:
        _beside_a_peer(with_peer)
    if alone:
        _alone(alone)
    return 0


if __name__ == "__main__":
    sys.exit(main())

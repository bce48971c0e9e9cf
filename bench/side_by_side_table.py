#!/usr/bin/env python3
"""Markdown tables of `bench/side_by_side.sh`'s runs (docs/PERFORMANCE.md section 15).

    python bench/side_by_side_table.py DIR [--log RUN.log]

DIR holds the runs' ``--json`` files, named ``TAG-FS-tTHREADS-LAYOUT-PEER.json``; the log
(the script's stdout) gives each run's load average before and after. Prints, per file
system and thread count, one row per layout, block size and run: each tier's store and load
GB/s (median with min-max), kvtier's ratio to the peer, CPU s/GiB, load p95 idle and under
the store flood, the scheduler loop kept, fio's psync read and the best hugetlb read.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

LABELS = {
    "kvtier": "kvtier",
    "vllm": "vLLM native",
    "lmcache-disk": "LMCache LocalDisk",
    "lmcache-disk-odirect": "LMCache LocalDisk O_DIRECT",
    "lmcache-fs": "LMCache FSConnector",
}
NAME = re.compile(
    r"^(?P<tag>[^-]+)-(?P<fs>[^-]+)-t(?P<threads>\d+)-(?P<layout>[^-]+)-(?P<peer>\w+)$"
)


def spread(stats: dict, key: str) -> str:
    value = stats.get(key)
    if value is None:
        return "-"
    lo, hi = stats.get("spread", {}).get(key, [value, value])
    return f"{value:.2f} ({lo:.2f}-{hi:.2f})"


def loads_from_log(path: Path | None) -> dict[str, str]:
    """Run name -> "before -> after" one-minute load average."""
    out: dict[str, str] = {}
    if path is None:
        return out
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[2] == "load":
            out[parts[1]] = parts[3]
        elif len(parts) >= 5 and parts[3] == "load" and parts[1] in out:
            out[parts[1]] += f" -> {parts[4]}"
    return out


def rows_of(name: str, results: dict, load: str) -> list[list[str]]:
    m = NAME.match(name)
    assert m, name
    rows = []
    for entry in results["sizes"]:
        tiers = entry["tiers"]
        kv = tiers["kvtier"]
        fio = entry.get("fio", {})
        best = entry.get("fio_loads", {})
        huge = max((v["read_gbps"] for v in best.values() if v.get("hugetlb")), default=None)
        huge_pct = (entry.get("primary") or {}).get("huge_page_bytes")
        placed = entry.get("primary") or {}
        share = f"{huge_pct / placed['bytes']:.0%}" if huge_pct is not None else "?"
        for peer, t in tiers.items():
            if peer == "kvtier":
                continue
            kt, pt = kv["throughput"], t["throughput"]
            ratio_s = kt["store_gbps"] / pt["store_gbps"] if pt.get("store_gbps") else None
            ratio_l = kt["load_gbps"] / pt["load_gbps"] if pt.get("load_gbps") else None
            rows.append(
                [
                    f"{m['layout']} ({share})",
                    entry["label"],
                    LABELS.get(peer, peer),
                    f"{spread(kt, 'store_gbps')} / {spread(kt, 'load_gbps')}",
                    f"{spread(pt, 'store_gbps')} / {spread(pt, 'load_gbps')}",
                    f"{ratio_s:.2f}x / {ratio_l:.2f}x" if ratio_s and ratio_l else "-",
                    f"{kt['store_cpu_s_per_gib']:.2f}/{kt['load_cpu_s_per_gib']:.2f} vs "
                    f"{pt['store_cpu_s_per_gib']:.2f}/{pt['load_cpu_s_per_gib']:.2f}",
                    _p95(kv) + " vs " + _p95(t),
                    f"{kv['interference']['ratio']:.0%} vs {t['interference']['ratio']:.0%}",
                    (f"{fio['read_gbps']:.2f}" if fio.get("read_gbps") else "-")
                    + (f" / {huge:.2f}" if huge else " / -"),
                    load,
                ]
            )
    return rows


def _p95(tier: dict) -> str:
    lat = tier["latency"]
    return f"{lat['idle']['p95_ms']:.1f}/{lat['flood']['p95_ms']:.1f} ({lat['p95_ratio']:.1f}x)"


HEADER = [
    "layout (huge)",
    "block",
    "peer",
    "kvtier store / load GB/s",
    "peer store / load GB/s",
    "kvtier/peer store / load",
    "CPU s/GiB store/load kvtier vs peer",
    "load p95 ms idle/flood kvtier vs peer",
    "loop kept",
    "fio psync read / hugetlb read",
    "load avg",
]


def compact(directory: Path, peer: str, key: str) -> None:
    """One line per file system, threads and layout: kvtier against ``peer`` on ``key``
    (store_gbps or load_gbps) at each block size, medians and their ratio."""
    table: dict[tuple[str, int, str], dict[str, str]] = {}
    labels: list[str] = []
    for path in sorted(directory.glob("*.json")):
        m = NAME.match(path.stem)
        if not m:
            continue
        results = json.loads(path.read_text())
        for entry in results["sizes"]:
            theirs = entry["tiers"].get(peer)
            if theirs is None:
                continue
            mine = entry["tiers"]["kvtier"]["throughput"][key]
            other = theirs["throughput"][key]
            if entry["label"] not in labels:
                labels.append(entry["label"])
            row = table.setdefault((m["fs"], int(m["threads"]), m["layout"]), {})
            row[entry["label"]] = f"{mine:.2f} vs {other:.2f} (**{mine / other:.2f}x**)"
    what = key.removesuffix("_gbps")
    print(f"\n| {what} GB/s, kvtier vs {LABELS.get(peer, peer)} | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for (fs, threads, layout), row in sorted(table.items()):
        cells = " | ".join(row.get(label, "-") for label in labels)
        print(f"| {fs}, {threads}+{threads}, {layout} | {cells} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dir", type=Path)
    p.add_argument("--log", type=Path)
    p.add_argument(
        "--compact",
        metavar="PEER",
        help="only kvtier against this tier (vllm, lmcache-disk-odirect, ...): store and load",
    )
    args = p.parse_args()
    if args.compact:
        for key in ("load_gbps", "store_gbps"):
            compact(args.dir, args.compact, key)
        return
    loads = loads_from_log(args.log)
    groups: dict[tuple[str, str], list[list[str]]] = {}
    for path in sorted(args.dir.glob("*.json")):
        m = NAME.match(path.stem)
        if not m:
            continue
        results = json.loads(path.read_text())
        key = (m["fs"], m["threads"])
        groups.setdefault(key, []).extend(rows_of(path.stem, results, loads.get(path.stem, "?")))
    for (fs, threads), rows in sorted(groups.items(), key=lambda kv: (kv[0][0], int(kv[0][1]))):
        rows.sort(key=lambda r: (r[1], r[0], r[2]))
        print(f"\n**{fs}, {threads}+{threads} threads**\n")
        print("| " + " | ".join(HEADER) + " |")
        print("|" + "---|" * len(HEADER))
        for row in rows:
            print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()

"""kvtier alone, store cap 2 against 1: flood/idle load p95, throughput (docs/PERFORMANCE.md section 29).

These runs were made before `flood_store_gbps` measured the whole drain; their flood store
rate is not shown (see summary_with_vllm.py for it).
"""
import json, glob, statistics, collections, sys, os
d = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(os.path.join(sys.argv[1], "r*-*.json"))):
    name = os.path.basename(f)[:-5]
    r, fs, t, cap = name.split("-")
    res = json.load(open(f))
    for e in res["sizes"]:
        tier = e["tiers"]["kvtier"]
        lat, tp = tier["latency"], tier["throughput"]
        key = (fs, t, e["label"])
        d[key][cap].append((r, lat["p95_ratio"], lat["idle"]["p95_ms"], lat["flood"]["p95_ms"],
                            lat.get("flood_store_gbps"), tp["store_gbps"], tp["load_gbps"]))
print("| fs, threads, block | flood/idle p95, cap 2 | cap 1 | flood p95 ms cap 2 / cap 1 | store GB/s (no loads) cap 2 / cap 1 | load GB/s cap 2 / cap 1 |")
print("|---|---|---|---|---|---|")
for key in sorted(d):
    a, b = d[key]["cap2"], d[key]["cap1"]
    med = lambda rows, i: statistics.median(x[i] for x in rows)
    rng = lambda rows, i: f"{min(x[i] for x in rows):.2f}–{max(x[i] for x in rows):.2f}"
    print(f"| {key[0]} {key[1]}+{key[1]} {key[2]} | {med(a,1):.2f} ({rng(a,1)}) | {med(b,1):.2f} ({rng(b,1)}) | {med(a,3):.2f} / {med(b,3):.2f} | {med(a,5):.2f} / {med(b,5):.2f} | {med(a,6):.2f} / {med(b,6):.2f} |")
print("rounds:", {k: len(v["cap2"]) for k, v in d.items()})

"""kvtier (store cap 2 and 1) beside vLLM native: flood/idle load p95 and the flood's store rate
while loading (docs/PERFORMANCE.md section 29).
"""
import json, glob, statistics, collections, sys, os
d = collections.defaultdict(lambda: collections.defaultdict(list))
for f in sorted(glob.glob(os.path.join(sys.argv[1], "r*-*.json"))):
    r, fs, t, cap = os.path.basename(f)[:-5].split("-")
    for e in json.load(open(f))["sizes"]:
        for tier, v in e["tiers"].items():
            lat = v["latency"]
            d[(fs, t, e["label"])][f"{tier}-{cap}"].append((lat["p95_ratio"], lat["flood"]["p95_ms"], lat["idle"]["p95_ms"], lat.get("flood_store_gbps")))
med = lambda rows, i: statistics.median(x[i] for x in rows)
print("| file system, threads, block | load p95 flood/idle: kvtier cap 2 / cap 1 / vLLM | flood's stores GB/s while loading: kvtier cap 2 / cap 1 / vLLM |")
print("|---|---|---|")
for k in sorted(d):
    a, b = d[k]["kvtier-cap2"], d[k]["kvtier-cap1"]
    v = d[k]["vllm-cap2"] + d[k]["vllm-cap1"]
    print(f"| {k[0]}, {k[1][1:]}+{k[1][1:]}, {k[2]} | {med(a,0):.2f} / **{med(b,0):.2f}** / {med(v,0):.1f} | {med(a,3):.2f} / {med(b,3):.2f} / {med(v,3):.2f} |")
print({k: (len(v["kvtier-cap2"]), len(v["kvtier-cap1"])) for k, v in d.items()})

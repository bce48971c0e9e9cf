"""Section 36: kvtier / vLLM native per side-by-side JSON (the old and new builds' runs).

    python summarize_side_by_side.py side-by-side/ab1/*.json side-by-side/ab2/*.json
"""
import json
import sys

for path in sys.argv[1:]:
    d = json.load(open(path))
    for size in d["sizes"]:
        tiers = size["tiers"]
        k = tiers["kvtier"]["throughput"]
        (peer_name,) = [t for t in tiers if t != "kvtier"]
        p = tiers[peer_name]["throughput"]
        print(
            f"{path.split('/')[-2]}/{path.split('/')[-1].split('-')[0]:4} {size['block_size'] >> 10:5} KiB  "
            f"store {k['store_gbps']:.2f}/{p['store_gbps']:.2f} = {k['store_gbps'] / p['store_gbps']:.2f}x  "
            f"load {k['load_gbps']:.2f}/{p['load_gbps']:.2f} = {k['load_gbps'] / p['load_gbps']:.2f}x  "
            f"load CPU s/GiB {k.get('load_cpu_s_per_gib', float('nan')):.3f} vs "
            f"{p.get('load_cpu_s_per_gib', float('nan')):.3f}"
        )

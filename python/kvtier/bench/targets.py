"""The targets of the `kvtier bench` issue, evaluated on one run's results (never asserted)."""

from __future__ import annotations

from kvtier.bench.config import MiB

#: Minimum fraction of fio's throughput, by block size (other sizes: no target).
FIO_FRACTION = {2 * MiB: 0.90, 256 << 10: 0.85}
CPU_VS_VLLM = 0.25
P95_FLOOD_RATIO = 3.0
LOOP_RATIO = 0.95


def evaluate_targets(results: dict) -> list[dict]:
    """One entry per target and block size: what, value, limit, met (None: not measurable)."""
    out: list[dict] = []
    for entry in results["sizes"]:
        bs, label = entry["block_size"], entry["label"]
        ours = entry["tiers"]["kvtier"]
        vllm = entry["tiers"].get("vllm")
        fio = entry.get("fio")
        if bs in FIO_FRACTION:
            limit = FIO_FRACTION[bs]
            for direction in ("store", "load"):
                value = ours["throughput"].get(f"{direction}_vs_fio") if fio else None
                out.append(
                    {
                        "target": f"{label} {direction} throughput >= {limit:.0%} of fio",
                        "value": value,
                        "limit": limit,
                        "met": None if value is None else value >= limit,
                    }
                )
        for direction in ("store", "load"):
            key = f"{direction}_cpu_s_per_gib"
            value = (
                ours["throughput"][key] / vllm["throughput"][key]
                if vllm and vllm["throughput"].get(key)
                else None
            )
            out.append(
                {
                    "target": f"{label} {direction} CPU s/GiB <= {CPU_VS_VLLM:.2f}x vLLM's fs tier",
                    "value": value,
                    "limit": CPU_VS_VLLM,
                    "met": None if value is None else value <= CPU_VS_VLLM,
                }
            )
        value = ours["latency"].get("p95_ratio")
        out.append(
            {
                "target": f"{label} load p95 under store flood <= {P95_FLOOD_RATIO:.0f}x idle p95",
                "value": value,
                "limit": P95_FLOOD_RATIO,
                "met": None if value is None else value <= P95_FLOOD_RATIO,
            }
        )
        value = ours["interference"].get("ratio")
        out.append(
            {
                "target": f"{label} scheduler loop keeps >= {LOOP_RATIO:.0%} of its idle rate",
                "value": value,
                "limit": LOOP_RATIO,
                "met": None if value is None else value >= LOOP_RATIO,
            }
        )
    return out

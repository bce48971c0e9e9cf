"""The targets of the `kvtier bench` issue, evaluated on one run's results (never asserted)."""

from __future__ import annotations

from kvtier.bench.config import MiB

#: Minimum fraction of fio's throughput, by block size (other sizes: no target).
FIO_FRACTION = {2 * MiB: 0.90, 256 << 10: 0.85}
CPU_VS_VLLM = 0.25
P95_FLOOD_RATIO = 3.0
LOOP_RATIO = 0.95


def _target(text: str, value: float | None, limit: float, at_least: bool) -> dict:
    met = None if value is None else (value >= limit if at_least else value <= limit)
    return {"target": text, "value": value, "limit": limit, "met": met}


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
                text = f"{label} {direction} throughput >= {limit:.0%} of fio"
                out.append(_target(text, value, limit, at_least=True))
        for direction in ("store", "load"):
            key = f"{direction}_cpu_s_per_gib"
            value = (
                ours["throughput"][key] / vllm["throughput"][key]
                if vllm and vllm["throughput"].get(key)
                else None
            )
            text = f"{label} {direction} CPU s/GiB <= {CPU_VS_VLLM:.2f}x vLLM's fs tier"
            out.append(_target(text, value, CPU_VS_VLLM, at_least=False))
        text = f"{label} load p95 under store flood <= {P95_FLOOD_RATIO:.0f}x idle p95"
        out.append(_target(text, ours["latency"].get("p95_ratio"), P95_FLOOD_RATIO, False))
        text = f"{label} scheduler loop keeps >= {LOOP_RATIO:.0%} of its idle rate"
        out.append(_target(text, ours["interference"].get("ratio"), LOOP_RATIO, True))
    return out

"""The terminal report and the JSON file."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvtier.bench.config import format_size
from kvtier.bench.machine import describe_short


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _pct(value: float | None) -> str:
    return _f(None if value is None else value * 100, "{:.0f}%")


def _tier_label(name: str, results: dict) -> str:
    if name == "vllm":
        io_path = results.get("peers", {}).get("vllm", {}).get("io_path", "")
        return "vllm fs (" + ("pure Python" if io_path.startswith("pure") else "native") + ")"
    return "kvtier fs"


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def render(results: dict) -> str:
    cfg = results["config"]
    out: list[str] = []
    out.append("kvtier bench")
    out.append(f"  machine:  {describe_short(results['machine'])}")
    bypass = ", ".join(f"{k}: {v}" for k, v in results.get("cache_bypass", {}).items())
    out.append(f"  root:     {cfg['root']} (scratch directory removed afterwards)")
    out.append(
        f"  workload: {format_size(cfg['bytes_per_block_size'])} per block size, "
        f"{cfg['blocks_per_job']} blocks per job, {cfg['read_threads']}+{cfg['write_threads']} "
        f"threads, {cfg['repeat']} run(s): {cfg['statistic']}"
    )
    out.append(f"  loads bypass the page cache with: {bypass or '-'}")
    vllm = results.get("peers", {}).get("vllm")
    if vllm:
        if vllm.get("available"):
            out.append(f"  vLLM peer: vLLM {vllm['version']}, {vllm['io_path']}")
        else:
            out.append(f"  vLLM peer: skipped: {vllm.get('skipped')}")
    out.append("")

    rows: list[list[str]] = []
    for entry in results["sizes"]:
        for name, t in entry["tiers"].items():
            tp = t["throughput"]
            rows.append(
                [
                    f"{entry['label']} {_tier_label(name, results)}",
                    _f(tp.get("store_gbps")),
                    _f(tp.get("load_gbps")),
                    _f(tp.get("store_cpu_s_per_gib"), "{:.3f}"),
                    _f(tp.get("load_cpu_s_per_gib"), "{:.3f}"),
                    _pct(tp.get("store_vs_fio")),
                    _pct(tp.get("load_vs_fio")),
                    _f(tp.get("first_store_gbps")),
                ]
            )
        fio = entry.get("fio")
        if fio:
            rows.append(
                [
                    f"{entry['label']} fio (ceiling)",
                    _f(fio.get("write_gbps")),
                    _f(fio.get("read_gbps")),
                    _f(fio.get("write_cpu_s_per_gib"), "{:.3f}"),
                    _f(fio.get("read_cpu_s_per_gib"), "{:.3f}"),
                    "",
                    "",
                    "",
                ]
            )
    out.append(
        "Throughput (GB/s = 1e9 bytes/s; CPU = process CPU seconds per GiB moved; store = into "
        "existing directories,\n1st store = the same blocks into a fresh root, which also "
        "creates the tier's directory tree)"
    )
    out.append(
        _table(
            [
                "block / tier",
                "store GB/s",
                "load GB/s",
                "store CPU",
                "load CPU",
                "store/fio",
                "load/fio",
                "1st store GB/s",
            ],
            rows,
        )
    )
    out.append("")

    rows = []
    for entry in results["sizes"]:
        for name, t in entry["tiers"].items():
            it = t["interference"]
            rows.append(
                [
                    f"{entry['label']} {_tier_label(name, results)}",
                    _f(it.get("idle_iter_per_s") and it["idle_iter_per_s"] / 1e6, "{:.2f}"),
                    _f(it.get("busy_iter_per_s") and it["busy_iter_per_s"] / 1e6, "{:.2f}"),
                    _pct(it.get("ratio")),
                ]
            )
    out.append("Scheduler loop on the main thread (million iterations/s)")
    out.append(_table(["block / tier", "idle", "while storing", "kept"], rows))
    out.append("")

    rows = []
    for entry in results["sizes"]:
        for name, t in entry["tiers"].items():
            lat = t["latency"]
            idle, flood = lat["idle"], lat["flood"]
            rows.append(
                [
                    f"{entry['label']} {_tier_label(name, results)}",
                    "/".join(_f(idle.get(p), "{:.2f}") for p in ("p50_ms", "p95_ms", "p99_ms")),
                    "/".join(_f(flood.get(p), "{:.2f}") for p in ("p50_ms", "p95_ms", "p99_ms")),
                    _f(lat.get("p95_ratio"), "{:.1f}x"),
                    f"{idle.get('n', 0)}/{flood.get('n', 0)}",
                ]
            )
    out.append("Load latency of 4-block jobs (ms, p50/p95/p99)")
    out.append(_table(["block / tier", "idle", "under store flood", "p95 ratio", "samples"], rows))

    fio_lines = [(e["label"], e["fio"]) for e in results["sizes"] if e.get("fio")]
    out.append("")
    if fio_lines:
        out.append("Ceiling commands (fio):")
        for label, fio in fio_lines:
            out.append(f"  {label}: {fio['write_command']}")
            out.append(f"  {label}: {fio['read_command']}")
    else:
        out.append(f"Ceiling: skipped ({results['fio'].get('skipped', 'fio not run')})")

    targets = results.get("targets", [])
    if targets:
        out.append("")
        out.append("Targets (measured here; informational):")
        for t in targets:
            mark = {True: "met   ", False: "MISSED", None: "n/a   "}[t["met"]]
            value = "-" if t["value"] is None else f"{t['value']:.2f}"
            out.append(f"  [{mark}] {t['target']}: {value}")
    for note in results.get("notes", []):
        out.append(f"Note: {note}")
    return "\n".join(out)


def write_json(results: dict, path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")

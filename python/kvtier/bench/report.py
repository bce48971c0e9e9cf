"""The terminal report and the JSON file."""

from __future__ import annotations

import json
import math
import textwrap
from pathlib import Path

from kvtier.bench.ceiling import BASIC_CEILINGS, CEILINGS
from kvtier.bench.config import NOISY_RATIO, TIER_OPTION_FLAGS
from kvtier.bench.machine import describe_short
from kvtier.bench.primary import PRIMARY_LAYOUT_TEXT
from kvtier.tiering.fs.capacity import format_size


def _f(value: float | None, fmt: str = "{:.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def _pct(value: float | None) -> str:
    return _f(None if value is None else value * 100, "{:.0f}%")


#: The LMCache peer's backends (kvtier.bench.peer_lmcache.VARIANTS) as the tables name them.
_LMCACHE_LABELS = {
    "lmcache-disk": "LMCache LocalDisk",
    "lmcache-disk-odirect": "LMCache LocalDisk O_DIRECT",
    "lmcache-fs": "LMCache FSConnector",
}


def _tier_label(name: str, results: dict) -> str:
    if name == "vllm":
        vllm = results.get("peers", {}).get("vllm", {})
        kind = vllm.get("io_path_kind")  # results saved before it: judged from the text
        if kind is None:
            kind = "python" if vllm.get("io_path", "").startswith("pure") else "native"
        return "vllm fs (" + ("pure Python" if kind == "python" else "native") + ")"
    if name in _LMCACHE_LABELS:
        return _LMCACHE_LABELS[name]
    if name.startswith("kvtier-"):  # --compare-io-engines: one tier per engine
        return f"kvtier fs ({name.removeprefix('kvtier-')})"
    return "kvtier fs"


def _io_engine_text(results: dict) -> str | None:
    """Which I/O engine each kvtier tier ran, and why "auto" fell back; None for results
    saved before the io_engine option."""
    engines = results.get("io_engines")
    if not engines:
        return None
    parts = []
    for info in engines.values():
        if "unavailable" in info:
            parts.append(f"{info['requested']} unavailable ({info['unavailable']})")
            continue
        ran = info.get("io_engine", info["requested"])
        if info["requested"] == "auto":
            reason = info.get("fallback_reason")
            ran += f" (auto fell back: {reason})" if reason else " (chosen by auto)"
        parts.append(ran)
    prefix = "side by side: " if results["config"].get("compare_io_engines") else ""
    return prefix + "; ".join(parts)


def _primary_text(results: dict) -> str | None:
    """The primary memory's layout (`--primary`) and, per block size, the share the kernel
    backed with huge pages; None for results saved before the option existed."""
    layout = results["config"].get("primary")
    if layout is None:
        return None
    text = f"{layout}, {PRIMARY_LAYOUT_TEXT.get(layout, '?')}"
    shares = []
    for entry in results.get("sizes", []):
        placed = entry.get("primary") or {}
        huge, length = placed.get("huge_page_bytes"), placed.get("bytes")
        if huge is not None and length:
            shares.append(f"{entry['label']} {huge / length:.0%}")
    if shares:
        text += f"; in huge pages: {', '.join(shares)}"
    return text


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
        return "  ".join([first, *rest]).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *map(line, rows)])


def _spread(stats: dict, key: str, fmt: str = "{:.2f}", scale: float = 1.0) -> str:
    """``median (min-max)`` of a figure over the runs, ``!`` when too noisy; the median alone
    for a single run."""
    value = stats.get(key)
    if value is None:
        return "-"
    text = fmt.format(value * scale)
    low_high = _range(stats, key)
    if low_high:
        low, high = (fmt.format(v * scale) for v in low_high)
        text += f" ({low}-{high})"
    noisy = stats.get("noisy")
    if noisy is None:  # saved before the flag existed: judge the runs the same way
        noisy = (
            [key]
            if low_high and (low_high[0] <= 0 or low_high[1] / low_high[0] > NOISY_RATIO)
            else []
        )
    if key in noisy:
        text += " !"
    return text


def _range(stats: dict, key: str) -> list[float] | None:
    """[min, max] of a figure over two or more runs (from the runs of an older result)."""
    values = [r[key] for r in stats.get("runs", []) if key in r]
    if len(values) < 2:
        return None
    return stats.get("spread", {}).get(key) or [min(values), max(values)]


def _overlap(a: dict, a_key: str, b: dict, b_key: str) -> bool:
    """Whether the min-max ranges of two figures overlap (the difference is not resolved)."""
    ra, rb = _range(a, a_key), _range(b, b_key)
    if not ra or not rb:
        return False
    return ra[0] <= rb[1] and rb[0] <= ra[1]


def render(results: dict) -> str:
    cfg = results["config"]
    out: list[str] = []
    out.append("kvtier bench")
    out.append(f"  machine:  {describe_short(results['machine'])}")
    bypass = ", ".join(f"{k}: {v}" for k, v in results.get("cache_bypass", {}).items())
    out.append(f"  root:     {cfg['root']} (scratch directory removed afterwards)")
    total, per_run = cfg["bytes_per_block_size"], cfg.get("bytes_per_run")
    if per_run is None:  # saved before the runs shared the total: it was per run
        per_run, total = total, total * cfg["repeat"]
    out.append(
        f"  workload: {format_size(total)} per block size in {cfg['repeat']} run(s) of "
        f"{format_size(per_run)} each, "
        f"{cfg['blocks_per_job']} blocks per job, {cfg['read_threads']}+{cfg['write_threads']} "
        f"threads"
    )
    out.append(f"  figures:  {cfg['statistic']}")
    primary = _primary_text(results)
    if primary:
        out.append(f"  primary memory: {primary}")
    out.append(f"  loads bypass the page cache with: {bypass or '-'}")
    engines = _io_engine_text(results)
    if engines:
        out.append(f"  io engine: {engines}, checksum {cfg.get('checksum', 'crc32c')}")
    # The fs tier options the run set (the tier's defaults otherwise).
    chosen = [f"{name}={cfg[name]:g}" for name in TIER_OPTION_FLAGS if cfg.get(name) is not None]
    if chosen:
        out.append(f"  kvtier options: {', '.join(chosen)}")
    vllm = results.get("peers", {}).get("vllm")
    if vllm:
        if vllm.get("available"):
            out.append(f"  vLLM peer: vLLM {vllm['version']}, {vllm['io_path']}")
        else:
            out.append(f"  vLLM peer: skipped: {vllm.get('skipped')}")
    lmcache = results.get("peers", {}).get("lmcache")
    if lmcache:
        out.extend(_lmcache_header(lmcache))
    out.append("")

    noisy: list[str] = []

    def cell(row_label: str, stats: dict, key: str, what: str, **fmt) -> str:
        """The table cell of one figure; a noisy one is also listed under the tables."""
        text = _spread(stats, key, **fmt)
        if text.endswith(" !"):
            noisy.append(f"{row_label}, {what}: {text[:-2]}")
        return text

    rows: list[list[str]] = []
    for entry in results["sizes"]:
        for name, t in entry["tiers"].items():
            tp = t["throughput"]
            row_label = f"{entry['label']} {_tier_label(name, results)}"
            rows.append(
                [
                    row_label,
                    cell(row_label, tp, "store_gbps", "store GB/s"),
                    cell(row_label, tp, "load_gbps", "load GB/s"),
                    _f(tp.get("store_cpu_s_per_gib"), "{:.3f}"),
                    _f(tp.get("load_cpu_s_per_gib"), "{:.3f}"),
                    _f(tp.get("first_store_gbps")),
                    _f(tp.get("first_load_gbps")),
                ]
            )
        for ceiling in BASIC_CEILINGS:
            fio = entry.get(ceiling.key)
            if not fio:
                continue
            row_label = f"{entry['label']} {ceiling.label}"
            rows.append(
                [
                    row_label,
                    cell(row_label, fio, "write_gbps", "write GB/s"),
                    cell(row_label, fio, "read_gbps", "read GB/s"),
                    _f(fio.get("write_cpu_s_per_gib"), "{:.3f}"),
                    _f(fio.get("read_cpu_s_per_gib"), "{:.3f}"),
                    "",
                    "",
                ]
            )
        best = _best_load(entry)
        if best is not None:
            _, fio = best
            row_label = f"{entry['label']} {_load_label(entry, fio)} (best load)"
            rows.append(
                [
                    row_label,
                    "-",
                    cell(row_label, fio, "read_gbps", "read GB/s"),
                    "-",
                    _f(fio.get("read_cpu_s_per_gib"), "{:.3f}"),
                    "",
                    "",
                ]
            )
    two_loads = any(
        "first_load_gbps" in t["throughput"] for e in results["sizes"] for t in e["tiers"].values()
    )  # results saved before the bench loaded twice timed the first load only
    out.append(
        "Throughput (GB/s = 1e9 bytes/s, median (min-max) of the runs; CPU = process CPU "
        "seconds per GiB moved;\nstore = into existing directories, 1st store = the same "
        "blocks into a fresh root, which also creates the tier's directory tree"
        + (
            ";\nload = the second load of the blocks, 1st load = the first, with what a tier "
            "sets up on first use)"
            if two_loads
            else ")"
        )
    )
    out.append(
        _table(
            [
                "block / tier",
                "store GB/s",
                "load GB/s",
                "store CPU",
                "load CPU",
                "1st store GB/s",
                "1st load GB/s",
            ],
            rows,
        )
    )
    out.append("")

    rows = []
    for entry in results["sizes"]:
        for name, t in entry["tiers"].items():
            it = t["interference"]
            row_label = f"{entry['label']} {_tier_label(name, results)}"
            rows.append(
                [
                    row_label,
                    _f(it.get("idle_iter_per_s") and it["idle_iter_per_s"] / 1e6, "{:.2f}"),
                    _f(it.get("busy_iter_per_s") and it["busy_iter_per_s"] / 1e6, "{:.2f}"),
                    cell(row_label, it, "ratio", "scheduler loop kept", fmt="{:.0f}%", scale=100),
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
                    _f(lat.get("flood_store_gbps"), "{:.2f}"),
                    f"{idle.get('n', 0)}/{flood.get('n', 0)}",
                ]
            )
    out.append(
        "Load latency of 4-block jobs (ms, p50/p95/p99, median of the runs); the flood's stores "
        "in GB/s while the loads ran"
    )
    header = ["block / tier", "idle", "under store flood", "p95 ratio", "flood stores GB/s"]
    out.append(_table([*header, "samples"], rows))

    comparison = _engine_comparison(results)
    if comparison:
        out.append("")
        out.extend(comparison)

    out.append("")
    out.extend(_ceiling_lines(results))
    if "capacity" in results:
        from kvtier.bench.capacity import render_capacity

        out.append("")
        out.extend(render_capacity(results["capacity"], _table))

    if noisy:
        ratio = cfg.get("noisy_ratio", NOISY_RATIO)
        out.append("")
        out.append(
            f"Too noisy to trust (marked !: the runs differ by more than {ratio:g}x, max/min):"
        )
        out.extend(f"  {item}" for item in noisy)
        out.append(
            "  Other work on this machine or its storage is the usual cause: measure again "
            "when it is quiet, or with a larger --total (longer runs)."
        )
    for note in results.get("notes", []):
        out.append(f"Note: {note}")
    return "\n".join(out)


def _lmcache_header(lmcache: dict) -> list[str]:
    if not lmcache.get("available"):
        return [f"  LMCache peer: skipped: {lmcache.get('skipped') or lmcache.get('reason')}"]
    names = ", ".join(_LMCACHE_LABELS.get(b, b) for b in lmcache.get("backends", []))
    text = (
        f"LMCache peer: LMCache {lmcache['version']} at its storage API ({names}), "
        f"{lmcache.get('threads')} threads per pool. Its buffered stores (LocalDisk without "
        "O_DIRECT, FSConnector) end in the page cache, never synced: the figures do not include "
        "writing them to the device, which the loads' fsync before dropping them does, "
        "untimed. FSConnector loads land in LMCache's staging pool and are copied into place "
        "(counted). LMCache's index lives in memory only."
    )
    return ["  " + line for line in textwrap.wrap(text, width=96, subsequent_indent="  ")]


def _load_label(entry: dict, fio: dict) -> str:
    """``fio load io_uring qd16 bs+4K``: a load ceiling of one size's results."""
    extra = fio.get("request_bytes", entry["block_size"]) - entry["block_size"]
    text = f"fio load {fio.get('ioengine', '?')} qd{fio.get('iodepth', '?')}"
    text += f" bs+{extra // 1024}K" if extra > 0 else ""
    return text + (" hugetlb" if fio.get("hugetlb") else "")


def _best_load(entry: dict) -> tuple[str, dict] | None:
    """The load ceiling with the highest median read in a size's results, if any ran."""
    loads: dict[str, dict] = entry.get("fio_loads") or {}
    if not loads:
        return None
    best = entry.get("fio_load_best")
    if isinstance(best, str) and best in loads:
        return best, loads[best]
    key = max(loads, key=lambda k: loads[k].get("read_gbps", 0.0))
    return key, loads[key]


def _ceiling_lines(results: dict) -> list[str]:
    """How close each figure is to fio's ceiling, and why a figure can be above it."""
    with_fio = [e for e in results["sizes"] if e.get("fio")]
    if not with_fio:
        return [f"Ceiling: skipped ({results['fio'].get('skipped', 'fio not run')})"]
    out = [
        "Against the ceiling (the tier's median as a share of fio's median on the same "
        'directory, block size and parallelism;\n100% = as fast as fio; "overlap": the '
        "min-max ranges overlap, so this run cannot tell the two apart)"
    ]
    rows: list[list[str]] = []
    above = False
    for entry in with_fio:
        fio = entry["fio"]
        for name, t in entry["tiers"].items():
            tp = t["throughput"]
            cells = [f"{entry['label']} {_tier_label(name, results)}"]
            for mine, theirs in (("store_gbps", "write_gbps"), ("load_gbps", "read_gbps")):
                if not tp.get(mine) or not fio.get(theirs):
                    cells.append("-")
                    continue
                share = tp[mine] / fio[theirs]
                cell = _pct(share)
                if _overlap(tp, mine, fio, theirs):
                    cell += " (overlap)"  # above 100% or not, the runs cannot tell
                else:
                    above = above or share > 1.0
                cells.append(cell)
            best = _best_load(entry)
            if best is not None:
                share = _ratio(tp.get("load_gbps"), best[1].get("read_gbps"))
                cells.append(_pct(share) if share is not None else "-")
            rows.append(cells)
    header = ["block / tier", "store / fio write", "load / fio read"]
    if any(_best_load(e) for e in with_fio):
        header.append("load / best fio load")
    out.append(_table(header, rows))
    if above:  # clearly above: the runs' ranges do not overlap
        out.extend(_above_ceiling_reason(results, with_fio[0]["fio"]))
    out.append("")
    out.extend(_target_lines(results, with_fio))
    out.append("Ceiling commands (fio, per run):")
    for entry in with_fio:
        for ceiling in BASIC_CEILINGS:
            if entry.get(ceiling.key):
                out.append(
                    f"  {entry['label']} {ceiling.label}: {entry[ceiling.key]['write_command']}"
                )
                out.append(
                    f"  {entry['label']} {ceiling.label}: {entry[ceiling.key]['read_command']}"
                )
        out.extend(_load_ceiling_lines(entry))
    for key, reason in results.get("fio", {}).get("skipped_ceilings", {}).items():
        label = next((c.label for c in CEILINGS if c.key == key), key)
        out.append(f"  {label}: skipped ({reason})")
    return out


def _load_ceiling_lines(entry: dict) -> list[str]:
    """The load ceilings of one size: the layout and the best one's commands, and every
    load ceiling's median read on one wrapped line (all their figures are in the JSON)."""
    best = _best_load(entry)
    if best is None:
        return []
    _, fio = best
    label = entry["label"]
    out = []
    layout = entry.get("fio_load_layout", {})
    if layout.get("write_command"):
        out.append(f"  {label} fio layout the load ceilings read: {layout['write_command']}")
    out.append(f"  {label} {_load_label(entry, fio)} (best load): {fio['read_command']}")
    loads = entry.get("fio_loads", {})
    figures = "; ".join(
        f"{_load_label(entry, v).removeprefix('fio load ')} {_f(v.get('read_gbps'))}"
        for v in loads.values()
    )
    text = f"{label} load ceilings, read GB/s (median; all figures in --json): {figures}"
    out.extend("  " + line for line in textwrap.wrap(text, width=96, subsequent_indent="    "))
    return out


def _ratio(mine: float | None, theirs: float | None) -> float | None:
    return mine / theirs if mine and theirs else None


def _engine_comparison(results: dict) -> list[str]:
    """--compare-io-engines: io_uring against psync per block size, as ratios (>1: io_uring
    moves more per second, or spends more CPU per GiB, or waits longer under the flood)."""
    if not results["config"].get("compare_io_engines"):
        return []
    rows = []
    for entry in results["sizes"]:
        ps = entry["tiers"].get("kvtier-psync")
        ur = entry["tiers"].get("kvtier-io_uring")
        cells = [entry["label"]]
        for key in ("store_gbps", "load_gbps"):
            mine = ps["throughput"].get(key) if ps else None
            theirs = ur["throughput"].get(key) if ur else None
            cells += [_f(mine), _f(theirs) if ur else "unavailable"]
            cells.append(_f(_ratio(theirs, mine), "{:.2f}x"))
        for key in ("store_cpu_s_per_gib", "load_cpu_s_per_gib"):
            mine = ps["throughput"].get(key) if ps else None
            theirs = ur["throughput"].get(key) if ur else None
            cells.append(_f(_ratio(theirs, mine), "{:.2f}x"))
        flood = [t["latency"]["flood"].get("p95_ms") if t else None for t in (ur, ps)]
        cells.append(_f(_ratio(*flood), "{:.2f}x"))
        rows.append(cells)
    header = ["block", "store psync", "io_uring", "ratio", "load psync", "io_uring", "ratio"]
    header += ["store CPU ratio", "load CPU ratio", "flood p95 ratio"]
    return [
        "io_uring against psync (GB/s; ratio = io_uring / psync, alternating within each run)",
        _table(header, rows),
    ]


#: The fio-relative targets: block size -> least share of fio's (psync) store and load GB/s.
_THROUGHPUT_TARGETS = {256 << 10: 0.8, 2 << 20: 0.9}
_CPU_TARGET = 1.3  # at most this times fio's CPU seconds per GiB, with checksum none
_FLOOD_TARGET = 3.0  # load p95 under a store flood at most this times idle
_LOOP_TARGET = 0.95  # scheduler loop kept while storing


def _target_lines(results: dict, with_fio: list[dict]) -> list[str]:
    """Each kvtier tier against the targets (throughput and CPU against fio psync, load p95
    under a store flood, scheduler loop kept, and against each peer's tier): the measured
    ratio, met or missed."""
    checksum = results["config"].get("checksum", "crc32c")
    rows: list[list[str]] = []

    def row(label: str, target: str, value: float | None, fmt: str, met: bool | None) -> None:
        verdict = "-" if value is None or met is None else ("met" if met else "missed")
        rows.append([f"{label}: {target}", _f(value, fmt), verdict])

    for entry in with_fio:
        fio = entry["fio"]
        for name, t in entry["tiers"].items():
            if not name.startswith("kvtier"):
                continue
            label = f"{entry['label']} {_tier_label(name, results)}"
            tp = t["throughput"]
            least = _THROUGHPUT_TARGETS.get(entry["block_size"])
            if least is not None:
                for mine, theirs, what in (
                    ("store_gbps", "write_gbps", "store"),
                    ("load_gbps", "read_gbps", "load"),
                ):
                    ratio = _ratio(tp.get(mine), fio.get(theirs))
                    met = None if ratio is None else ratio >= least
                    row(label, f"{what} >= {least}x fio psync", ratio, "{:.2f}x", met)
            for mine, theirs, what in (
                ("store_cpu_s_per_gib", "write_cpu_s_per_gib", "store"),
                ("load_cpu_s_per_gib", "read_cpu_s_per_gib", "load"),
            ):
                ratio = _ratio(tp.get(mine), fio.get(theirs))
                if checksum == "none":
                    met = None if ratio is None else ratio <= _CPU_TARGET
                    row(label, f"{what} CPU/GiB <= {_CPU_TARGET}x fio's", ratio, "{:.2f}x", met)
                else:  # the target is set for checksum none: shown, not judged
                    target = f"{what} CPU/GiB <= {_CPU_TARGET}x fio's (with --checksum none)"
                    row(label, target, ratio, "{:.2f}x", None)
            ratio = t["latency"].get("p95_ratio")
            met = None if ratio is None else ratio <= _FLOOD_TARGET
            row(label, f"load p95 under flood <= {_FLOOD_TARGET:g}x idle", ratio, "{:.1f}x", met)
            kept = t["interference"].get("ratio")
            met = None if kept is None else kept >= _LOOP_TARGET
            row(label, f"scheduler loop kept >= {_LOOP_TARGET:.0%}", kept, "{:.0%}", met)
            for peer, other in entry["tiers"].items():
                if peer.startswith("kvtier"):
                    continue
                peer_label = "vLLM's fs tier" if peer == "vllm" else _tier_label(peer, results)
                for key, what in (("store_gbps", "store"), ("load_gbps", "load")):
                    ratio = _ratio(tp.get(key), other["throughput"].get(key))
                    met = None if ratio is None else ratio >= 1.0
                    row(label, f"{what} >= {peer_label}", ratio, "{:.2f}x", met)
    if not rows:
        return []
    note = "" if checksum == "none" else ";\nCPU is judged only with --checksum none"
    return [
        "Against the targets (medians; throughput and CPU against fio psync on the same "
        f"files,\nload p95 against idle, and against each peer's tier{note})",
        _table(["block / tier: target", "measured", "result"], rows),
    ]


def _above_ceiling_reason(results: dict, fio: dict) -> list[str]:
    """Why a figure can beat fio: the two do different I/O (what `kvtier bench` runs)."""
    cfg = results["config"]
    threads = cfg["read_threads"] + cfg["write_threads"]
    first_run = (fio.get("runs") or [{}])[0]  # older results kept these per run only
    jobs = fio.get("numjobs", first_run.get("numjobs", threads))
    per_job = fio.get("size_per_job", first_run.get("size_per_job"))
    per_job_text = f"{format_size(per_job)} " if per_job else ""
    text = (
        "Above 100% does not mean faster than the device: fio is the ceiling only for its own "
        f"access pattern. fio's {jobs} jobs each stream one {per_job_text}file, one block per "
        "call, and fio's GB/s is the total over its slowest job's time; the tier's "
        f"{threads} threads share one queue and read or write one file per block (header and "
        "payload in one call). Caches and read-ahead below the file system (a virtual disk's "
        "host, a RAID controller, network storage) serve the two patterns at different speeds."
    )
    if results.get("fio", {}).get("direct", True):
        text += " Both bypass this machine's page cache (O_DIRECT)."
    else:
        text += (
            " O_DIRECT does not work here, so fio ran buffered (--direct=0) and dropped its "
            "files from the page cache before reading (its default invalidate=1), and the "
            "tier's files were fsync'd and dropped with posix_fadvise(DONTNEED) before the "
            "loads; where file data lives in memory (tmpfs, ramfs) neither drop removes "
            "anything and both read RAM: the figures then compare software overhead per "
            "block, not the storage."
        )
    return ["  " + line for line in textwrap.wrap(text, width=98)]


def write_json(results: dict, path: Path) -> None:
    path.write_text(json.dumps(results, indent=2, sort_keys=False) + "\n")

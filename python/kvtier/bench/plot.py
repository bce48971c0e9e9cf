"""``--plot``: throughput per block size and load-latency distributions (matplotlib)."""

from __future__ import annotations

from pathlib import Path

from kvtier.bench.errors import BenchError

MISSING = "--plot needs matplotlib, which is not installed: pip install 'kvtier[plot]'"


def check_matplotlib() -> None:
    """Raise BenchError before a run starts if the plot could not be drawn at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise BenchError(MISSING) from exc


def plot(results: dict, path: Path) -> None:
    check_matplotlib()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    sizes = results["sizes"]
    tiers = list(sizes[0]["tiers"]) if sizes else []
    series: list[tuple[str, list[float]]] = []
    for name in tiers:
        for direction in ("store", "load"):
            series.append(
                (
                    f"{name} {direction}",
                    [e["tiers"][name]["throughput"].get(f"{direction}_gbps", 0.0) for e in sizes],
                )
            )
    if any(e.get("fio") for e in sizes):
        for rw in ("write", "read"):
            series.append((f"fio {rw}", [e.get("fio", {}).get(f"{rw}_gbps", 0.0) for e in sizes]))

    fig, (ax_tp, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.6), dpi=80)
    x = np.arange(len(sizes))
    width = 0.8 / max(1, len(series))
    for i, (label, values) in enumerate(series):
        ax_tp.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=label)
    ax_tp.set_xticks(x, [e["label"] for e in sizes])
    ax_tp.set_ylabel("GB/s")
    ax_tp.set_xlabel("block size")
    ax_tp.set_title("Throughput (median of runs)")
    ax_tp.legend(fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.13))

    boxes, labels = [], []
    for e in sizes:
        for name in tiers:
            lat = e["tiers"][name]["latency"]
            for phase in ("idle", "flood"):
                samples = lat[phase].get("samples_ms", [])
                if samples:
                    boxes.append(samples)
                    labels.append(f"{e['label']}\n{name}\n{phase}")
    if boxes:
        ax_lat.boxplot(boxes, whis=(5, 95), showfliers=False)
        ax_lat.set_xticks(range(1, len(labels) + 1), labels, fontsize=6)
        ax_lat.set_yscale("log")
        ax_lat.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax_lat.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax_lat.set_ylabel("ms (log)")
    ax_lat.set_title("4-block load latency, idle vs. store flood (whiskers p5-p95)")
    ax_lat.title.set_fontsize(9)

    machine = results.get("machine", {})
    fs = machine.get("filesystem", {})
    fig.suptitle(
        f"kvtier bench: {machine.get('usable_cpus', '?')} CPUs, {fs.get('type', '?')} "
        f"on {fs.get('device', '?')}, kernel {machine.get('kernel', '?')}",
        fontsize=9,
    )
    fig.tight_layout()
    try:
        fig.savefig(path)
    except OSError as exc:
        raise BenchError(f"cannot write the plot to {path}: {exc.strerror}") from exc
    finally:
        plt.close(fig)

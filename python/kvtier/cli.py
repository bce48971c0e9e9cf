"""The `kvtier` command: `kvtier bench` (measure your storage), `kvtier info`, and `kvtier gc`
and `kvtier du` (capacity, in cli_capacity.py)."""

from __future__ import annotations

import argparse
import importlib.util
import platform
import shutil
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad argument as one line (``<prog>: error: ...``), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: expected an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"invalid count {text!r}: must be at least 1")
    return value


def _thread_count(text: str) -> int:
    # The fs tier's own limit, checked up front: a bad count is an argument error, not a
    # failure in the middle of a run.
    from kvtier.tiering.fs.options import MAX_THREADS

    value = _positive_int(text)
    if value > MAX_THREADS:
        raise argparse.ArgumentTypeError(
            f"invalid count {text!r}: at most {MAX_THREADS} threads (the fs tier's limit)"
        )
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: expected seconds") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid duration {text!r}: must be positive")
    return value


def _fs_option(name: str) -> Callable[[str], Any]:
    """An argparse type for one of the fs tier's options: the tier's own check (its range and
    message) on the bench's value."""

    def parse(text: str) -> Any:
        from kvtier.errors import ConfigurationError
        from kvtier.tiering.fs.options import FsTierOptions

        try:
            return getattr(FsTierOptions.parse("fs", {"root_dir": ".", name: text}), name)
        except ConfigurationError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return parse


def _sizes(text: str) -> tuple[int, ...]:
    from kvtier.bench.config import parse_block_sizes
    from kvtier.bench.errors import BenchError

    try:
        return parse_block_sizes(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _size(text: str) -> int:
    from kvtier.bench.config import parse_size
    from kvtier.bench.errors import BenchError

    try:
        return parse_size(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ceilings(text: str) -> tuple:
    from kvtier.bench.ceiling import parse_ceilings
    from kvtier.bench.errors import BenchError

    try:
        return parse_ceilings(text)
    except BenchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ceilings_help() -> str:
    from kvtier.bench.ceiling import CEILINGS_HELP

    return f"the fio ceilings (default: default): {CEILINGS_HELP}"


def _max_bytes(text: str) -> int:
    from kvtier.cli_capacity import size_arg

    return size_arg(text)  # the tier's max_bytes syntax, as `kvtier gc --max-bytes`


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The `kvtier` parser and each sub-command's; a sub-command is one ``_add_*`` function
    that sets ``run`` (its handler) as a default."""
    from kvtier import __version__

    parser = _Parser(
        prog="kvtier",
        description="kvtier: storage tiers for LLM KV-cache blocks.",
    )
    parser.add_argument("--version", action="version", version=f"kvtier {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)
    sub.required = True
    commands = {
        "bench": _add_bench(sub),
        "info": _add_info(sub),
        **_add_capacity(sub),
    }
    return parser, commands


def _add_capacity(sub: argparse._SubParsersAction) -> dict[str, argparse.ArgumentParser]:
    from kvtier.cli_capacity import add_commands, run_du

    parsers = add_commands(sub)
    parsers["gc"].set_defaults(run=_gc)
    parsers["du"].set_defaults(run=run_du)
    return parsers


def _gc(args: argparse.Namespace) -> int:
    from kvtier.cli_capacity import run_gc

    # A sidecar stopped with SIGTERM finishes like Ctrl-C: the round in progress unwinds.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    return run_gc(args)


def _add_bench(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    from kvtier.bench.config import DEFAULT_REPEAT
    from kvtier.bench.primary import DEFAULT_PRIMARY_LAYOUT, PRIMARY_LAYOUTS
    from kvtier.tiering.fs.capacity.sizes import SIZE_UNITS_HELP

    bench = sub.add_parser(
        "bench",
        help="measure KV offload on your storage (throughput, CPU, latency, interference)",
        description=(
            "Store and load KV blocks through kvtier's fs tier on --root and report GB/s, CPU "
            "seconds per GiB, load latency under a store flood and how much a Python "
            "scheduler loop slows down, next to fio's ceilings and (--peer) vLLM's, LMCache's or "
            "SGLang's tier. "
            "Every figure is the median of --repeat runs with its min-max spread."
        ),
    )
    bench.set_defaults(run=_bench)
    bench.add_argument(
        "--root",
        type=Path,
        help="existing directory on the storage to measure (a scratch directory is created in "
        "it and removed afterwards; default: the current directory)",
    )
    bench.add_argument(
        "--create-root",
        action="store_true",
        help="create --root if it does not exist (else a missing --root is an error: a "
        "mistyped mount point would measure the file system above it)",
    )
    bench.add_argument(
        "--sizes",
        type=_sizes,
        default=None,
        help=f"block sizes, comma-separated (default: 256K,2M; {SIZE_UNITS_HELP})",
    )
    bench.add_argument(
        "--total",
        type=_size,
        default=None,
        help="bytes stored per block size, all runs together (default: 1G, bounded by free "
        f"disk and memory; {SIZE_UNITS_HELP})",
    )
    bench.add_argument(
        "--read-threads",
        type=_thread_count,
        default=None,
        help="tier threads that take only loads (default: the tier's, sized by the machine)",
    )
    bench.add_argument(
        "--write-threads",
        type=_thread_count,
        default=None,
        help="tier threads that take stores first (default: the tier's, sized by the machine)",
    )
    bench.add_argument(
        "--blocks-per-job",
        type=_positive_int,
        default=8,
        help="blocks per store/load job in the throughput phase (default: 8)",
    )
    bench.add_argument(
        "--repeat",
        type=_positive_int,
        default=DEFAULT_REPEAT,
        help=f"runs per block size, side by side (default: {DEFAULT_REPEAT}); --total, "
        "--latency-samples and --loop-seconds are shared out among them, so more runs show "
        "the spread in about the same time, each on less data",
    )
    bench.add_argument(
        "--latency-samples",
        type=_positive_int,
        default=100,
        help="4-block load jobs timed idle and under the flood, all runs together (default: 100)",
    )
    bench.add_argument(
        "--loop-seconds",
        type=_positive_float,
        default=1.0,
        help="how long the idle scheduler loop runs, before and after, all runs together "
        "(default: 1)",
    )
    bench.add_argument(
        "--peer",
        action="append",
        choices=["vllm", "sglang", "lmcache"],
        default=[],
        help="also run the workload through vLLM's fs tier (needs vllm; its native I/O path "
        "where vllm.fs_io_C loads: .ci/vllm-native-env.sh), (lmcache) LMCache's "
        "LocalDiskBackend, buffered and O_DIRECT, and its FSConnector (needs lmcache: "
        ".ci/lmcache-env.sh), or (sglang) SGLang's file backend and kvtier's SGLang backend "
        "side by side (needs sglang)",
    )
    engines = bench.add_mutually_exclusive_group()
    engines.add_argument(
        "--io-engine",
        choices=["auto", "io_uring", "psync"],
        default="auto",
        help="the fs tier's io_engine (default: auto, io_uring where the kernel allows it, "
        "otherwise psync; the report says which ran and why auto fell back)",
    )
    engines.add_argument(
        "--compare-io-engines",
        action="store_true",
        help="run the tier with psync and with io_uring side by side, alternating within each "
        "run, with their ratio",
    )
    from kvtier._core import ENGINE_DEFAULTS
    from kvtier.bench.config import TIER_OPTION_FLAGS

    # The fs tier's options that the bench passes on, checked by the tier's own parser.
    flag_text = {
        "io_timeout_s": ("SECONDS", "deadline of one block operation (0: none; "),
        "max_stores_in_flight_while_loading": ("N", "stores at the device while loads run ("),
    }
    for name in TIER_OPTION_FLAGS:
        metavar, what = flag_text[name]
        default = ENGINE_DEFAULTS[name]
        bench.add_argument(
            "--" + name.replace("_", "-"),
            type=_fs_option(name),
            default=None,
            metavar=metavar,
            help=f"the fs tier's {name}: {what}default: the tier's, {default:g})",
        )
    bench.add_argument(
        "--checksum",
        choices=["crc32c", "none"],
        default="crc32c",
        help="the fs tier's checksum (default: crc32c; the CPU target is set for none)",
    )
    bench.add_argument(
        "--primary",
        choices=list(PRIMARY_LAYOUTS),
        default=DEFAULT_PRIMARY_LAYOUT,
        help="physical layout of the primary memory the tiers store from and load into: "
        "scattered (4 KiB pages faulted in a random order, as a long-running engine's), thp "
        "(transparent huge pages), plain (left to the kernel; varies from run to run); "
        f"default: {DEFAULT_PRIMARY_LAYOUT}. On a virtio disk it decides load throughput",
    )
    bench.add_argument("--no-fio", action="store_true", help="skip the fio ceilings")
    bench.add_argument("--ceilings", type=_ceilings, default=None, help=_ceilings_help())
    bench.add_argument(
        "--max-bytes",
        type=_max_bytes,
        default=None,
        metavar="SIZE",
        help='also measure a full cache of this budget ("512M", "2GB"): stores of 2 x SIZE '
        "into it (each one makes room) next to the same stores without a budget, eviction CPU "
        "per GiB, submit_store p99 with the budget and without, and recency bookkeeping on "
        f"load latency; needs 3 x SIZE free ({SIZE_UNITS_HELP})",
    )
    bench.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write every figure and the machine description as JSON",
    )
    bench.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="draw throughput and latency (needs matplotlib: kvtier[plot])",
    )
    bench.add_argument("--quiet", action="store_true", help="no progress on stderr")
    bench.add_argument(
        "--from-json",
        type=Path,
        metavar="FILE",
        help="measure nothing: print the table (and --plot) of a saved --json result",
    )
    return bench


def _add_info(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    info = sub.add_parser(
        "info",
        help="version, build options, CUDA, O_DIRECT and io_uring support",
        description="Print kvtier's version, build options, CUDA availability, whether "
        "O_DIRECT works in DIR and whether io_uring works in this process.",
    )
    info.set_defaults(run=_info)
    info.add_argument(
        "dir",
        nargs="?",
        type=Path,
        default=Path("."),
        help="directory to probe for O_DIRECT (default: .)",
    )
    return info


def _check_output_path(path: Path, option: str) -> None:
    from kvtier.bench.errors import BenchError

    parent = path.resolve().parent
    if not parent.is_dir():
        raise BenchError(f"{option} {path}: directory {parent} does not exist")
    if path.is_dir():
        raise BenchError(f"{option} {path}: is a directory, expected a file name")


def _bench(args: argparse.Namespace) -> int:
    from kvtier import _core
    from kvtier.bench.config import DEFAULT_SIZES, TIER_OPTION_FLAGS, BenchConfig
    from kvtier.bench.errors import BenchError
    from kvtier.bench.plot import check_matplotlib, plot
    from kvtier.bench.report import render, write_json
    from kvtier.bench.runner import run_bench

    # A polite kill (SIGTERM) cleans up like Ctrl-C does: SystemExit unwinds through the
    # `finally` blocks that shut the tiers down and remove the scratch directory.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    # The counts the fs tier would choose on this root, resolved here so that fio and the
    # peers run with the same numbers.
    machine = _core.machine_thread_counts(str(args.root or "."))
    config = BenchConfig(
        root=args.root,
        create_root=args.create_root,
        block_sizes=args.sizes or DEFAULT_SIZES,
        total_bytes=args.total,
        read_threads=machine[0] if args.read_threads is None else args.read_threads,
        write_threads=machine[1] if args.write_threads is None else args.write_threads,
        blocks_per_job=args.blocks_per_job,
        repeat=args.repeat,
        latency_samples=args.latency_samples,
        loop_seconds=args.loop_seconds,
        peers=tuple(dict.fromkeys(args.peer)),
        io_engine=args.io_engine,
        compare_io_engines=args.compare_io_engines,
        checksum=args.checksum,
        **{name: getattr(args, name) for name in TIER_OPTION_FLAGS},
        primary=args.primary,
        run_fio=not args.no_fio,
        ceilings=args.ceilings,
        json_path=args.json,
        plot_path=args.plot,
        progress=not args.quiet,
        max_bytes=args.max_bytes,
    )
    try:
        if config.json_path is not None:
            _check_output_path(config.json_path, "--json")
        if config.plot_path is not None:
            _check_output_path(config.plot_path, "--plot")
            check_matplotlib()
        if args.from_json is not None:
            results = _load_results(args.from_json)
        else:
            results = run_bench(config)
        print(render(results), flush=True)
        if config.json_path is not None or config.plot_path is not None:
            print()
        if config.json_path is not None:
            try:
                write_json(results, config.json_path)
            except OSError as exc:
                raise BenchError(f"cannot write {config.json_path}: {exc.strerror}") from exc
            print(f"Results (JSON): {config.json_path.resolve()}", flush=True)
        if config.plot_path is not None:
            plot(results, config.plot_path)
            print(f"Plot: {config.plot_path.resolve()}", flush=True)
    except BenchError as exc:
        print(f"kvtier bench: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except OSError as exc:
        # Anything the file system says that a phase did not translate: still one line.
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"kvtier bench: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _load_results(path: Path) -> dict:
    import json

    from kvtier.bench.errors import BenchError

    try:
        results = json.loads(path.read_text())
    except OSError as exc:
        raise BenchError(f"cannot read --from-json {path}: {exc.strerror}") from exc
    except ValueError as exc:
        raise BenchError(f"--from-json {path} is not JSON: {exc}") from exc
    if not isinstance(results, dict) or "sizes" not in results or "config" not in results:
        raise BenchError(f"--from-json {path} is not a kvtier bench result (no 'sizes')")
    return results


def _info(args: argparse.Namespace) -> int:
    import kvtier
    from kvtier import _core

    directory: Path = args.dir
    if not directory.is_dir():
        print(f"kvtier info: error: {directory} is not a directory", file=sys.stderr)
        return EXIT_USAGE
    probe = _core.probe_o_direct(str(directory))
    # Report only what the build itself says: no guessing from other installed packages.
    if hasattr(_core, "cuda_available"):
        gpu_text = "built (the CUDA runtime is loaded at run time)"
        if _core.cuda_available():
            cuda_text = "available"
        else:
            reason = getattr(_core, "cuda_unavailable_reason", lambda: "")()
            cuda_text = "not available" + (f": {reason}" if reason else "")
    else:
        gpu_text = "not built"
        cuda_text = "not available (this build has no GPU support)"
    rows = [
        ("kvtier", kvtier.__version__),
        ("native core", _core.__file__),
        ("block format version", str(_core.FORMAT_VERSION)),
        ("crc32c", _crc32c_path(_core.crc32c_is_hardware())),
        ("GPU path", gpu_text),
        ("CUDA", cuda_text),
        (
            f"O_DIRECT in {directory.resolve()}",
            "supported" if probe == "" else f"not supported: {probe}",
        ),
        ("io_uring (io_engine)", _io_uring_text()),
        ("fio (bench ceiling)", shutil.which("fio") or "not found"),
        ("matplotlib (bench --plot)", _found("matplotlib")),
        ("vllm (bench --peer vllm)", _found("vllm")),
        ("lmcache (bench --peer lmcache)", _found("lmcache")),
        ("sglang (bench --peer sglang)", _found("sglang")),
        ("CMake package", kvtier.cmake_dir()),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key.ljust(width)}  {value}")
    return 0


def _io_uring_text() -> str:
    """Whether io_engine "io_uring" (and so "auto"'s first choice) works in this process."""
    import tempfile

    from kvtier.tiering.fs.engine import io_uring_refusal

    with tempfile.TemporaryDirectory(prefix="kvtier-info-") as scratch:
        refusal = io_uring_refusal(scratch)
    return "usable" if not refusal else f"not usable, 'auto' uses psync: {refusal}"


def _crc32c_path(hardware: bool) -> str:
    """Which CRC32C implementation the native core picked on this CPU."""
    if not hardware:
        return "software"
    instructions = {"x86_64": "SSE4.2", "aarch64": "ARMv8 CRC32"}.get(platform.machine())
    return f"hardware ({instructions})" if instructions else "hardware"


def _found(module: str) -> str:
    try:
        return "found" if importlib.util.find_spec(module) is not None else "not installed"
    except (ImportError, ValueError):
        return "not installed"


def _exit_on_sigterm(signum: int, frame: object) -> NoReturn:
    raise SystemExit(128 + signum)


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = _build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # report it as the sub-command's error: "kvtier bench: error: ..."
        commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return args.run(args)
    except KeyboardInterrupt:
        print(f"kvtier {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""`kvtier gc` and `kvtier du`: the tiers' capacity policy for operators, without an engine.

`gc` brings a root within its budget and free-space floor with the code the tiers use
(scanner, survey, evictor lock, ledger), once or as a long-running sidecar; `du` shows usage
per model namespace. Both exit 0 on success and 2 on bad arguments, with one-line errors.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtier import _core
from kvtier.tiering.fs.capacity.evictor import Evicted, evict, evictor_lock
from kvtier.tiering.fs.capacity.ledger import LEDGER_FILE_NAME, UsageLedger, state_dir
from kvtier.tiering.fs.capacity.policy import (
    MAX_MIN_FREE_FRACTION,
    CapacityPolicy,
    fs_used_bytes,
)
from kvtier.tiering.fs.capacity.scanner import STATE_DIR_NAME
from kvtier.tiering.fs.capacity.sizes import SIZE_UNITS_HELP, format_size, parse_size
from kvtier.tiering.fs.capacity.survey import Survey, survey
from kvtier.tiering.fs.file_mapper import make_tier_directory

EXIT_USAGE = 2
EXIT_FAILED = 1
# `gc --once` waits this long for a tier that is evicting already, then gives up (exit 1).
LOCK_WAIT_SECONDS = 60.0


def size_arg(text: str) -> int:
    try:
        value = parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"invalid size {text!r}: must be positive")
    return value


def _fraction_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= MAX_MIN_FREE_FRACTION:
        raise argparse.ArgumentTypeError(
            f"invalid fraction {text!r}: expected a number in [0, {MAX_MIN_FREE_FRACTION}]"
        )
    return value


def _interval_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"invalid interval {text!r}: expected seconds > 0")
    return value


def add_commands(sub: Any) -> dict[str, argparse.ArgumentParser]:
    """Register `gc` and `du` on an argparse sub-parsers object; returns them by name."""
    gc = sub.add_parser(
        "gc",
        help="bring a root within its byte budget and free-space floor (LRU), once or as a sidecar",
        description="Evict least recently used block files under ROOT until it is within "
        "--max-bytes and the file system has --min-free-fraction free, with the policy the "
        "tiers use (starts above 90% of the budget, goes down to 80%). Only block files "
        "(*.kvb) are removed. ROOT must be a kvtier root (a directory a tier has used, or one "
        "made a root with --init).",
    )
    gc.add_argument("root", type=Path, metavar="ROOT", help="the tiers' root_dir")
    gc.add_argument(
        "--max-bytes",
        type=size_arg,
        metavar="SIZE",
        help=f'e.g. "500GiB", "2TB" ({SIZE_UNITS_HELP})',
    )
    gc.add_argument(
        "--init",
        action="store_true",
        help=f"make ROOT (an existing directory) a kvtier root if it is not one: create "
        f"ROOT/{STATE_DIR_NAME}/",
    )
    gc.add_argument(
        "--min-free-fraction",
        type=_fraction_arg,
        default=0.05,
        metavar="F",
        help="free-space floor of the file system (default: 0.05)",
    )
    mode = gc.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="one round, then exit (default)")
    mode.add_argument(
        "--interval", type=_interval_arg, metavar="SECONDS", help="run a round every SECONDS"
    )
    gc.add_argument("--dry-run", action="store_true", help="report what would go; remove nothing")
    gc.add_argument("--json", type=Path, metavar="FILE", help="write the (last) summary as JSON")
    du = sub.add_parser(
        "du",
        help="usage of a root per model namespace",
        description="Blocks, bytes, tmp files and least/most recent use per model namespace "
        "under ROOT, as every tier counts them.",
    )
    du.add_argument("root", type=Path, metavar="ROOT", help="the tiers' root_dir")
    du.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return {"gc": gc, "du": du}


# A namespace directory of a tier: "<model-slug>-<fp[0:32]>" (docs/FORMAT.md, "Paths").
_NAMESPACE_RE = re.compile(r"^[A-Za-z0-9._-]{1,48}-[0-9a-f]{32}$")


def _error(command: str, message: str) -> None:
    print(f"kvtier {command}: error: {message}", file=sys.stderr)


def is_kvtier_root(root: str) -> bool:
    """Whether ``root`` is a kvtier root: it holds the capacity state directory, or the
    namespace directory (with its config.json) of a tier that used it (docs/FORMAT.md)."""
    try:
        if stat.S_ISDIR(os.lstat(os.path.join(root, STATE_DIR_NAME)).st_mode):
            return True
    except FileNotFoundError:
        pass
    with os.scandir(root) as entries:
        for entry in entries:
            if not (_NAMESPACE_RE.match(entry.name) and entry.is_dir(follow_symlinks=False)):
                continue
            try:
                if stat.S_ISREG(os.lstat(os.path.join(entry.path, "config.json")).st_mode):
                    return True
            except OSError:
                pass
    return False


def _check_root(command: str, root: Path, init: bool = False) -> str | None:
    """The absolute path of ``root`` if gc/du may work on it; else print why and None."""
    if not root.is_dir():
        _error(command, f"{root} is not a directory")
        return None
    path = os.path.abspath(root)
    try:
        if init:
            make_tier_directory(
                os.path.join(path, STATE_DIR_NAME), int(_core.directory_mode(0o600))
            )
        elif not is_kvtier_root(path):
            _error(
                command,
                f"{path} is not a kvtier root (no {STATE_DIR_NAME}/ and no tier namespace in "
                f"it); if it is meant to be one, make it so with `kvtier gc --init {path}`",
            )
            return None
        ledger = os.path.join(state_dir(path), LEDGER_FILE_NAME)
        try:
            mode = os.lstat(ledger).st_mode
        except FileNotFoundError:
            return path
        if not stat.S_ISREG(mode):  # a FIFO would block the first open; refuse it unopened
            _error(
                command,
                f"{ledger} is not a regular file ({_file_kind(mode)}); remove it (the tiers "
                "rebuild the ledger by a scan)",
            )
            return None
    except OSError as exc:
        _error(command, f"{exc.filename or path}: {exc.strerror or exc}")
        return None
    return path


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISLNK: "a symbolic link",
        stat.S_ISDIR: "a directory",
        stat.S_ISSOCK: "a socket",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a regular file")


def run_gc(args: argparse.Namespace) -> int:
    root = _check_root("gc", args.root, args.init)
    if root is None:
        return EXIT_USAGE
    return _failing_with_path("gc", root, lambda: _run_gc(args, root))


def _failing_with_path(command: str, root: str, work: Callable[[], int]) -> int:
    """``work()``, with a file-system error turned into one line naming the path (exit 1)."""
    try:
        return work()
    except OSError as exc:
        _error(command, f"{exc.filename or root}: {exc.strerror or exc}")
        return EXIT_FAILED


def _run_gc(args: argparse.Namespace, root: str) -> int:
    if args.json is not None and not args.json.resolve().parent.is_dir():
        print(f"kvtier gc: error: --json {args.json}: no such directory", file=sys.stderr)
        return EXIT_USAGE
    policy = CapacityPolicy(args.max_bytes, args.min_free_fraction, "lru")
    while True:
        summary = _gc_round(root, policy, args.dry_run, args.interval is None)
        if summary is None:
            _error("gc", f"another evictor kept {root} busy")
            return EXIT_FAILED
        print(_summary_line(summary), flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        if args.interval is None:
            return 0
        time.sleep(args.interval)


def _gc_round(root: str, policy: CapacityPolicy, dry_run: bool, wait: bool) -> dict | None:
    started = time.monotonic()
    if dry_run:  # writes nothing, not even the state directory
        return _gc_work(root, policy, True, None, started)
    deadline = started + (LOCK_WAIT_SECONDS if wait else 0.0)
    while True:
        with evictor_lock(root) as held:
            if held:
                return _gc_work(root, policy, False, UsageLedger(root), started)
        if time.monotonic() >= deadline:
            return None if wait else _skipped(root, policy, started)
        time.sleep(0.2)


def _skipped(root: str, policy: CapacityPolicy, started: float) -> dict:
    summary = _summary(root, policy, False, Survey(), Evicted(), started)
    summary["skipped"] = "another evictor is active"
    return summary


def _gc_work(
    root: str, policy: CapacityPolicy, dry_run: bool, ledger: UsageLedger | None, started: float
) -> dict:
    st = os.statvfs(root)
    known = ledger.read() if ledger is not None else None
    estimate = known.used if known is not None and known.complete else fs_used_bytes(st)
    want = max(policy.budget_need(estimate), policy.free_need(st))
    _progress(f"kvtier gc: scanning {root} ...")
    added = known.added if known is not None else 0
    found = survey(root, want + (policy.max_bytes or 0) // 20)
    if ledger is not None:
        ledger.reconcile(found.block_bytes, added)  # tmp files: in leases
    need = max(policy.budget_need(found.total_bytes), policy.free_need(os.statvfs(root)))
    if need > found.candidates.bytes:  # the estimate was low: pick again
        found = survey(root, need + (policy.max_bytes or 0) // 20)
    progress = {"files": 0, "bytes": 0}

    def batch(paths: list[str], nbytes: int, recycled: list[str]) -> None:
        # gc asks evict() to keep nothing for reuse: every file is unlinked (recycled is [])
        if ledger is not None:
            ledger.subtract(nbytes)
        progress["files"] += len(paths)
        progress["bytes"] += nbytes
        verb = "would remove" if dry_run else "removed"
        _progress(f"kvtier gc: {verb} {progress['files']} files ({format_size(progress['bytes'])})")

    done = (
        evict(found.candidates, need, dry_run=dry_run, on_batch=batch, root=root)
        if need
        else Evicted()
    )
    if done.denied and done.bytes < need:
        # The candidates were picked to cover `need`, and files this user may not remove
        # took part of them: pick again with room for those (the oldest, so picked first
        # again), and go on past them.
        again = survey(root, need + done.denied_bytes + (policy.max_bytes or 0) // 20)
        more = evict(again.candidates, need - done.bytes, on_batch=batch, root=root)
        done.paths += more.paths
        done.bytes += more.bytes
    return _summary(root, policy, dry_run, found, done, started)


def _summary(
    root: str, policy: CapacityPolicy, dry_run: bool, found: Survey, done: Evicted, started: float
) -> dict:
    st = os.statvfs(root)
    return {
        "root": root,
        "dry_run": dry_run,
        "removed_files": len(done.paths),
        "removed_bytes": done.bytes,
        # Kept: this user may not remove them (EACCES, EPERM); the first, to look at.
        "denied_files": done.denied,
        "first_denied": done.first_denied,
        "seconds": round(time.monotonic() - started, 3),
        "used_bytes_before": found.total_bytes,
        "used_bytes_after": found.total_bytes - done.bytes,
        "blocks_before": found.blocks,
        "max_bytes": policy.max_bytes,
        "min_free_fraction": policy.min_free_fraction,
        "free_fraction": round(st.f_bavail / st.f_blocks, 4) if st.f_blocks else 0.0,
    }


def _summary_line(s: dict) -> str:
    if "skipped" in s:
        return f"kvtier gc: skipped ({s['skipped']})"
    verb = "would remove" if s["dry_run"] else "removed"
    budget = "none" if s["max_bytes"] is None else format_size(s["max_bytes"])
    denied = (
        f"; {s['denied_files']} files not removable by this user (EACCES or EPERM), e.g. "
        f"{s['first_denied']}"
        if s["denied_files"]
        else ""
    )
    return (
        f"kvtier gc: {verb} {s['removed_files']} files ({format_size(s['removed_bytes'])}) in "
        f"{s['seconds']:.2f} s; usage {format_size(s['used_bytes_before'])} -> "
        f"{format_size(s['used_bytes_after'])} (max_bytes {budget}, free "
        f"{100 * s['free_fraction']:.1f}%, floor {100 * s['min_free_fraction']:.1f}%){denied}"
    )


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_du(args: argparse.Namespace) -> int:
    root = _check_root("du", args.root)
    if root is None:
        return EXIT_USAGE
    return _failing_with_path("du", root, lambda: _run_du(args, root))


def _run_du(args: argparse.Namespace, root: str) -> int:
    started = time.monotonic()
    found = survey(root, 0)
    rows: list[dict[str, Any]] = [
        {
            "namespace": name,
            "blocks": u.blocks,
            "block_bytes": u.block_bytes,
            "tmp_files": u.tmp_files,
            "tmp_bytes": u.tmp_bytes,
            "least_recent_use": _iso(u.oldest_ns),
            "most_recent_use": _iso(u.newest_ns),
        }
        for name, u in sorted(found.namespaces.items())
    ]
    ledger_path = os.path.join(state_dir(root), LEDGER_FILE_NAME)
    accounted = UsageLedger(root).read().used if os.path.exists(ledger_path) else None
    report = {
        "root": root,
        "namespaces": rows,
        "blocks": found.blocks,
        "bytes": found.total_bytes,
        "ledger_used_bytes": accounted,
        "seconds": round(time.monotonic() - started, 3),
    }
    if args.json:
        print(json.dumps(report, indent=2, sort_keys=True))
        return 0
    header = ("namespace", "blocks", "bytes", "tmp files", "least recent use", "most recent use")
    table = [header] + [
        (
            r["namespace"] or ".",
            str(r["blocks"]),
            format_size(r["block_bytes"] + r["tmp_bytes"]),
            str(r["tmp_files"]),
            r["least_recent_use"] or "-",
            r["most_recent_use"] or "-",
        )
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    ledger_text = "" if accounted is None else f", ledger {format_size(accounted)}"
    print(
        f"total: {found.blocks} blocks, {format_size(found.total_bytes)}{ledger_text} "
        f"({report['seconds']:.2f} s)"
    )
    return 0


def _iso(ns: int | None) -> str | None:
    """A use time for people: ISO 8601 in UTC, or ``@<seconds>`` (as `date -d` reads it)
    for an mtime outside what ISO dates can say (years 1-9999; anyone can set any mtime)."""
    if ns is None:
        return None
    try:
        t = datetime.datetime.fromtimestamp(ns // 10**9, tz=datetime.timezone.utc)
    except (OverflowError, OSError, ValueError):
        return f"@{ns // 10**9}"
    return t.isoformat(timespec="seconds")


__all__ = ["add_commands", "run_du", "run_gc"]

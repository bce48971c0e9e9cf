"""`kvtier gc` and `kvtier du` on a real tree of block files written by fs tiers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from block_files import immutable, planted_blocks
from kvtier.tiering.base import JobMetadata, ReqContext, make_offload_key
from kvtier.tiering.fs.capacity import block_file_bytes
from kvtier.tiering.fs.capacity.ledger import LEDGER_FILE_NAME, UsageLedger
from kvtier.tiering.fs.manager import FileSystemTierManager
from kvtier.tiering.spec import OffloadingSpec

ROW = 64 << 10
FILE = block_file_bytes(ROW)
MODELS = ("org/alpha", "org/beta")


def kvtier(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kvtier", *args], capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree(tmp_path) -> Path:
    """Two namespaces of 20 blocks each; in each, blocks 0-9 were last used an hour ago."""
    return make_tree(tmp_path / "root")


def make_tree(root: Path) -> Path:
    for model in MODELS:
        buf = np.random.default_rng(1).integers(0, 256, (1, ROW), dtype=np.uint8)
        spec = OffloadingSpec(model_name=model, dtype="float16")
        tier = FileSystemTierManager(spec, memoryview(buf), "fs", root_dir=str(root))
        for i in range(20):
            k = make_offload_key(i.to_bytes(32, "big"), 0)
            tier.submit_store(JobMetadata(i, [k], np.zeros(1, np.int64), False, ReqContext("r")))
        tier.drain_jobs()
        assert all(r.success for r in tier.get_finished())
        tier.shutdown()
    old = time.time() - 3600
    for path in root.rglob("*.kvb"):
        if int(path.name[:64], 16) < 10:
            os.utime(path, (old, old))
    return root


def blocks(root: Path) -> set[str]:
    return {str(p) for p in root.rglob("*.kvb")}


def test_du_reports_each_namespace(tree):
    proc = kvtier("du", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["blocks"] == 40 and report["bytes"] == 40 * FILE
    rows = report["namespaces"]
    assert [r["namespace"].split("-")[0] for r in rows] == ["org_alpha", "org_beta"]
    for r in rows:
        assert r["blocks"] == 20 and r["block_bytes"] == 20 * FILE and r["tmp_files"] == 0
        assert r["least_recent_use"] < r["most_recent_use"]
    table = kvtier("du", str(tree))
    assert (
        table.returncode == 0 and "org_alpha" in table.stdout and "total: 40 blocks" in table.stdout
    )


def test_gc_dry_run_removes_nothing(tree, tmp_path):
    before = blocks(tree)
    ledger = (tree / ".kvtier" / LEDGER_FILE_NAME).read_bytes()
    out = tmp_path / "gc.json"
    proc = kvtier("gc", str(tree), "--max-bytes", str(20 * FILE), "--dry-run", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert blocks(tree) == before
    summary = json.loads(out.read_text())
    assert summary["dry_run"] and summary["removed_files"] > 0
    assert "would remove" in proc.stdout
    assert (tree / ".kvtier" / LEDGER_FILE_NAME).read_bytes() == ledger  # nor the ledger


def test_gc_once_evicts_least_recently_used_blocks(tree, tmp_path):
    out = tmp_path / "gc.json"
    budget = 30 * FILE
    before = blocks(tree)
    proc = kvtier("gc", str(tree), "--max-bytes", str(budget), "--once", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    left = blocks(tree)
    assert summary["used_bytes_before"] == 40 * FILE
    assert summary["used_bytes_after"] == len(left) * FILE <= budget
    assert summary["removed_files"] == 40 - len(left) > 0
    # Only the blocks used an hour ago went: 10 per namespace were old, fewer than 20 go.
    removed_indices = {int(Path(p).name[:64], 16) for p in before - left}
    assert removed_indices <= set(range(10))
    assert "removed" in proc.stdout and "usage" in proc.stdout
    # The tiers' ledger now agrees with the tree.
    ledger = UsageLedger(str(tree)).read()
    assert ledger.files == len(left) * FILE and ledger.complete


def test_gc_never_touches_other_files(tree):
    keep = [tree / "notes.txt", next(tree.rglob("*.kvb")).with_suffix(".kvb.hostx.1.1.tmp")]
    for path in keep:
        path.write_bytes(b"keep")
    proc = kvtier("gc", str(tree), "--max-bytes", "1")
    assert proc.returncode == 0, proc.stderr
    assert not blocks(tree)
    assert all(path.read_bytes() == b"keep" for path in keep)


@pytest.mark.parametrize(
    "args",
    [
        ["gc", "{root}", "--max-bytes", "lots"],
        ["gc", "{root}", "--min-free-fraction", "0.95"],
        ["gc", "{root}", "--once", "--interval", "5"],
        ["gc", "{root}", "--interval", "0"],
        ["gc", "{root}/missing"],
        ["du", "{root}/missing"],
        ["gc", "{root}", "--max-bytes", "1G"],  # not a kvtier root
        ["du", "{root}"],
        ["gc", "{root}/missing", "--init"],
        ["du", "{root}", "--bogus"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path, args):
    proc = kvtier(*[a.format(root=tmp_path) for a in args])
    assert proc.returncode == 2
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "error" in proc.stderr


def test_gc_interval_runs_as_a_sidecar(tree, tmp_path):
    """With --interval, gc keeps the root within budget round after round until stopped."""
    out = tmp_path / "gc.json"
    budget = 30 * FILE
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "kvtier", "gc", str(tree), "--max-bytes", str(budget)]
        + ["--interval", "0.1", "--json", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not (out.exists() and len(blocks(tree)) * FILE <= budget):
            assert sidecar.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        # A new block file arrives (here: a copy); the next rounds bring the root back.
        extra = [Path(f"{p}.copy{i}.kvb") for i, p in enumerate(sorted(blocks(tree))[:8])]
        for path in extra:
            path.write_bytes(b"\0" * FILE)
        while len(blocks(tree)) * FILE > budget:
            assert sidecar.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        sidecar.terminate()
        out_text, _ = sidecar.communicate(timeout=60)
    assert out_text.startswith("kvtier gc: removed ")  # the first round's summary


# -- operators' mistakes (issue 18, item 12) ---------------------------------------------------


@pytest.mark.parametrize("command", [["gc", "--max-bytes", "1G"], ["du"]])
def test_a_directory_that_is_not_a_root_is_refused_and_left_alone(tmp_path, command):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "notes.txt").write_text("not kvtier's")
    (plain / "org_model-notahash").mkdir()  # a directory, but no tier namespace
    proc = kvtier(command[0], str(plain), *command[1:])
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert "is not a kvtier root" in line and f"kvtier gc --init {plain}" in line
    assert sorted(p.name for p in plain.iterdir()) == ["notes.txt", "org_model-notahash"]


def test_gc_init_makes_a_directory_a_root_deliberately(tmp_path):
    plain = tmp_path / "plain"
    plain.mkdir()
    proc = kvtier("gc", str(plain), "--init", "--max-bytes", "1G")
    assert proc.returncode == 0, proc.stderr
    assert (plain / ".kvtier").is_dir()
    assert kvtier("du", str(plain)).returncode == 0
    assert kvtier("gc", str(plain), "--max-bytes", "1G").returncode == 0


def test_a_root_with_tier_namespaces_is_a_root_without_capacity_state(tree):
    shutil.rmtree(tree / ".kvtier")
    proc = kvtier("du", str(tree), "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["blocks"] == 40


@pytest.fixture
def big_time_fs(tmp_path) -> Path:
    """A tmpfs: it keeps any 64-bit mtime (ext4 clamps to 1901-2446)."""
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a tmpfs")
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "none", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_du_reports_mtimes_outside_years_1_to_9999(big_time_fs):
    root = make_tree(big_time_fs / "root")
    first, second = sorted(root.rglob("*.kvb"))[:2]
    os.utime(first, (4 * 10**11, 4 * 10**11))  # the year 12,677
    os.utime(second, (-(10**11), -(10**11)))  # before year 1
    if first.stat().st_mtime != 4 * 10**11:
        pytest.skip("this tmpfs clamps mtimes")
    proc = kvtier("du", str(root), "--json")
    assert proc.returncode == 0, proc.stderr
    uses = {r["most_recent_use"] for r in json.loads(proc.stdout)["namespaces"]}
    uses |= {r["least_recent_use"] for r in json.loads(proc.stdout)["namespaces"]}
    assert {"@400000000000", f"@{-(10**11)}"} <= uses
    table = kvtier("du", str(root))
    assert table.returncode == 0 and "@400000000000" in table.stdout, table.stderr
    assert kvtier("gc", str(root), "--max-bytes", "1").returncode == 0
    assert not blocks(root)


@pytest.mark.parametrize("command", [["du"], ["gc", "--max-bytes", "1G"]])
def test_a_fifo_at_the_ledger_is_an_error_naming_it(tree, command):
    ledger = tree / ".kvtier" / LEDGER_FILE_NAME
    ledger.unlink()
    os.mkfifo(ledger)
    # Opening a FIFO for reading blocks until a writer comes: gc/du must never open it.
    proc = subprocess.run(
        [sys.executable, "-m", "kvtier", command[0], str(tree), *command[1:]],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    (line,) = proc.stderr.strip().splitlines()
    assert str(ledger) in line and "FIFO" in line


def test_gc_help_says_90_percent():
    proc = kvtier("gc", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "above 90% of the budget" in text and "%%" not in text
    assert "--init" in text


def test_gc_keeps_and_reports_blocks_it_may_not_remove(tree, tmp_path):
    """The oldest blocks sit in a directory this user may not change (immutable here; another
    user's directory is EACCES the same way): gc removes what it may and says what it kept."""
    theirs = tree / "org_gamma" / "rank-0" / "00"
    # 2001: older than every tree block, and more than the 5% of max_bytes gc picks beyond
    # what it needs: the first pick alone could not reach the budget.
    planted_blocks(theirs, 10**6, 6, FILE, 10**18)
    out = tmp_path / "gc.json"
    with immutable(theirs):
        proc = kvtier("gc", str(tree), "--max-bytes", str(30 * FILE), "--once", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(out.read_text())
    assert summary["denied_files"] == 6 and Path(summary["first_denied"]).parent == theirs
    assert len(list(theirs.iterdir())) == 6
    assert summary["used_bytes_before"] == 46 * FILE
    assert summary["used_bytes_after"] == (46 - summary["removed_files"]) * FILE <= 30 * FILE
    assert len(blocks(tree)) == 46 - summary["removed_files"]
    assert "6 files not removable by this user (EACCES or EPERM)" in proc.stdout

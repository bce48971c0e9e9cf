"""The survey of a root (native walk, kvtier._core.RootSurvey, behind survey.survey): what
`kvtier gc`, `kvtier du` and a tier's evictor count and may evict, checked against a walk of
the test's own on real files, names that are not UTF-8, a reader without permission, a stop
asked for mid-walk, and threads surveying while others store and remove files."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest
from kvtier import _core
from kvtier.tiering.fs.capacity.survey import Interrupted, survey


def own_walk(root: str) -> tuple[dict[str, list[int]], list[tuple[int, str, int]]]:
    """Per namespace [blocks, block_bytes, tmp_files, tmp_bytes], and every block as
    (mtime_ns, path, size), by os.walk without following links: the rules docs/tiers.md
    states, written out independently of kvtier's code."""
    usage: dict[str, list[int]] = {}
    blocks = []
    for d, dirs, names in os.walk(root):
        rel = os.path.relpath(d, root)
        if rel == ".":
            dirs[:] = [n for n in dirs if n != ".kvtier"]
        # A directory named like a block or a block tmp file is never walked.
        dirs[:] = [
            n for n in dirs if not n.endswith(".kvb") and not (n.endswith(".tmp") and ".kvb." in n)
        ]
        namespace = "" if rel == "." else rel.split(os.sep)[0]
        for n in names:
            path = os.path.join(d, n)
            st = os.lstat(path)
            block = n.endswith(".kvb")
            tmp = n.endswith(".tmp") and ".kvb." in n
            if not (block or tmp) or not os.path.isfile(path) or os.path.islink(path):
                continue
            u = usage.setdefault(namespace, [0, 0, 0, 0])
            if block:
                u[0] += 1
                u[1] += st.st_size
                blocks.append((st.st_mtime_ns, path, st.st_size))
            else:
                u[2] += 1
                u[3] += st.st_size
    # Oldest first, ties by the paths' bytes (a name that is not UTF-8 sorts by its bytes).
    return usage, sorted(blocks, key=lambda b: (b[0], os.fsencode(b[1]), b[2]))


def plant_tree(root: Path, seed: int) -> None:
    """Namespaces nested a few levels, blocks, tmp files, other files, links (to files and
    to directories, inside and outside), a block-named directory, names that are not
    UTF-8 and many equal mtimes."""
    rnd = random.Random(seed)
    outside = root.parent / f"outside-{seed}"
    outside.mkdir()
    (outside / "o.kvb").write_bytes(b"o" * 100)
    dirs = [bytes(root)]
    for i in range(rnd.randint(3, 25)):
        name = rnd.choice(
            [
                b"ns%d" % i,
                b"d%d" % i,
                b"x%d.kvb" % i,
                b".kvtier",
                b"bad\xff%d" % i,
                "\u00e9t\u00e9%d".encode() % i,
                b"y%d.tmp" % i,  # walked: a tmp name only with ".kvb." in it
                b"z%d.kvb.h.1.0000000000000000.1.tmp" % i,  # not walked
            ]
        )
        path = os.path.join(rnd.choice(dirs), name)
        if not os.path.exists(path):
            os.makedirs(path)
            dirs.append(path)
    for i in range(rnd.randint(0, 300)):
        d = rnd.choice(dirs)
        kind = rnd.random()
        if kind < 0.6:
            name = b"b%d.kvb" % i
        elif kind < 0.7:
            name = b"b%d.kvb.host.1.%016x.3.tmp" % (i, i)
        elif kind < 0.75:
            name = b"n\xfe%d.kvb" % i
        elif kind < 0.8:
            name = "\u00e9\U0001f600%d.kvb".encode() % i
        elif kind < 0.9:
            name = b"other%d" % i
        else:
            os.symlink(bytes(outside / "o.kvb"), os.path.join(d, b"l%d.kvb" % i))
            continue
        path = os.path.join(d, name)
        with open(path, "wb") as f:
            f.write(b"x" * rnd.randint(0, 5000))
        t = rnd.choice([10**18, 10**18 + rnd.randint(0, 999) * 10**6, 1_500_000_000 * 10**9])
        os.utime(path, ns=(t, t))
    os.symlink(bytes(outside), os.path.join(rnd.choice(dirs), b"linked-dir"))


@pytest.mark.parametrize("seed", range(12))
def test_a_survey_counts_what_a_walk_of_our_own_finds(tmp_path, seed):
    root = tmp_path / "root"
    root.mkdir()
    plant_tree(root, seed)
    usage, blocks = own_walk(str(root))
    found = survey(str(root), 1 << 62)
    got = {
        name: [u.blocks, u.block_bytes, u.tmp_files, u.tmp_bytes]
        for name, u in found.namespaces.items()
    }
    assert got == usage
    for name, u in found.namespaces.items():
        mine = [t for t, p, _ in blocks if (os.path.relpath(p, root).split(os.sep) + [""])[0]
                == name or (name == "" and os.sep not in os.path.relpath(p, root))]  # fmt: skip
        assert (u.oldest_ns, u.newest_ns) == ((min(mine), max(mine)) if mine else (None, None))
    # Every block is a candidate, oldest first, ties by path; paths as os functions take
    # them (a name that is not UTF-8 comes back as os.fsdecode spells it).
    assert [(e.mtime_ns, e.path, e.size) for e in found.candidates] == blocks
    assert all(os.path.isfile(e.path) for e in found.candidates)


def test_candidates_are_the_oldest_blocks_that_cover_what_is_wanted(tmp_path):
    ns = tmp_path / "ns"
    ns.mkdir()
    for i in range(100):
        path = ns / f"{i:03d}.kvb"
        path.write_bytes(b"x" * 1000)
        os.utime(path, ns=(10**18 + (i % 10), 10**18 + (i % 10)))  # ten blocks per instant
    found = survey(str(tmp_path), 25_000)
    # 25 oldest: the ten of the first instant, the ten of the second, five of the third
    # (by path).
    assert len(found.candidates) == 25 and found.candidates.bytes == 25_000
    names = [Path(e.path).name for e in found.candidates]
    assert names[:10] == [f"{i:03d}.kvb" for i in range(0, 100, 10)]
    assert set(names[10:20]) == {f"{i:03d}.kvb" for i in range(1, 100, 10)}
    third = names[20:]
    assert third == sorted(third) and all(int(n[:3]) % 10 == 2 for n in third)
    assert survey(str(tmp_path), 0).candidates.bytes == 0


def test_a_want_beyond_64_bits_keeps_every_block(tmp_path):
    """`kvtier gc --max-bytes 1000000PB` asks for more than 2**63 bytes of candidates."""
    (tmp_path / "ns").mkdir()
    for i in range(3):
        (tmp_path / "ns" / f"{i}.kvb").write_bytes(b"x")
    assert len(survey(str(tmp_path), 10**20).candidates) == 3


SHARED_WALK = """
import sys, threading
from kvtier import _core
for _ in range(5):
    walk = _core.RootSurvey(sys.argv[1], 1 << 62, 1 << 18)
    errors, ended = [], []
    def step():
        try:
            while not walk.advance(1):
                walk.namespaces()
                walk.files
            ended.append(True)
        except BaseException as e:
            errors.append(e)
    threads = [threading.Thread(target=step) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(ended) == 6, errors
    print(walk.files, len(walk.take_candidates()))
"""


def test_threads_sharing_one_walk_take_turns(tmp_path):
    """Six threads advance one walk a file at a time while reading its totals (each call
    releases the GIL): every file is counted once, and nothing crashes (a subprocess: a
    walk without turns freed its directory twice)."""
    for ns in range(20):
        (tmp_path / f"ns{ns}").mkdir()
        for i in range(30):
            (tmp_path / f"ns{ns}" / f"{i}.kvb").write_bytes(b"x")
    out = subprocess.run(
        [sys.executable, "-c", SHARED_WALK, str(tmp_path)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["600", "600"] * 5


def test_a_missing_root_is_empty_and_a_root_that_is_a_file_raises_with_its_path(tmp_path):
    assert survey(str(tmp_path / "missing"), 1 << 62).namespaces == {}
    plain = tmp_path / "plain"
    plain.write_bytes(b"")
    with pytest.raises(NotADirectoryError) as raised:
        survey(str(plain), 1 << 62)
    assert raised.value.filename == str(plain)


def test_a_survey_stops_when_asked_and_past_max_files(tmp_path):
    ns = tmp_path / "ns"
    ns.mkdir()
    for i in range(5000):
        (ns / f"{i}.kvb").touch()
    stop = threading.Event()
    stop.set()
    with pytest.raises(Interrupted):
        survey(str(tmp_path), 1 << 62, stop)
    assert survey(str(tmp_path), 0, max_files=5000).blocks == 5000
    with pytest.raises(Interrupted):
        survey(str(tmp_path), 0, max_files=4999)
    # Asked while it runs: a thread sets the event after the walk's first step.
    real = _core.RootSurvey
    steps = []

    class Watched:
        def __init__(self, *args):
            self.walk = real(*args)

        def advance(self, n):
            steps.append(n)
            ended = self.walk.advance(n)
            stop.set()
            return ended

        def __getattr__(self, name):
            return getattr(self.walk, name)

    stop.clear()
    pytest.MonkeyPatch().setattr(_core, "RootSurvey", Watched)
    try:
        with pytest.raises(Interrupted):
            survey(str(tmp_path), 1 << 62, stop)
    finally:
        pytest.MonkeyPatch().setattr(_core, "RootSurvey", real)
    assert steps == [4096]


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run the survey as another user")
def test_a_directory_the_user_may_not_read_is_skipped():
    """Surveyed by nobody (a forked child that dropped to uid 65534): a namespace it may not
    read is left out, the rest is counted."""
    root = Path(tempfile.mkdtemp(prefix="kvtier-survey-"))
    try:
        root.chmod(0o755)
        for ns, mode in (("open", 0o755), ("closed", 0o700)):
            (root / ns).mkdir()
            (root / ns / "1.kvb").write_bytes(b"x")
            (root / ns).chmod(mode)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: only system calls and the survey, then _exit
            code = 1
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                found = survey(str(root), 1 << 62)
                blocks = {n: u.blocks for n, u in found.namespaces.items()}
                os.write(write, json.dumps(blocks).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        with os.fdopen(read, "rb") as f:
            out = f.read()
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert json.loads(out) == {"open": 1}
    finally:
        shutil.rmtree(root)


def test_threads_survey_one_root_while_others_store_and_remove(tmp_path):
    """Eight threads walk one root at once while two others create and remove blocks and
    whole directories: no walk fails, and each counts at least the blocks that never move
    and at most those plus the ones that come and go."""
    stable = tmp_path / "stable"
    stable.mkdir()
    for i in range(300):
        (stable / f"{i}.kvb").write_bytes(b"s" * 10)
    stop = threading.Event()
    errors: list[BaseException] = []
    counts: list[int] = []

    def churn(k: int) -> None:
        n = 0
        while not stop.is_set():
            d = tmp_path / f"churn{k}" / f"{n % 7}"
            d.mkdir(parents=True, exist_ok=True)
            for i in range(20):
                (d / f"{i}.kvb").write_bytes(b"c")
            for i in range(20):
                (d / f"{i}.kvb").unlink()
            d.rmdir()
            n += 1

    def walk() -> None:
        try:
            for _ in range(30):
                counts.append(survey(str(tmp_path), 1 << 62).blocks)
        except BaseException as e:  # any failure of a walk is the test's failure
            errors.append(e)

    churners = [threading.Thread(target=churn, args=(k,)) for k in range(2)]
    walkers = [threading.Thread(target=walk) for _ in range(8)]
    for t in churners + walkers:
        t.start()
    for t in walkers:
        t.join()
    stop.set()
    for t in churners:
        t.join()
    assert errors == []
    assert len(counts) == 240 and all(300 <= c <= 340 for c in counts)

"""Reaping dead writers' records (UsageLedger.reap_dead) with real files, real processes and
real OFD locks: every ordering of a writer's last record, its death, the evictor's reading
and a crash of the evictor itself must leave the count at or above the block bytes it stands
for (docs/tiers.md, "The margin": every accounting error over-counts)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kvtier.tiering.fs.capacity import block_file_bytes
from kvtier.tiering.fs.capacity.ledger import (
    Base,
    UsageLedger,
    replace_atomically,
    writers_dir,
)

FILE = block_file_bytes(256 << 10)
BEFORE = 20 * FILE  # block bytes the count holds before any of these writers

# A writer in a process of its own: it holds its lock (an OFD lock, released when the
# process dies) and writes the records it is sent on stdin, one "added writing reserved" a
# line, answering each once it is in place.
WRITER = """
import sys
from kvtier.tiering.fs.capacity.ledger import WriterRecord, WriterSlot
slot = WriterSlot(sys.argv[1], 0o600)
print(slot.id, flush=True)
for line in sys.stdin:
    slot.write(WriterRecord(*map(int, line.split())))
    print("written", flush=True)
"""

# An evictor that reaps and is SIGKILLed right after it unlinks the first file whose name
# ends with argv[2]: a crash at that point of the reap.
CRASHING_REAPER = """
import os, signal, sys
from kvtier.tiering.fs.capacity.ledger import UsageLedger
unlink = os.unlink
def unlink_then_die(path, *args, **kwargs):
    unlink(path, *args, **kwargs)
    if str(path).endswith(sys.argv[2]):
        os.kill(os.getpid(), signal.SIGKILL)
os.unlink = unlink_then_die
ledger = UsageLedger(sys.argv[1])
ledger.reap_dead(ledger.read())
"""


class Writer:
    def __init__(self, root: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(root)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.id = self.proc.stdout.readline().strip()
        assert len(self.id) == 32, self.id

    def write(self, added: int, writing: int = 0, reserved: int = 0) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{added} {writing} {reserved}\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "written"

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=30)


@pytest.fixture
def ledger(tmp_path: Path) -> UsageLedger:
    led = UsageLedger(str(tmp_path))
    led.publish(Base(BEFORE, True, {}))
    return led


def leftovers(led: UsageLedger) -> list[str]:
    return sorted(p.name for p in Path(writers_dir(led.root)).iterdir())


def test_a_last_record_written_after_the_evictor_read_the_records_is_counted(
    ledger: UsageLedger,
) -> None:
    """The evictor lists the records while the writer is alive; the writer then settles its
    reservation (4 more files) in its last record and dies before the evictor tries its lock.
    The record to fold in is the last one, read after the lock was taken."""
    w = Writer(Path(ledger.root))
    w.write(10 * FILE, 0, 4 * FILE)
    state = ledger.read()
    w.write(14 * FILE)
    w.kill()
    after, uncertain = ledger.reap_dead(state)
    assert after.used == BEFORE + 14 * FILE, (after.used - BEFORE) / FILE
    assert ledger.read().used == BEFORE + 14 * FILE
    assert not uncertain  # its last record is exact: nothing in flight, nothing reserved
    assert leftovers(ledger) == []


def test_a_writer_dead_holding_a_reservation_is_counted_in_full_and_recounted(
    ledger: UsageLedger,
) -> None:
    """Stores take from a reservation in memory; their files exist before a record shows
    them. A writer killed holding 4 files' reservation may have written up to 4 more files:
    they are counted, and the count is marked for a scan."""
    w = Writer(Path(ledger.root))
    w.write(10 * FILE, 0, 4 * FILE)
    w.kill()
    after, uncertain = ledger.reap_dead(ledger.read())
    assert uncertain
    assert after.used == BEFORE + 14 * FILE
    assert ledger.read().used == BEFORE + 14 * FILE


@pytest.mark.parametrize("dies_after", [".lock", ".rec"])
def test_an_evictor_killed_while_it_reaps_loses_no_bytes(
    ledger: UsageLedger, dies_after: str
) -> None:
    """The evictor dies right after it removed the dead writer's lock file, or its record:
    the count already holds the writer's bytes, and the next reap neither loses nor adds
    them again."""
    w = Writer(Path(ledger.root))
    w.write(12 * FILE)
    w.kill()
    reaper = subprocess.run(
        [sys.executable, "-c", CRASHING_REAPER, ledger.root, dies_after],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert reaper.returncode == -signal.SIGKILL, reaper.stderr  # it did die mid-reap
    assert ledger.read().used == BEFORE + 12 * FILE
    after, _ = ledger.reap_dead(ledger.read())
    assert after.used == BEFORE + 12 * FILE
    assert ledger.read().used == BEFORE + 12 * FILE
    assert leftovers(ledger) == []


def test_a_count_older_than_the_listing_of_records_is_not_trusted(ledger: UsageLedger) -> None:
    """What an evictor on a second mount reads when its client cache serves an old
    ``usage.kvl`` while its listing of records is fresh, after the first evictor folded a
    dead writer in and removed its record: the old count has a folded entry for that writer
    and lacks what it added since. That count is uncertain (a scan must rebuild it) and the
    entry that shows it is kept until then."""
    w = Writer(Path(ledger.root))
    w.write(4 * FILE)
    ledger.subtract(0)  # an evictor's publish while it is alive: 4 files folded in
    old = Path(ledger.path).read_bytes()
    w.write(9 * FILE)
    w.kill()
    after, _ = ledger.reap_dead(ledger.read())  # the first evictor
    assert after.used == BEFORE + 9 * FILE and leftovers(ledger) == []
    replace_atomically(ledger.path, old, 0o600)  # what the second one reads
    stale = ledger.read()
    assert stale.used == BEFORE + 4 * FILE  # 5 files short
    _, uncertain = ledger.reap_dead(stale)
    assert uncertain
    assert stale.orphans == [w.id]
    ledger.subtract(FILE)  # an eviction wave in between keeps the evidence
    assert ledger.read().orphans == [w.id]
    _, uncertain = ledger.reap_dead(ledger.read())
    assert uncertain
    rebuilt = ledger.reconcile(BEFORE + 8 * FILE, 0)  # the scan: what is on disk now
    assert rebuilt.orphans == [] and rebuilt.used == BEFORE + 8 * FILE
    assert ledger.reap_dead(ledger.read()) == (ledger.read(), False)

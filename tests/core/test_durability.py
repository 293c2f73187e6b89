"""The durability retrofit: journal file format, crash tails, term/vote meta, follower acks."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from doq_lib.raft.durability import MAGIC, DurableJournal
from tests.harness import REPO


def _journal(tmp_path: object) -> DurableJournal:
    return DurableJournal(os.path.join(str(tmp_path), "journal.bin"))


def _fill(journal: DurableJournal, first: int, count: int, term: int = 1) -> None:
    for idx in range(first, first + count):
        journal.add(b"cmd-%d" % idx, idx, term)


def test_entries_survive_reopen_and_sync_marks_them_durable(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 5)
    assert j.dirty and j.synced_index == 0
    j.sync()
    assert not j.dirty and j.synced_index == 5 and j.stats.syncs == 1
    j.sync()
    assert j.stats.syncs == 1, "a clean journal must not fsync again"
    j._destroy()
    again = _journal(tmp_path)
    assert [e[1] for e in again] == [1, 2, 3, 4, 5]
    assert again[2] == (b"cmd-3", 3, 1)
    assert again.synced_index == 5


def test_a_torn_tail_is_cut_off_on_open(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 3)
    j.sync_now()
    with open(j.path, "ab") as f:                       # a half-written record after a crash
        f.write(b"\x20\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00partial")
    size_with_tail = os.path.getsize(j.path)
    os.close(j._fd)
    reopened = _journal(tmp_path)
    assert len(reopened) == 3
    assert os.path.getsize(j.path) < size_with_tail
    reopened.add(b"cmd-4", 4, 1)                         # appending after the cut works
    reopened._destroy()
    assert [e[1] for e in _journal(tmp_path)] == [1, 2, 3, 4]


def test_a_corrupt_record_ends_the_log_there(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 4)
    j._destroy()
    offset = _journal(tmp_path)._offsets[2]
    with open(j.path, "r+b") as f:                       # flip a byte inside record 3
        f.seek(offset + 26)
        byte = f.read(1)
        f.seek(offset + 26)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert [e[1] for e in _journal(tmp_path)] == [1, 2]


def test_truncation_and_compaction(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 10)
    j.sync()
    j.deleteEntriesFrom(6)                               # drop entries 7..10 (position 6)
    assert [e[1] for e in j] == [1, 2, 3, 4, 5, 6] and j.synced_index == 6
    _fill(j, 7, 2, term=2)
    j.deleteEntriesTo(4)                                 # keep positions 4.. (entries 5..8)
    assert [e[1] for e in j] == [5, 6, 7, 8]
    j._destroy()
    reopened = _journal(tmp_path)
    assert [(e[1], e[2]) for e in reopened] == [(5, 1), (6, 1), (7, 2), (8, 2)]
    with open(j.path, "rb") as f:
        assert f.read(len(MAGIC)) == MAGIC


def test_an_append_of_entries_already_present_rewrites_nothing(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 6, term=2)
    j.sync()
    size, epoch = os.path.getsize(j.path), j._epoch
    j.begin_append(2)                          # the leader resends 3..4 after a stale reset
    j.deleteEntriesFrom(2)
    j.add(b"cmd-3", 3, 2)
    j.add(b"cmd-4", 4, 2)
    j.end_append()
    assert [e[1] for e in j] == [1, 2, 3, 4, 5, 6], "entries 5..6 of this leader are kept"
    assert os.path.getsize(j.path) == size and j._epoch == epoch and j.synced_index == 6


def test_an_append_cuts_the_log_at_the_first_conflict(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 6, term=1)
    j.sync()
    j.begin_append(3)
    j.deleteEntriesFrom(2)
    j.add(b"cmd-3", 3, 1)                      # same as ours
    j.add(b"new-4", 4, 3)                      # conflicts: 4..6 go
    j.end_append()
    assert [(e[1], e[2]) for e in j] == [(1, 1), (2, 1), (3, 1), (4, 3)]
    assert j.synced_index == 3
    j._destroy()
    assert _journal(tmp_path)[3] == (b"new-4", 4, 3)


def test_a_stale_suffix_from_another_term_is_cut_after_the_append(tmp_path: object) -> None:
    j = _journal(tmp_path)
    _fill(j, 1, 5, term=1)
    j.begin_append(2)
    j.deleteEntriesFrom(2)
    j.add(b"cmd-3", 3, 1)
    j.end_append()                             # 4..5 were written by an older leader
    assert [e[1] for e in j] == [1, 2, 3]


def test_term_and_vote_are_stored_durably_before_returning(tmp_path: object) -> None:
    j = _journal(tmp_path)
    j.setCurrentTerm(7, "node-b")
    assert j.stats.meta_syncs == 1
    assert not os.path.exists(j.path + ".meta.tmp")
    with open(j.path + ".meta", "rb") as f:
        meta = pickle.loads(f.read())
    assert meta["currentTerm"] == 7 and meta["votedForNodeId"] == "node-b"
    j.setRaftCommitIndex(42)
    assert j.stats.meta_syncs == 1, "the commit index is flushed lazily"
    j.onOneSecondTimer()
    assert j.stats.meta_syncs == 2
    reopened = _journal(tmp_path)
    assert (reopened.getCurrentTerm(), reopened.getVotedForNodeId()) == (7, "node-b")
    assert reopened.getRaftCommitIndex() == 42


def _probe(tmp_path: object, mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "probes", "ack_probe.py"),
         str(tmp_path), mode, "200"],
        capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_followers_ack_only_synced_entries(tmp_path: object) -> None:
    """Three real Raft nodes; every follower ack on the wire is checked against its journal."""
    result = _probe(tmp_path, "durable")
    assert result["committed"] == 201
    assert result["acks"] > 10
    assert result["unsynced_acks"] == 0
    assert result["commits"] > 10
    assert result["commits_not_on_durable_majority"] == 0
    syncs = result["follower_syncs"]
    assert all(0 < s for s in syncs), "followers must fsync"          # type: ignore[union-attr]
    entries = result["follower_log_entries"]
    assert all(s <= e for s, e in zip(syncs, entries)), "at most one fsync per entry"  # type: ignore[arg-type]


def test_the_probe_detects_acks_of_unsynced_entries(tmp_path: object) -> None:
    """Negative control: with the hold-back disabled the same probe sees unsynced acks."""
    result = _probe(tmp_path, "plain")
    assert result["committed"] == 201
    assert result["unsynced_acks"] > 0


def test_the_probe_detects_a_leader_that_counts_its_unsynced_entries(tmp_path: object) -> None:
    """Negative control of the leader's side: a leader that counts itself toward the majority
    before its own fsync announces commits that only one node has on disk."""
    result = _probe(tmp_path, "leader-plain")
    assert result["committed"] == 201
    assert result["commits_not_on_durable_majority"] > 0


def test_a_restarted_leader_is_not_caught_up_before_it_applied_every_acknowledged_write(
        tmp_path: object) -> None:
    """After a system crash the journal's meta may hold an old commit index and the store is
    rebuilt from the journal. PySyncObj's isReady turned true at that old index, so /readyz
    said 200 (and the crash test read a queue) before the last acknowledged writes were
    applied; the window is as long as the new term's first commit takes (its sync is 300 ms
    late in the probe). ``caught_up`` (what /readyz asks) waits for that commit."""
    out = subprocess.run(
        [sys.executable, os.path.join(REPO, "tests", "probes", "ready_probe.py"),
         str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=REPO, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ready_while_behind"] > 0, f"the probe must open the window: {result}"
    assert result["caught_up_while_behind"] == 0, result
    assert result["caught_up"] is True and result["applied"] == result["last"]
    assert result["ready"] == 40, "every acknowledged enqueue is back"


def _wait_for(predicate: object, seconds: float = 5.0) -> None:
    import time

    import gevent
    deadline = time.monotonic() + seconds
    while not predicate():                     # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        gevent.sleep(0.005)


def test_the_sync_thread_runs_jobs_in_order_and_reports_in_the_loop() -> None:
    import threading

    from doq_lib.raft.syncer import SyncThread
    loop_thread = threading.get_ident()
    worker = SyncThread()
    ran_in: list[int] = []
    reported: list[tuple[object, bool, int]] = []

    def job(n: int) -> None:
        ran_in.append(threading.get_ident())

    def broken() -> None:
        raise OSError("the disk went away")
    for n in range(5):
        worker.submit(job, (n,), lambda ok, n=n: reported.append(
            (n, ok, threading.get_ident())))
    worker.submit(broken, (), lambda ok: reported.append(("broken", ok, threading.get_ident())))
    _wait_for(lambda: len(reported) == 6)
    assert [r[:2] for r in reported] == [(0, True), (1, True), (2, True), (3, True),
                                         (4, True), ("broken", False)]
    assert {r[2] for r in reported} == {loop_thread}, "done() runs in the event loop"
    assert len(ran_in) == 5 and loop_thread not in ran_in, "jobs run in the worker thread"
    assert worker.jobs_run == 6
    worker.stop()


def test_a_journal_synced_by_the_sync_thread(tmp_path: object) -> None:
    from doq_lib.raft.syncer import SyncThread
    worker = SyncThread()
    journal = DurableJournal(os.path.join(str(tmp_path), "j.bin"), background=worker.submit)
    synced: list[int] = []
    journal.on_synced = lambda: synced.append(journal.synced_index)
    for idx in range(1, 4):
        journal.add(b"cmd%d" % idx, idx, 1)
    assert journal.synced_index == 0 and journal.dirty
    journal.start_sync()
    assert journal.syncing and journal.synced_index == 0      # runs in the worker
    journal.wait_synced()
    assert journal.synced_index == 3 and synced[-1] == 3
    journal.add(b"cmd4", 4, 1)
    journal.wait_synced()
    assert journal.synced_index == 4
    journal._destroy()
    worker.stop()


def test_the_loop_notifier_wakes_the_poll_from_a_greenlet_and_from_a_thread() -> None:
    import threading
    import time

    import gevent

    from doq_lib.raft.poller import GeventPoller, LoopNotifier
    poller = GeventPoller()
    notifier = LoopNotifier(poller)
    for wake in (lambda: gevent.spawn_later(0.05, notifier.notify),
                 lambda: threading.Timer(0.05, notifier.notify).start()):
        wake()
        started = time.monotonic()
        poller.poll(5.0)
        assert time.monotonic() - started < 2.0, "the poll was not woken"


def test_a_journal_synced_through_native_aio(tmp_path: object) -> None:
    """The kernel runs the fdatasync; its completion arrives in the event loop, in order."""
    import threading

    from doq_lib.raft import aio
    assert aio.available(str(tmp_path)), "this kernel takes AIO fdatasync (Linux 4.18+)"
    syncer = aio.AioSync()
    journal = DurableJournal(os.path.join(str(tmp_path), "j.bin"), background=syncer.submit)
    synced: list[tuple[int, int]] = []
    journal.on_synced = lambda: synced.append((journal.synced_index, threading.get_ident()))
    for idx in range(1, 4):
        journal.add(b"cmd%d" % idx, idx, 1)
    journal.start_sync()
    assert journal.syncing and journal.synced_index == 0        # the kernel has it
    journal.wait_synced()
    assert synced == [(3, threading.get_ident())]
    journal.add(b"cmd4", 4, 1)
    journal.wait_synced()
    assert journal.synced_index == 4 and syncer.jobs_run == 2
    with pytest.raises(ValueError):
        syncer.submit(os.fsync, (0,), lambda ok: None)          # fdatasync only
    journal._destroy()
    syncer.stop()
    assert [e[1] for e in _journal(tmp_path)] == []              # another file: j.bin kept
    reopened = DurableJournal(os.path.join(str(tmp_path), "j.bin"))
    assert [e[1] for e in reopened] == [1, 2, 3, 4]


def test_without_native_aio_the_node_falls_back_to_the_sync_thread(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from doq_lib.raft import aio
    monkeypatch.setattr(aio, "_SYSCALLS", {})
    assert not aio.available(str(tmp_path))
    assert os.listdir(str(tmp_path)) == [], "the probe leaves nothing behind"

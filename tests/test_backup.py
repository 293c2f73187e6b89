"""Backups and restores: the file format, the change history, restore through the log
(state machine level here; a real cluster and the CLI in test_backup_cluster.py)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Iterator

import pytest

from doq_lib import backup as bk
from doq_lib import commands as C
from doq_lib.errors import Conflict, InvalidArgument, ResultCode
from doq_lib.store import TRACKED
from tests.test_fsm import OK, RR, T0, WEIGHTED, Node, create, dequeue, enqueue, nack

DAY_MS = 86_400_000


def take(node: Node, since: int = 0) -> bytes:
    stream = bk.BackupStream(node.store, since, "test")
    return b"".join(stream.chunks())


def queue_state(node: Node) -> str:
    """Digest of the queue state alone (no Raft bookkeeping)."""
    return node.store.state(include_meta=False)[1]


def restore(node: Node, *files: bytes, token: str = "t") -> tuple[int, object]:
    """Restore through the state machine as Service.restore does (parts in order)."""
    headers: list[bk.Header] = []
    assert node.ok((C.RESTORE_BEGIN, token)) is None
    for data in files:
        f = io.BytesIO(data)
        for part in bk.scan(f):
            headers.append(part.header)
            records = list(bk.part_records(f, part))
            for i in range(0, len(records), 7):                 # several chunks
                node.ok((C.RESTORE_PUT, token, records[i:i + 7]))
    first, last = headers[0], headers[-1]
    return node.do((C.RESTORE_COMMIT, token, first.kind == "full", first.since,
                    last.last_version, max(h.last_id for h in headers),
                    max(h.next_qid for h in headers)))


def fill(node: Node) -> dict[str, list[int]]:
    node.run(create("d"), create("rr", "fair", RR, 2, 3600), create("w", "fair", WEIGHTED),
             create("gone"))
    ids: dict[str, list[int]] = {"d": [], "rr": [], "w": []}
    for i in range(30):
        ids["d"].append(node.ok(enqueue("d", f"d{i}", i % 7, metadata={"n": str(i)}))[0])
        ids["rr"].append(node.ok(enqueue("rr", f"r{i}", 5, f"g{i % 3}"))[0])
        ids["w"].append(node.ok(enqueue("w", f"w{i}", 5, f"g{i % 2}.{i % 3}"))[0])
    node.ok(enqueue("gone", "bye"))
    node.ok(dequeue("rr"))                                      # unacked, with a deadline
    node.ok(dequeue("d", True))
    return ids


@pytest.fixture
def source(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "source")
    yield n
    n.close()


@pytest.fixture
def target(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "target")
    n.run(create("old"), enqueue("old", "replaced"))         # a full restore replaces this
    yield n
    n.close()


# -- the format ----------------------------------------------------------------------------------

def test_full_backup_round_trip(source: Node, target: Node) -> None:
    fill(source)
    data = take(source)
    parts = bk.scan(io.BytesIO(data))
    assert len(parts) == 1
    header = parts[0].header
    assert (header.kind, header.since, header.last_version) == ("full", 0, source.index)
    assert header.last_id == source.sm.last_id and header.next_qid == source.sm.next_qid
    stored = sum(len(source.store.dump()[name]) for name in TRACKED)
    assert parts[0].records == stored
    assert restore(target, data) == (OK, {"queues": 4})
    assert queue_state(target) == queue_state(source)
    assert "old" not in target.sm.queues
    # the in-memory indexes follow: the same deliveries in the same order on both sides
    for q in ("d", "rr", "w"):
        assert target.drain_ids(q) == source.drain_ids(q)
    assert queue_state(target) == queue_state(source)


def test_incrementals_replay_changes_and_deletions(source: Node, target: Node) -> None:
    ids = fill(source)
    full = take(source)
    v0 = source.index
    # changes: enqueue, ack, nack, delete a message, delete a queue, create a queue
    delivered = source.ok(dequeue("d"))[0]
    source.ok((C.ACK, "d", delivered))
    source.ok((C.DELETE, "w", ids["w"][3]))
    source.ok((C.DELETE_QUEUE, "gone"))
    source.run(create("new", "fair", RR), enqueue("new", "fresh", 1, "a"))
    inc1 = take(source, v0 + 1)
    v1 = source.index
    rr = source.ok(dequeue("rr"))[0]
    source.ok(nack("rr", rr, 9, {"retry": "1"}))
    source.ok((C.UPDATE_PRIORITY, "d", ids["d"][5], 99))
    source.ok(enqueue("d", "late", 1))
    inc2 = take(source, v1 + 1)
    h1, h2 = bk.scan(io.BytesIO(inc1))[0].header, bk.scan(io.BytesIO(inc2))[0].header
    assert (h1.kind, h1.since, h1.last_version) == ("incremental", v0 + 1, v1)
    assert (h2.since, h2.last_version) == (v1 + 1, source.index)
    # deletions are in the file
    deleted = [r for r in bk.part_records(io.BytesIO(inc1), bk.scan(io.BytesIO(inc1))[0])
               if r[2] is None]
    assert any(code == TRACKED["queues"] and key == b"gone" for code, key, _ in deleted)
    # one at a time, in order
    assert restore(target, full, token="a")[0] == OK
    assert restore(target, inc1, token="b")[0] == OK
    assert restore(target, inc2, token="c")[0] == OK
    assert queue_state(target) == queue_state(source)
    assert target.sm.restored_version == source.index
    assert set(target.sm.queues) == {"d", "rr", "w", "new"}
    for q in ("d", "rr", "w", "new"):
        assert target.drain_ids(q) == source.drain_ids(q)


def chain(node: Node, incrementals: int) -> list[bytes]:
    """A full backup of ``node``, then ``incrementals`` backups each after one enqueue."""
    files = [take(node)]
    for i in range(incrementals):
        since = node.index + 1
        node.ok(enqueue("d", f"change-{i}"))
        files.append(take(node, since))
    return files


def test_all_files_in_one_restore_and_concatenated(source: Node, tmp_path: Path) -> None:
    fill(source)
    full, inc = chain(source, 1)
    for name, files in (("separate", (full, inc)), ("joined", (full + inc,))):
        other = Node(tmp_path / name)
        try:
            assert restore(other, *files)[0] == OK
            assert queue_state(other) == queue_state(source)
        finally:
            other.close()


def test_an_empty_incremental_is_valid(source: Node) -> None:
    fill(source)
    data = take(source, source.index + 1)
    part = bk.scan(io.BytesIO(data))[0]
    assert part.records == 0 and part.header.since == source.index + 1


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:len(d) // 2], "truncated: the file ends inside"),
    (lambda d: d[:-1], "truncated"),
    (lambda d: d[:40] + bytes([d[40] ^ 0xFF]) + d[41:], "damaged"),
    (lambda d: d[:-40] + bytes([d[-40] ^ 1]) + d[-39:], "damaged"),
    (lambda d: b"NOTABACKUP" + d[10:], "not a DOQ backup file"),
    (lambda d: d + b"junk", "not a DOQ backup file"),
    (lambda d: b"", "the backup file is empty"),
    (lambda d: d[:10] + bytes([9]) + d[11:], "backup format 9 is not supported"),
])
def test_damaged_files_are_refused(source: Node, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    fill(source)
    data = damage(take(source))
    with pytest.raises(bk.BadBackup) as exc:
        bk.scan(io.BytesIO(data))
    assert message in exc.value.message
    assert exc.value.http_status == 400


def test_since_past_the_newest_version_is_refused(source: Node) -> None:
    fill(source)
    with pytest.raises(InvalidArgument, match="after the newest version"):
        bk.BackupStream(source.store, source.index + 2, "test")


@pytest.fixture
def short_history(tmp_path: Path) -> Iterator[Node]:
    """A node that keeps one minute of change history, with a delayed queue "d"."""
    node = Node(tmp_path / "n")
    node.sm.history_ms = 60_000
    node.run(create("d"))
    yield node
    node.close()


def test_pruned_history_refuses_old_incrementals(short_history: Node) -> None:
    node = short_history
    for i in range(20):
        node.ok(enqueue("d", f"x{i}"), now_ms=T0 + i * 10_000)       # 10 s apart
    with pytest.raises(Conflict, match="no longer kept"):
        bk.BackupStream(node.store, 2, "test")
    with node.store.read() as txn:
        kept = txn.history_from()
    assert kept is not None and kept > 2
    data = b"".join(bk.BackupStream(node.store, kept, "test").chunks())
    assert bk.scan(io.BytesIO(data))[0].records > 0


def test_history_stays_bounded(short_history: Node) -> None:
    """Records older than the history window are pruned as new ones arrive."""
    node = short_history
    for i in range(300):
        node.ok(enqueue("d", f"x{i}"), now_ms=T0 + i * 1000)
        node.drain_ids("d", now_ms=T0 + i * 1000)
    with node.store.read() as txn:
        versions = {v for v, _, _ in txn.changes(1)}
    assert min(versions) > node.index - 3 * 70             # about a minute of entries kept


# -- restore rules -------------------------------------------------------------------------------

def test_incremental_out_of_order_is_refused(source: Node, target: Node) -> None:
    fill(source)
    full, inc1, inc2 = chain(source, 2)
    v0 = bk.scan(io.BytesIO(full))[0].header.last_version
    before = queue_state(target)
    code, why = restore(target, inc1)
    assert code == ResultCode.RESTORE_CONFLICT and "no restore was made here" in str(why)
    assert queue_state(target) == before
    assert restore(target, full)[0] == OK
    code, why = restore(target, inc2)
    assert code == ResultCode.RESTORE_CONFLICT and f"ended at version {v0}" in str(why)
    with pytest.raises(Conflict, match="give them in order"):
        bk.check_chain([bk.scan(io.BytesIO(d))[0].header for d in (full, inc2)], None)
    with pytest.raises(Conflict, match="only the first one may be"):
        bk.check_chain([bk.scan(io.BytesIO(d))[0].header for d in (full, full)], None)


def test_a_newer_restore_takes_over_and_abort_drops_staging(source: Node,
                                                            target: Node) -> None:
    fill(source)
    records = list(bk.part_records(io.BytesIO(data := take(source)),
                                   bk.scan(io.BytesIO(data))[0]))
    before = queue_state(target)
    target.ok((C.RESTORE_BEGIN, "one"))
    target.ok((C.RESTORE_PUT, "one", records[:5]))
    target.ok((C.RESTORE_BEGIN, "two"))
    code, why = target.do((C.RESTORE_PUT, "one", records[5:]))
    assert code == ResultCode.RESTORE_CONFLICT and "another restore started" in why
    target.ok((C.RESTORE_ABORT, "two"))
    code, _ = target.do((C.RESTORE_COMMIT, "two", True, 0, 5, 0, 0))
    assert code == ResultCode.RESTORE_CONFLICT
    assert queue_state(target) == before
    with target.store.read() as txn:
        assert list(txn.staged()) == []


def test_restored_ids_never_repeat(source: Node, target: Node) -> None:
    fill(source)
    assert restore(target, take(source))[0] == OK
    top = max(max(q.unacked, default=0) for q in source.sm.queues.values())
    new = target.ok(enqueue("d", "after"))[0]
    assert new > top and new > source.sm.last_id

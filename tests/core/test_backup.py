"""Backups and restores: the file format, the change history, restore through the log
(state machine level here; a real cluster and the CLI in test_backup_cluster.py)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib import backup as bk
from doq_lib import commands as C
from doq_lib.errors import Conflict, InvalidArgument, ResultCode
from doq_lib.store import TRACKED, U64
from tests.core.test_fsm import (
    OK,
    RR,
    T0,
    WEIGHTED,
    Node,
    create,
    dequeue,
    enqueue,
    nack,
    update,
)

DAY_MS = 86_400_000


def take(node: Node, since: int = 0) -> bytes:
    stream = bk.BackupStream(node.store, since, "test")
    return b"".join(stream.chunks())


def queue_state(node: Node) -> str:
    """Digest of the queue state alone (no Raft bookkeeping)."""
    return node.store.state(include_meta=False)[1]


def restore(node: Node, *files: bytes, token: str = "t",
            key: bytes | None = None) -> tuple[int, object]:
    """Restore through the state machine as Service.restore does (parts in order, every
    record checked first)."""
    headers: list[bk.Header] = []
    checker = bk.RecordChecker({qs.defn.qid: qs.defn for qs in node.sm.queues.values()})
    for data in files:
        bk.scan(io.BytesIO(data), key, checker)
    checker.finish()
    assert node.ok((C.RESTORE_BEGIN, token)) is None
    for data in files:
        f = io.BytesIO(data)
        for part in bk.scan(f, key):
            headers.append(part.header)
            records = list(bk.part_records(f, part, key))
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


def test_lifecycle_state_round_trips(source: Node, target: Node) -> None:
    """The message lifecycle's state: its settings, delivery counts with last errors, dead
    letters, through a full backup and an incremental one."""
    source.run(create("dlq"), create("work", "fair", RR, 0, 3600,
                                     {"max_deliveries": 3, "dead_letter_queue": "dlq"}))
    ids = [source.ok(enqueue("work", f"m{i}", 1, "g"))[0] for i in range(4)]
    assert [source.ok(dequeue("work"))[0] for _ in range(2)] == ids[:2]
    for mid in ids[:2]:
        source.ok(nack("work", mid, 0, None, f"failed {mid}"))      # delivery count 1
    full = take(source)
    since = source.index + 1
    taken = source.ok(dequeue("work"))                               # 2nd delivery of ids[0]
    assert (taken[0], taken[5], taken[6]) == (ids[0], 2, f"failed {ids[0]}")
    source.ok(C.reject("work", ids[0], "poison"))                    # into the DLQ
    source.ok(update("work", 0, 0, 0, {"max_deliveries": 5, "dedup_window": 600,
                                       "max_messages": 100, "overflow": "drop_oldest"}))
    keyed = source.ok(C.enqueue("work", 0, "g", 1, "once", None, "key-1"))[0]
    timed = source.ok(C.enqueue("work", 0, "g", 1, "timed", None, "", 600))[0]
    inc = take(source, since)
    assert restore(target, full, token="a")[0] == OK
    assert target.ok((C.GET, "work", ids[1]))[5:7] == (1, f"failed {ids[1]}")
    assert restore(target, inc, token="b")[0] == OK
    assert queue_state(target) == queue_state(source)
    settings = target.sm.queues["work"].defn.settings
    assert (settings.max_deliveries, settings.dead_letter_queue) == (5, "dlq")
    assert target.sm.queues["work"].attempts == source.sm.queues["work"].attempts
    assert target.sm.queues["work"].expires == {timed: source.now_ms + 600_000}
    assert target.sm.queues["work"].dedup == source.sm.queues["work"].dedup == {
        b"key-1": (keyed, source.now_ms)}
    assert target.ok(C.enqueue("work", 0, "g", 1, "again", None, "key-1"))[:1] == (keyed,)
    source.ok(C.enqueue("work", 0, "g", 1, "again", None, "key-1"))
    dead = target.ok(dequeue("dlq", True))
    assert dead == source.ok(dequeue("dlq", True))
    assert dead[4]["x-dead-reason"] == "rejected" and dead[4]["x-last-error"] == "poison"
    for q in ("work", "dlq"):
        assert target.drain_ids(q) == source.drain_ids(q)


def test_operator_controls_round_trip(source: Node, target: Node) -> None:
    """Operator controls's state: a paused queue and paused groups, through a full backup and an
    incremental one; the restored replica skips the same groups."""
    source.run(create("d"), create("rr", "fair", RR, 0, 3600), create("w", "fair", WEIGHTED))
    for i in range(3):
        for group in ("a", "a.b", "b"):
            source.ok(enqueue("rr", f"{group}{i}", 1, group))
            source.ok(enqueue("w", f"{group}{i}", 1, group))
    source.ok(C.set_paused("d", "", True))
    source.ok(C.set_paused("rr", "a", True))
    full = take(source)
    since = source.index + 1
    source.ok(C.set_paused("w", "a.b", True))
    source.ok(C.set_paused("d", "", False))
    source.ok(C.set_paused("rr", "b", True))
    inc = take(source, since)
    assert restore(target, full, token="a")[0] == OK
    assert target.sm.queues["d"].defn.paused
    assert target.sm.queues["rr"].defn.paused_groups == ("a",)
    assert restore(target, inc, token="b")[0] == OK
    assert queue_state(target) == queue_state(source)
    assert not target.sm.queues["d"].defn.paused
    assert target.sm.queues["rr"].defn.paused_groups == ("a", "b")
    assert target.sm.queues["w"].defn.paused_groups == ("a.b",)
    assert target.run(dequeue("rr", True))[0][0] == ResultCode.QUEUE_EMPTY
    for q in ("w", "rr"):
        source.ok(C.set_paused(q, "a", False))
        target.ok(C.set_paused(q, "a", False))
        assert target.drain_ids(q) == source.drain_ids(q)


def test_deliveries_and_their_tokens_round_trip(source: Node, target: Node) -> None:
    """A delivery's time and consumer travel in backups: after a restore its token
    still settles it, and another one does not."""
    source.run(create("q", "fair", RR, 0, 3600), enqueue("q", "a", 1, "g"),
               enqueue("q", "b", 1, "h"))
    first = source.ok(C.dequeue("q", False, "host:1:w1"))
    full = take(source)
    since = source.index + 1
    second = source.ok(C.dequeue("q", False, "host:2:w2"), now_ms=source.now_ms + 5)
    inc = take(source, since)
    assert restore(target, full, token="a")[0] == OK
    assert restore(target, inc, token="b")[0] == OK
    assert queue_state(target) == queue_state(source)
    for value, consumer in ((first, "host:1:w1"), (second, "host:2:w2")):
        entry = target.sm.queues["q"].unacked[value[0]]
        assert (entry.deliveries, entry.since, entry.consumer) == (1, value[8], consumer)
    assert target.do(C.ack("q", first[0], (1, first[8] + 1)))[0] == \
        ResultCode.STALE_DELIVERY
    assert target.ok(C.ack("q", first[0], (1, first[8]))) is None


def test_rate_limit_state_round_trips(source: Node, target: Node) -> None:
    """Each group's rate state goes through a full and an incremental backup:
    the restored replica holds back the same groups until the same time."""
    source.run(create("r", "fair", RR, 0, 3600, {"group_rate": 0.5, "max_in_flight": 10}))
    for group in ("a", "b", "c"):
        for i in range(3):
            source.ok(enqueue("r", f"{group}{i}", 1, group))
    source.ok(dequeue("r", True))
    full = take(source)
    since = source.index + 1
    source.ok(dequeue("r", True))
    inc = take(source, since)
    assert restore(target, full, token="a")[0] == OK
    assert restore(target, inc, token="b")[0] == OK
    assert queue_state(target) == queue_state(source)
    assert target.sm.queues["r"].rate_tat == source.sm.queues["r"].rate_tat
    assert len(source.sm.queues["r"].rate_tat) == 2
    for at in (source.now_ms, source.now_ms + 2000):
        assert target.drain_ids("r", now_ms=at) == source.drain_ids("r", now_ms=at)


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


# -- forged and poisoned files ----------------------------------------------------------

def forge(header: dict[str, object], records: list[tuple[int, bytes, bytes | None]],
          key: bytes | None = None) -> bytes:
    """A file built from the documented format, the way anyone could: valid checksum."""
    import hashlib
    import hmac
    import json
    import struct

    fields = {"format": 2 if key else 1, "kind": "full", "since": 0, "last_version": 5,
              "last_id": 10, "next_qid": 5, "created_ms": 0, "source": "forged", **header}
    raw = json.dumps(fields).encode()
    out = bytearray(bk.MAGIC + struct.pack(">BI", fields["format"], len(raw)) + raw)
    for code, rkey, value in records:
        if value is None:
            out += bytes((bk.DELETE,)) + struct.pack(">BH", code, len(rkey)) + rkey
        else:
            out += bytes((bk.PUT,)) + struct.pack(">BHI", code, len(rkey), len(value)) + rkey
            out += value
    if key:
        out += bytes((bk.MAC,)) + hmac.new(key, bytes(out), hashlib.sha256).digest()
    out += bytes((bk.END,)) + struct.pack(">Q", len(records)) + hashlib.sha256(out).digest()
    return bytes(out)


def _queue_record(name: str, qid: int, lifecycle: dict[str, object] | None = None,
                  fair: bool = False, **controls: Any) -> tuple[int, bytes, bytes]:
    from doq_lib.models import QueueDef, QueueSettings, QueueType, Strategy
    from doq_lib.store import encode_queue, queue_key

    settings = QueueSettings(Strategy.ROUND_ROBIN if fair else Strategy.STRATEGY_UNSPECIFIED,
                             0, 60, **lifecycle or {})  # type: ignore[arg-type]
    return TRACKED["queues"], queue_key(name), encode_queue(
        QueueDef(name, qid, QueueType.FAIR if fair else QueueType.DELAYED, settings,
                 **controls))


def _message_record(qid: int, mid: int, value: bytes | None = None) -> tuple[int, bytes, bytes]:
    from doq_lib.store import encode_message, message_key

    return TRACKED["messages"], message_key(qid, mid), \
        value if value is not None else encode_message(1, "", "hello", None)


def check(data: bytes, existing: dict | None = None,  # type: ignore[type-arg]
          key: bytes | None = None) -> None:
    checker = bk.RecordChecker(existing or {})
    bk.scan(io.BytesIO(data), key, checker)
    checker.finish()


def test_every_backup_this_version_writes_passes_the_record_checks(source: Node) -> None:
    fill(source)
    files = chain(source, 2)
    check(b"".join(files))
    for qs in source.sm.queues.values():
        assert qs.defn.qid < source.sm.next_qid


@pytest.mark.parametrize(("db", "key", "value", "says"), [
    ("rates", b"g", b"\xff" * 8, "rate record of group 'g'"),
    ("expiry", U64.pack(7), b"\x00" * 8, "expires at 0"),
    ("messages", U64.pack(7), b"\x00\x01", "cannot be read"),
])
def test_a_store_record_a_restore_would_refuse_is_refused_at_backup_time(
        source: Node, db: str, key: bytes, value: bytes, says: str) -> None:
    """what a backup carries, a restore accepts; a store holding anything else
    (a bug, a damaged disk) gets a 400 when the backup is asked for, not a file that fails
    at restore time."""
    source.run(create("q", "fair", RR))
    take(source)                                  # a clean store backs up
    with source.store.write() as txn:
        txn.put(db, U64.pack(source.qid("q")) + key, value)
    with pytest.raises(bk.UnrestorableState, match=says) as info:
        bk.BackupStream(source.store, 0, "test")
    assert info.value.http_status == 400 and "no backup was taken" in info.value.message
    assert source.store.env.readers().count("\n") <= 2      # its snapshot was released


@pytest.mark.parametrize(("header", "records", "message"), [
    ({"last_id": 2 ** 64 - 1}, [], "last_id is out of range"),
    ({"next_qid": 2 ** 63}, [], "next_qid is out of range"),
    ({"next_qid": 0}, [], "next_qid must be at least 1"),
    ({"last_version": -1}, [], "inconsistent"),
    ({}, [_message_record(9, 1)], "belongs to no queue"),
    ({}, [_queue_record("q", 1), _message_record(1, 0)], "has id"),
    ({}, [_queue_record("q", 1), _message_record(1, 7, b"\x00\x01")], "cannot be read"),
    ({}, [_queue_record("q", 1), _message_record(1, 7, b"\x00" * 8 + b"\x00\x00\x00\x00"
                                                     b"\x00\x00\x00\x02\xff\xfe")],
     "cannot be read"),
    ({}, [_queue_record("q", 9)], "not below the header's next_qid"),
    ({}, [_queue_record("a/b", 1)], "without '/'"),
    ({}, [(TRACKED["queues"], b"other", _queue_record("q", 1)[2])], "has another key"),
    ({}, [(TRACKED["messages"], b"\x00" * 9, b"")], "not 16"),
    ({}, [(TRACKED["unacked"], b"\x00" * 8 + b"\x00" * 7 + b"\x01", b"\x00")],
     "cannot be read"),
    # the second form of a delivery record (0xFF, deadline, made at, slot length)
    ({}, [_queue_record("q", 1), (TRACKED["unacked"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\xff" + b"\x00" * 8 + b"\xff" * 8 + b"\x00\x00")],
     "was made at"),
    ({}, [_queue_record("q", 1), (TRACKED["unacked"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\xff" + b"\x00" * 10)], "cannot be read"),
    ({}, [_queue_record("q", 1), (TRACKED["unacked"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\xff" + b"\x00" * 16 + b"\x00\x01\xff")],
     "cannot be read"),
    ({}, [_queue_record("q", 1), (TRACKED["attempts"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\x00" * 12)], "delivery count"),
    ({}, [_queue_record("q", 1), (TRACKED["attempts"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\x00\x00\x00\x01" + b"\x00" * 8 + b"\xff")],
     "cannot be read"),
    ({}, [_queue_record("q", 1), (TRACKED["attempts"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\x00\x00\x00\x01" + b"\xff" * 8)], "held until"),
    ({}, [_queue_record("q", 1, {"max_deliveries": -2})], "settings.max_deliveries"),
    ({}, [_queue_record("q", 1, {"dead_letter_queue": "a/b"})], "settings.dead_letter_queue"),
    ({}, [_queue_record("q", 1, {"overflow": "up"})], "settings.overflow"),
    ({}, [_queue_record("q", 1, paused="yes")], "paused: expected true or false"),
    ({}, [_queue_record("q", 1), (TRACKED["rates"], b"\x00" * 7 + b"\x01" + b"g",
                                  b"\xff" * 8)], "rate record of group"),
    ({}, [_queue_record("q", 1), (TRACKED["rates"], b"\x00" * 7 + b"\x01" + b"\x00",
                                  b"\x00" * 7 + b"\x01")], "names no group"),
    ({}, [_queue_record("q", 1, paused_groups=("a",))], "only a fair queue"),
    ({}, [_queue_record("q", 1, fair=True, paused_groups=("a", ""))], "group names"),
    ({}, [_queue_record("q", 1, fair=True, paused_groups=("a", "a"))], "distinct names"),
    ({}, [_queue_record("q", 1, fair=True, paused_groups=tuple(
        f"g{i:04}" for i in range(1001)))], "more than 1000"),
    ({}, [_queue_record("q", 1), (TRACKED["dedup"], b"\x00" * 7 + b"\x01" + b"k" * 300,
                                  b"\x00" * 7 + b"\x05" + b"\x00" * 8)], "dedup key"),
    ({}, [_queue_record("q", 1), (TRACKED["dedup"], b"\x00" * 7 + b"\x01k", b"\x00" * 16)],
     "names message id 0"),
    ({}, [_queue_record("q", 1), (TRACKED["expiry"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\xff" * 8)], "expires at"),
    ({}, [_queue_record("q", 1), (TRACKED["expiry"], b"\x00" * 7 + b"\x01" + b"\x00" * 7
                                  + b"\x05", b"\x01")], "cannot be read"),
])
def test_forged_records_are_refused_before_anything_changes(
        target: Node, header: dict[str, object], records: list, message: str,  # type: ignore[type-arg]
        ) -> None:
    before = queue_state(target)
    with pytest.raises(bk.BadBackup, match=message):
        check(forge(header, records))
    assert queue_state(target) == before


def test_incomplete_fair_scheduler_records_are_refused(source: Node) -> None:
    fill(source)
    for group in ("p.a", "p.b"):                                   # a group node: p
        source.ok(enqueue("rr", "nested", 5, group))
    data = take(source)
    f = io.BytesIO(data)
    part, = bk.scan(f)
    records = list(bk.part_records(f, part))
    check(forge(part.header.__dict__, records))                    # intact: accepted
    sched = [r for r in records if r[0] == TRACKED["sched"]]
    assert len(sched) > 2, "the fill has fair scheduler records"
    # Drop a group node of the round-robin tree: its children lose their parent.
    group_nodes = [r for r in sched if len(r[2]) > 41 and not r[2][40] & 0x01]
    assert group_nodes
    without_parent = [r for r in records if r is not group_nodes[0]]
    with pytest.raises(bk.BadBackup, match="scheduler records of queue"):
        check(forge(part.header.__dict__, without_parent))
    # Drop the root record: the others hang from nothing
    root = [r for r in sched if r[1].endswith(b"\0" * 8)]
    without_root = [r for r in records if r not in root]
    with pytest.raises(bk.BadBackup, match="scheduler records of queue"):
        check(forge(part.header.__dict__, without_root))


def test_a_message_of_an_existing_queue_is_accepted_in_an_incremental(target: Node) -> None:
    qs = target.sm.queues["old"]
    data = forge({"kind": "incremental", "since": 3}, [_message_record(qs.defn.qid, 77)])
    check(data, {qs.defn.qid: qs.defn})
    with pytest.raises(bk.BadBackup, match="belongs to no queue"):
        check(data)                              # the same file for a cluster without it


KEY = b"k" * 32


def test_with_a_key_backups_are_signed_and_only_signed_ones_restore(
        source: Node, target: Node) -> None:
    fill(source)
    signed = b"".join(bk.BackupStream(source.store, 0, "test", KEY).chunks())
    assert bk.scan(io.BytesIO(signed))[0].records > 0      # readable without the key too
    assert restore(target, signed, key=KEY)[0] == ResultCode.OK
    assert queue_state(target) == queue_state(source)
    with pytest.raises(bk.BadBackup, match="not signed"):
        check(take(source), key=KEY)
    with pytest.raises(bk.BadBackup, match="signature does not match"):
        check(signed, key=b"x" * 32)
    # Changing the header (a huge last_id) and fixing the checksum is no longer enough.
    f = io.BytesIO(signed)
    part, = bk.scan(f)
    records = list(bk.part_records(f, part))
    forged = forge({**part.header.__dict__, "last_id": 2 ** 62}, records, key=b"y" * 32)
    with pytest.raises(bk.BadBackup, match="signature does not match"):
        check(forged, key=KEY)
    assert restore(target, forge(part.header.__dict__, records, key=KEY), key=KEY)[0] == \
        ResultCode.OK


def test_a_signed_file_without_its_signature_frame_is_damaged(source: Node) -> None:
    fill(source)
    f = io.BytesIO(take(source))
    part, = bk.scan(f)
    records = list(bk.part_records(f, part))
    unsigned_v2 = forge({**part.header.__dict__, "format": 2}, records)
    with pytest.raises(bk.BadBackup, match="signature frame is missing"):
        check(unsigned_v2)


def test_the_state_machine_refuses_restore_counters_out_of_range(target: Node) -> None:
    assert target.ok((C.RESTORE_BEGIN, "t")) is None
    code, _ = target.do((C.RESTORE_COMMIT, "t", True, 0, 1, 2 ** 64 - 1, 1))
    assert code == ResultCode.BAD_COMMAND
    assert target.sm.last_id < 2 ** 63

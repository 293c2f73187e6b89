"""The service over the in-memory proposer (doq_lib/raft/proposer.LocalProposer): the business
operations and their failures, applied through the real state machine on LMDB in a temporary
directory, without Raft, sockets or subprocesses."""
from __future__ import annotations

from pathlib import Path

import gevent
import pytest

from doq_lib import commands as C
from doq_lib.config import Config
from doq_lib.errors import (
    InsufficientStorage,
    InvalidSettings,
    MessageNotFound,
    NotUnacked,
    QueueEmpty,
    QueueNotFound,
)
from doq_lib.models import Strategy
from doq_lib.raft.proposer import LocalProposer
from doq_lib.service import EnqueueItem, Service
from tests.conftest import FixedClock, LocalNode, local_node


@pytest.fixture
def parts(local: LocalNode) -> tuple[Service, FixedClock, LocalProposer]:
    return local.service, local.clock, local.proposer


def test_a_message_goes_in_and_out(parts: tuple[Service, FixedClock, LocalProposer]) -> None:
    svc, clock, proposer = parts
    svc.create_queue("q", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    stored = svc.enqueue("q", 0, "", 5, "hello", {"k": "v"})
    assert (stored.priority, stored.content, stored.metadata) == (5, "hello", {"k": "v"})
    info = svc.queue_info("q")
    assert (info.ready, info.unacked) == (1, 0)
    taken = svc.dequeue("q", ack=False)
    assert taken.id == stored.id and svc.queue_info("q").unacked == 1
    svc.touch("q", taken.id)
    svc.ack("q", taken.id)
    assert (svc.queue_info("q").ready, svc.queue_info("q").unacked) == (0, 0)
    assert proposer.stats()["ops_proposed"] == 5
    assert svc.readiness() == (True, "OK") and svc.cut_off() is None


def test_failures_carry_the_tables_wording(
        parts: tuple[Service, FixedClock, LocalProposer]) -> None:
    svc, _, _ = parts
    with pytest.raises(QueueNotFound, match="^Failed to get a queue: nope$"):
        svc.enqueue("nope", 0, "", 1, "x", None)
    with pytest.raises(QueueNotFound, match="^Failed to delete a queue: nope$"):
        svc.delete_queue("nope")
    with pytest.raises(InvalidSettings, match="^Failed to create a queue: d: invalid ack timeout$"):
        svc.create_queue("d", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 5)
    svc.create_queue("q", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    with pytest.raises(QueueEmpty, match="^Queue is empty: q$"):
        svc.dequeue("q", ack=True)
    with pytest.raises(MessageNotFound, match="^Failed to get a message from a queue: q$"):
        svc.get("q", 42)
    with pytest.raises(NotUnacked, match="^Message not found: q$"):
        svc.ack("q", 42)
    assert [(mid, type(e).__name__) for mid, e in svc.ack_ids("q", [42])] == \
        [(42, "MessageNotFound")]


def test_batches_and_redelivery_by_the_clock(
        parts: tuple[Service, FixedClock, LocalProposer]) -> None:
    svc, clock, _ = parts
    svc.create_queue("f", "fair", Strategy.ROUND_ROBIN, 0, 60)
    ids = svc.enqueue_batch([EnqueueItem("f", 0, g, 1, f"m{g}", None) for g in "abab"])
    assert len(set(ids)) == 4
    stored, error = svc.enqueue_seq([EnqueueItem("f", 0, "c", 1, "c1", None),
                                     EnqueueItem("missing", 0, "", 1, "x", None),
                                     EnqueueItem("f", 0, "c", 1, "never", None)])
    assert [m.content for m in stored] == ["c1"]
    assert isinstance(error, QueueNotFound)
    taken = svc.dequeue_many("f", ack=False, count=10)
    assert [m.group for m in taken] == ["a", "b", "c", "a", "b"]       # round robin
    clock.t += 61                                                    # past the ack timeout
    svc.submit(C.requeue_expired())
    info = svc.queue_info("f")
    assert (info.ready, info.unacked) == (5, 0)


def test_a_waiting_consumer_wakes_on_enqueue(
        parts: tuple[Service, FixedClock, LocalProposer]) -> None:
    svc, _, _ = parts
    svc.create_queue("w", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    waiter = gevent.spawn(svc.take, "w", True, 1, 5.0)
    gevent.sleep(0.05)
    assert not waiter.ready()
    svc.enqueue("w", 0, "", 1, "late", None)
    got = waiter.get(timeout=2)
    assert [m.content for m in got] == ["late"]


def _local(path: Path, clock: FixedClock) -> Service:
    return local_node(path, clock).service


def test_a_backup_restored_into_another_node(tmp_path: Path) -> None:
    """backup_jobs through the service, in memory: a full backup of one node restored into
    another gives the same queues and messages; a node that does not lead refuses both."""
    import io

    from doq_lib.errors import NotLeader

    clock = FixedClock(1_700_000_000.0)
    source, target = _local(tmp_path / "a", clock), _local(tmp_path / "b", clock)
    source.create_queue("d", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    source.create_queue("f", "fair", Strategy.WEIGHTED, 2, 60)
    for i in range(5):
        source.enqueue("d", 0, "", i, f"d{i}", {"i": str(i)} if i % 2 else None)
        source.enqueue("f", 0, f"g{i % 2}", 1, f"f{i}", None)
    held = source.dequeue("d", ack=False)
    last, chunks = source.backup(0)
    data = b"".join(chunks)
    assert last > 0 and data
    result = target.restore([io.BytesIO(data)])
    assert result["backups"] == 1 and result["last_version"] == last
    assert target.list_queues() == source.list_queues()
    assert target.get("d", held.id).content == held.content
    assert target.fsm.store.digest(include_meta=False) == \
        source.fsm.store.digest(include_meta=False)

    class Follower(LocalProposer):
        @property
        def is_leader(self) -> bool:
            return False

    cfg = Config()
    follower = Service(cfg, Follower(target.fsm, clock, cfg.raft.address), target.fsm, clock)
    with pytest.raises(NotLeader):
        follower.backup(0)
    with pytest.raises(NotLeader):
        follower.restore([io.BytesIO(data)])
    for svc in (source, target):
        svc.fsm.store.close()


def test_a_full_disk_refuses_new_messages_not_consumers(
        parts: tuple[Service, FixedClock, LocalProposer]) -> None:
    svc, _, _ = parts
    svc.create_queue("q", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    kept = svc.enqueue("q", 0, "", 5, "kept", None)
    svc.disk.problem = lambda: "insufficient storage: test"      # type: ignore[method-assign]
    with pytest.raises(InsufficientStorage, match="insufficient storage: test"):
        svc.enqueue("q", 0, "", 5, "refused", None)
    with pytest.raises(InsufficientStorage):
        svc.create_queue("other", "delayed", Strategy.STRATEGY_UNSPECIFIED, 0, 60)
    assert svc.readiness() == (False, "insufficient storage: test")
    taken = svc.dequeue("q", ack=False)
    svc.ack("q", taken.id)
    assert taken.id == kept.id and svc.queue_info("q").ready == 0

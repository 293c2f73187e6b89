"""The consumers a queue knows, in the state machine: each lease records
its consumer; per consumer the deliveries, acks, nacks, last seen and the messages it holds;
replicated state that survives a restart and travels in backups; forgotten after an hour
idle, and bounded whatever names clients invent."""
from __future__ import annotations

import tracemalloc
from pathlib import Path
from typing import Iterator

import pytest

from doq_lib import commands as C
from doq_lib.fsm import consumers
from doq_lib.store import U64
from tests.core.test_backup import queue_state, restore, take
from tests.core.test_fsm import RR, T0, Node, create, enqueue, requeue


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.ok(create("q", "fair", RR, 0, 10))
    yield n
    n.close()


def known(node: Node, queue: str = "q") -> dict[str, consumers.ConsumerView]:
    views = node.sm.queue_consumers(queue)
    assert views is not None
    return {v.name: v for v in views}


def take_one(node: Node, who: str, ack: bool = False, now_ms: int | None = None) -> int:
    return node.ok(C.dequeue("q", ack, who), now_ms)[0]  # type: ignore[no-any-return]


def test_each_lease_is_counted_for_its_consumer(node: Node) -> None:
    ids = [node.ok(enqueue("q", str(n), 1, f"g{n}"))[0] for n in range(6)]
    a = [take_one(node, "host:1:a", now_ms=T0 + n) for n in range(3)]
    b = take_one(node, "host:2:b", now_ms=T0 + 10)
    take_one(node, "host:2:b", ack=True, now_ms=T0 + 11)   # taken and acked at once
    take_one(node, "", now_ms=T0 + 12)                     # unnamed: not recorded
    view = known(node)
    assert sorted(view) == ["host:1:a", "host:2:b"]
    assert (view["host:1:a"].held, view["host:1:a"].messages, view["host:1:a"].oldest_since,
            view["host:1:a"].deliveries) == (3, a, T0, 3)
    assert (view["host:2:b"].held, view["host:2:b"].messages, view["host:2:b"].deliveries,
            view["host:2:b"].last_seen) == (1, [b], 2, T0 + 11)
    node.ok(C.ack("q", a[0]), now_ms=T0 + 20)
    node.ok(C.nack("q", a[1], 0, None), now_ms=T0 + 21)
    node.ok(C.reject("q", b, "bad"), now_ms=T0 + 22)        # counts as a nack
    view = known(node)
    assert (view["host:1:a"].acks, view["host:1:a"].nacks, view["host:1:a"].held,
            view["host:1:a"].oldest_since, view["host:1:a"].last_seen) == (1, 1, 1, T0 + 2,
                                                                          T0 + 21)
    assert (view["host:2:b"].nacks, view["host:2:b"].held) == (1, 0)
    assert len(ids) == 6


def test_leases_that_end_without_their_consumer_are_no_longer_held(node: Node) -> None:
    for n in range(4):
        node.ok(enqueue("q", str(n), 1, f"g{n}"))
    held = [take_one(node, "w") for _ in range(4)]
    node.ok(C.delete("q", held[0]))
    node.ok(C.purge("q", True), now_ms=T0 + 1)              # drops the other three
    view = known(node)["w"]
    assert (view.held, view.acks, view.nacks, view.deliveries) == (0, 0, 0, 4)
    node.ok(enqueue("q", "x", 1, "g"))
    mid = take_one(node, "w", now_ms=T0 + 2)
    assert node.ok(requeue(), now_ms=T0 + 20_000) == 1     # its lease ran out
    assert known(node)["w"].held == 0 and mid in node.sm.queues["q"].index.ready_ids()


def test_the_registry_survives_a_restart_and_a_backup(node: Node, tmp_path: Path) -> None:
    for n in range(3):
        node.ok(enqueue("q", str(n), 1, f"g{n}"))
    first = take_one(node, "alpha", now_ms=T0 + 5)
    take_one(node, "beta", now_ms=T0 + 6)
    node.ok(C.ack("q", first), now_ms=T0 + 7)
    take_one(node, "alpha", now_ms=T0 + 8)
    before = known(node)
    node.restart()
    assert known(node) == before
    target = Node(tmp_path / "target")
    try:
        assert restore(target, take(node))[0] == 0
        assert known(target) == before and queue_state(target) == queue_state(node)
    finally:
        target.close()


def test_idle_consumers_are_forgotten_holders_are_kept(node: Node) -> None:
    for n in range(2):
        node.ok(enqueue("q", str(n), 1, f"g{n}"))
    node.ok(C.update_queue("q", RR, 0, 1_000_000, 0, None))  # leases outlive the idle time
    take_one(node, "idle", ack=True)
    take_one(node, "holder")
    at = T0 + consumers.IDLE_MS - 1
    node.ok(requeue(), now_ms=at)
    assert sorted(known(node)) == ["holder", "idle"]
    node.ok(requeue(), now_ms=at + 1)
    assert sorted(known(node)) == ["holder"]                 # it holds a message: kept
    with node.store.read() as txn:
        keys = [k[8:] for k, _ in txn.items("consumers", U64.pack(node.qid("q")))]
    assert keys == [b"holder"]
    node.restart()
    assert sorted(known(node)) == ["holder"]


@pytest.mark.slow
def test_a_hundred_thousand_names_stay_bounded(node: Node) -> None:
    """A client inventing a name per request: the registry keeps at most MAX_CONSUMERS
    names (one holding messages is never dropped), its records too, and its memory is
    bounded."""
    count = 100_000
    node.run(*[enqueue("q", "x", 1, "g") for _ in range(count)])
    tracemalloc.start()
    try:
        start = tracemalloc.take_snapshot()
        for start_n in range(0, count, 1000):
            node.run(*[C.dequeue("q", True, f"worker-{n:06d}")
                       for n in range(start_n, start_n + 1000)])
        grown = tracemalloc.take_snapshot().compare_to(start, "filename")
    finally:
        tracemalloc.stop()
    qs = node.sm.queues["q"]
    assert len(qs.consumers) == consumers.MAX_CONSUMERS
    assert next(iter(qs.consumers)) == f"worker-{count - consumers.MAX_CONSUMERS:06d}"
    with node.store.read() as txn:
        assert sum(1 for _ in txn.items("consumers", qs.prefix)) == consumers.MAX_CONSUMERS
    held_by_registry = sum(s.size_diff for s in grown if "consumers.py" in str(s.traceback))
    assert held_by_registry < 400 * consumers.MAX_CONSUMERS, held_by_registry
    node.restart()
    assert len(node.sm.queues["q"].consumers) == consumers.MAX_CONSUMERS


def test_explain_and_browse_name_the_holder(node: Node) -> None:
    node.ok(enqueue("q", "a", 1, "g"))
    mid = take_one(node, "host:9:w", now_ms=T0 + 3)
    explained = node.sm.explain("q", mid, T0 + 5)
    assert explained is not None
    assert (explained.state, explained.held_by, explained.held_since) == ("unacked",
                                                                          "host:9:w", T0 + 3)
    page = node.sm.browse("q", "unacked", None, None, 10)
    assert page is not None
    row = page[0][0]
    assert (row.state, row.consumer, row.since) == ("unacked", "host:9:w", T0 + 3)


def test_a_consumer_lists_its_first_hundred_messages(node: Node) -> None:
    node.ok(create("many", "delayed", 0, 0, 10))
    for n in range(150):
        node.ok(enqueue("many", str(n), 1))
    taken = [node.ok(C.dequeue("many", False, "big"), T0 + n)[0] for n in range(150)]
    view = known(node, "many")["big"]
    assert (view.held, view.messages, view.oldest_since) == (150, taken[:100], T0)


def test_batch_takes_and_settles_write_each_consumer_once(node: Node) -> None:
    """A take or settle of many messages writes each consumer's record once, at its end:
    what is stored is what the registry holds (a restart finds the same)."""
    for n in range(6):
        node.ok(enqueue("q", str(n), 1, f"g{n}"))
    taken = [v[0] for v in node.ok(C.dequeue_many("q", False, 5, "batcher"))]
    code, failed = node.do(C.ack_ids("q", taken[:3]))
    assert code == 0 and failed == []
    node.ok(C.nack_ids("q", taken[3:], 0, None))
    before = known(node)
    assert (before["batcher"].deliveries, before["batcher"].acks, before["batcher"].nacks,
            before["batcher"].held) == (5, 3, 2, 0)
    node.restart()
    assert known(node) == before

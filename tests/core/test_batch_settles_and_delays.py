"""An acknowledgement batch whose ids each store messages with their ack (ACK_IDS with
``enqueue``): per id, the ack and its messages happen together or not at all; one id's
failure (a stale token, an unknown or full target) leaves the others alone. And an enqueue's
``delay``: a new message held back until its time, in any queue type, in batches and in
the messages a settle stores."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from tests.core.test_fsm import Node, create, enqueue


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.ok(create("src"))
    n.ok(create("out"))
    n.ok(create("small", lifecycle={"max_messages": 1}))
    yield n
    n.close()


def item(queue: str, content: str) -> tuple[object, ...]:
    return C.Item(queue, 0, "", 1, content, {"from": "batch"})


def delivered(node: Node, count: int) -> list[tuple[int, tuple[int, int]]]:
    for n in range(count):
        node.ok(enqueue("src", f"in{n}", n + 1))
    taken = node.ok(C.dequeue_many("src", False, count))
    return [(m[0], (m[5], m[8])) for m in taken]


def stored(node: Node, queue: str) -> list[str]:
    return sorted(m[3] for m in (node.ok(C.dequeue(queue, True)) for _ in range(
        node.sm.queues[queue].waiting)))


def test_each_id_stores_its_own_messages_or_fails_alone(node: Node) -> None:
    (a, ta), (b, tb), (c, tc), (d, td), (e, te) = delivered(node, 5)
    node.ok(enqueue("small", "fills it"))
    op = C.ack_ids("src", [a, b, c, d, e, 999], [ta, (tb[0], tb[1] + 1), tc, td, te, None], [
        [item("out", "a1"), item("out", "a2")],     # stored with a's ack
        [item("out", "b1")],                         # b's token is stale: nothing of b
        [item("nope", "c1")],                        # unknown target: nothing of c
        [item("small", "d1")],                       # full target: nothing of d
        [],                                          # e: a plain ack
        [item("out", "x")]])                         # 999: not delivered
    failed, ids = node.ok(op)
    assert [(mid, ResultCode(code)) for mid, code, _ in failed] == [
        (b, ResultCode.STALE_DELIVERY), (c, ResultCode.QUEUE_NOT_FOUND),
        (d, ResultCode.QUEUE_FULL), (999, ResultCode.MESSAGE_NOT_FOUND)]
    assert failed[1][2] == "nope" and "small" in failed[2][2]
    assert [len(x) for x in ids] == [2, 0, 0, 0, 0, 0]
    assert stored(node, "out") == ["a1", "a2"]
    assert sorted(node.sm.queues["src"].unacked) == sorted([b, c, d])   # still delivered
    assert stored(node, "small") == ["fills it"]


def test_what_an_ack_stored_survives_a_restart(node: Node) -> None:
    (a, ta), (b, tb) = delivered(node, 2)
    failed, ids = node.ok(C.ack_ids("src", [a, b], [ta, None], [[item("out", "r")]]))
    assert failed == [] and len(ids[0]) == 1 and ids[1] == []
    node.restart()
    assert node.sm.queues["src"].unacked == {} and node.sm.queues["src"].waiting == 0
    assert node.ok(C.get("out", ids[0][0]))[3] == "r"


def test_ack_many_never_stores(node: Node) -> None:
    """ACK_MANY shares ACK_IDS's fields; an enqueue it carries is ignored, not half done."""
    (a, ta), = delivered(node, 1)
    assert node.ok((C.ACK_MANY, "src", [a], [ta], [[item("out", "r")]])) == []
    assert node.sm.queues["out"].waiting == 0


# -- an enqueue's delay ------------------------------------------------------------------------

def test_a_delayed_enqueue_waits_for_its_time_in_any_queue_type(node: Node) -> None:
    node.ok(create("fair", "fair", 1))
    for n, queue in enumerate(("src", "fair")):
        t = node.now_ms + n * 100_000
        mid = node.ok(C.enqueue(queue, 0, "g", 1, "later", None, "", 0, 30), now_ms=t)[0]
        qs = node.sm.queues[queue]
        assert mid in qs.held and qs.attempts[mid] == (0, "")
        explained = node.sm.explain(queue, mid, t)
        assert explained is not None and explained.reasons == [
            {"code": "delayed_until", "until": t + 30_000}]
        assert node.do(C.dequeue(queue, True), now_ms=t + 29_000)[0] == ResultCode.QUEUE_EMPTY
        node.restart()                                     # still held after a restart
        assert mid in node.sm.queues[queue].held
        node.ok(C.requeue_expired(), now_ms=t + 30_000)    # the leader's round
        got = node.ok(C.dequeue(queue, False), now_ms=t + 30_000)
        assert (got[0], got[5]) == (mid, 1)                # its first delivery
        assert mid not in node.sm.queues[queue].attempts   # nothing left to remember
        node.ok(C.ack(queue, mid), now_ms=t + 30_001)
        with node.store.read() as txn:
            assert list(txn.items("attempts")) == []


def test_items_of_a_batch_and_of_a_settle_carry_their_delay(node: Node) -> None:
    ids = [v[0] for v in node.ok(C.enqueue_batch([
        C.Item("out", 0, "", 1, "now", None), C.Item("out", 0, "", 2, "soon", None, "", 0, 5)]))]
    assert node.ok(C.dequeue("out", True))[0] == ids[0]
    assert node.do(C.dequeue("out", True))[0] == ResultCode.QUEUE_EMPTY
    (a, ta), = delivered(node, 1)
    _, stored_ids = node.ok(C.ack("src", a, ta, [C.Item("out", 0, "", 1, "next", None,
                                                         "", 0, 60)]))
    assert stored_ids[0] in node.sm.queues["out"].held
    node.ok(C.requeue_expired(), now_ms=node.now_ms + 5_000)
    assert node.ok(C.dequeue("out", True), now_ms=node.now_ms + 5_000)[0] == ids[1]


def test_the_longest_delay_and_a_shorter_ttl(node: Node) -> None:
    from doq_lib import rules

    far = node.ok(C.enqueue("src", 0, "", 1, "far", None, "", 0, rules.MAX_DELAY))[0]
    short = node.ok(C.enqueue("src", 0, "", 1, "expires first", None, "", 10, 60))[0]
    node.restart()
    assert {far, short} <= set(node.sm.queues["src"].held)
    # its TTL ran out while it was held: never delivered
    node.ok(C.requeue_expired(), now_ms=node.now_ms + 61_000)
    assert node.do(C.dequeue("src", True), now_ms=node.now_ms + 61_000)[0] == \
        ResultCode.QUEUE_EMPTY
    node.ok(C.requeue_expired(), now_ms=node.now_ms + rules.MAX_DELAY * 1000)
    got = node.ok(C.dequeue("src", True), now_ms=node.now_ms + rules.MAX_DELAY * 1000)
    assert got[0] == far

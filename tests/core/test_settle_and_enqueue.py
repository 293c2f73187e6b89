"""Settle and enqueue in one operation, in the state machine: an ack, nack
or reject may carry items to enqueue (any queues); the settle and every enqueue happen, or
none — an unknown or full target, a stale token, a full dead-letter queue refuse the whole
operation and leave the message as it was."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from tests.core.test_fsm import OK, Node, create, enqueue

ITEM = C.Item("out", 0, "", 1, "result", {"from": "in"})


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.run(create("in", ack_timeout=60), create("out"),
          create("small", lifecycle={"max_messages": 1}), create("dlq"),
          create("dl-in", ack_timeout=60, lifecycle={"dead_letter_queue": "dlq",
                                                     "max_deliveries": 1}))
    yield n
    n.close()


def delivered(node: Node, queue: str = "in") -> tuple[int, Any]:
    mid = node.ok(enqueue(queue, "job"))[0]
    value = node.ok(C.dequeue(queue, False))
    assert value[0] == mid
    return mid, (value[5], value[8])


def state(node: Node) -> dict[str, Any]:
    dump = node.store.dump()
    return {db: dump[db] for db in ("messages", "unacked", "attempts")}


def test_an_ack_stores_its_results_with_it(node: Node) -> None:
    mid, token = delivered(node)
    items = [ITEM, C.Item("out", 0, "", 2, "second", None), C.Item("in", 0, "", 3, "next", None)]
    code, (settled, ids) = node.do(C.ack("in", mid, token, items))
    assert code == OK and settled is None and len(ids) == 3
    assert node.do(C.get("in", mid))[0] == ResultCode.MESSAGE_NOT_FOUND
    assert [node.ok(C.get(i.queue, n))[3] for i, n in zip(items, ids)] == [
        "result", "second", "next"]


@pytest.mark.parametrize("kind", ["nack", "reject"])
def test_a_nack_or_reject_stores_its_results_with_it(node: Node, kind: str) -> None:
    mid, token = delivered(node, "dl-in")
    op = C.nack("dl-in", mid, 0, None, "boom", 0, token, [ITEM]) if kind == "nack" else \
        C.reject("dl-in", mid, "bad", token, [ITEM])
    code, (settled, ids) = node.do(op)
    assert code == OK and len(ids) == 1
    assert node.ok(C.get("out", ids[0]))[3] == "result"
    assert node.sm.queues["dlq"].waiting == 1                 # dead-lettered either way
    if kind == "nack":
        assert settled[2] is True                             # its deliveries were spent


@pytest.mark.parametrize("case", ["unknown-target", "full-target", "stale-token",
                                  "settled-already", "malformed-items"])
def test_a_refused_part_refuses_the_whole(node: Node, case: str) -> None:
    node.ok(enqueue("small", "fills it"))
    mid, token = delivered(node)
    if case == "settled-already":
        node.ok(C.nack("in", mid, 0, None, "", 0, token))
    before = state(node)
    items: Any = [ITEM, C.Item("small", 0, "", 1, "x", None)] if case == "full-target" else \
        [ITEM, C.Item("nope", 0, "", 1, "x", None)] if case == "unknown-target" else [ITEM]
    if case == "malformed-items":
        op: C.Op = (C.ACK, "in", mid, token, [("out",)])
    else:
        op = C.ack("in", mid, (9, 9) if case == "stale-token" else token, items)
    code, detail = node.do(op)
    expected = {"unknown-target": (ResultCode.QUEUE_NOT_FOUND, "nope"),
                "full-target": (ResultCode.QUEUE_FULL, None),
                "stale-token": (ResultCode.STALE_DELIVERY, None),
                "settled-already": (ResultCode.STALE_DELIVERY, None),
                "malformed-items": (ResultCode.BAD_COMMAND, None)}[case]
    assert code == expected[0]
    if expected[1] is not None:
        assert detail == expected[1]
    if case == "full-target":
        assert "'small' is full" in detail
    assert state(node) == before                            # nothing changed
    assert node.sm.queues["out"].waiting == 0


def test_a_reject_whose_dead_letter_queue_is_full_stores_nothing(node: Node) -> None:
    node.run(create("tiny-dlq", lifecycle={"max_messages": 1}),
             create("w", ack_timeout=60, lifecycle={"dead_letter_queue": "tiny-dlq"}))
    node.ok(enqueue("tiny-dlq", "fills it"))
    mid, token = delivered(node, "w")
    before = state(node)
    code, detail = node.do(C.reject("w", mid, "bad", token, [ITEM]))
    assert code == ResultCode.QUEUE_FULL and "'tiny-dlq' is full" in detail
    assert state(node) == before


def test_the_settle_counts_the_dead_letter_it_makes(node: Node) -> None:
    """A reject into a dead-letter queue with room for one, with an item for that same
    queue: both cannot fit, so neither happens (checked before anything changes)."""
    node.run(create("one-dlq", lifecycle={"max_messages": 1}),
             create("v", ack_timeout=60, lifecycle={"dead_letter_queue": "one-dlq"}))
    mid, token = delivered(node, "v")
    before = state(node)
    code, _ = node.do(C.reject("v", mid, "bad", token, [C.Item("one-dlq", 0, "", 1, "x", None)]))
    assert code == ResultCode.QUEUE_FULL and state(node) == before
    assert node.ok(C.reject("v", mid, "bad", token)) is None  # alone, it fits
    assert node.sm.queues["one-dlq"].waiting == 1


def test_items_keep_their_ids_dedup_keys_and_a_replay_is_the_same(node: Node,
                                                                 tmp_path: Path) -> None:
    node.run(create("dd", lifecycle={"dedup_window": 3600}))
    node.ok(enqueue("dd", "first"))
    mid, token = delivered(node)
    items = [C.Item("out", 424242, "", 1, "mine", None),
             C.Item("dd", 0, "", 1, "again", None, "key-1"),
             C.Item("dd", 0, "", 1, "dup", None, "key-1")]
    code, (_, ids) = node.do(C.ack("in", mid, token, items))
    assert code == OK and ids[0] == 424242 and ids[1] == ids[2]     # the second is a duplicate
    node.restart()
    assert node.ok(C.get("out", 424242))[3] == "mine"
    assert node.sm.queues["dd"].waiting == 2

"""Delivery tokens (fenced settles) in the state machine: a delivery with ack=false is named by
(deliveries, delivered at); an ack, nack, touch or reject that carries the token of another
delivery of the message (its lease ran out and it went to another consumer, or it was settled
already) is refused with STALE_DELIVERY and changes nothing. Without a token, settles behave
as before (the original DOQ's clients). The delivery's time and consumer are stored, survive
a restart and travel in backups."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib import commands as C
from doq_lib import rules
from doq_lib.errors import ResultCode
from doq_lib.store import U64, decode_unacked, encode_unacked
from tests.core.test_fsm import OK, T0, Node, create, enqueue, requeue

STALE = ResultCode.STALE_DELIVERY


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    n.ok(create("q", ack_timeout=10))
    yield n
    n.close()


def take(node: Node, consumer: str = "", now_ms: int | None = None) -> tuple[int, Any]:
    """(id, token) of a delivery from queue q."""
    value = node.ok(C.dequeue("q", False, consumer), now_ms)
    return value[0], (value[5], value[8])


def snapshot(node: Node) -> dict[str, Any]:
    return node.store.dump()


def expire_and_retake(node: Node, mid: int) -> Any:
    """The lease of ``mid`` runs out; it is delivered again: the new token."""
    assert node.ok(requeue(), now_ms=T0 + 10_000) == 1
    again, token = take(node, "second", now_ms=T0 + 10_500)
    assert again == mid
    return token


def test_a_delivery_has_a_token_that_settles_it(node: Node) -> None:
    mid = node.ok(enqueue("q", "a"))[0]
    got, token = take(node, "w1")
    assert got == mid and token == (1, T0)
    assert node.ok(C.touch("q", mid, token)) is None
    assert node.ok(C.ack("q", mid, token)) is None
    assert node.do(C.get("q", mid))[0] == ResultCode.MESSAGE_NOT_FOUND


@pytest.mark.parametrize("settle", ["ack", "nack", "touch", "reject", "ack_ids", "nack_ids",
                                    "ack_many"])
def test_the_token_of_an_expired_lease_settles_nothing(node: Node, settle: str) -> None:
    """A worker whose lease ran out, while the message went to a second one, can neither
    ack it (gone under the second), nor nack it (a third copy), nor touch or reject it."""
    mid = node.ok(enqueue("q", "a"))[0]
    _, old = take(node, "first")
    new = expire_and_retake(node, mid)
    assert new == (2, T0 + 10_500) and new != old
    before = snapshot(node)
    op = {"ack": C.ack("q", mid, old), "nack": C.nack("q", mid, 0, None, "", 0, old),
          "touch": C.touch("q", mid, old), "reject": C.reject("q", mid, "bad", old),
          "ack_ids": C.ack_ids("q", [mid], [old]),
          "nack_ids": C.nack_ids("q", [mid], 0, None, "", 0, [old]),
          "ack_many": C.ack_many("q", [mid], [old])}[settle]
    code, value = node.do(op, now_ms=T0 + 11_000)
    if settle in ("ack_ids", "nack_ids"):
        assert code == OK and value == [(mid, int(STALE))]
    elif settle == "ack_many":
        assert code == OK and value == [mid]
    else:
        assert code == STALE
    after = snapshot(node)
    assert after["unacked"] == before["unacked"] and after["messages"] == before["messages"]
    entry = node.sm.queues["q"].unacked[mid]
    assert (entry.deliveries, entry.since, entry.consumer) == (2, T0 + 10_500, "second")
    # the second worker's token still settles it
    assert node.ok(C.ack("q", mid, new), now_ms=T0 + 11_000) is None


def test_a_token_of_a_settled_delivery_is_stale_and_a_message_gone_is_not_found(
        node: Node) -> None:
    mid = node.ok(enqueue("q", "a"))[0]
    _, token = take(node)
    node.ok(C.nack("q", mid, 5, None, "", 0, token))          # back, waiting
    assert node.do(C.ack("q", mid, token))[0] == STALE          # settled already
    assert node.do(C.ack("q", mid))[0] == ResultCode.NOT_UNACKED  # no token: as before
    _, token2 = take(node)
    assert token2[0] == 2
    node.ok(C.ack("q", mid))                                    # no token: any delivery
    # a message that is gone, or never was, is not found, token or not
    assert node.do(C.ack("q", mid, token2))[0] == ResultCode.NOT_UNACKED
    assert node.do(C.touch("q", 999, (1, T0)))[0] == ResultCode.NOT_UNACKED


def test_batch_settles_fence_each_id_on_its_own(node: Node) -> None:
    ids = [node.ok(enqueue("q", str(n)))[0] for n in range(3)]
    tokens = [take(node)[1] for _ in ids]
    code, failed = node.do(C.ack_ids("q", ids, [tokens[0], (9, 9), None]))
    assert code == OK and failed == [(ids[1], int(STALE))]
    assert list(node.sm.queues["q"].unacked) == [ids[1]]


@pytest.mark.parametrize("bad", ["x", 7, [1], [1, 2, 3], {"a": 1}, (None, None), [True, 1]])
def test_a_malformed_token_in_the_log_settles_nothing_and_raises_nothing(
        node: Node, bad: Any) -> None:
    """Only the service writes operations, but the state machine is total: whatever a token
    field holds, the operation is refused the same way on every replica."""
    mid = node.ok(enqueue("q", "a"))[0]
    take(node)
    assert node.do((C.ACK, "q", mid, bad))[0] == STALE
    assert node.do((C.ACK_IDS, "q", [mid], [bad]))[1] == [(mid, int(STALE))]
    assert node.do((C.ACK_IDS, "q", [mid], "no list"))[1] == []    # not a list: no tokens
    assert mid not in node.sm.queues["q"].unacked


def test_the_delivery_record_survives_a_restart(node: Node) -> None:
    mid = node.ok(enqueue("q", "a"))[0]
    _, token = take(node, "host:12:worker")
    node.ok(C.touch("q", mid, token), now_ms=T0 + 3000)          # the lease goes on
    node.restart()
    entry = node.sm.queues["q"].unacked[mid]
    assert (entry.since, entry.consumer, entry.deadline) == (T0, "host:12:worker", T0 + 13_000)
    assert node.ok(C.ack("q", mid, token)) is None


def test_a_delivery_record_of_the_first_form_loads_with_time_zero(node: Node) -> None:
    """Records written before tokens (deadline and slot only): their token's time is 0."""
    mid = node.ok(enqueue("q", "a"))[0]
    take(node)
    key = node.sm.queues["q"].prefix + U64.pack(mid)
    with node.store.write() as txn:
        txn.put("unacked", key, U64.pack(T0 + 10_000) + b"default")
    node.restart()
    entry = node.sm.queues["q"].unacked[mid]
    assert (entry.deadline, entry.slot, entry.since, entry.consumer) == \
        (T0 + 10_000, "default", 0, "")
    assert node.do(C.ack("q", mid, (1, T0)))[0] == STALE
    assert node.ok(C.ack("q", mid, (1, 0))) is None


@pytest.mark.parametrize("values", [(0, "", 0, ""), (2 ** 63 - 1, "g" * 1024, 2 ** 63 - 1,
                                                     "c" * 300), (5, "tenant.é", 7, "h:1:ü")])
def test_delivery_records_round_trip(values: tuple[int, str, int, str]) -> None:
    assert decode_unacked(encode_unacked(*values)) == values


def test_tokens_are_checked_at_the_edge() -> None:
    token = rules.delivery_token(123, 2, T0)
    assert rules.parse_token(token, 123) == (123, (2, T0))
    assert "message 123, not of message 5" in rules.token_problem(token, 5)  # type: ignore
    for bad in ["", "x", "1-2", "1-0-5", "-1-2-3", "1-2-3-4", "1-2-99999999999999999999",
                "1-99999999999-3", "１-2-3", "1-2-3\n", None, 5, "9" * 65]:
        assert rules.token_problem(bad) is not None, bad
    assert rules.token_problem(f"{2 ** 64 - 1}-{2 ** 32 - 1}-{2 ** 63 - 1}") is None

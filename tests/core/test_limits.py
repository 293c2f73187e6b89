"""Delivery limits in the state machine: max_in_flight, and group_rate /
group_burst driven only by the operations' time; restarts rebuild exactly the same state."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from tests.core.test_fsm import RR, T0, WEIGHTED, Node, create, dequeue, enqueue, update

EMPTY = ResultCode.QUEUE_EMPTY


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    yield n
    n.close()


def groups_of(node: Node, q: str, now_ms: int, count: int = 50) -> list[str]:
    """The groups of up to ``count`` messages taken (acked at once) at ``now_ms``."""
    out = []
    for _ in range(count):
        code, value = node.do(dequeue(q, True), now_ms)
        if code == EMPTY:
            break
        out.append(value[1])
    return out


def test_max_in_flight_caps_the_unacked_of_the_whole_queue(node: Node) -> None:
    node.run(create("q", "fair", RR, 0, 60, {"max_in_flight": 2}))
    for n in range(6):
        node.ok(enqueue("q", f"m{n}", 1, f"g{n % 3}"))
    taken = [node.ok(dequeue("q"))[0] for _ in range(2)]
    assert node.do(dequeue("q"))[0] == EMPTY
    assert node.do(dequeue("q", True))[0] == EMPTY                  # at the cap: nothing
    assert node.sm.deliverable_ms("q") is None
    assert node.do((C.DEQUEUE_MANY, "q", False, 5))[0] == EMPTY
    node.ok((C.ACK, "q", taken[0]))
    assert node.sm.deliverable_ms("q") == 0
    assert len(node.ok((C.DEQUEUE_MANY, "q", False, 5))) == 1        # one slot freed
    node.ok(update("q", 0, 0, 0, {"max_in_flight": 0}))              # lifted
    assert len(node.ok((C.DEQUEUE_MANY, "q", False, 5))) == 3


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_group_rate_skips_a_group_out_of_its_rate_and_serves_the_others(
        node: Node, strategy: int) -> None:
    node.run(create("q", "fair", strategy, 0, 60, {"group_rate": 2.0}))     # every 500 ms
    for n in range(6):
        node.ok(enqueue("q", f"a{n}", 1, "a"))
    for n in range(2):
        node.ok(enqueue("q", f"b{n}", 1, "b"))
    assert groups_of(node, "q", T0) == ["a", "b"]                   # one each, then none
    assert node.sm.deliverable_ms("q") == T0 + 500
    assert groups_of(node, "q", T0 + 499) == []
    assert groups_of(node, "q", T0 + 500) == ["a", "b"]
    assert groups_of(node, "q", T0 + 1000) == ["a"]
    assert groups_of(node, "q", T0 + 2600) == ["a"]                 # no credit for idle time
    assert node.sm.queues["q"].stats.rate_limited == 6


def test_group_burst_and_the_delayed_queue_s_one_group(node: Node) -> None:
    node.run(create("d", "delayed", 0, 0, 60, {"group_rate": 10.0, "group_burst": 3}))
    for n in range(10):
        node.ok(enqueue("d", f"m{n}", n))
    assert len(groups_of(node, "d", T0)) == 3                        # the burst
    assert groups_of(node, "d", T0 + 99) == []
    assert len(groups_of(node, "d", T0 + 100)) == 1                  # then 10 per second
    assert len(groups_of(node, "d", T0 + 1100)) == 3                 # refilled to the burst


def test_rate_records_are_forgotten_once_the_bucket_is_full(node: Node) -> None:
    node.run(create("q", "fair", RR, 0, 60, {"group_rate": 4.0}))
    node.ok(enqueue("q", "x", 1, "g"))
    assert groups_of(node, "q", T0) == ["g"]
    assert node.store.dump()["rates"]
    node.run(C.tick(), now_ms=T0 + 250)                              # any entry runs the events
    assert node.store.dump()["rates"] == {} and node.sm.queues["q"].rate_tat == {}


def test_a_changed_rate_starts_every_group_again(node: Node) -> None:
    node.run(create("q", "fair", RR, 0, 60, {"group_rate": 0.5}))
    for n in range(3):
        node.ok(enqueue("q", f"m{n}", 1, "g"))
    assert groups_of(node, "q", T0) == ["g"]
    node.ok(update("q", 0, 0, 0, {"group_rate": 0.5, "group_burst": 2}))
    assert groups_of(node, "q", T0 + 10) == ["g", "g"]
    node.ok(update("q", 0, 0, 0, {"group_rate": 0}))
    assert node.store.dump()["rates"] == {}


def test_explain_names_the_limit(node: Node) -> None:
    node.run(create("q", "fair", RR, 0, 60, {"group_rate": 1.0, "max_in_flight": 1}))
    ids = [node.ok(enqueue("q", f"m{n}", 1, "g"))[0] for n in range(3)]
    node.ok(dequeue("q"))
    found = node.sm.explain("q", ids[1], T0)
    assert found is not None and found.state == "blocked"
    assert found.reasons == [{"code": "queue_at_max_in_flight", "in_flight": 1, "max": 1},
                             {"code": "group_rate_limited", "group": "g",
                              "next_at": T0 + 1000}]
    node.ok((C.ACK, "q", ids[0]))
    assert node.sm.explain("q", ids[1], T0 + 1000).reasons == []  # type: ignore[union-attr]


def test_a_restart_rebuilds_the_same_rate_state(tmp_path: Path) -> None:
    """Two replicas apply the same entries; one restarts after each. Their choices and
    stored records stay identical, blocked groups included."""
    a, b = Node(tmp_path / "a"), Node(tmp_path / "b")
    try:
        for n in (a, b):
            n.run(create("q", "fair", WEIGHTED, 2, 60, {"group_rate": 3.0, "group_burst": 2}))
        now = T0
        for step in range(60):
            now += (step * 37) % 400
            ops: list[C.Op] = [enqueue("q", f"m{step}", step % 3, f"g{step % 4}"),
                               dequeue("q", step % 3 == 0), dequeue("q", True)]
            assert a.run(*ops, now_ms=now) == b.run(*ops, now_ms=now), step
            b.restart()
            assert a.store.dump() == b.store.dump()
            assert a.sm.queues["q"].index.limited == b.sm.queues["q"].index.limited
    finally:
        a.close()
        b.close()

"""The replicated state machine on a real LMDB in ``tmp_path`` (SPEC §5, §6.1-6.2, §12.1-12.2).

Time is only ever the command's ``now_ms``; redelivery happens only through REQUEUE_EXPIRED.
Randomized logs use ``random.Random(seed)`` with fixed seeds.
"""
from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib import commands as C
from doq_lib import schedules
from doq_lib.errors import ResultCode
from doq_lib.fsm import FAULT_CONTENT, StateMachine
from doq_lib.ids import NODE_BITS, SEQ_BITS, Snowflake, id_time_ms, next_fsm_id
from doq_lib.lmdb_store import LmdbStore
from doq_lib.models import QueueSettings, QueueType, Strategy
from doq_lib.store import TRACKED, U64

T0 = 1_700_000_000_000            # ms
S0 = T0 // 1000
OK = ResultCode.OK
RR, WEIGHTED = int(Strategy.ROUND_ROBIN), int(Strategy.WEIGHTED)


# -- operation builders (defaults for the tests; the operations are doq_lib.commands') -----------
def create(name: str, qtype: str = "delayed", strategy: int = 0, max_unacked: int = 0,
           ack_timeout: int = 0, lifecycle: dict[str, Any] | None = None) -> C.Op:
    return C.create_queue(name, qtype, strategy, max_unacked, ack_timeout, 0, lifecycle)


def update(name: str, strategy: int = 0, max_unacked: int = 0, ack_timeout: int = 0,
           lifecycle: dict[str, Any] | None = None) -> C.Op:
    return C.update_queue(name, strategy, max_unacked, ack_timeout, 0, lifecycle)


def enqueue(q: str, content: str = "x", priority: int = 10, group: str = "default",
            mid: int = 0, metadata: dict[str, str] | None = None) -> C.Op:
    return C.enqueue(q, mid, group, priority, content, metadata)


def dequeue(q: str, ack: bool = False) -> C.Op:
    return C.dequeue(q, ack)


def nack(q: str, mid: int, priority: int = 0, metadata: dict[str, str] | None = None,
         error: str = "") -> C.Op:
    return C.nack(q, mid, priority, metadata, error)


def requeue() -> C.Op:
    return C.requeue_expired()


class Node:
    """One replica: an LmdbStore in a directory and the StateMachine on it."""

    def __init__(self, path: Path, fault_injection: bool = False) -> None:
        self.path = str(path)
        self.fault_injection = fault_injection
        self.store = LmdbStore(self.path)
        self.sm = StateMachine(self.store, fault_injection=fault_injection)
        self.index = self.sm.applied_index
        self.now_ms = T0

    def run(self, *ops: C.Op, now_ms: int | None = None) -> list[tuple[int, Any]]:
        self.index += 1
        result = self.sm.apply_entries([(self.index, list(ops), self.now_ms if now_ms is None
                                         else now_ms)])
        assert result[0] is not None
        return result[0]

    def do(self, op: C.Op, now_ms: int | None = None) -> tuple[int, Any]:
        return self.run(op, now_ms=now_ms)[0]

    def ok(self, op: C.Op, now_ms: int | None = None) -> Any:
        code, value = self.do(op, now_ms)
        assert code == OK, (code, value)
        return value

    def restart(self) -> None:
        self.store.close()
        self.store = LmdbStore(self.path)
        self.sm = StateMachine(self.store, fault_injection=self.fault_injection)

    def qid(self, name: str) -> int:
        return self.sm.queues[name].defn.qid

    def drain_ids(self, q: str, ack: bool = True, now_ms: int | None = None) -> list[int]:
        out = []
        while True:
            code, value = self.do(dequeue(q, ack), now_ms)
            if code == ResultCode.QUEUE_EMPTY:
                return out
            assert code == OK
            out.append(value[0])

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    yield n
    n.close()


# -- queue lifecycle -------------------------------------------------------------------------------
class TestQueueLifecycle:
    def test_defaults(self, node: Node) -> None:
        node.ok(create("d"))
        node.ok(create("f", "fair"))
        node.ok(create("w", "fair", WEIGHTED, 3, 60))
        assert node.sm.queues["d"].defn.settings == QueueSettings(
            Strategy.STRATEGY_UNSPECIFIED, 0, 1800)
        assert node.sm.queues["f"].defn.settings == QueueSettings(Strategy.ROUND_ROBIN, 0, 1800)
        assert node.sm.queues["w"].defn.settings == QueueSettings(Strategy.WEIGHTED, 3, 60)
        assert node.sm.queues["f"].defn.type is QueueType.FAIR

    def test_duplicate_create_is_a_noop_success(self, node: Node) -> None:
        node.ok(create("q", "fair", WEIGHTED, 3, 60))
        node.ok(enqueue("q", group="g"))
        before = node.store.dump()["queues"]
        assert node.do(create("q", "delayed", 0, 0, 10)) == (OK, True)   # True: it existed
        assert node.do(create("q", "fair", RR, 9, 5)) == (OK, True)   # even invalid settings
        assert node.store.dump()["queues"] == before
        assert node.sm.queues["q"].defn.settings == QueueSettings(Strategy.WEIGHTED, 3, 60)
        assert node.sm.queues["q"].index.ready == 1

    @pytest.mark.parametrize("op, reason", [
        (create("q", "delayed", RR), "invalid strategy"),
        (create("q", "delayed", WEIGHTED), "invalid strategy"),
        (create("q", "delayed", 0, 3), "invalid max unacked"),
        (create("q", "delayed", 0, 0, 1), "invalid ack timeout"),
        (create("q", "delayed", 0, 0, 9), "invalid ack timeout"),
        (create("q", "fair", RR, 0, 9), "invalid ack timeout"),
        (create("q", "fair", 7), "invalid strategy"),
        (create("q", "lifo"), "invalid queue type"),
    ])
    def test_invalid_settings(self, node: Node, op: C.Op, reason: str) -> None:
        assert node.do(op) == (ResultCode.INVALID_SETTINGS, reason)
        assert "q" not in node.sm.queues
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_NOT_FOUND
        assert node.store.dump()["queues"] == {}

    def test_ack_timeout_ten_is_valid(self, node: Node) -> None:
        node.ok(create("q", "delayed", 0, 0, 10))
        assert node.sm.queues["q"].defn.settings.ack_timeout == 10

    def test_update_rules(self, node: Node) -> None:
        node.ok(create("f", "fair"))
        node.ok(create("d"))
        assert node.do(update("f", WEIGHTED)) == (ResultCode.INVALID_SETTINGS,
                                                  "invalid queue settings")
        assert node.do(update("d", RR)) == (ResultCode.INVALID_SETTINGS, "invalid queue settings")
        assert node.do(update("f", 0, 0, 5)) == (ResultCode.INVALID_SETTINGS,
                                                 "invalid ack timeout")
        node.ok(update("f", 0, 5, 60))          # omitted strategy keeps the current one
        node.ok(update("f", RR, 5, 60))         # the same strategy explicitly
        node.ok(update("d", 0, 4, 30))          # max_unacked ignored for delayed queues
        assert node.sm.queues["f"].defn.settings == QueueSettings(Strategy.ROUND_ROBIN, 5, 60)
        assert node.sm.queues["d"].defn.settings == QueueSettings(
            Strategy.STRATEGY_UNSPECIFIED, 0, 30)
        assert node.sm.queues["f"].index.max_unacked == 5
        node.restart()
        assert node.sm.queues["f"].defn.settings == QueueSettings(Strategy.ROUND_ROBIN, 5, 60)
        assert node.sm.queues["f"].index.max_unacked == 5
        assert node.sm.queues["d"].defn.settings.ack_timeout == 30
        node.ok(update("f", 0, 0, 0))           # 0 -> the fallback default
        assert node.sm.queues["f"].defn.settings == QueueSettings(Strategy.ROUND_ROBIN, 0, 1800)
        assert node.do(update("nope"))[0] == ResultCode.QUEUE_NOT_FOUND

    def test_changed_ack_timeout_applies_to_future_deliveries(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        a = node.ok(enqueue("q", "a"))[0]
        b = node.ok(enqueue("q", "b"))[0]
        node.ok(dequeue("q"))
        node.ok(update("q", ack_timeout=100))
        node.ok(dequeue("q"))
        assert node.sm.queues["q"].unacked[a].deadline == T0 + 10_000
        assert node.sm.queues["q"].unacked[b].deadline == T0 + 100_000

    def test_delete_queue_removes_every_record(self, node: Node) -> None:
        node.ok(create("q", "fair", RR, 2, 10))
        node.ok(create("other", "fair"))
        for i in range(20):
            node.ok(enqueue("q", f"m{i}", group=f"c{i % 3}.p{i % 2}"))
        node.ok(enqueue("other", "keep", group="g"))
        delivered = [node.ok(dequeue("q"))[0] for _ in range(4)]
        qid = node.qid("q")
        prefix = U64.pack(qid)
        dump = node.store.dump()
        assert any(k.startswith(prefix) for k in dump["unacked"])
        assert any(k.startswith(prefix) for k in dump["sched"])
        node.ok((C.DELETE_QUEUE, "q"))
        dump = node.store.dump()
        for db in ("messages", "unacked", "sched"):
            assert not [k for k in dump[db] if k.startswith(prefix)], db
        assert b"q" not in dump["queues"]
        assert len([k for k in dump["messages"]]) == 1          # "other" untouched
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_NOT_FOUND
        assert node.do((C.ACK, "q", delivered[0]))[0] == ResultCode.QUEUE_NOT_FOUND
        assert node.do((C.DELETE_QUEUE, "q"))[0] == ResultCode.QUEUE_NOT_FOUND
        # nothing comes back from the old deadlines, neither live nor after a restart
        assert node.ok(requeue(), now_ms=T0 + 60_000) == 0
        node.restart()
        assert "q" not in node.sm.queues
        node.ok(create("q", "fair"))
        assert node.qid("q") != qid
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_EMPTY
        assert node.do((C.ACK, "q", delivered[0]))[0] == ResultCode.NOT_UNACKED
        assert node.ok(dequeue("other"))[3] == "keep"
        node.ok((C.DELETE_QUEUE, "other"))           # its keys are the last ones in each db
        node.ok((C.DELETE_QUEUE, "q"))
        dump = node.store.dump()
        assert all(not dump[db] for db in ("queues", "messages", "unacked", "sched"))


class TestLongNames:
    """LMDB keys are limited to 511 bytes; HTTP allows 1024-character queue names and group
    names are unbounded, so neither may end up verbatim in a key."""

    @pytest.mark.parametrize("name", ["q" * 1024, "é" * 1024, "x" * 511, "y" * 512])
    def test_long_queue_name(self, node: Node, name: str) -> None:
        node.ok(create(name, "fair"))
        node.ok(create(name, "fair", WEIGHTED))                  # duplicate: still a no-op
        mid = node.ok(enqueue(name, "body", group="g"))[0]
        node.ok(update(name, 0, 3, 60))
        node.restart()
        assert node.sm.queues[name].defn.settings == QueueSettings(Strategy.ROUND_ROBIN, 3, 60)
        assert node.ok(dequeue(name, True))[0] == mid
        node.ok((C.DELETE_QUEUE, name))
        node.restart()
        assert name not in node.sm.queues
        assert node.store.dump()["queues"] == {}

    def test_similar_long_names_stay_distinct(self, node: Node) -> None:
        a, b = "n" * 700 + "a", "n" * 700 + "b"
        node.ok(create(a))
        node.ok(create(b, "fair"))
        node.restart()
        assert node.sm.queues[a].defn.type is QueueType.DELAYED
        assert node.sm.queues[b].defn.type is QueueType.FAIR

    @pytest.mark.parametrize("strategy", [RR, WEIGHTED])
    @pytest.mark.parametrize("group", ["g" * 600, "é" * 400, ".".join(["level"] * 120),
                                       "a" * 300 + "." + "b" * 300])
    def test_long_group_name(self, node: Node, strategy: int, group: str) -> None:
        node.ok(create("f", "fair", strategy, 1, 10))
        first = node.ok(enqueue("f", "1", priority=1, group=group))[0]
        second = node.ok(enqueue("f", "2", priority=2, group=group))[0]
        other = node.ok(enqueue("f", "3", priority=3, group="short"))[0]
        assert node.ok(dequeue("f"))[:2] == (first, group)
        node.restart()
        assert node.ok(dequeue("f"))[0] == other           # the long group is at its limit
        node.ok((C.ACK, "f", first))
        assert node.ok(dequeue("f", True))[0] == second
        node.ok((C.ACK, "f", other))
        assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY


# -- ordering --------------------------------------------------------------------------------------
class TestOrdering:
    def test_fifo_for_equal_priorities(self, node: Node) -> None:   # test_regular_queue
        node.ok(create("q"))
        ids = [node.ok(enqueue("q", str(i)))[0] for i in range(8)]
        got = [node.ok(dequeue("q", True))[3] for _ in range(8)]
        assert got == [str(i) for i in range(8)]
        assert ids == sorted(ids)

    def test_priority_order(self, node: Node) -> None:              # test_priority_queue
        node.ok(create("q"))
        for i, p in enumerate((123, 523, 35, 7863, 12, 4, 1, 4555)):
            node.ok(enqueue("q", str(i), priority=p))
        got = [int(node.ok(dequeue("q", True))[3]) for _ in range(8)]
        assert got == [6, 5, 4, 2, 0, 1, 7, 3]

    def test_delayed_worked_example(self, node: Node) -> None:      # SPEC §5.2
        node.ok(create("q"))
        node.ok(enqueue("q", "A", priority=S0 + 2))
        node.ok(enqueue("q", "B", priority=S0 + 1))
        node.ok(enqueue("q", "C", priority=10))
        assert node.ok(dequeue("q", True))[3] == "C"
        assert node.do(dequeue("q", True)) == (ResultCode.QUEUE_EMPTY, None)
        assert node.do(dequeue("q", True), now_ms=T0 + 999)[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(dequeue("q", True), now_ms=T0 + 1100)[3] == "B"
        assert node.do(dequeue("q", True), now_ms=T0 + 1100)[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(dequeue("q", True), now_ms=T0 + 2200)[3] == "A"

    def test_time_never_runs_backwards(self, node: Node) -> None:
        node.ok(create("q"))
        node.ok(enqueue("q", "later", priority=S0 + 5))
        mid = node.ok(dequeue("q"), now_ms=T0 + 5000)[0]
        node.ok(nack("q", mid), now_ms=T0)
        # an older command time still sees the newest time: the message stays deliverable
        assert node.ok(dequeue("q"), now_ms=T0)[3] == "later"
        assert node.sm.last_now_ms == T0 + 5000
        assert node.sm.queues["q"].unacked[mid].deadline == T0 + 5000 + 1800 * 1000
        node.restart()
        assert node.sm.last_now_ms == T0 + 5000

    def test_fair_worked_example(self, node: Node) -> None:         # test_fair_priority_queue
        node.ok(create("f", "fair"))
        groups = ["customer-1"] * 4 + ["customer-2"] * 2 + ["customer-3", "customer-4"]
        for i, g in enumerate(groups):
            node.ok(enqueue("f", str(i), group=g, metadata={"i": str(i)}))
        got = [node.ok(dequeue("f", True)) for _ in range(8)]
        assert [int(m[3]) for m in got] == [0, 4, 6, 7, 1, 5, 2, 3]
        assert all(m[4] == {"i": m[3]} for m in got)

    def test_fair_order_survives_restart(self, node: Node) -> None:
        """TestFSMPersistRestoreFairQueue: c1[m1 p10,m2 p5,m3 p15], c2[m4 p15,m5 p1], c3[m6 p1]."""
        node.ok(create("f", "fair"))
        for name, group, p in (("m1", "c1", 10), ("m2", "c1", 5), ("m3", "c1", 15),
                               ("m4", "c2", 15), ("m5", "c2", 1), ("m6", "c3", 1)):
            node.ok(enqueue("f", name, priority=p, group=group))
        node.restart()
        assert [node.ok(dequeue("f", True))[3] for _ in range(6)] == \
            ["m2", "m5", "m6", "m1", "m4", "m3"]

    def test_delayed_queue_group_is_default(self, node: Node) -> None:
        node.ok(create("d"))
        node.ok(create("f", "fair"))
        assert node.ok(enqueue("d", group="custom"))[1] == "default"
        assert node.ok(enqueue("f", group=""))[1] == "default"
        assert node.ok(dequeue("d"))[1] == "default"


# -- ack / nack / touch / redelivery --------------------------------------------------------------
class TestDelivery:
    def test_ack_then_empty(self, node: Node) -> None:              # test_message_ack
        node.ok(create("q"))
        mid = node.ok(enqueue("q"))[0]
        assert node.ok(dequeue("q"))[0] == mid
        assert node.do((C.ACK, "q", mid)) == (OK, None)
        for _ in range(8):
            assert node.do(dequeue("q")) == (ResultCode.QUEUE_EMPTY, None)
        assert node.do((C.ACK, "q", mid))[0] == ResultCode.NOT_UNACKED
        assert node.do((C.ACK, "q", 12345))[0] == ResultCode.NOT_UNACKED
        assert node.do((C.GET, "q", mid))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.store.dump()["messages"] == {} and node.store.dump()["unacked"] == {}

    def test_dequeue_ack_true_removes_at_delivery(self, node: Node) -> None:
        node.ok(create("q"))
        mid = node.ok(enqueue("q"))[0]
        node.ok(dequeue("q", True))
        assert node.do((C.GET, "q", mid))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.do((C.ACK, "q", mid))[0] == ResultCode.NOT_UNACKED

    def test_nack_original_order_and_metadata(self, node: Node) -> None:   # test_message_nack
        node.ok(create("q"))
        ids = [node.ok(enqueue("q", str(i)))[0] for i in range(3)]
        assert [node.ok(dequeue("q"))[0] for _ in range(3)] == ids
        for mid in ids:
            assert node.ok(nack("q", mid, 10, {"retry": "1"})) == (10, {"retry": "1"}, False, "")
        got = [node.ok(dequeue("q")) for _ in range(3)]
        assert [m[0] for m in got] == ids
        assert all(m[4] == {"retry": "1"} and m[2] == 10 for m in got)

    def test_nack_priority_and_metadata_rules(self, node: Node) -> None:    # TestQueueNack
        node.ok(create("q"))
        a = node.ok(enqueue("q", "a", priority=7, metadata={"k": "v"}))[0]
        b = node.ok(enqueue("q", "b", priority=20))[0]
        node.ok(dequeue("q"))
        node.ok(nack("q", a))                       # priority 0 and metadata None: keep both
        assert node.ok((C.GET, "q", a)) == (a, "default", 7, "a", {"k": "v"}, 1, "", 0, None)
        assert node.ok(dequeue("q"))[0] == a        # still ahead of b
        node.ok(nack("q", a, 30, {}))               # {} replaces (clears) the metadata
        assert node.ok((C.GET, "q", a)) == (a, "default", 30, "a", {}, 2, "", 0, None)
        assert [node.ok(dequeue("q"))[0] for _ in range(2)] == [b, a]
        node.ok(nack("q", b, 0, {"x": "y"}))
        assert node.ok((C.GET, "q", b))[2:] == (20, "b", {"x": "y"}, 1, "", 0, None)
        node.restart()
        assert node.ok((C.GET, "q", b))[2:] == (20, "b", {"x": "y"}, 1, "", 0, None)
        assert node.ok(dequeue("q"))[0] == b

    def test_nack_needs_unacked(self, node: Node) -> None:
        node.ok(create("q"))
        mid = node.ok(enqueue("q"))[0]
        for op in (nack("q", mid), (C.TOUCH, "q", mid), (C.ACK, "q", mid), nack("q", 999)):
            assert node.do(op) == (ResultCode.NOT_UNACKED, None)
        assert node.ok(dequeue("q"))[0] == mid      # nothing above changed its state

    def test_touch_pushes_deadline(self, node: Node) -> None:        # TestQueueTouch
        node.ok(create("q", ack_timeout=10))
        mid = node.ok(enqueue("q"))[0]
        node.ok(dequeue("q"))
        node.ok((C.TOUCH, "q", mid), now_ms=T0 + 5000)
        assert node.sm.queues["q"].unacked[mid].deadline == T0 + 15_000
        assert node.ok(requeue(), now_ms=T0 + 10_000) == 0
        assert node.ok(requeue(), now_ms=T0 + 14_999) == 0
        assert node.do(dequeue("q"), now_ms=T0 + 14_999)[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(requeue(), now_ms=T0 + 15_000) == 1
        assert node.ok(dequeue("q"), now_ms=T0 + 15_000)[0] == mid

    def test_touch_survives_restart(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        mid = node.ok(enqueue("q"))[0]
        node.ok(dequeue("q"))
        node.ok((C.TOUCH, "q", mid), now_ms=T0 + 5000)
        node.restart()
        assert node.ok(requeue(), now_ms=T0 + 14_999) == 0
        assert node.ok(requeue(), now_ms=T0 + 15_000) == 1

    def test_redelivery_only_at_deadline(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        a = node.ok(enqueue("q", "a", priority=3, metadata={"m": "1"}))[0]
        b = node.ok(enqueue("q", "b", priority=5))[0]
        node.ok(dequeue("q"))
        node.ok(dequeue("q"), now_ms=T0 + 2000)
        assert node.ok(requeue(), now_ms=T0 + 9_999) == 0
        assert node.do(dequeue("q"), now_ms=T0 + 9_999)[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(requeue(), now_ms=T0 + 10_000) == 1          # only a
        assert node.do((C.ACK, "q", a))[0] == ResultCode.NOT_UNACKED  # a late ack fails
        assert node.ok(dequeue("q", True)) == (a, "default", 3, "a", {"m": "1"}, 2, "", 0, None)
        assert node.ok(requeue(), now_ms=T0 + 12_000) == 1          # b
        assert node.ok(dequeue("q", True))[0] == b
        assert node.ok(requeue(), now_ms=T0 + 100_000) == 0

    def test_redelivery_after_restart(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        mid = node.ok(enqueue("q"))[0]
        node.ok(dequeue("q"))
        node.restart()
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(requeue(), now_ms=T0 + 9_999) == 0
        assert node.ok(requeue(), now_ms=T0 + 10_000) == 1
        assert node.ok(dequeue("q"))[0] == mid


# -- get / delete / update priority ---------------------------------------------------------------
class TestMessageOps:
    def test_update_priority_of_ready(self, node: Node) -> None:
        node.ok(create("q"))
        ids = [node.ok(enqueue("q", str(i), priority=10 + i))[0] for i in range(4)]
        node.ok((C.UPDATE_PRIORITY, "q", ids[3], 1))
        node.ok((C.UPDATE_PRIORITY, "q", ids[0], 100))
        assert node.ok((C.GET, "q", ids[3]))[2] == 1
        assert node.drain_ids("q") == [ids[3], ids[1], ids[2], ids[0]]
        assert node.do((C.UPDATE_PRIORITY, "q", ids[0], 5))[0] == ResultCode.MESSAGE_NOT_FOUND

    def test_update_priority_in_fair_group(self, node: Node) -> None:
        node.ok(create("f", "fair"))
        m1 = node.ok(enqueue("f", "1", group="c1"))[0]
        m4 = node.ok(enqueue("f", "4", group="c1"))[0]
        m5 = node.ok(enqueue("f", "5", group="c2"))[0]
        node.ok((C.UPDATE_PRIORITY, "f", m1, 20))
        assert node.drain_ids("f") == [m4, m5, m1]

    def test_update_priority_of_unacked_keeps_deadline(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        a = node.ok(enqueue("q", "a", priority=1))[0]
        b = node.ok(enqueue("q", "b", priority=50))[0]
        node.ok(dequeue("q"))
        node.ok((C.UPDATE_PRIORITY, "q", a, 99), now_ms=T0 + 3000)
        assert node.sm.queues["q"].unacked[a].deadline == T0 + 10_000
        assert node.ok((C.GET, "q", a))[2] == 99
        assert node.ok(requeue(), now_ms=T0 + 9_999) == 0
        assert node.ok(requeue(), now_ms=T0 + 10_000) == 1
        assert node.drain_ids("q") == [b, a]           # returned with the new priority

    def test_get_and_delete(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        a = node.ok(enqueue("q", "a", priority=1, metadata={"k": "v"}))[0]
        b = node.ok(enqueue("q", "b", priority=2))[0]
        future = node.ok(enqueue("q", "f", priority=S0 + 3600))[0]
        assert node.ok((C.GET, "q", a)) == (a, "default", 1, "a", {"k": "v"}, 0, "", 0, None)
        assert node.ok((C.GET, "q", future))[3] == "f"       # not yet due, still gettable
        node.ok(dequeue("q"))                                  # a is unacked
        assert node.ok((C.GET, "q", a))[3] == "a"
        assert node.do((C.DELETE, "q", b)) == (OK, None)
        assert node.do((C.GET, "q", b))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.do((C.DELETE, "q", a)) == (OK, None)      # unacked delete
        assert node.do((C.GET, "q", a))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.do((C.ACK, "q", a))[0] == ResultCode.NOT_UNACKED
        assert node.ok(requeue(), now_ms=T0 + 60_000) == 0      # no redelivery afterwards
        assert node.do((C.DELETE, "q", a))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.do((C.GET, "q", 4242))[0] == ResultCode.MESSAGE_NOT_FOUND
        assert node.do(dequeue("q"), now_ms=T0 + 60_000)[0] == ResultCode.QUEUE_EMPTY
        node.restart()
        assert set(node.store.dump()["messages"]) == {U64.pack(node.qid("q")) + U64.pack(future)}

    def test_unknown_queue(self, node: Node) -> None:
        ops = [enqueue("nope"), dequeue("nope"), dequeue("nope", True), (C.GET, "nope", 1),
               (C.DELETE, "nope", 1), (C.ACK, "nope", 1), nack("nope", 1), (C.TOUCH, "nope", 1),
               (C.UPDATE_PRIORITY, "nope", 1, 5), update("nope"), (C.DELETE_QUEUE, "nope")]
        for code, _ in node.run(*ops):
            assert code == ResultCode.QUEUE_NOT_FOUND

    def test_unknown_operation(self, node: Node) -> None:
        node.ok(create("q"))
        results = node.run(enqueue("q", "before"), (99, "q"), (), enqueue("q", "after"))
        assert [r[0] for r in results] == [OK, ResultCode.BAD_COMMAND, ResultCode.BAD_COMMAND, OK]
        assert [m[3] for m in (node.ok(dequeue("q", True)) for _ in range(2))] == \
            ["before", "after"]

    def test_malformed_operation_is_contained(self, node: Node) -> None:
        node.ok(create("q"))
        digest_before = node.store.digest(include_meta=False)
        results = node.run(enqueue("q", "before"), (C.ENQUEUE, "q"), (C.ACK,),
                           enqueue("q", "after"))
        assert results[0][0] == OK and results[3][0] == OK
        for code, _ in results[1:3]:
            assert code in (ResultCode.BAD_COMMAND, ResultCode.INTERNAL)
        assert node.store.digest(include_meta=False) != digest_before
        assert [m[3] for m in (node.ok(dequeue("q", True)) for _ in range(2))] == \
            ["before", "after"]

    def test_leader_config_persisted(self, node: Node) -> None:
        node.ok((C.LEADER_CONFIG, "n1", "10.0.0.1:9000", "10.0.0.1:10000", "10.0.0.1:8000"))
        node.restart()
        assert node.sm.leader is not None
        assert (node.sm.leader.node_id, node.sm.leader.grpc_addr) == ("n1", "10.0.0.1:10000")


    def test_member_identities_one_per_id_and_address(self, node: Node) -> None:
        node.ok((C.MEMBER_INFO, "a", "h1:9000", "h1:8000", "h1:10000"))
        node.ok((C.MEMBER_INFO, "b", "h2:9000", "h2:8000", ""))
        node.ok((C.MEMBER_INFO, "a", "h3:9000", "h3:8000", ""))      # "a" moved
        node.ok((C.MEMBER_INFO, "c", "h2:9000", "h2:8001", ""))      # h2 now is "c"
        node.restart()
        assert {addr: m.node_id for addr, m in node.sm.members.items()} == \
            {"h3:9000": "a", "h2:9000": "c"}
        node.ok((C.MEMBER_FORGET, "h3:9000"))
        node.ok((C.MEMBER_FORGET, "nowhere:1"))
        assert list(node.sm.members) == ["h2:9000"]
        assert node.sm.members["h2:9000"].http_addr == "h2:8001"


class TestDeadlines:
    def test_an_entry_committed_after_its_deadline_is_refused_whole(self, tmp_path: Path) -> None:
        sm = StateMachine(LmdbStore(str(tmp_path / "s")))
        sm.apply_entries([(1, [create("q")], T0)])
        sm.apply_entries([(2, [(C.TICK,)], T0 + 10_000)])          # the cluster moved on
        late = [(C.ENQUEUE, "q", 0, "", 1, "late", None), (C.DELETE_QUEUE, "q")]
        digest = sm.store.digest(include_meta=False)
        [results] = sm.apply_entries([(3, late, T0 + 1_000, T0 + 5_000)])
        assert results == [(ResultCode.EXPIRED, None)] * 2
        assert sm.store.digest(include_meta=False) == digest and sm.applied_index == 3
        assert sm.last_now_ms == T0 + 10_000
        [results] = sm.apply_entries([(4, late[:1], T0 + 9_000, T0 + 14_000)])
        assert results[0][0] == OK, "within its deadline"

    def test_a_merged_entry_refuses_only_its_late_batches(self, tmp_path: Path) -> None:
        """A merged entry (several proposers' batches in one Raft entry) applies its batches
        in order; a batch committed after its own deadline is refused alone."""
        sm = StateMachine(LmdbStore(str(tmp_path / "s")))
        sm.apply_entries([(1, [create("q")], T0)])
        sm.apply_entries([(2, [(C.TICK,)], T0 + 10_000)])
        ops = [enqueue("q", "a"), enqueue("q", "late-1"), enqueue("q", "late-2"),
               enqueue("q", "b")]
        layout = [(1, T0 + 20_000), (2, T0 + 5_000), (1, 0)]       # (count, expires_ms)
        [results] = sm.apply_entries([(3, ops, T0 + 11_000, 0, "", layout)])
        codes = [code for code, _ in results]
        assert codes == [OK, ResultCode.EXPIRED, ResultCode.EXPIRED, OK]
        assert sm.last_now_ms == T0 + 11_000 and sm.applied_index == 3
        contents = [sm.apply_entries([(4 + n, [dequeue("q", ack=True)], T0 + 12_000)])[0][0][1][3]
                    for n in range(2)]
        assert contents == ["a", "b"]
        everything_late = [(5 + 1, [enqueue("q", "c")], T0 + 13_000, 0, "", [(1, T0 + 1)])]
        digest = sm.store.digest(include_meta=False)
        assert sm.apply_entries(everything_late) == [[(ResultCode.EXPIRED, None)]]
        assert sm.store.digest(include_meta=False) == digest
        assert sm.last_now_ms == T0 + 12_000, "a wholly refused entry does not move the clock"

    def test_tick_only_moves_the_clock(self, tmp_path: Path) -> None:
        sm = StateMachine(LmdbStore(str(tmp_path / "s")))
        sm.apply_entries([(1, [create("q")], T0)])
        digest = sm.store.digest(include_meta=False)
        assert sm.apply_entries([(2, [(C.TICK,)], T0 + 3_000)]) == [[(OK, None)]]
        assert sm.last_now_ms == T0 + 3_000
        assert sm.store.digest(include_meta=False) == digest


# -- ids and duplicates ---------------------------------------------------------------------------
class TestIds:
    def test_generated_ids(self, node: Node) -> None:
        node.ok(create("q"))
        ids = []
        for step in range(5):
            results = node.run(*[enqueue("q", str(i)) for i in range(1500)],
                               now_ms=T0 + (step // 4) * 3)   # 6000 ids in one ms overflow
            ids.extend(r[1][0] for r in results)
        assert all(a < b for a, b in zip(ids, ids[1:]))
        node_mask = ((1 << NODE_BITS) - 1) << SEQ_BITS
        assert all(mid & node_mask == 0 for mid in ids)       # node bits are 0
        assert id_time_ms(ids[0]) == T0
        assert T0 <= id_time_ms(ids[-1]) <= T0 + 20
        node.restart()                                          # the counter survives a restart
        assert node.ok(enqueue("q"), now_ms=T0)[0] > ids[-1]

    def test_generated_id_skips_client_id(self, node: Node) -> None:
        node.ok(create("q"))
        first = node.ok(enqueue("q", "gen"))[0]
        expected_next = next_fsm_id(first, T0)
        node.ok(enqueue("q", "client", mid=expected_next))
        node.ok(enqueue("q", "client2", mid=next_fsm_id(expected_next, T0)))
        generated = node.ok(enqueue("q", "gen2"))[0]
        assert generated > expected_next and generated not in (expected_next, first)
        assert generated != next_fsm_id(expected_next, T0)
        assert node.ok((C.GET, "q", expected_next))[3] == "client"
        assert node.ok((C.GET, "q", generated))[3] == "gen2"
        assert len(node.store.dump()["messages"]) == 4

    def test_next_fsm_id(self) -> None:
        node_mask = ((1 << NODE_BITS) - 1) << SEQ_BITS
        mid = next_fsm_id(0, T0)
        assert id_time_ms(mid) == T0 and mid & ((1 << SEQ_BITS) - 1) == 0
        ids = [mid]
        for _ in range(10_000):                 # overflows the 12-bit sequence twice
            ids.append(next_fsm_id(ids[-1], T0))
        assert all(a < b for a, b in zip(ids, ids[1:]))
        assert all(m & node_mask == 0 for m in ids)
        assert id_time_ms(ids[-1]) == T0 + 2
        assert next_fsm_id(ids[-1], T0 - 5000) == ids[-1] + 1     # an older clock: still later
        assert id_time_ms(next_fsm_id(ids[-1], T0 + 10)) == T0 + 10

    def test_snowflake_never_meets_fsm_ids(self) -> None:
        """GenerateIDs ids carry node number >= 1; state-machine ids carry 0."""
        ticks = iter([T0 / 1000] * 5000 + [(T0 - 50) / 1000] * 10 + [(T0 + 7) / 1000] * 3)
        gen = Snowflake(node=3, clock=lambda: next(ticks))
        ids = gen.generate(5013)                       # sequence overflow + clock stepping back
        assert all(a < b for a, b in zip(ids, ids[1:]))
        assert {(m >> SEQ_BITS) & ((1 << NODE_BITS) - 1) for m in ids} == {3}
        with pytest.raises(ValueError):
            Snowflake(node=0)

    def test_client_ids_used_verbatim(self, node: Node) -> None:
        node.ok(create("q"))
        assert node.ok(enqueue("q", mid=12312))[0] == 12312
        assert node.ok(dequeue("q"))[0] == 12312
        node.ok((C.ACK, "q", 12312))

    def test_duplicate_ready_id_is_repositioned(self, node: Node) -> None:
        node.ok(create("q"))
        node.ok(enqueue("q", "old", priority=50, mid=42))
        others = [node.ok(enqueue("q", str(i), priority=20))[0] for i in range(3)]
        node.ok(enqueue("q", "new", priority=1, mid=42, metadata={"v": "2"}))
        assert node.sm.queues["q"].index.ready == 4
        got = [node.ok(dequeue("q", True)) for _ in range(4)]
        assert got[0] == (42, "default", 1, "new", {"v": "2"}, 1, "", 0, None)
        assert [m[0] for m in got[1:]] == others
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_EMPTY

    def test_duplicate_ready_id_changes_fair_group(self, node: Node) -> None:
        node.ok(create("f", "fair"))
        node.ok(enqueue("f", "a", group="g1", mid=7))
        node.ok(enqueue("f", "b", group="g1", mid=8))
        node.ok(enqueue("f", "c", group="g2", mid=7))
        assert node.sm.queues["f"].index.group_of(7) == "g2"
        got = [node.ok(dequeue("f", True)) for _ in range(2)]
        assert [(m[0], m[1]) for m in got] == [(8, "g1"), (7, "g2")]
        assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY

    def test_duplicate_unacked_id_stays_unacked(self, node: Node) -> None:
        node.ok(create("f", "fair", RR, 1, 10))
        node.ok(enqueue("f", "v1", priority=50, group="g1", mid=42))
        node.ok(enqueue("f", "other", priority=60, group="g1", mid=43))
        assert node.ok(dequeue("f"))[0] == 42
        result = node.ok(enqueue("f", "v2", priority=1, group="g2", mid=42))
        assert result == (42, "g2", 1, "v2", {}, False)
        assert 42 in node.sm.queues["f"].unacked
        assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY    # g1 is at its limit
        assert node.ok((C.GET, "f", 42))[3] == "v2"
        node.ok(nack("f", 42))                                        # frees g1's slot
        got = [node.ok(dequeue("f", True)) for _ in range(2)]
        assert {(m[0], m[1], m[2], m[3]) for m in got} == {(42, "g2", 1, "v2"),
                                                           (43, "g1", 60, "other")}
        assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY
        assert node.sm.queues["f"].index.inflight == {}

    def test_duplicate_unacked_redelivered_once(self, node: Node) -> None:
        node.ok(create("q", ack_timeout=10))
        node.ok(enqueue("q", "v1", mid=5))
        node.ok(dequeue("q"))
        node.ok(enqueue("q", "v2", mid=5, priority=3))
        node.restart()
        assert node.do(dequeue("q"))[0] == ResultCode.QUEUE_EMPTY
        assert node.ok(requeue(), now_ms=T0 + 10_000) == 1
        assert node.ok(dequeue("q", True))[2:4] == (3, "v2")
        assert node.do(dequeue("q", True))[0] == ResultCode.QUEUE_EMPTY


# -- max_unacked ----------------------------------------------------------------------------------
def _release(node: Node, how: str, q: str, mid: int) -> None:
    if how == "ack":
        node.ok((C.ACK, q, mid))
    elif how == "nack":
        node.ok(nack(q, mid))
    elif how == "delete":
        node.ok((C.DELETE, q, mid))
    else:
        assert node.ok(requeue(), now_ms=node.now_ms + 10_000) == 1


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
@pytest.mark.parametrize("how", ["ack", "nack", "delete", "redelivery"])
def test_max_unacked_slot_freed(node: Node, strategy: int, how: str) -> None:
    """Every transition out of UNACKED frees the group's slot (the reference leaks here)."""
    node.ok(create("f", "fair", strategy, 1, 10))
    ids = [node.ok(enqueue("f", str(i), priority=i, group="g"))[0] for i in range(4)]
    delivered = []
    for _ in range(3):                       # repeat: a leak would show up on the second round
        mid = node.ok(dequeue("f"))[0]
        delivered.append(mid)
        assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY
        _release(node, how, "f", mid)
        node.now_ms += 10_000
        assert node.sm.queues["f"].index.has_ready(0)
    returns = how in ("nack", "redelivery")
    assert delivered == ([ids[0]] * 3 if returns else ids[:3])
    assert node.ok(dequeue("f"))[0] == (ids[0] if returns else ids[3])
    node.restart()                           # the rebuilt index counts the same slots
    assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_max_unacked_raise_unblocks(node: Node, strategy: int) -> None:
    node.ok(create("f", "fair", strategy, 1, 10))
    for i in range(3):
        node.ok(enqueue("f", str(i), group="g"))
    node.ok(dequeue("f"))
    assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY
    node.ok(update("f", 0, 3, 10))
    node.ok(dequeue("f"))
    node.ok(dequeue("f"))
    node.ok(update("f", 0, 1, 10))
    node.restart()
    assert node.sm.queues["f"].index.max_unacked == 1
    assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY
    for mid in list(node.sm.queues["f"].unacked):
        node.ok((C.ACK, "f", mid))
    assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY      # nothing left at all
    index = node.sm.queues["f"].index
    index.drain_changes()
    assert index.bookkeeping_size() == 0


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_restart_right_after_limit_change(tmp_path: Path, strategy: int) -> None:
    """A limit change that unblocks a group must persist whatever scheduler state it moves."""
    nodes = [Node(tmp_path / "live"), Node(tmp_path / "restarted")]
    try:
        for n in nodes:
            n.ok(create("w", "fair", strategy, 1, 10))
            for i in range(5):
                n.ok(enqueue("w", f"a{i}", group="A"))
            for i in range(40):
                n.ok(enqueue("w", f"b{i}", group="B"))
            n.ok(dequeue("w"))                           # A is now at its limit
            for _ in range(20):                          # B keeps being served and acked
                mid = n.ok(dequeue("w"))[0]
                n.ok((C.ACK, "w", mid))
            n.ok(update("w", 0, 3, 10))                  # A is eligible again
        nodes[1].restart()
        after = [[n.do(dequeue("w", True)) for _ in range(30)] for n in nodes]
        assert after[0] == after[1]
        assert nodes[0].store.digest() == nodes[1].store.digest()
    finally:
        for n in nodes:
            n.close()


def test_weighted_groups_served_fairly(node: Node) -> None:        # TestFairDequeue
    node.ok(create("w", "fair", WEIGHTED))
    sizes = {"a": 10, "b": 5, "c": 3, "d": 1}
    for group, n in sizes.items():
        for i in range(n):
            node.ok(enqueue("w", f"{group}{i}", group=group))
    got = [node.ok(dequeue("w", True)) for _ in range(19)]
    assert sorted(m[3] for m in got) == sorted(f"{g}{i}" for g, n in sizes.items()
                                               for i in range(n))
    assert {m[1] for m in got[:4]} == {"a", "b", "c", "d"}
    assert node.do(dequeue("w"))[0] == ResultCode.QUEUE_EMPTY


# -- replay, wake-ups, rates ----------------------------------------------------------------------
def test_replay_is_idempotent(node: Node) -> None:
    node.ok(create("q"))
    entry = (2, [enqueue("q", "once")], T0)
    first = node.sm.apply_entries([entry])
    assert first[0] is not None and first[0][0][0] == OK
    digest = node.store.digest()
    assert node.sm.apply_entries([entry]) == [None]
    assert node.sm.apply_entries([(1, [create("other")], T0), entry]) == [None, None]
    assert node.store.digest() == digest
    mixed = node.sm.apply_entries([entry, (3, [dequeue("q", True)], T0)])
    assert mixed[0] is None and mixed[1] is not None and mixed[1][0][1][3] == "once"
    node.restart()
    assert node.sm.applied_index == 3 and node.store.applied_index() == 3
    digest = node.store.digest()
    assert node.sm.apply_entries([entry, (3, [dequeue("q", True)], T0)]) == [None, None]
    assert node.store.digest() == digest


def test_wakeups(node: Node) -> None:
    woken: list[set[str]] = []
    node.sm.on_ready = woken.append

    def fired(*ops: C.Op, now_ms: int | None = None) -> set[str]:
        woken.clear()
        node.run(*ops, now_ms=now_ms)
        return set().union(*woken) if woken else set()

    node.ok(create("q", ack_timeout=10))
    node.ok(create("f", "fair", RR, 1, 10))
    assert fired(enqueue("q", "a", mid=1), enqueue("f", "b", group="g", mid=2)) == {"q", "f"}
    assert len(woken) == 1                                 # one call per applied batch
    assert fired(enqueue("q", "a2", mid=1)) == set()       # duplicate id: no wake-up
    assert fired(dequeue("q"), dequeue("f")) == set()
    assert fired(enqueue("f", "c", group="g", mid=3)) == {"f"}   # new id (blocked, still fired)
    assert fired(dequeue("f")) == set()                    # blocked: empty
    assert fired((C.ACK, "f", 2)) == {"f"}                 # ack unblocks the fair group
    assert fired(nack("q", 1)) == {"q"}
    assert fired(dequeue("q")) == set()
    assert fired(requeue(), now_ms=T0 + 9_000) == set()
    assert fired(requeue(), now_ms=T0 + 10_000) == {"q"}   # redelivery
    assert fired(dequeue("f"), now_ms=T0 + 10_000) == set()
    node.ok(enqueue("f", "d", group="g", mid=4))
    assert fired(update("f", 0, 2, 10)) == {"f"}           # a raised limit unblocks
    assert fired(update("f", 0, 2, 20)) == set()


def test_rates_counted_where_applied(node: Node) -> None:
    node.ok(create("q", ack_timeout=10))
    now = T0 + 500
    ids = [node.ok(enqueue("q", str(i)), now_ms=now)[0] for i in range(10)]
    node.ok(enqueue("q", "dup", mid=ids[0]), now_ms=now)         # not counted
    for mid in ids[:5]:
        assert node.ok(dequeue("q"), now_ms=now)[0] == mid
    for mid in ids[:3]:
        node.ok((C.ACK, "q", mid), now_ms=now)
    for mid in ids[3:5]:
        node.ok(nack("q", mid), now_ms=now)
    node.ok(dequeue("q"), now_ms=now)
    node.ok(requeue(), now_ms=now + 20_000)                       # redelivery: not counted
    node.ok((C.DELETE, "q", ids[9]), now_ms=now + 20_000)         # delete: not counted
    stats = node.sm.queues["q"].stats
    assert stats.rates(S0) == {"enqueue": 0.0, "dequeue": 0.0, "ack": 0.0, "nack": 0.0}
    assert stats.rates(S0 + 1) == pytest.approx(
        {"enqueue": 1.0, "dequeue": 0.6, "ack": 0.3, "nack": 0.2})
    assert stats.totals() == {"enqueue": 10, "dequeue": 6, "ack": 3, "nack": 2}


# -- random logs: determinism, restart equivalence, fault containment -----------------------------
RR_GROUPS = ["a", "a.b", "a.b.c", "a.c", "x.y", "x.z", "k", "k.l.m"]
W_GROUPS = ["g1", "g2", "g3", "g4"]
QUEUES = {          # in creation order: a dead-letter queue before the queues that use it
    "dlq": create("dlq", "delayed", 0, 0, 10),
    "d": create("d", "delayed", 0, 0, 10, {"max_deliveries": 3, "dead_letter_queue": "dlq",
                                           "backoff_initial": 1, "backoff_max": 4}),
    "rr": create("rr", "fair", RR, 2, 10, {"max_deliveries": 2, "dead_letter_queue": "dlq"}),
    "rr0": create("rr0", "fair", 0, 0, 20, {"group_rate": 0.5, "group_burst": 2}),
    "w": create("w", "fair", WEIGHTED, 3, 10, {"max_deliveries": 2}),     # drops dead letters
    "cap": create("cap", "fair", RR, 0, 10, {"max_messages": 6, "overflow": "drop_oldest",
                                             "dead_letter_queue": "dlq"}),
    "lim": create("lim", "delayed", 0, 0, 10, {"max_messages": 5}),
    "once": create("once", "delayed", 0, 0, 10, {"dedup_window": 10, "message_ttl": 6,
                                                 "dead_letter_queue": "dlq"}),
    "rate": create("rate", "fair", WEIGHTED, 0, 10, {"group_rate": 0.25, "group_burst": 2,
                                                     "max_in_flight": 3}),
}
LIFECYCLES = [None, None, {"max_deliveries": 1}, {"max_deliveries": 0},
              {"dead_letter_queue": "dlq"}, {"dead_letter_queue": ""},
              {"dead_letter_queue": "rr"},          # from dlq: a cycle when rr uses dlq
              {"dead_letter_queue": "missing"}, {"max_deliveries": 2, "dead_letter_queue": "w"},
              {"backoff_initial": 2, "backoff_max": 3}, {"backoff_initial": 0},
              {"backoff_max": 1},                   # below an initial of 2: refused
              {"group_rate": 0.0}, {"group_rate": 2.5, "group_burst": 3},
              {"max_in_flight": 1}, {"max_in_flight": 0}, {"group_burst": 0}]     # 0: refused

Entry = tuple[int, list[C.Op], int]


def _random_op(rng: random.Random, known: dict[str, list[int]], now_ms: int,
               sm: StateMachine | None = None) -> C.Op:
    q = rng.choice(sorted(QUEUES))

    def some_id() -> int:
        ids = known[q]
        return rng.choice(ids) if ids and rng.random() < 0.9 else rng.randrange(1, 40)

    r = rng.random()
    if r < 0.03:
        items = [_random_op(rng, known, now_ms) for _ in range(rng.randrange(1, 4))]
        batch = [op[1:] for op in items if op[0] == C.ENQUEUE]
        if rng.random() < 0.1:
            batch.append(("missing", 0, "", 1, "lost", None))     # refused whole
        return (rng.choice([C.ENQUEUE_BATCH, C.ENQUEUE_SEQ]), batch)
    if r < 0.34:
        mid = rng.randrange(1, 40) if rng.random() < 0.25 else 0
        group = rng.choice(RR_GROUPS if q.startswith("rr") else W_GROUPS)
        if q == "d" and rng.random() < 0.3:
            priority = now_ms // 1000 + rng.randrange(0, 6)       # a future second
        else:
            priority = rng.randrange(-3, 30)
        meta = {"n": str(rng.randrange(5))} if rng.random() < 0.3 else None
        if rng.random() < 0.3 or q == "once":
            return C.enqueue(q, mid, group, priority, f"c{rng.randrange(1000)}", meta,
                             f"key{rng.randrange(6)}")
        return enqueue(q, f"c{rng.randrange(1000)}", priority, group, mid, meta)
    if r < 0.54:
        return dequeue(q, rng.random() < 0.3)
    if r < 0.58:
        return (C.DEQUEUE_MANY, q, rng.random() < 0.3, rng.randrange(0, 5))
    if r < 0.62:
        return (C.ACK, q, some_id())
    if r < 0.64:
        ids = [some_id() for _ in range(rng.randrange(0, 4))]
        kind = rng.random()
        if kind < 0.4:
            return (C.ACK_MANY, q, ids)
        if kind < 0.6:
            return (C.ACK_IDS, q, ids)
        if kind < 0.7:                       # each id stores messages with its ack
            ids = known[q][-3:] + ids[:1]   # the newest: the likeliest to be delivered
            targets = sorted(QUEUES) * 3 + ["missing"]
            return C.ack_ids(q, ids, None, [
                [C.Item(rng.choice(targets), 0, "", rng.randrange(5), f"r{rng.randrange(100)}",
                        None) for _ in range(rng.randrange(0, 3))] for _ in ids])
        return (C.NACK_IDS, q, ids, rng.choice([0, 7]), rng.choice([None, {"again": "1"}]),
                rng.choice(["", "timeout"]))
    if r < 0.70:
        recent = known[q][-4:]           # the newest ids are the likeliest to be delivered
        mid = rng.choice(recent) if recent and rng.random() < 0.5 else some_id()
        if rng.random() < 0.3:              # the newest id: likely delivered just now
            return C.reject(q, known[q][-1] if known[q] else mid, rng.choice(["", "poison"]))
        if rng.random() < 0.15:             # back out of the dead-letter queue
            ids = None if rng.random() < 0.6 else [some_id() for _ in range(3)]
            return C.redrive("dlq", rng.choice(["", "", q, "missing"]), ids, rng.randrange(1, 6))
        return C.nack(q, mid, rng.choice([0, 0, 5, 40]),
                      rng.choice([None, None, {}, {"retry": "1"}]),
                      rng.choice(["", "", "failed", "ошибка"]), rng.choice([0, 0, 0, 3]))
    if r < 0.74:
        return (C.TOUCH, q, some_id())
    if r < 0.78:
        return (C.DELETE, q, some_id())
    if r < 0.81:
        return (C.GET, q, some_id())
    if r < 0.85:
        return (C.UPDATE_PRIORITY, q, some_id(), rng.randrange(-3, 30))
    if r < 0.87:
        return requeue()
    if r < 0.91:
        return _schedule_op(rng, q, now_ms, sm)
    if r < 0.93:
        return update(q, rng.choice([0, 0, RR, WEIGHTED]), rng.randrange(0, 4),
                      rng.choice([0, 10, 15, 5]), rng.choice(LIFECYCLES))
    if r < 0.942:
        return (C.DELETE_QUEUE, q)
    if r < 0.955:                    # pause / resume the queue or a group (a delayed one's:
        if rng.random() < 0.4:       # refused), paused more often than resumed
            group = ""
        else:
            group = rng.choice(RR_GROUPS[:3] + W_GROUPS[:2] + ["", "x"])
        return C.set_paused(q, group, rng.random() < 0.45)
    if r < 0.958:
        return C.purge(q, rng.random() < 0.5)
    if r < 0.97:
        return QUEUES[q]                                     # create (again)
    if r < 0.978:
        return (C.LEADER_CONFIG, f"n{rng.randrange(3)}", "h:9000", "h:10000", "h:8000")
    if r < 0.986:
        k = rng.randrange(4)
        return (C.MEMBER_INFO, f"n{k}", f"h{rng.randrange(3)}:9000", f"h{k}:8000", "")
    if r < 0.992:
        return (C.MEMBER_FORGET, f"h{rng.randrange(3)}:9000")
    if r < 0.996:
        return (C.TICK,)
    if r < 0.998:                    # the first valid one names the cluster, later ones not
        return C.cluster_id(rng.choice(["ab" * 16, f"{rng.randrange(16 ** 32):032x}",
                                        "not hex"]))
    return (77, q)


_SCHEDULE_TIMES = [T0 + k * 1000 for k in range(5)]      # small: fires often find their mark


def _schedule_op(rng: random.Random, q: str, now_ms: int, sm: StateMachine | None) -> C.Op:
    """A schedule operation: put (one of two names, cron or every, sometimes paused),
    delete, pause or resume, or a fire whose ``after`` is often the schedule's next (read
    from the reference replica ``sm``)."""
    name = rng.choice(["a", "b"])
    r = rng.random()
    if r < 0.3:
        cron = rng.choice(["", "*/5 * * * *", "0 3 * * *"])
        defn = schedules.define(name, {"content": f"s{rng.randrange(9)}",
                                       "group": rng.choice(["", "g1"]),
                                       "metadata": {"n": "1"}}, now_ms, cron=cron,
                                every=None if cron else rng.choice([1, 60]),
                                timezone="Europe/Berlin" if cron else "",
                                catch_up=rng.choice(schedules.CATCH_UP))
        return C.schedule_put(q, defn.to_json(), rng.choice(_SCHEDULE_TIMES),
                              rng.random() < 0.2)
    if r < 0.4:
        return C.schedule_delete(q, name)
    if r < 0.55:
        return C.schedule_pause(q, name, rng.random() < 0.5)
    after = rng.choice(_SCHEDULE_TIMES)
    current = sm.schedule_views(q, name) if sm is not None else None
    if current and rng.random() < 0.9:
        after = current[0].next_ms
    fired = [after + 500 * k for k in range(rng.randrange(0, 3))]
    return C.schedule_fire(q, name, after, fired, rng.randrange(0, 3),
                           min(after + 1000, _SCHEDULE_TIMES[-1]))


def _dump_records(ref: "Node") -> list[tuple[int, bytes, bytes | None]]:
    dump = ref.store.dump()
    return [(code, key, value) for name, code in TRACKED.items()
            for key, value in dump[name].items()]


def _restore_ops(rng: random.Random, older: list[tuple[int, bytes, bytes | None]],
                 current: list[tuple[int, bytes, bytes | None]], sm: StateMachine,
                 index: int) -> list[C.Op]:
    """A full restore of a state the reference replica had earlier, or an incremental one of
    its current state (often out of chain); sometimes interrupted by another restore or
    aborted. (An incremental applies on top of whatever is there: only the current state
    keeps the scheduler records of fair queues consistent.)"""
    token = f"t{index}"
    full = rng.random() < 0.6
    records = older if full else current
    records = records + [(1, b"no-such-queue", None)]         # a deletion of nothing
    half = len(records) // 2
    since = (sm.restored_version or 0) + 1 if rng.random() < 0.7 else rng.randrange(1, 50)
    ops: list[C.Op] = [(C.RESTORE_BEGIN, token), (C.RESTORE_PUT, token, records[:half])]
    r = rng.random()
    if r < 0.15:
        ops.append((C.RESTORE_BEGIN, token + "x"))            # a newer restore takes over
    elif r < 0.3:
        ops.append((C.RESTORE_ABORT, token))
    ops.append((C.RESTORE_PUT, token, records[half:]))
    ops.append((C.RESTORE_COMMIT, token, full, since, index, sm.last_id, sm.next_qid))
    return ops


class Log:
    """A random command log and what a reference replica (one entry per call) returned for it."""

    def __init__(self, entries: list[Entry], results: list[list[tuple[int, Any]]],
                 digest: str) -> None:
        self.entries, self.results, self.digest = entries, results, digest


def make_log(seed: int, n_entries: int, path: Path) -> Log:
    """A random log; ids for ack/nack/... are picked from what the reference replica returned."""
    rng = random.Random(seed)
    ref = Node(path)
    known: dict[str, list[int]] = {q: [] for q in QUEUES}
    entries: list[Entry] = [(1, list(QUEUES.values()), T0)]
    all_results = ref.sm.apply_entries(entries)
    saved: list[tuple[int, bytes, bytes | None]] | None = None
    now = T0
    for index in range(2, n_entries + 2):
        now += rng.randrange(0, 2500)
        stamp = now - rng.randrange(1, 8000) if rng.random() < 0.06 else now
        ops = [_random_op(rng, known, stamp, ref.sm) for _ in range(rng.randrange(1, 5))]
        if rng.random() < 0.025:               # a restore, alone in its entry
            if saved is None or rng.random() < 0.3:
                saved = _dump_records(ref)
            ops = _restore_ops(rng, saved, _dump_records(ref), ref.sm, index)
        entry = (index, ops, stamp)
        entries.append(entry)
        results = ref.sm.apply_entries([entry])[0]
        assert results is not None
        all_results.append(results)
        for op, (code, value) in zip(ops, results):
            if code != OK:
                continue
            if op[0] in (C.ENQUEUE, C.DEQUEUE):
                known[op[1]].append(value[0])
            elif op[0] == C.DEQUEUE_MANY:
                known[op[1]].extend(v[0] for v in value)
            elif op[0] in (C.ENQUEUE_BATCH, C.ENQUEUE_SEQ):
                stored = value if op[0] == C.ENQUEUE_BATCH else value[0]
                for item, v in zip(op[1], stored):
                    known[item[0]].append(v[0])
            for ids in known.values():
                del ids[:-30]
    # a tail that makes in-memory scheduler state observable: redeliver, then drain everything
    tail = [requeue()] + [dequeue(q, True) for q in sorted(QUEUES) for _ in range(60)]
    entries.append((n_entries + 2, tail, now + 10_000_000))
    all_results.extend(ref.sm.apply_entries(entries[-1:]))
    digest = ref.store.digest()
    ref.close()
    return Log(entries, all_results, digest)  # type: ignore[arg-type]


def run_log(path: Path, entries: list[Entry], chunks: list[int] | None = None,
            restart_at: set[int] = frozenset(), fault_injection: bool = False,
            ) -> tuple[list[list[tuple[int, Any]]], str]:
    """Apply ``entries`` to a fresh replica in batches of ``chunks`` sizes (cycled), restarting
    the replica after the entry counts in ``restart_at``; returns the results and the digest."""
    node = Node(path, fault_injection=fault_injection)
    results: list[list[tuple[int, Any]]] = []
    pos, k = 0, 0
    while pos < len(entries):
        size = chunks[k % len(chunks)] if chunks else 1
        k += 1
        stop = min((r for r in restart_at if r > pos), default=len(entries))
        batch = entries[pos:min(pos + size, stop)]
        out = node.sm.apply_entries(batch)
        assert all(r is not None for r in out)
        results.extend(out)        # type: ignore[arg-type]
        pos += len(batch)
        if pos in restart_at:
            node.restart()
            assert node.sm.applied_index == entries[pos - 1][0]
            # the journal replays from the start: everything applied is skipped
            assert node.sm.apply_entries(entries[:pos]) == [None] * pos
    digest = node.store.digest()
    node.close()
    return results, digest


SEEDS = (11, 12, 13)


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Log]:
    base = tmp_path_factory.mktemp("logs")
    return {seed: make_log(seed, 800, base / f"ref{seed}") for seed in SEEDS}


def _summary(results: list[list[tuple[int, Any]]]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for entry in results:
        for code, _ in entry:
            counts[code] = counts.get(code, 0) + 1
    return counts


@pytest.mark.parametrize("seed", SEEDS)
def test_log_exercises_everything(logs: dict[int, Log], seed: int) -> None:
    """Guard for the tests below: the random log really covers the interesting paths."""
    log = logs[seed]
    counts = _summary(log.results)
    for code in (OK, ResultCode.QUEUE_EMPTY, ResultCode.NOT_UNACKED,
                 ResultCode.MESSAGE_NOT_FOUND, ResultCode.BAD_COMMAND):
        assert counts.get(code, 0) > 0, code
    requeued = sum(v for entry, (_, ops, _) in zip(log.results, log.entries)
                   for (code, v), op in zip(entry, ops) if op[0] == C.REQUEUE_EXPIRED)
    assert requeued > 5
    commits = [(code, op[2]) for entry, (_, ops, _) in zip(log.results, log.entries)
               for (code, _), op in zip(entry, ops) if op[0] == C.RESTORE_COMMIT]
    assert (OK, True) in commits and (OK, False) in commits      # full and incremental
    assert any(code == ResultCode.RESTORE_CONFLICT for code, _ in commits)


def test_logs_exercise_the_message_lifecycle(logs: dict[int, Log]) -> None:
    """Guard, over the logs of every seed: dead letters of each kind the log can make reach
    the dead-letter queue, delivery counts go above one, and the state refuses lifecycle
    settings and deletions it must refuse."""
    counts: dict[int, int] = {}
    dead: list[dict[str, str]] = []
    redelivered = 0
    for log in logs.values():
        for code, n in _summary(log.results).items():
            counts[code] = counts.get(code, 0) + n
        for entry, (_, ops, _) in zip(log.results, log.entries):
            for (code, v), op in zip(entry, ops):
                if code != OK or op[0] not in (C.DEQUEUE, C.DEQUEUE_MANY, C.GET):
                    continue
                for m in (v if op[0] == C.DEQUEUE_MANY else [v]):
                    redelivered += m[5] > 1
                    if op[1] == "dlq":
                        dead.append(m[4])
    assert {m.get("x-dead-reason") for m in dead} >= {"max_deliveries", "rejected"}
    assert all(m["x-dead-from"] in QUEUES and int(m["x-deliveries"]) >= 0
               for m in dead if "x-dead-from" in m)
    ops_seen = {op[0] for log in logs.values() for _, ops, _ in log.entries for op in ops}
    assert set(C.NAMES) <= ops_seen                  # every operation, in some log
    fires = [(code, v) for log in logs.values() for entry, (_, ops, _) in
             zip(log.results, log.entries) for (code, v), op in zip(entry, ops)
             if op[0] == C.SCHEDULE_FIRE]
    assert sum(1 for code, v in fires if code == OK and v) >= 4    # stored messages
    stored_with_acks = [ids for log in logs.values() for entry, (_, ops, _) in
                        zip(log.results, log.entries) for (code, v), op in zip(entry, ops)
                        if op[0] == C.ACK_IDS and len(op) > 4 and code == OK
                        for ids in v[1] if ids]
    assert len(stored_with_acks) >= 3           # acks of a batch that stored messages
    assert sum(1 for code, v in fires if code == OK and v is None) >= 3    # moved on: nothing
    assert redelivered > 10
    assert counts.get(ResultCode.INVALID_LIFECYCLE, 0) > 0
    assert counts.get(ResultCode.QUEUE_IN_USE, 0) > 0
    assert counts.get(ResultCode.QUEUE_FULL, 0) > 0
    duplicates = [v for log in logs.values() for entry, (_, ops, _) in zip(log.results,
                                                                             log.entries)
                  for (code, v), op in zip(entry, ops)
                  if op[0] == C.ENQUEUE and code == OK and v.duplicate]
    assert len(duplicates) > 5
    nacked = [v for log in logs.values() for entry, (_, ops, _) in zip(log.results, log.entries)
              for (code, v), op in zip(entry, ops) if op[0] == C.NACK and code == OK]
    assert len(nacked) > 10
    assert sum(1 for log in logs.values() for _, ops, _ in log.entries for op in ops
               if op[0] == C.NACK and len(op) > 6 and op[6]) > 10      # nacks with a delay
    assert {"overflow", "expired"} <= {m.get("x-dead-reason") for m in dead}
    redriven = [v for log in logs.values() for entry, (_, ops, _) in zip(log.results, log.entries)
                for (code, v), op in zip(entry, ops) if op[0] == C.REDRIVE and code == OK]
    assert sum(moved for moved, _ in redriven) > 5
    assert {code for _, failed in redriven for _, code, _ in failed} >= {
        ResultCode.MESSAGE_NOT_FOUND, ResultCode.NO_ORIGIN}


def test_logs_exercise_the_operator_controls(logs: dict[int, Log]) -> None:
    """Guard: pauses and resumes of queues and groups take effect, dequeues of a
    paused queue are refused, group pauses of delayed queues are refused, purges drop
    messages with and without the delivered ones."""
    results: dict[int, list[tuple[int, Any]]] = {C.SET_PAUSED: [], C.PURGE: [], C.DEQUEUE: []}
    purges: list[tuple[bool, int]] = []
    for log in logs.values():
        for entry, (_, ops, _) in zip(log.results, log.entries):
            for (code, v), op in zip(entry, ops):
                if op[0] in results:
                    results[op[0]].append((code, v))
                if op[0] == C.PURGE and code == OK:
                    purges.append((op[2], v))
    assert sum(1 for code, v in results[C.SET_PAUSED] if code == OK and v) > 10
    assert any(code == ResultCode.INVALID_CONTROL for code, _ in results[C.SET_PAUSED])
    assert sum(1 for code, _ in results[C.DEQUEUE] if code == ResultCode.QUEUE_PAUSED) > 5
    assert any(n > 0 for with_unacked, n in purges if with_unacked)
    assert any(n > 0 for with_unacked, n in purges if not with_unacked)


def test_logs_exercise_the_delivery_limits(logs: dict[int, Log], tmp_path: Path) -> None:
    """Guard: in the logs, groups run out of their rate and come back, and a
    queue reaches its max_in_flight."""
    limited = capped = 0
    for seed, log in logs.items():
        node = Node(tmp_path / f"limits-{seed}")
        for entry in log.entries:
            before = {q: node.sm.queues[q].stats.rate_limited for q in ("rate", "rr0")
                      if q in node.sm.queues}
            node.sm.apply_entries([entry])
            for q, qs in node.sm.queues.items():
                if q in before:
                    limited += max(0, qs.stats.rate_limited - before[q])
                cap = qs.defn.settings.max_in_flight
                capped += bool(cap) and len(qs.unacked) >= cap
        node.close()
    assert limited > 5 and capped > 5


@pytest.mark.parametrize("seed", SEEDS)
def test_determinism_across_chunkings(logs: dict[int, Log], seed: int, tmp_path: Path) -> None:
    log = logs[seed]
    many, digest_many = run_log(tmp_path / "many", log.entries, chunks=[3, 7, 1, 12, 5])
    assert digest_many == log.digest
    assert many == log.results
    whole, digest_whole = run_log(tmp_path / "whole", log.entries, chunks=[len(log.entries)])
    assert digest_whole == log.digest
    assert whole == log.results


@pytest.mark.parametrize("seed", SEEDS)
def test_restart_equivalence(logs: dict[int, Log], seed: int, tmp_path: Path) -> None:
    """A replica restarted mid-log (indexes rebuilt from LMDB) ends identical to the others."""
    log = logs[seed]
    half = len(log.entries) // 2
    restarted, digest_r = run_log(tmp_path / "half", log.entries, chunks=[5], restart_at={half})
    assert digest_r == log.digest
    assert restarted == log.results
    often, digest_o = run_log(tmp_path / "often", log.entries, chunks=[4, 1, 9],
                              restart_at=set(range(7, len(log.entries), 23)))
    assert digest_o == log.digest
    assert often == log.results


def _insert_faults(entries: list[Entry], rng: random.Random) -> tuple[list[Entry], set]:
    """Insert faulty ENQUEUEs at the start, middle, end of entries and as an entry's only op."""
    faulty: list[Entry] = []
    where: set[tuple[int, int]] = set()
    for n, (index, ops, now_ms) in enumerate(entries):
        ops = list(ops)
        if n > 1 and n % 17 == 0:
            q = rng.choice(sorted(QUEUES))
            mid = rng.choice([0, 0, rng.randrange(1, 40)])
            bad = enqueue(q, FAULT_CONTENT, 3, rng.choice(RR_GROUPS), mid)
            spot = [0, len(ops) // 2, len(ops)][n % 3] if n % 51 else None
            if spot is None:
                ops = [bad]
                spot = 0
            else:
                ops.insert(spot, bad)
            where.add((n, spot))
        faulty.append((index, ops, now_ms))
    return faulty, where


@pytest.mark.parametrize("seed", [11, 12])
def test_fault_containment(logs: dict[int, Log], seed: int, tmp_path: Path) -> None:
    """A failing op is answered INTERNAL and leaves no trace; the rest of its entry (and of its
    batch) applies exactly as in a log without it."""
    rng = random.Random(seed)
    faulty, where = _insert_faults(logs[seed].entries, rng)
    assert any(len(faulty[n][1]) == 1 for n, _ in where)      # some entries hold only the fault
    clean_view = [(i, [op for k, op in enumerate(ops) if (n, k) not in where], t)
                  for n, (i, ops, t) in enumerate(faulty)]
    expected, digest = run_log(tmp_path / "clean", clean_view, chunks=[8],
                               fault_injection=True)
    for chunks in ([1], [6, 2, 11]):
        got, digest_f = run_log(tmp_path / f"faulty{len(chunks)}", faulty, chunks=chunks,
                                fault_injection=True)
        internal = 0
        for n, spot in where:
            # INTERNAL, or QUEUE_NOT_FOUND when the log had just deleted that queue, or
            # QUEUE_FULL when it was full (refused before the faulty part)
            assert got[n][spot] in ((ResultCode.INTERNAL, "internal error"),
                                    (ResultCode.QUEUE_NOT_FOUND, None),
                                    (ResultCode.QUEUE_FULL, None))
            internal += got[n][spot][0] == ResultCode.INTERNAL
            del got[n][spot]
        assert internal >= len(where) // 2
        assert got == expected
        assert digest_f == digest


def test_fault_leaves_no_trace(node: Node, tmp_path: Path) -> None:
    faulty = Node(tmp_path / "faulty", fault_injection=True)
    try:
        for n in (node, faulty):
            n.ok(create("f", "fair", RR, 0, 10))
            n.ok(enqueue("f", "keep", priority=5, group="a", mid=9))
        results = faulty.run(enqueue("f", "before", group="b"),
                             enqueue("f", FAULT_CONTENT, priority=1, group="c"),
                             enqueue("f", FAULT_CONTENT, priority=1, group="a", mid=9),
                             enqueue("f", "after", group="b"), now_ms=T0 + 1)
        assert [r[0] for r in results] == [OK, ResultCode.INTERNAL, ResultCode.INTERNAL, OK]
        node.run(enqueue("f", "before", group="b"), enqueue("f", "after", group="b"),
                 now_ms=T0 + 1)
        assert faulty.store.digest() == node.store.digest()
        qs = faulty.sm.queues["f"]
        assert qs.index.ready == 3 and qs.index.group_of(9) == "a"
        assert FAULT_CONTENT.encode() not in b"".join(faulty.store.dump()["messages"].values())
        assert faulty.drain_ids("f") == node.drain_ids("f")
        # a faulty op alone in its entry still advances the replicated clock like an empty entry
        faulty.run(enqueue("f", FAULT_CONTENT), now_ms=T0 + 50_000)
        node.run(now_ms=T0 + 50_000)
        assert faulty.store.digest() == node.store.digest()
    finally:
        faulty.close()


# -- batch operations (gRPC extensions) ------------------------------------------------------------
def _item(q: str, content: str, priority: int = 5, mid: int = 0) -> tuple[Any, ...]:
    return (q, mid, "", priority, content, None)


def test_enqueue_batch_is_all_or_nothing(node: Node) -> None:
    node.ok(create("b1"))
    node.ok(create("b2", "fair"))
    values = node.ok((C.ENQUEUE_BATCH, [_item("b1", "x"), _item("b2", "y"), _item("b1", "z")]))
    assert [v[3] for v in values] == ["x", "y", "z"]
    assert len({v[0] for v in values}) == 3
    code, detail = node.do((C.ENQUEUE_BATCH, [_item("b1", "kept?"), _item("nope", "w")]))
    assert (code, detail) == (ResultCode.QUEUE_NOT_FOUND, "nope")
    assert node.sm.queues["b1"].index.ready == 2           # "kept?" was not stored


def test_enqueue_seq_applies_the_prefix_before_a_failure(node: Node) -> None:
    node.ok(create("s"))
    values, failure = node.ok((C.ENQUEUE_SEQ, [_item("s", "a"), _item("s", "b"),
                                               _item("gone", "c"), _item("s", "d")]))
    assert [v[3] for v in values] == ["a", "b"]
    assert failure == (ResultCode.QUEUE_NOT_FOUND, "gone")
    assert node.sm.queues["s"].index.ready == 2
    values, failure = node.ok((C.ENQUEUE_SEQ, [_item("s", "e")]))
    assert [v[3] for v in values] == ["e"] and failure is None


def test_dequeue_many_takes_up_to_the_count_in_order(node: Node) -> None:
    node.ok(create("m"))
    for p in (3, 1, 2):
        node.ok(enqueue("m", f"p{p}", p))
    got = node.ok((C.DEQUEUE_MANY, "m", False, 2))
    assert [v[3] for v in got] == ["p1", "p2"]
    assert len(node.sm.queues["m"].unacked) == 2
    got = node.ok((C.DEQUEUE_MANY, "m", True, 10))
    assert [v[3] for v in got] == ["p3"]
    assert node.do((C.DEQUEUE_MANY, "m", True, 10)) == (ResultCode.QUEUE_EMPTY, None)
    assert node.do((C.DEQUEUE_MANY, "nope", True, 1)) == (ResultCode.QUEUE_NOT_FOUND, None)


def test_ack_ids_and_nack_ids_say_why_each_id_failed(node: Node) -> None:
    node.ok(create("a"))
    ids = [node.ok(enqueue("a", f"m{i}", 5))[0] for i in range(4)]
    node.ok((C.DEQUEUE_MANY, "a", False, 3))
    failed = node.ok((C.ACK_IDS, "a", [ids[0], ids[3], 999]))
    assert failed == [(ids[3], ResultCode.NOT_UNACKED), (999, ResultCode.MESSAGE_NOT_FOUND)]
    qs = node.sm.queues["a"]
    assert set(qs.unacked) == {ids[1], ids[2]} and qs.index.ready == 1
    failed = node.ok((C.NACK_IDS, "a", [ids[1], ids[0], ids[3]], 2, {"k": "v"}))
    assert failed == [(ids[0], ResultCode.MESSAGE_NOT_FOUND), (ids[3], ResultCode.NOT_UNACKED)]
    assert set(qs.unacked) == {ids[2]} and qs.index.ready == 2
    got = node.ok((C.GET, "a", ids[1]))
    assert (got[2], got[4]) == (2, {"k": "v"})
    assert node.ok((C.NACK_IDS, "a", [ids[2]], 0, None)) == []
    kept = node.ok((C.GET, "a", ids[2]))
    assert (kept[2], kept[4]) == (5, {})
    for op in ((C.ACK_IDS, "nope", [1]), (C.NACK_IDS, "nope", [1], 0, None)):
        assert node.do(op) == (ResultCode.QUEUE_NOT_FOUND, None)


def test_ack_many_reports_what_was_not_unacked(node: Node) -> None:
    node.ok(create("a"))
    ids = [node.ok(enqueue("a", f"m{i}"))[0] for i in range(3)]
    node.ok((C.DEQUEUE_MANY, "a", False, 2))
    failed = node.ok((C.ACK_MANY, "a", [ids[0], ids[2], 999, ids[1]]))
    assert failed == [ids[2], 999]
    assert not node.sm.queues["a"].unacked and node.sm.queues["a"].index.ready == 1
    assert node.do((C.ACK_MANY, "nope", [1])) == (ResultCode.QUEUE_NOT_FOUND, None)


def test_the_read_api_answers_what_readers_need(node: Node) -> None:
    """Everything outside the state machine reads through its read API (no internals)."""
    from doq_lib.fsm import MISSING

    sm = node.sm
    node.ok(create("d"))
    node.ok(create("f", "fair", RR, 2, 60))
    node.ok(enqueue("d", "later", priority=S0 + 100))
    node.ok(enqueue("f", "a", group="a"))
    node.ok(dequeue("f"))
    node.ok(C.leader_config("n1", "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"))
    node.ok(C.member_info("n1", "127.0.0.1:1", "127.0.0.1:3", "127.0.0.1:2"))
    infos = sm.queue_infos(S0)
    assert [(q.name, q.ready, q.unacked) for q in infos] == [("d", 1, 0), ("f", 0, 1)]
    assert sm.queue_info("f", S0) == infos[1] and sm.queue_info("nope", S0) is None
    counters = {c.name: c for c in sm.queue_counters()}
    assert counters["f"].totals["dequeue"] == 1 and counters["d"].ready == 1
    assert {d.name for d in sm.queue_defs().values()} == {"d", "f"}
    assert sm.deliverable_ms("d") == (S0 + 100) * 1000
    assert sm.deliverable_ms("f") is None                    # its only message is in flight
    assert sm.deliverable_ms("nope") is MISSING
    assert sm.member("127.0.0.1:1").node_id == "n1" and sm.member("127.0.0.1:9") is None
    members = sm.member_list()
    members.clear()                                            # a copy: the state is unchanged
    assert list(sm.member_list()) == ["127.0.0.1:1"]
    assert sm.published_leader().http_addr == "127.0.0.1:3"

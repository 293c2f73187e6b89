"""Every multi-item operation is all or nothing (docs/ARCHITECTURE.md, All or nothing): the
state machine, on a real LMDB, is run against a small model by hypothesis's stateful testing.

The model holds what each queue keeps (content and state of each message, by id order) and
applies each operation as its documented rule says: an operation applies its moves in order,
and if one of them does not fit, none of them happens. Drawn: the queues' limits
(max_messages, each overflow mode, dedup windows) on a chain of dead-letter queues with
limits of their own, and operations whose ids collide with waiting and delivered messages,
with each other and with the dead letters they make: batch enqueues, settles that enqueue
(ack, nack, reject, and per id in a batch ack), batch nacks, redrives, purges, a schedule's
firing. After every step the machine holds what
the model holds, an operation refused changes nothing, and none fails inside (no INTERNAL).

``DOQ_MODEL_EXAMPLES`` sets how many runs (the suite's bounded run: 100; docs/RELIABILITY.md
gives a long run's figures)."""
from __future__ import annotations

import copy
import os
import shutil
import tempfile
from typing import Any

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from doq_lib import commands as C
from doq_lib import schedules
from doq_lib.errors import ResultCode
from doq_lib.fsm import StateMachine
from doq_lib.fsm.state import RULES
from doq_lib.lmdb_store import LmdbStore
from doq_lib.store import U64, decode_message

T0 = 1_700_000_000_000
OK = ResultCode.OK
QUEUES = ("a", "b", "d1", "d2")
DEAD_LETTERS = {"a": "d1", "b": "d1", "d1": "d2", "d2": ""}
IDS = st.sampled_from([0, 0, 1, 2, 3, 4, 5, 6])          # 0: the machine picks one
KEYS = st.sampled_from(["", "", "k1", "k2"])
SOURCES = st.sampled_from(["a", "b"])
TARGETS = st.sampled_from(QUEUES)
EXAMPLES = int(os.environ.get("DOQ_MODEL_EXAMPLES", "100"))


class Msg:
    __slots__ = ("content", "unacked", "dead_from", "priority")

    def __init__(self, content: str, dead_from: str = "", priority: int = 1) -> None:
        self.content, self.unacked, self.dead_from = content, False, dead_from
        self.priority = priority        # a dead letter in a delayed queue: 0, due at once


class Refused(Exception):
    """A move that does not fit: the operation changes nothing."""


class Model:
    """What the queues hold, by the documented rules."""

    def __init__(self, limits: dict[str, tuple[int, str, bool]]) -> None:
        self.limits = limits                    # queue -> (max_messages, overflow, dedup)
        self.msgs: dict[str, dict[int, Msg]] = {q: {} for q in QUEUES}
        self.keys: dict[str, set[bytes]] = {q: set() for q in QUEUES}
        self.auto = 10 ** 17                    # machine ids are larger than every drawn one
        self.protected: frozenset[int] = frozenset()

    def new_id(self) -> int:
        self.auto += 1
        return self.auto

    def room(self, q: str) -> None:
        """Make room for one more message in ``q`` (drop_oldest: its oldest waiting ones
        that the operation does not name, to its dead-letter queue), or refuse."""
        most, overflow, _ = self.limits[q]
        if not most:
            return
        over = len(self.msgs[q]) + 1 - most
        if over <= 0:
            return
        oldest = sorted(i for i, m in self.msgs[q].items()
                        if not m.unacked and i not in self.protected)
        if overflow != "drop_oldest" or len(oldest) < over:
            raise Refused(q)
        for mid in oldest[:over]:
            event("a drop_oldest made room")
            self.dead_letter(q, mid)

    def next_ready(self, q: str) -> int | None:
        """What a dequeue of ``q`` takes: by priority (a delayed queue's due time), then id."""
        ready = [(m.priority, i) for i, m in self.msgs[q].items() if not m.unacked]
        return min(ready)[1] if ready else None

    def dead_letter(self, q: str, mid: int) -> None:
        msg = self.msgs[q].pop(mid)
        target = DEAD_LETTERS[q]
        if not target:
            return                                          # dropped
        self.room(target)
        new = mid if mid not in self.msgs[target] else self.new_id()
        self.msgs[target][new] = Msg(msg.content, dead_from=q, priority=0)

    def enqueue(self, q: str, mid: int, content: str, key: str) -> None:
        _, _, dedup = self.limits[q]
        raw = (key.encode() if key else (b"\xff" + U64.pack(mid) if mid else b"")) \
            if dedup else b""
        if raw and raw in self.keys[q]:
            event("a duplicate")
            return                                          # a duplicate: nothing stored
        if not mid or mid not in self.msgs[q]:
            self.room(q)
        if not mid:
            mid = self.new_id()
        if mid in self.msgs[q]:                             # replaced, in the same state
            event("an id replaced a message" + " (delivered)" * self.msgs[q][mid].unacked)
            msg = self.msgs[q][mid]
            msg.content, msg.dead_from, msg.priority = content, "", 1
        else:
            self.msgs[q][mid] = Msg(content)
        if raw:
            self.keys[q].add(raw)

    def atomically(self, moves: Any, protected: frozenset[int]) -> bool:
        """Apply ``moves()`` to this model, or nothing when one is refused."""
        before = copy.deepcopy((self.msgs, self.keys, self.auto))
        self.protected = protected
        try:
            moves()
            return True
        except Refused:
            event("an operation was refused whole")
            self.msgs, self.keys, self.auto = before
            return False
        finally:
            self.protected = frozenset()


def named(items: list[tuple[str, int, str, str]]) -> frozenset[int]:
    return frozenset(mid for _, mid, _, _ in items if mid)


def op_items(items: list[tuple[str, int, str, str]]) -> list[tuple[Any, ...]]:
    return [(q, mid, "", 1, content, None, key) for q, mid, content, key in items]


ITEMS = st.lists(st.tuples(TARGETS, IDS, st.just(""), KEYS), min_size=1, max_size=5)


class AllOrNothing(RuleBasedStateMachine):
    """The state machine beside the model, step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="doq-model-")
        self.store = LmdbStore(self.root)
        self.sm = StateMachine(self.store)
        self.index = 0
        self.now = T0
        self.counter = 0
        self.model: Model | None = None
        self.schedules: dict[str, int] = {}          # queue -> its schedule's next occurrence

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- driving the machine -------------------------------------------------------------
    def run(self, op: C.Op) -> tuple[int, Any]:
        self.index += 1
        self.now += 1
        before = self.store.digests()[2]
        [results] = self.sm.apply_entries([(self.index, [op], self.now, 0, "", None, RULES)])
        assert results is not None
        code, value = results[0]
        assert code != ResultCode.INTERNAL, (C.describe(op), value)
        if code != OK:
            assert self.store.digests()[2] == before, f"refused but changed: {C.describe(op)}"
        return int(code), value

    def content(self) -> str:
        self.counter += 1
        return f"c{self.counter}"

    def fill(self, items: list[tuple[str, int, str, str]]) -> list[tuple[str, int, str, str]]:
        return [(q, mid, self.content(), key) for q, mid, _, key in items]

    @initialize(limits=st.fixed_dictionaries({q: st.tuples(
        st.sampled_from([0, 1, 2, 3]), st.sampled_from(["reject", "drop_oldest"]),
        st.booleans()) for q in QUEUES}))
    def make_queues(self, limits: dict[str, tuple[int, str, bool]]) -> None:
        self.model = Model(limits)
        for q in reversed(QUEUES):                   # dead-letter queues first
            most, overflow, dedup = limits[q]
            lifecycle = {"max_messages": most, "overflow": overflow,
                         "dedup_window": 600 if dedup else 0}
            if DEAD_LETTERS[q]:
                lifecycle["dead_letter_queue"] = DEAD_LETTERS[q]
            code, _ = self.run(C.create_queue(q, "delayed", 0, 0, 600, 600, lifecycle))
            assert code == OK

    # -- the operations ------------------------------------------------------------------
    @rule(items=ITEMS)
    def enqueue_batch(self, items: list[tuple[str, int, str, str]]) -> None:
        assert self.model is not None
        items = self.fill(items)
        code, _ = self.run(C.enqueue_batch(op_items(items)))
        model = self.model
        fits = model.atomically(lambda: [model.enqueue(*i) for i in items], named(items))
        assert (code == OK) == fits, (code, items)
        if not fits:
            assert code == ResultCode.QUEUE_FULL

    @rule(q=SOURCES)
    def dequeue(self, q: str) -> None:
        assert self.model is not None
        code, value = self.run(C.dequeue(q, False))
        first = self.model.next_ready(q)
        if first is None:
            assert code == ResultCode.QUEUE_EMPTY
            return
        assert code == OK and value[3] == self.model.msgs[q][first].content
        self.model.msgs[q][first].unacked = True

    def machine_id(self, q: str, content: str) -> int:
        """The machine's id of the message of ``q`` whose content is ``content`` (the
        model's own ids of the messages the machine numbered differ)."""
        qs = self.sm.queues[q]
        with self.store.read() as txn:
            for mid in list(qs.unacked) + qs.index.ready_ids():
                raw = txn.get("messages", qs.prefix + U64.pack(mid))
                if decode_message(raw)[2] == content:
                    return mid
        raise AssertionError(f"no message {content!r} in {q}")

    def _delivered(self, q: str, pick: int) -> tuple[int, int] | None:
        """(the model's id, the machine's id) of one delivered message of ``q``."""
        assert self.model is not None
        held = sorted(i for i, m in self.model.msgs[q].items() if m.unacked)
        if not held:
            return None
        mid = held[pick % len(held)]
        return mid, self.machine_id(q, self.model.msgs[q][mid].content)

    @rule(q=SOURCES, pick=st.integers(0, 3), how=st.sampled_from(["ack", "nack", "reject"]),
          items=st.lists(st.tuples(TARGETS, IDS, st.just(""), KEYS), max_size=3))
    def settle_and_enqueue(self, q: str, pick: int, how: str,
                           items: list[tuple[str, int, str, str]]) -> None:
        model = self.model
        assert model is not None
        found = self._delivered(q, pick)
        if found is None:
            return
        mid, real = found
        items = self.fill(items)
        enqueue = op_items(items) or None
        op = {"ack": C.ack(q, real, None, enqueue),
              "nack": C.nack(q, real, 0, None, "", 0, None, enqueue),
              "reject": C.reject(q, real, "", None, enqueue)}[how]
        code, _ = self.run(op)

        def moves() -> None:
            if how == "ack":
                del model.msgs[q][mid]
            elif how == "nack":
                model.msgs[q][mid].unacked = False
            else:
                model.dead_letter(q, mid)
            for item in items:
                model.enqueue(*item)
        fits = model.atomically(moves, named(items))
        assert (code == OK) == fits, (code, how, mid, items)

    @rule(q=SOURCES, picks=st.lists(st.integers(0, 3), min_size=1, max_size=3),
          items=st.lists(st.lists(st.tuples(TARGETS, IDS, st.just(""), KEYS), max_size=2),
                         min_size=3, max_size=3))
    def ack_many_with_items(self, q: str, picks: list[int],
                            items: list[list[tuple[str, int, str, str]]]) -> None:
        """A batch ack whose ids each store items: all or nothing per id, in order."""
        model = self.model
        assert model is not None
        found: list[tuple[int, int]] = []
        for p in picks:
            f = self._delivered(q, p)
            if f is not None and f not in found:
                found.append(f)
        if not found:
            return
        per_id = [self.fill(items[n]) for n in range(len(found))]
        code, value = self.run(C.ack_ids(q, [real for _, real in found], None,
                                         [op_items(i) for i in per_id]))
        assert code == OK
        failed = {mid for mid, _, _ in value[0]}
        for (mid, real), its in zip(found, per_id):
            def moves(mid: int = mid, its: list[tuple[str, int, str, str]] = its) -> None:
                del model.msgs[q][mid]
                for item in its:
                    model.enqueue(*item)
            fits = model.atomically(moves, named(its))
            assert (real not in failed) == fits, (real, its, value)

    @rule(q=st.sampled_from(["d1", "d2"]), count=st.integers(1, 4))
    def fire_schedule(self, q: str, count: int) -> None:
        """A schedule's occurrences, each stored as an enqueue of its own (one refused is
        counted and left out; the others go in)."""
        model = self.model
        assert model is not None
        if q not in self.schedules:
            defn = schedules.define("s", {"content": f"sched-{q}"}, T0, every=1)
            code, _ = self.run(C.schedule_put(q, defn.to_json(), T0, False))
            assert code == OK
            self.schedules[q] = T0
        after = self.schedules[q]
        occurrences = [after + 1000 * n for n in range(count)]
        code, ids = self.run(C.schedule_fire(q, "s", after, occurrences, 0,
                                             after + 1000 * count))
        assert code == OK
        self.schedules[q] = after + 1000 * count
        stored = 0
        for at in occurrences:
            key = f"schedule:s:{at}"
            if model.atomically(lambda key=key: model.enqueue(q, 0, f"sched-{q}", key),
                                frozenset()):
                stored += 1
        assert len(ids) == stored            # (a duplicate answers the first id)

    @rule(q=SOURCES, picks=st.lists(st.integers(0, 3), min_size=1, max_size=3))
    def nack_many(self, q: str, picks: list[int]) -> None:
        assert self.model is not None
        found = {f for p in picks if (f := self._delivered(q, p)) is not None}
        if not found:
            return
        code, failed = self.run(C.nack_ids(q, sorted(real for _, real in found), 0, None))
        assert code == OK and failed == []
        for mid, _ in found:
            self.model.msgs[q][mid].unacked = False

    @rule(dlq=st.sampled_from(["d1", "d2"]), limit=st.integers(1, 4))
    def redrive(self, dlq: str, limit: int) -> None:
        model = self.model
        assert model is not None
        code, value = self.run(C.redrive(dlq, "", None, limit))
        assert code == OK
        moved, failed = value
        expect_moved, expect_failed = 0, []     # (codes only: the machine numbers its own)
        for mid in sorted(model.msgs[dlq])[:limit]:
            msg = model.msgs[dlq].get(mid)
            if msg is None:                  # an earlier move's room dropped it meanwhile
                expect_failed.append(int(ResultCode.MESSAGE_NOT_FOUND))
                continue
            origin = msg.dead_from
            if not origin or DEAD_LETTERS[origin] != dlq:
                expect_failed.append(int(ResultCode.NO_ORIGIN))
                continue

            def move(mid: int = mid, origin: str = origin) -> None:
                msg = model.msgs[dlq].pop(mid)           # out first: its room is free then
                model.room(origin)
                new = mid if mid not in model.msgs[origin] else model.new_id()
                model.msgs[origin][new] = Msg(msg.content, priority=msg.priority)
            if model.atomically(move, frozenset()):
                expect_moved += 1
            else:
                expect_failed.append(int(ResultCode.QUEUE_FULL))
        assert (moved, [c for _, c, _ in failed]) == (expect_moved, expect_failed)

    @rule(q=TARGETS)
    def purge(self, q: str) -> None:
        assert self.model is not None
        code, _ = self.run(C.purge(q, False))
        assert code == OK
        self.model.msgs[q] = {i: m for i, m in self.model.msgs[q].items() if m.unacked}

    # -- after every step ----------------------------------------------------------------
    @invariant()
    def holds_what_the_model_holds(self) -> None:
        if self.model is None:
            return
        for q in QUEUES:
            qs = self.sm.queues[q]
            unacked = set(qs.unacked)
            present = sorted(set(qs.index.ready_ids()) | unacked | set(qs.held))
            with self.store.read() as txn:
                got = [(decode_message(txn.get("messages", qs.prefix + U64.pack(mid)))[2],
                        mid in unacked) for mid in present]
            want = [(m.content, m.unacked) for _, m in sorted(self.model.msgs[q].items())]
            assert got == want, (q, got, want)
            most = self.model.limits[q][0]
            assert not most or len(present) <= most, (q, present)


AllOrNothing.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=50, deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
test_multi_item_operations_are_all_or_nothing = AllOrNothing.TestCase

"""Every value validation accepts is safe to apply, restart with, back up and restore.

Hypothesis draws queue settings and message fields from the whole range each transport
accepts, with the bounds, their neighbours and (for the settings a stored record may hold)
subnormal floats, then runs a log of operations with them through the state machine and
checks, for each drawn log:

- no operation answers INTERNAL (nothing raised inside the state machine), and browse and
  explain answer for every message;
- a replica restarted at a drawn point ends in exactly the state of one that was not, and
  gives the same results for the rest of the log;
- a full backup of the end state, and a full plus an incremental one, pass the restore
  check and restore to exactly that state, which then delivers what the source delivers.

The examples are derandomized (the same on every run), so a failure here is reproducible.
"""
from __future__ import annotations

import io
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doq_lib import backup as bk
from doq_lib import commands as C
from doq_lib import rules
from doq_lib.errors import Conflict, ResultCode
from doq_lib.fsm.limits import MAX_INTERVAL_US, rate_interval_us
from tests.core.test_backup import queue_state, restore, take
from tests.core.test_fsm import T0, Node

U32 = 2 ** 32 - 1
I63 = 2 ** 63 - 1
SUBNORMALS = [5e-324, 1e-310, 2.2250738585072014e-308, 1e-300, 1e-13, 5e-14]


def edges(lo: int, hi: int) -> st.SearchStrategy[int]:
    """An integer of [lo, hi], the bounds and their neighbours often."""
    picks = sorted({lo, min(lo + 1, hi), max(hi - 1, lo), hi})
    return st.one_of(st.sampled_from(picks), st.integers(lo, hi))


def api_rate() -> st.SearchStrategy[float]:
    """A group_rate a request may set: 0, or MIN_GROUP_RATE .. MAX_GROUP_RATE."""
    return st.one_of(st.sampled_from([0.0, rules.MIN_GROUP_RATE, rules.MAX_GROUP_RATE, 1.0]),
                     st.floats(rules.MIN_GROUP_RATE, rules.MAX_GROUP_RATE))


def stored_rate() -> st.SearchStrategy[float]:
    """A group_rate a stored record (an older version's) or a log command may hold."""
    return st.one_of(api_rate(), st.sampled_from(SUBNORMALS),
                     st.floats(0, rules.MIN_GROUP_RATE, allow_subnormal=True))


def lifecycle(rate: st.SearchStrategy[float]) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional={
        "max_deliveries": edges(0, rules.MAX_DELIVERIES),
        "max_messages": edges(0, rules.MAX_MESSAGES),
        "overflow": st.sampled_from(rules.OVERFLOW_POLICIES),
        "dedup_window": edges(0, rules.MAX_DEDUP_WINDOW),
        "backoff_initial": edges(0, rules.MAX_DELAY),
        "message_ttl": edges(0, rules.MAX_TTL),
        "max_in_flight": edges(0, rules.MAX_MESSAGES),
        "group_rate": rate,
        "group_burst": edges(1, rules.MAX_GROUP_BURST),
        "dead_letter_queue": st.sampled_from(["", "dlq"]),
    }).map(_backoff_order)


def _backoff_order(settings: dict[str, Any]) -> dict[str, Any]:
    if "backoff_initial" in settings:       # backoff_max >= backoff_initial, up to MAX_DELAY
        settings["backoff_max"] = max(settings["backoff_initial"], rules.MAX_DELAY)
    return settings


ACK_TIMEOUT = st.one_of(st.just(0), edges(rules.MIN_ACK_TIMEOUT, rules.MAX_ACK_TIMEOUT))
PRIORITY = st.one_of(edges(0, rules.MAX_PRIORITY), st.integers(0, 1000),
                     st.integers(T0 // 1000 - 10, T0 // 1000 + 3600))   # delays, in seconds
MESSAGE_ID = st.one_of(st.just(0), edges(1, rules.MAX_ID))
# ids that gRPC accepted before one rule held on both transports: a store may hold them
STORED_ID = st.one_of(MESSAGE_ID, edges(rules.MAX_ID, 2 ** 64 - 1))
GROUP = st.sampled_from(["a", "b", "a.x", "a.x.y", "b.z"])
REF = st.integers(0, 10 ** 6)               # which known message an operation names


def queue_ops(rate: st.SearchStrategy[float]) -> st.SearchStrategy[list[C.Op]]:
    fair = st.tuples(st.sampled_from([1, 2]), edges(0, rules.MAX_UNACKED), ACK_TIMEOUT,
                     lifecycle(rate))
    delayed = st.tuples(ACK_TIMEOUT, lifecycle(rate))
    return st.tuples(fair, delayed).map(lambda d: [
        C.create_queue("dlq", "delayed", 0, 0, 0, 1800),
        C.create_queue("f", "fair", d[0][0], d[0][1], d[0][2], 1800, d[0][3]),
        C.create_queue("d", "delayed", 0, 0, d[1][0], 1800, d[1][1])])


def step(rate: st.SearchStrategy[float],
         ids: st.SearchStrategy[int]) -> st.SearchStrategy[tuple[Any, ...]]:
    """One drawn step of a log; message references are resolved when it runs. Deliveries
    and settles are drawn more often than the operations that empty a queue."""
    q = st.sampled_from(["f", "d"])
    enqueue = st.tuples(st.just("enqueue"), q, ids, GROUP, PRIORITY,
                        st.one_of(st.just(0), edges(0, rules.MAX_TTL)),
                        st.sampled_from(["", "k1", "k2", "7"]),
                        st.one_of(st.just(0), edges(0, rules.MAX_DELAY)))
    settle = st.one_of(
        st.tuples(st.just("ack"), q, REF),
        st.tuples(st.just("nack"), q, REF, st.one_of(st.just(0), PRIORITY),
                  st.one_of(st.just(0), edges(0, rules.MAX_DELAY))),
        st.tuples(st.just("touch"), q, REF),
        st.tuples(st.just("reject"), q, REF))
    # a delivery, and what its consumer does with it at once (if anything)
    dequeue = st.tuples(st.just("dequeue"), q, st.booleans(), edges(1, 1000),
                        st.one_of(st.none(), settle))
    other = st.one_of(
        st.tuples(st.just("priority"), q, REF, PRIORITY),
        st.tuples(st.just("update"), q, edges(0, rules.MAX_UNACKED), ACK_TIMEOUT,
                  lifecycle(rate)),
        st.tuples(st.just("pause"), q, st.sampled_from(["", "a", "a.x"]), st.booleans()),
        st.tuples(st.just("purge"), q, st.booleans()),
        st.tuples(st.just("redrive"), st.just("dlq"), st.integers(1, 50)),
        st.tuples(st.just("requeue")))
    # time moves on: within a second, up to a rate interval, to the end of a hold or a TTL,
    # years; the leader's clock stays below 2100
    time = st.tuples(st.just("time"), st.sampled_from([
        1, 999, 60_000, 86_400_000, MAX_INTERVAL_US // 1000, rules.MAX_TTL * 1000,
        20 * 365 * 86_400_000]))
    kinds = {"enqueue": enqueue, "dequeue": dequeue, "settle": settle, "time": time,
             "other": other}
    weights = ["enqueue"] * 5 + ["dequeue"] * 5 + ["settle"] * 2 + ["time"] * 2 + ["other"] * 2
    return st.sampled_from(weights).flatmap(kinds.__getitem__)


class Runner:
    """Turns drawn steps into operations against replicas that all see the same log."""

    def __init__(self) -> None:
        self.now = T0
        self.known: dict[str, list[int]] = {"f": [], "d": [], "dlq": []}
        self.delivered: dict[str, list[int]] = {"f": [], "d": [], "dlq": []}

    def ref(self, q: str, n: int, delivered: bool = False) -> int:
        """A message of ``q``: one of the last delivered (settles; -1: the very last), else
        any known one."""
        ids = self.delivered[q][-8:] if delivered and self.delivered[q] else self.known[q]
        return ids[n % len(ids)] if ids else 1 + abs(n)

    def op(self, s: tuple[Any, ...]) -> C.Op | None:
        kind = s[0]
        if kind == "enqueue":
            _, q, mid, group, priority, ttl, key, delay = s
            return C.enqueue(q, mid, group, priority, "x", {"k": "v"}, key, ttl, delay)
        if kind == "dequeue":
            _, q, ack, count, _ = s
            return C.dequeue_many(q, ack, count) if count > 1 else C.dequeue(q, ack)
        if kind in ("ack", "touch"):
            return (C.ack if kind == "ack" else C.touch)(s[1], self.ref(s[1], s[2], True))
        if kind == "nack":
            return C.nack(s[1], self.ref(s[1], s[2], True), s[3], None, "failed", s[4])
        if kind == "reject":
            return C.reject(s[1], self.ref(s[1], s[2], True), "bad")
        if kind == "priority":
            return C.update_priority(s[1], self.ref(s[1], s[2]), s[3])
        if kind == "update":
            _, q, max_unacked, ack_timeout, settings = s
            return C.update_queue(q, 0, max_unacked if q == "f" else 0, ack_timeout, 1800,
                                  settings)
        if kind == "pause":
            return C.set_paused(s[1], s[2] if s[1] == "f" else "", s[3])
        if kind == "purge":
            return C.purge(s[1], s[2])
        if kind == "redrive":
            return C.redrive(s[1], "", None, s[2])
        if kind == "time":
            self.now += s[1]
            return C.tick()
        return C.requeue_expired()

    def followup(self, s: tuple[Any, ...]) -> C.Op | None:
        """The settle of a dequeue step, on the message it delivered (None: none)."""
        if s[0] != "dequeue" or s[4] is None or s[2] or not self.delivered[s[1]]:
            return None
        then = (s[4][0], s[1], -1, *s[4][3:])
        return self.op(then)

    def learn(self, op: C.Op, result: tuple[int, Any]) -> None:
        code, value = result
        if code != ResultCode.OK:
            return
        if op[0] == C.ENQUEUE and not (len(value) > 5 and value[5]):
            self.known[op[1]].append(value[0])
        elif op[0] == C.DEQUEUE and value is not None and not op[2]:
            self.delivered[op[1]].append(value[0])
        elif op[0] == C.DEQUEUE_MANY and not op[2]:
            self.delivered[op[1]].extend(m[0] for m in value)


def check_reads(node: Node) -> None:
    """Browse and explain answer for every message of every queue (no exception)."""
    sm = node.sm
    for name in ("f", "d", "dlq"):
        for state in ("ready", "unacked", "all"):
            listed, _ = sm.browse(name, state, None, None, rules.MAX_BROWSE)
        qs = sm.queues[name]
        for mid in list(qs.unacked) + list(qs.held) + qs.index.ready_ids():
            explained = sm.explain(name, mid, node.now_ms)
            assert explained is not None
            for reason in explained.reasons:
                for value in reason.values():      # fits the wire: uint64 / JSON
                    assert not isinstance(value, int) or 0 <= value < 2 ** 64


def run(data: st.DataObject, rate: st.SearchStrategy[float],
        ids: st.SearchStrategy[int] = MESSAGE_ID) -> None:
    setup = data.draw(queue_ops(rate), "queues")
    steps = data.draw(st.lists(step(rate, ids), min_size=5, max_size=40), "steps")
    cut = data.draw(st.integers(0, len(steps)), "restart at")
    base = Path(tempfile.mkdtemp(prefix="bounds-"))
    nodes = [Node(base / "plain"), Node(base / "restarted")]
    try:
        runner = Runner()
        for op in setup:
            results = [n.do(op, T0) for n in nodes]
            assert results[0] == results[1]
            assert results[0][0] == ResultCode.OK, (op, results[0])
        middle = None
        for n, s in enumerate(steps):
            if n == cut:
                nodes[1].restart()
                assert queue_state(nodes[1]) == queue_state(nodes[0])
                middle = take(nodes[0])
                middle_version, middle_now = nodes[0].index, runner.now
            op = runner.op(s)
            while op is not None:
                results = []
                for node in nodes:
                    node.now_ms = runner.now
                    results.append(node.do(op))
                assert results[0] == results[1], (s, results)
                assert results[0][0] != ResultCode.INTERNAL, (s, results[0])
                runner.learn(op, results[0])
                op = runner.followup(s) if op[0] in (C.DEQUEUE, C.DEQUEUE_MANY) else None
        for node in nodes:
            check_reads(node)
        assert nodes[0].store.state() == nodes[1].store.state()
        # backups: a full one of the end state, and the middle one plus an incremental
        end = take(nodes[0])
        chains = [[end]]
        if middle is not None:
            try:
                chains.append([middle, take(nodes[0], middle_version + 1)])
            except Conflict:            # the change history is kept for a day only
                assert runner.now - middle_now > 86_400_000
        for n, chain in enumerate(chains):
            target = Node(base / f"restored-{n}")
            nodes.append(target)
            assert restore(target, *chain)[0] == ResultCode.OK
            assert queue_state(target) == queue_state(nodes[0])
            target.restart()
            assert queue_state(target) == queue_state(nodes[0])
        # every replica, restored ones too, delivers the same from here on
        for node in nodes:
            node.now_ms = runner.now + 1
        for q in ("f", "d", "dlq"):
            for _ in range(3):
                got = [node.do(C.dequeue_many(q, True, 1000)) for node in nodes]
                assert all(g == got[0] for g in got), got
    finally:
        for node in nodes:
            node.close()
        shutil.rmtree(base, ignore_errors=True)


COMMON = settings(max_examples=300, deadline=None, derandomize=True, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@pytest.mark.slow
@COMMON
@given(data=st.data())
def test_values_the_api_accepts_apply_restart_back_up_and_restore(data: st.DataObject) -> None:
    run(data, api_rate())


@pytest.mark.slow
@COMMON
@given(data=st.data())
def test_values_a_stored_record_may_hold_are_safe_too(data: st.DataObject) -> None:
    """A queue record or log command written before the lower bound on group_rate existed
    (a subnormal rate, say), or a message id from 2^63 to 2^64-1 (gRPC took them before),
    is applied, restarted with, backed up and restored alike."""
    run(data, stored_rate(), STORED_ID)


@pytest.mark.parametrize("rate", SUBNORMALS + [0.0, float("nan"), float("inf"), -1.0,
                                                rules.MIN_GROUP_RATE, rules.MAX_GROUP_RATE])
def test_the_rate_interval_is_total(rate: float) -> None:
    assert 1 <= rate_interval_us(rate) <= MAX_INTERVAL_US


@pytest.mark.parametrize("rate", SUBNORMALS + [rules.MIN_GROUP_RATE * 0.999])
def test_a_request_may_not_set_a_rate_slower_than_the_minimum(rate: float) -> None:
    why = rules.group_rate_problem(rate)
    assert why is not None and "30 days" in why
    assert rules.group_rate_problem(rate, stored=True) is None
    assert rules.group_rate_problem(rules.MIN_GROUP_RATE) is None


def test_a_subnormal_rate_in_the_log_does_not_stop_the_replica(tmp_path: Path) -> None:
    """The reproduction: group_rate 5e-324 then a dequeue used to make every later entry
    fail and the restart exit."""
    node = Node(tmp_path / "n")
    node.ok(C.create_queue("q", "fair", 1, 0, 60, 1800, {"group_rate": 5e-324}))
    node.ok(C.enqueue("q", 0, "a", 1, "x", None))
    node.ok(C.enqueue("q", 0, "a", 1, "y", None))
    assert node.ok(C.dequeue("q", True))[3] == "x"
    assert node.do(C.dequeue("q", True), T0 + 86_400_000)[0] == ResultCode.QUEUE_EMPTY
    node.ok(C.enqueue("q", 0, "b", 1, "z", None), T0 + 86_400_000)
    node.restart()
    assert node.ok(C.dequeue("q", True), T0 + 86_400_001)[3] == "z"
    released = T0 + MAX_INTERVAL_US // 1000
    assert node.ok(C.dequeue("q", True), released)[3] == "y"
    data = take(node)
    bk.scan(io.BytesIO(data), None, bk.RecordChecker({}))
    node.close()

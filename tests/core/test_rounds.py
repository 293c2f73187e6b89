"""No operation loops over an unbounded amount of due work (docs/ARCHITECTURE.md, Bounded
rounds): one leader's round (REQUEUE_EXPIRED) handles at most ROUND_BUDGET messages whose
lease ran out, whose hold ended or whose TTL passed, sweeps the TTL expiry of the queues the
leader names and looks at the idle consumers of those it names; a dequeue dead-letters at
most SWEEP_BUDGET expired messages before it delivers. Each at the loop's maximum (far more
due than one operation takes), on a real LMDB: the work is bounded, nothing is lost or
delivered expired, every replica — one restarted midway included — ends identical, and an
entry written before rounds were bounded (rules 1) still applies as it did."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode
from doq_lib.fsm import StateMachine
from doq_lib.fsm.consumers import IDLE_MS
from doq_lib.fsm.lifecycle import ROUND_BUDGET, ROUND_QUEUES, SWEEP_BUDGET
from doq_lib.fsm.state import RULES
from doq_lib.lmdb_store import LmdbStore

T0 = 1_700_000_000_000
OK = ResultCode.OK
MANY = 3 * ROUND_BUDGET + 200          # more due than three rounds take


class Replica:
    """A state machine on its own LMDB, fed entries as the log would (rules as given)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.store = LmdbStore(self.path)
        self.sm = StateMachine(self.store)
        self.index = 0

    def run(self, ops: list[C.Op], now_ms: int, rules: int = RULES) -> list[tuple[int, Any]]:
        self.index += 1
        [results] = self.sm.apply_entries([(self.index, ops, now_ms, 0, "", None, rules)])
        assert results is not None
        return results

    def ok(self, op: C.Op, now_ms: int, rules: int = RULES) -> Any:
        [(code, value)] = self.run([op], now_ms, rules)
        assert code == OK, (code, value)
        return value

    def restart(self) -> None:
        self.store.close()
        self.store = LmdbStore(self.path)
        self.sm = StateMachine(self.store)

    def digest(self) -> Any:
        return self.store.digests()[1:]

    def info(self, queue: str) -> Any:
        qs = self.sm.queues[queue]
        return qs.index.ready, len(qs.unacked), len(qs.held)

    def close(self) -> None:
        self.store.close()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    out = [Replica(tmp_path / name) for name in ("a", "b")]
    yield out
    for r in out:
        r.close()


def every(replicas: list[Replica], op: C.Op, now_ms: int, rules: int = RULES) -> list[Any]:
    return [r.ok(op, now_ms, rules) for r in replicas]


def fill(replicas: list[Replica], queue: str, count: int, ttl: int = 0,
         settings: dict[str, Any] | None = None, now_ms: int = T0) -> None:
    every(replicas, C.create_queue(queue, "delayed", 0, 0, 600, 600, settings), now_ms)
    for start in range(0, count, 500):
        items = [(queue, 0, "", 1, f"m{n}", None, "", ttl)
                 for n in range(start, min(count, start + 500))]
        every(replicas, C.enqueue_batch(items), now_ms)


def test_a_round_requeues_at_most_its_budget_of_leases_run_out(replicas: list[Replica]) -> None:
    fill(replicas, "q", MANY)
    every(replicas, C.dequeue_many("q", False, MANY, ""), T0)      # one lease for them all
    for r in replicas:
        assert r.info("q") == (0, MANY, 0)
    late = T0 + 601_000
    moved = []
    for n in range(4):
        if n == 1:
            replicas[1].restart()               # a replica rebuilt from its store midway
        moved.append(every(replicas, C.requeue_expired(ROUND_BUDGET), late + n))
    assert moved == [[ROUND_BUDGET] * 2] * 3 + [[200] * 2]
    for r in replicas:
        assert r.info("q") == (MANY, 0, 0)
    assert replicas[0].digest() == replicas[1].digest()


def test_stale_leases_do_not_count_and_replicas_agree_whatever_stale_ones_they_hold(
        replicas: list[Replica]) -> None:
    """Acked deliveries leave stale entries in a replica's deadline heap; one rebuilt from
    its store has none. Both requeue the same live leases, a budget's worth."""
    fill(replicas, "q", MANY)
    ids = [m[0] for m in every(replicas, C.dequeue_many("q", False, MANY, ""), T0)[0]]
    every(replicas, C.ack_ids("q", ids[:2000], None), T0 + 1)
    replicas[1].restart()
    assert len(replicas[0].sm.deadlines) == MANY and len(replicas[1].sm.deadlines) == MANY - 2000
    moved = every(replicas, C.requeue_expired(ROUND_BUDGET), T0 + 601_000)
    assert moved == [ROUND_BUDGET, ROUND_BUDGET]
    assert replicas[0].digest() == replicas[1].digest()


def test_a_round_releases_at_most_its_budget_of_holds(replicas: list[Replica]) -> None:
    fill(replicas, "q", MANY)
    ids = [m[0] for m in every(replicas, C.dequeue_many("q", False, MANY, ""), T0)[0]]
    every(replicas, C.nack_ids("q", ids, 0, None, "later", 60, None), T0 + 1)
    for r in replicas:
        assert r.info("q") == (0, 0, MANY)
    released = [every(replicas, C.requeue_expired(ROUND_BUDGET), T0 + 61_000 + n)
                for n in range(4)]
    assert released == [[ROUND_BUDGET] * 2] * 3 + [[200] * 2]
    assert replicas[0].info("q") == (MANY, 0, 0)


def test_ttl_expiry_is_swept_a_budget_at_a_time_and_nothing_expired_is_delivered(
        replicas: list[Replica]) -> None:
    every(replicas, C.create_queue("dead", "delayed", 0, 0, 600, 600), T0)
    fill(replicas, "q", MANY, ttl=60, settings={"dead_letter_queue": "dead"})
    every(replicas, C.enqueue("q", 0, "", 2, "fresh", None), T0 + 59_000)
    late = T0 + 61_000
    qid = replicas[0].sm.queues["q"].defn.qid
    assert all(r.sm.expiry_due(late, ROUND_QUEUES) == [qid] for r in replicas)
    assert every(replicas, C.requeue_expired(ROUND_BUDGET, [qid]), late) == [ROUND_BUDGET] * 2
    # a dequeue takes SWEEP_BUDGET more and delivers nothing while expired ones are left
    [(code, _)] = replicas[0].run([C.dequeue("q", True)], late + 1)
    replicas[1].run([C.dequeue("q", True)], late + 1)
    assert code == ResultCode.QUEUE_EMPTY
    assert replicas[0].sm.queues["dead"].index.ready == ROUND_BUDGET + SWEEP_BUDGET
    while True:                      # the rounds take the rest; then "fresh" is delivered
        if every(replicas, C.requeue_expired(ROUND_BUDGET, [qid]), late + 2) == [0, 0]:
            break
    delivered = every(replicas, C.dequeue("q", True), late + 3)
    assert [d[3] for d in delivered] == ["fresh", "fresh"]
    assert replicas[0].sm.queues["dead"].index.ready == MANY
    assert replicas[0].digest() == replicas[1].digest()


def test_a_round_sweeps_only_the_queues_it_names(replicas: list[Replica]) -> None:
    """200 queues with an expired message each: the index names ROUND_QUEUES of them, the
    earliest first, and a round sweeps those; the rest wait for the next rounds."""
    for n in range(200):
        fill(replicas, f"q{n:03d}", 1, ttl=10 + n)
    late = T0 + 300_000
    swept = 0
    for _ in range(4):
        named = replicas[0].sm.expiry_due(late, ROUND_QUEUES)
        assert replicas[1].sm.expiry_due(late, ROUND_QUEUES) == named
        assert len(named) == min(ROUND_QUEUES, 200 - swept)
        assert every(replicas, C.requeue_expired(ROUND_BUDGET, named), late) == [len(named)] * 2
        swept += len(named)
    assert swept == 200 and replicas[0].sm.expiry_due(late, ROUND_QUEUES) == []
    assert all(replicas[0].info(f"q{n:03d}") == (0, 0, 0) for n in range(200))


def test_idle_consumers_are_looked_at_in_the_queues_named(replicas: list[Replica]) -> None:
    for name in ("a", "b"):
        every(replicas, C.create_queue(name, "delayed", 0, 0, 600, 600), T0)
        every(replicas, C.enqueue(name, 0, "", 1, "x", None), T0)
        every(replicas, C.dequeue(name, True, f"worker-{name}"), T0)
    later = T0 + IDLE_MS + 1000
    qid_a = replicas[0].sm.queues["a"].defn.qid
    every(replicas, C.requeue_expired(ROUND_BUDGET, [], [qid_a]), later)
    for r in replicas:
        assert list(r.sm.queues["a"].consumers) == []
        assert list(r.sm.queues["b"].consumers) == ["worker-b"]     # not named: kept
    assert replicas[0].digest() == replicas[1].digest()


def test_entries_written_before_bounded_rounds_apply_as_they_did(
        replicas: list[Replica]) -> None:
    """Rules 1 (an older version's journal): the round of the first form handles every
    lease at once, and a dequeue sweeps every expired message of its queue."""
    fill(replicas, "q", MANY)
    every(replicas, C.dequeue_many("q", False, MANY, "", ), T0, rules=1)
    assert every(replicas, C.requeue_expired(), T0 + 601_000, rules=1) == [MANY, MANY]
    fill(replicas, "t", MANY, ttl=60, now_ms=T0 + 601_000)
    [(code, _)] = replicas[0].run([C.dequeue("t", True)], T0 + 662_000, rules=1)
    assert code == ResultCode.QUEUE_EMPTY and replicas[0].info("t") == (0, 0, 0)


def test_a_round_names_queues_by_qid_and_ignores_what_it_cannot_read(
        replicas: list[Replica]) -> None:
    fill(replicas, "q", 10, ttl=1)
    bad = (C.REQUEUE_EXPIRED, ROUND_BUDGET, ["q", None, 10 ** 30, -1], "not a list")
    assert every(replicas, bad, T0 + 5_000) == [0, 0]
    assert replicas[0].info("q") == (10, 0, 0)
    huge = (C.REQUEUE_EXPIRED, 10 ** 12, [replicas[0].sm.queues["q"].defn.qid], [])
    assert every(replicas, huge, T0 + 5_000) == [10, 10]       # the budget is capped

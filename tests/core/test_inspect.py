"""Browse and explain: they agree with dequeue, list held-back
messages as blocked after the deliverable ones, are taken in steps of bounded work that
change nothing, and survive the queue changing between steps. The service lets two run at
once and stops one whose client left."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import gevent
import pytest

from doq_lib import commands as C
from doq_lib.errors import ResultCode, Unavailable
from doq_lib.fsm.inspect import STEP
from tests.core.test_fsm import RR, T0, WEIGHTED, Node, create, dequeue, enqueue, nack


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "node")
    yield n
    n.close()


def rows(node: Node, q: str, state: str = "ready", group: str | None = None,
         limit: int = 1000) -> list[tuple[int, str]]:
    found = node.sm.browse(q, state, group, None, limit)
    assert found is not None
    return [(m.message.id, m.state) for m in found[0]]


def taken(node: Node, q: str) -> list[int]:
    """What dequeues that ack at once take, from a copy of the node (nothing changes)."""
    out = []
    while True:
        code, value = node.do(dequeue(q, True))
        if code != ResultCode.OK:
            return out
        out.append(value[0])


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_a_paused_groups_messages_are_listed_blocked_after_the_deliverable_ones(
        node: Node, strategy: int) -> None:
    """Browse listed a paused group's messages as ready, in delivery order, while
    dequeue skipped them and explain said group_paused."""
    node.ok(create("f", "fair", strategy))
    ids: dict[str, list[int]] = {}
    for n in range(4):
        for group in ("a", "b", "c.d", "c.e"):
            ids.setdefault(group, []).append(node.ok(enqueue("f", f"{group}{n}", n % 2,
                                                             group))[0])
    node.ok(C.set_paused("f", "b", True))
    node.ok(C.set_paused("f", "c", True))          # a parent: c.d and c.e too
    listed = rows(node, "f")
    ready = [mid for mid, state in listed if state == "ready"]
    blocked = [mid for mid, state in listed if state == "blocked"]
    assert listed == [(m, "ready") for m in ready] + [(m, "blocked") for m in blocked]
    assert sorted(ready) == sorted(ids["a"])
    index = node.sm.queues["f"].index
    by_group = [group for group in ("b", "c.d", "c.e") for _ in ids[group]]
    assert [index.group_of(m) for m in blocked] == by_group       # group by group, by name
    for group in ("b", "c.d", "c.e"):                             # each in its own order
        mine = [m for m in blocked if index.group_of(m) == group]
        assert mine == sorted(ids[group], key=lambda m: (index.priority_of(m), m))
    for mid in blocked:
        explained = node.sm.explain("f", mid, T0)
        assert explained is not None and explained.state == "blocked"
        assert explained.reasons[0]["code"] == "group_paused"
    assert rows(node, "f", group="c.d") == [(m, "blocked") for m in sorted(
        ids["c.d"], key=lambda m: (node.sm.queues["f"].index.priority_of(m), m))]
    assert taken(node, "f") == ready               # dequeue takes exactly the ready rows


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_the_ready_rows_are_what_dequeues_take_and_explain_counts_them(
        node: Node, strategy: int) -> None:
    node.ok(create("f", "fair", strategy, 2))
    for n in range(60):
        node.ok(enqueue("f", f"m{n}", n % 5, f"g{n % 7}.s{n % 3}"))
    for _ in range(9):                              # a rotation in progress, 2 in flight each
        node.ok(dequeue("f"))
    listed = rows(node, "f")
    ready = [mid for mid, state in listed if state == "ready"]
    for place, mid in enumerate(ready[:15]):
        explained = node.sm.explain("f", mid, T0)
        assert explained is not None and (explained.state, explained.ahead) == ("ready", place)
    for mid, state in listed:
        if state == "blocked":
            explained = node.sm.explain("f", mid, T0)
            assert explained is not None and explained.state == "blocked"
            assert explained.ahead == len(ready)
    before = node.store.state()[1]
    assert rows(node, "f") == listed and node.store.state()[1] == before   # nothing moved
    assert taken(node, "f") == ready


def test_held_back_messages_come_last_by_release_time(node: Node) -> None:
    node.ok(create("d"))
    due = [node.ok(enqueue("d", f"m{n}", n))[0] for n in range(3)]
    later = node.ok(enqueue("d", "later", T0 // 1000 + 3600))[0]
    for _ in range(3):
        node.ok(dequeue("d"))
    node.ok(nack("d", due[0], 0, None))
    node.ok(nack("d", due[1], 0, None))
    node.ok(C.nack("d", due[2], 0, None, "", 50))                # held back 50 s
    assert rows(node, "d", state="all") == [(due[0], "ready"), (due[1], "ready"),
                                            (later, "blocked"), (due[2], "blocked")]
    for mid in (later, due[2]):
        explained = node.sm.explain("d", mid, T0)
        assert explained is not None and (explained.state, explained.ahead) == ("blocked", 2)


def test_a_queue_at_max_in_flight_lists_nothing_as_ready(node: Node) -> None:
    node.ok(create("f", "fair", RR, 0, 60, {"max_in_flight": 1}))
    for n in range(3):
        node.ok(enqueue("f", f"m{n}", 1, f"g{n}"))
    node.ok(dequeue("f"))
    listed = rows(node, "f")
    assert listed and all(state == "blocked" for _, state in listed)
    assert node.do(dequeue("f"))[0] == ResultCode.QUEUE_EMPTY


def test_a_read_is_taken_in_steps_of_bounded_work_and_a_first_page_is_one(
        node: Node) -> None:
    """On a queue of 100k groups a browse of 10 took 10 s with the node frozen
    (the whole scheduler was deep-copied, then walked). A page costs about what it lists;
    reaching far costs steps of at most STEP rows, between which the node runs."""
    node.ok(create("f", "fair", RR))
    count = 5 * STEP
    node.run(*[enqueue("f", "x", 1, f"tenant{n}") for n in range(count)])
    job = node.sm.browse_job("f", "ready", None, None, 10)
    assert job is not None and job.step() is True            # one step for a first page
    assert len(job.result()[0]) == 10
    last = node.sm.queues["f"].index.ready_ids()[-1]
    explain = node.sm.explain_job("f", last, T0)
    assert explain is not None
    steps = 1
    while not explain.step():
        steps += 1
    assert steps == pytest.approx(count / STEP, abs=1) and explain.result().ahead == count - 1
    deep = node.sm.browse_job("f", "ready", None, None, 10)
    assert deep is not None
    deep.after = explain.mid                      # as a page's "next" would
    deep.found = False
    steps = 1
    while not deep.step():
        steps += 1
    assert steps >= count // STEP and deep.result()[0] == []


@pytest.mark.parametrize("strategy", [RR, WEIGHTED])
def test_how_a_read_is_cut_into_steps_changes_nothing_it_lists(node: Node,
                                                                strategy: int) -> None:
    """A step ends after a number of rows or when its time is up (the latter found by the
    full suite: a step that ran out of time dropped the row in hand, so pages under load
    missed messages). Rows, time, or both: the pages are those of one uncut read."""
    node.ok(create("f", "fair", strategy))
    node.run(*[enqueue("f", "x", n % 4, f"t{n % 7}") for n in range(2500)])
    for _ in range(40):
        node.ok(dequeue("f", False))

    def pages(budget: int, seconds: float) -> list[int]:
        seen: list[int] = []
        after = None
        while True:
            job = node.sm.browse_job("f", "all", None, after, 97)
            assert job is not None
            while not job.step(budget, seconds):
                pass
            listed, after = job.result()
            seen += [m.message.id for m in listed]
            if after is None:
                return seen

    whole = pages(10 ** 9, 0.0)
    assert len(whole) == len(set(whole)) == 2500
    assert pages(1, 0.0) == whole
    assert pages(10 ** 9, 1e-12) == whole           # every 64 rows, out of time
    assert pages(100, 1e-12) == whole
    last = node.sm.queues["f"].index.ready_ids()[-1]
    aheads = set()
    for budget, seconds in ((10 ** 9, 0.0), (1, 0.0), (10 ** 9, 1e-12)):
        explain = node.sm.explain_job("f", last, T0)
        assert explain is not None
        while not explain.step(budget, seconds):
            pass
        aheads.add(explain.result().ahead)
    assert aheads == {2500 - 40 - 1}


def test_the_queue_may_change_between_steps(node: Node) -> None:
    node.ok(create("f", "fair", RR))
    node.run(*[enqueue("f", "x", n % 3, f"g{n % 500}") for n in range(3 * STEP)])
    job = node.sm.browse_job("f", "all", None, None, 1000)
    assert job is not None
    job.step(200)
    for _ in range(300):                          # taken, acked, enqueued, deleted meanwhile
        node.ok(dequeue("f", True))
    node.run(*[enqueue("f", "y", 0, f"h{n}") for n in range(100)])
    node.ok(C.purge("f", False))
    while not job.step(200):
        pass
    listed, _ = job.result()
    assert all(m.message.content in ("x", "y") for m in listed)     # no record it lost
    assert len({m.message.id for m in listed}) == len(listed)      # none twice
    job = node.sm.browse_job("f", "all", None, None, 10)
    assert job is not None
    node.ok(C.delete_queue("f"))
    with pytest.raises(LookupError):
        job.step()


def test_long_reads_take_turns_a_first_page_never_waits_a_left_client_stops(
        tmp_path: Path) -> None:
    from tests.conftest import local_node

    local = local_node(tmp_path / "s")
    try:
        svc = local.service
        svc.create_queue("f", "fair", 1, 0, 60)
        svc.enqueue_batch([C.Item("f", 0, f"g{n}", 1, "x", None) for n in range(3 * STEP)])
        last = local.fsm.queues["f"].index.ready_ids()[-1]
        stepped = svc.reads_stepped
        answers = iter([False, True])                       # the client leaves after one step
        with pytest.raises(Unavailable, match="went away"):
            svc.explain("f", last, cancelled=lambda: next(answers))
        assert svc.reads_stepped == stepped + 1            # one step, then it stopped
        import doq_lib.service as service_module
        service_module.HEAVY_WAIT, saved = 0.2, service_module.HEAVY_WAIT
        try:
            gate: Any = svc._heavy
            gate.acquire()
            gate.acquire()                                  # two long reads running
            with pytest.raises(Unavailable, match="busy"):
                svc.explain("f", last)                      # more than one step: waits
            # a first page is one step: served like any request while long reads run
            assert len(svc.browse("f", "ready", None, None, 10)[0]) == 10
            gate.release()
            assert svc.explain("f", last).ahead == 3 * STEP - 1
            gate.release()
        finally:
            service_module.HEAVY_WAIT = saved
        explained = svc.explain("f", last)
        assert explained.ahead == 3 * STEP - 1
        gevent.sleep(0)
    finally:
        local.close()

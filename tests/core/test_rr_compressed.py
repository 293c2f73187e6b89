"""The path-compressed round robin against the full tree it replaces.

``tests/core/rr_reference.py`` is the round robin as it was: one node per label of every
group, each holding its whole path. The compressed index must hand messages out in exactly
the same order through any sequence of operations (adds, takes with and without holding,
removals, new priorities, pauses, rates, in-flight limits), rebuild the same state from its
own records, convert records of the old format into the same rotation, list the same
delivery order without changing anything, and cost at most two nodes per group whatever
its depth.
"""
from __future__ import annotations

import random
from typing import Any

import pytest

from doq_lib.queues.fair import RoundRobinIndex
from tests.core.rr_reference import RoundRobinIndex as Reference

NOW = 1_700_000_000
GROUPS = ["a", "a.b", "a.b.c", "a.b.d", "a.x", "b", "b.c.d.e.f", "b.c.d.e.g", "c.d", "c",
          "d.e.f.g.h.i.j.k", "d.e.f.g.h", "d.e", "e.f.g", "e", "f.g", "f.h.i", "f.h"]


def _ops(rng: random.Random, steps: int, indexes: list[Any], next_id: list[int],
         ready: dict[int, str], inflight: dict[str, int]) -> list[object]:
    """The same random operations on every index; the trace of what they answered (each
    answer checked equal across the indexes)."""
    trace: list[object] = []
    for _ in range(steps):
        r = rng.random()
        if r < 0.35 or not ready:
            mid = next_id[0]
            next_id[0] += 1
            group, prio = rng.choice(GROUPS), rng.randrange(0, 8)
            for index in indexes:
                index.add(mid, group, prio)
            ready[mid] = group
        elif r < 0.62:
            hold = rng.random() < 0.6
            got = {index.pop(NOW, hold=hold) for index in indexes}
            assert len(got) == 1, got
            mid = got.pop()
            trace.append(mid)
            if mid is not None:
                group = ready.pop(mid)
                if hold:
                    inflight[group] = inflight.get(group, 0) + 1
        elif r < 0.72 and inflight:
            group = rng.choice(sorted(inflight))
            for index in indexes:
                index.inflight_remove(group)
            inflight[group] -= 1
            if not inflight[group]:
                del inflight[group]
        elif r < 0.80:
            mid = rng.choice(sorted(ready))
            assert all(index.remove(mid) for index in indexes)
            del ready[mid]
        elif r < 0.86:
            mid = rng.choice(sorted(ready))
            prio = rng.randrange(0, 8)
            for index in indexes:
                index.reprioritize(mid, prio)
        elif r < 0.90:
            paused = tuple(sorted(rng.sample(["a", "a.b", "b.c", "d.e.f", "x", "f"],
                                             rng.randrange(0, 3))))
            for index in indexes:
                index.set_paused(paused)
        elif r < 0.94:
            group, on = rng.choice(GROUPS), rng.random() < 0.5
            for index in indexes:
                index.set_limited(group, on)
        elif r < 0.97:
            limit = rng.choice([0, 1, 2, 3])
            for index in indexes:
                index.set_max_unacked(limit)
        else:
            assert len({index.has_ready(NOW) for index in indexes}) == 1
        assert len({index.ready for index in indexes}) == 1
    return trace


def _apply(records: dict[bytes, bytes], changes: list[Any]) -> None:
    for key, value in changes:
        if value is None:
            records.pop(key, None)
        else:
            records[key] = value


def _rebuild(cls: Any, records: dict[bytes, bytes], source: Any, ready: dict[int, str],
             inflight: dict[str, int]) -> Any:
    """A new index of ``cls`` from ``records``, as the state machine loads one."""
    index = cls(source.max_unacked)
    index.load_records(sorted(records.items()))
    index.set_paused(tuple(sorted(source.paused)))
    for mid in sorted(ready):
        index.add(mid, ready[mid], source.priority_of(mid))
    for group, count in sorted(inflight.items()):
        for _ in range(count):
            index.inflight_add(group)
    for group in sorted(source.limited):
        index.set_limited(group, True)
    index.finish_load()
    assert index.drain_changes() == [], "records were incomplete"   # as the state machine
    return index


@pytest.mark.parametrize("seed", range(8))
def test_the_same_deliveries_as_the_full_tree(seed: int) -> None:
    rng = random.Random(seed)
    new, old = RoundRobinIndex(0), Reference(0)
    ready: dict[int, str] = {}
    inflight: dict[str, int] = {}
    trace = _ops(rng, 4000, [new, old], [1], ready, inflight)
    assert sum(1 for mid in trace if mid is not None) > 500
    assert new.node_count() <= 2 * len(new.ready_by_group()) + 1


@pytest.mark.parametrize("seed", range(6))
def test_its_records_rebuild_the_same_rotation(seed: int) -> None:
    rng = random.Random(100 + seed)
    new, old = RoundRobinIndex(1), Reference(1)
    ready: dict[int, str] = {}
    inflight: dict[str, int] = {}
    records: dict[bytes, bytes] = {}
    next_id = [1]
    for _ in range(40):
        _ops(rng, 50, [new, old], next_id, ready, inflight)
        _apply(records, new.drain_changes())
        old.drain_changes()
    rebuilt = _rebuild(RoundRobinIndex, records, new, ready, inflight)
    _ops(rng, 1500, [new, old, rebuilt], next_id, dict(ready), dict(inflight))
    twin = dict(records)
    _apply(records, new.drain_changes())
    _apply(twin, rebuilt.drain_changes())
    assert records == twin


@pytest.mark.parametrize("seed", range(6))
def test_records_of_the_old_format_convert_to_the_same_rotation(seed: int) -> None:
    """A store written before the compression: the index converts its records and, at the
    queue's next change, writes them all in the new format (replacing the old ones)."""
    rng = random.Random(200 + seed)
    old = Reference(2)
    ready: dict[int, str] = {}
    inflight: dict[str, int] = {}
    old_records: dict[bytes, bytes] = {}
    next_id = [1]
    for _ in range(30):
        _ops(rng, 40, [old], next_id, ready, inflight)
        _apply(old_records, old.drain_changes())
    converted = _rebuild(RoundRobinIndex, old_records, old, ready, inflight)
    assert converted.node_count() <= 2 * len(converted.ready_by_group()) + 1
    _ops(rng, 1500, [old, converted], next_id, dict(ready), dict(inflight))
    records = dict(old_records)
    _apply(records, converted.drain_changes())
    assert records and all(len(v) != 16 for k, v in records.items() if k == b"\0" * 8)
    again = _rebuild(RoundRobinIndex, records, converted, {m: converted.group_of(m)
                                                            for m in converted.ready_ids()},
                     dict(converted.inflight))
    a = [again.pop(NOW) for _ in range(200)]
    b = [converted.pop(NOW) for _ in range(200)]
    assert a == b


@pytest.mark.parametrize("as_is", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_the_listed_order_is_the_full_trees_and_changes_nothing(seed: int,
                                                                as_is: bool) -> None:
    rng = random.Random(300 + seed)
    new, old = RoundRobinIndex(2), Reference(2)
    ready: dict[int, str] = {}
    inflight: dict[str, int] = {}
    _ops(rng, 1200, [new, old], [1], ready, inflight)
    before = new.drain_changes()
    listed = list(new.delivery_order(as_is))
    assert listed == list(old.delivery_order(as_is))
    assert new.drain_changes() == [] and before is not None
    if as_is:                             # what takes (that ack at once) then get
        taken = []
        while (mid := new.pop(NOW)) is not None:
            taken.append(mid)
        assert taken == listed
    else:
        assert sorted(listed) == sorted(ready)


def test_a_group_costs_at_most_two_nodes_whatever_its_depth() -> None:
    """100 messages with distinct 1,024-level groups took a node from 77 MB to
    613 MB (each of the 1,024 nodes of a path held the whole path). Depth costs nothing
    now: the nodes are counted, not measured."""
    index = RoundRobinIndex(0)
    for n in range(100):
        deep = ".".join(["level"] * 1023 + [f"g{n}"])
        index.add(n + 1, deep, 1)
    assert index.node_count() <= 2 * 100 + 1
    shallow = RoundRobinIndex(0)
    for n in range(100):
        shallow.add(n + 1, f"g{n}", 1)
    assert index.node_count() <= shallow.node_count() + 1
    labels = sum(len(node.labels) for node in _nodes(index))
    assert labels <= 1023 + 100 + 1                 # the shared chain is stored once
    assert [index.pop(NOW) for _ in range(100)] == list(range(1, 101))
    assert index.node_count() == 1                  # all gone, only the root


def _nodes(index: RoundRobinIndex) -> list[Any]:
    out, stack = [], [index.root]
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.order)
    return out


@pytest.mark.parametrize("seed", range(3))
def test_a_wide_rotation_lists_the_same_order(seed: int) -> None:
    """Hundreds of groups of uneven sizes: the listing drops emptied children as it goes
    (compaction) and still follows the rotation."""
    rng = random.Random(400 + seed)
    new, old = RoundRobinIndex(1), Reference(1)
    mid = 0
    for n in range(300):
        group = f"t{n % 150}" + (f".u{n % 7}" if n % 3 else "")
        for _ in range(rng.choice([1, 1, 1, 2, 5, 40])):
            mid += 1
            priority = rng.randrange(3)
            for index in (new, old):
                index.add(mid, group, priority)
    for _ in range(120):                           # some rotation state, some holds
        assert new.pop(NOW, hold=True) == old.pop(NOW, hold=True)
    for as_is in (True, False):
        assert list(new.delivery_order(as_is)) == list(old.delivery_order(as_is))


def test_a_store_of_the_old_format_is_converted_by_the_state_machine(tmp_path: Any) -> None:
    """Scheduler records written before the compression: a node loads them, delivers in
    the old rotation's order, rewrites them in the new format at the queue's next change
    (old chain records deleted) and loads those again after a restart."""
    from doq_lib import commands as C
    from doq_lib.store import U64
    from tests.core.test_fsm import Node, create, enqueue

    node = Node(tmp_path / "n")
    node.ok(create("q", "fair", 1))
    old = Reference(0)
    rng = random.Random(7)
    for _ in range(60):
        group, priority = rng.choice(GROUPS), rng.randrange(3)
        mid = node.ok(enqueue("q", "x", priority, group))[0]
        old.add(mid, group, priority)
    for _ in range(25):                            # a rotation in progress
        mid = node.ok(C.dequeue("q", True))[0]
        assert mid == old.pop(NOW)
    prefix = U64.pack(node.qid("q"))
    with node.store.write() as txn:                # the store as the old version left it
        txn.delete_prefix("sched", prefix)
        for key, value in old.drain_changes():
            if value is not None:
                txn.put("sched", prefix + key, value)
    node.restart()
    assert node.ok(C.dequeue("q", True))[0] == old.pop(NOW)
    stored = {k: v for k, v in node.store.dump()["sched"].items() if k.startswith(prefix)}
    assert all(len(v) != 16 for k, v in stored.items() if k == prefix + b"\0" * 8)
    assert len(stored) <= 2 * len(node.sm.queues["q"].index.ready_by_group()) + 1
    node.restart()
    while (expected := old.pop(NOW)) is not None:
        assert node.ok(C.dequeue("q", True))[0] == expected
    node.close()

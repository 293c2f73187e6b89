"""Pure tests of the in-memory queue indexes (SPEC §5.2-§5.4, §5.11, §12.2 "Queue structures").

No storage here: the indexes hold ids, groups and priorities only. Time is passed in explicitly;
every randomized test uses ``random.Random(seed)`` with a fixed seed.
"""
from __future__ import annotations

import random
from typing import Any, Callable

import pytest

from doq_lib.queues.base import PriorityHeap
from doq_lib.queues.delayed import DelayedIndex
from doq_lib.queues.fair import RoundRobinIndex
from doq_lib.queues.stats import QueueStats
from doq_lib.queues.weighted import WeightedIndex, calculate_weight

NOW = 1_700_000_000          # a realistic unix second: ordinary priorities are far below it
CLEANUP_N = 100_000          # enqueues in the memory-cleanup tests (the reference uses 1 000 000)

Index = RoundRobinIndex | WeightedIndex


def drain(index, now_s: int = NOW, hold: bool = False, limit: int = 10_000) -> list[int]:
    out = []
    for _ in range(limit):
        mid = index.pop(now_s, hold=hold)
        if mid is None:
            return out
        out.append(mid)
    raise AssertionError("index never ran dry")


def fill(index, items: list[tuple[int, str, int]]) -> None:
    for mid, group, priority in items:
        index.add(mid, group, priority)


# -- PriorityHeap --------------------------------------------------------------------------------
class TestPriorityHeap:
    def test_order_priority_then_id(self) -> None:
        heap = PriorityHeap()
        for mid, p in zip(range(1, 10), (10, 50, 20, 70, 100, 7, 4, 2, 5)):
            heap.push(mid, p)
        assert [heap.pop() for _ in range(9)] == [8, 7, 9, 6, 1, 3, 2, 4, 5]
        assert heap.pop() is None and heap.peek() is None

    def test_move_and_remove(self) -> None:
        heap = PriorityHeap()
        for mid in range(1, 6):
            heap.push(mid, mid)
        heap.push(1, 10)                  # moved behind everyone
        assert heap.remove(3) and not heap.remove(3) and not heap.remove(99)
        assert 3 not in heap and len(heap) == 4
        assert heap.peek() == (2, 2)
        assert [heap.pop() for _ in range(4)] == [2, 4, 5, 1]

    def test_same_priority_push_and_readd_never_duplicates(self) -> None:
        heap = PriorityHeap()
        heap.push(1, 5)
        heap.push(1, 5)                   # re-push at the same priority
        assert heap.pop() == 1
        heap.push(1, 5)                   # back again (e.g. a nack keeping its priority)
        assert heap.pop() == 1
        assert heap.pop() is None and len(heap) == 0

    def test_compaction_bounds_stale_entries(self) -> None:
        heap = PriorityHeap()
        for mid in range(1000):
            heap.push(mid, mid)
        for mid in range(999):
            heap.remove(mid)
        assert heap.stale_entries() <= 2 * len(heap) + 64
        assert heap.pop() == 999


# -- Delayed ---------------------------------------------------------------------------------------
class TestDelayedIndex:
    def test_priority_order(self) -> None:     # TestDelayedQueue / TestPriorityMemoryQueue
        index = DelayedIndex()
        for mid, p in zip(range(1, 10), (10, 50, 20, 70, 100, 7, 4, 2, 5)):
            index.add(mid, "ignored", p)
        assert index.ready == 9
        assert index.ordered_ids() == [8, 7, 9, 6, 1, 3, 2, 4, 5]
        assert drain(index) == [8, 7, 9, 6, 1, 3, 2, 4, 5]
        assert index.ready == 0

    def test_ties_by_id(self) -> None:
        index = DelayedIndex()
        for mid in (12, 4, 11):
            index.add(mid, "default", 53)
        assert drain(index) == [4, 11, 12]

    def test_future_head_hidden_until_due(self) -> None:   # TestDelayedQueueDelayed
        index = DelayedIndex()
        index.add(1, "default", NOW + 1)
        assert not index.has_ready(NOW)
        assert index.pop(NOW) is None
        assert index.seconds_until_due(NOW) == 1.0
        assert index.ready == 1 and index.contains(1)
        assert index.has_ready(NOW + 1)
        assert index.seconds_until_due(NOW + 1) == 0.0
        assert index.pop(NOW + 1) == 1
        assert index.seconds_until_due(NOW + 1) is None

    def test_only_head_gates(self) -> None:
        """SPEC §5.2 worked example at index level: A=now+2, B=now+1, C=10."""
        index = DelayedIndex()
        index.add(1, "default", NOW + 2)
        index.add(2, "default", NOW + 1)
        index.add(3, "default", 10)
        assert index.pop(NOW) == 3
        assert index.pop(NOW) is None
        assert index.pop(NOW + 1) == 2
        assert index.pop(NOW + 1) is None
        assert index.pop(NOW + 2) == 1

    def test_has_ready_is_read_only(self) -> None:   # TestDelayedQueuePeekReady
        index = DelayedIndex()
        index.add(1, "default", NOW + 5)
        index.add(2, "default", 7)
        before = (index.ready, index.ordered_ids(), index.bookkeeping_size())
        for _ in range(10):
            assert index.has_ready(NOW)
            assert index.seconds_until_due(NOW) == 0.0
        assert (index.ready, index.ordered_ids(), index.bookkeeping_size()) == before

    def test_delete_reprioritize_get(self) -> None:
        index = DelayedIndex()
        for mid in range(1, 6):
            index.add(mid, "anything", 10 * mid)
        assert index.group_of(3) == "default"
        assert index.remove(3) and not index.remove(3) and not index.remove(42)
        index.reprioritize(1, 100)
        assert not index.contains(3) and index.contains(1)
        assert drain(index) == [2, 4, 5, 1]

    def test_memory_cleanup(self) -> None:          # TestDelayedQueue_MemoryCleanup
        index = DelayedIndex()
        n = CLEANUP_N
        for mid in range(1, n + 1):
            index.add(mid, "default", mid * 7919 % 1000)
        for mid in range(1, n + 1, 3):
            index.remove(mid)
        assert len(drain(index, limit=n)) == n - len(range(1, n + 1, 3))
        assert index.ready == 0
        assert index.bookkeeping_size() == 0


# -- Round robin -----------------------------------------------------------------------------------
SUBGROUPS = {
    1: "customer-1.project-1.user-1", 2: "customer-1.project-1.user-1",
    3: "customer-1.project-1.user-2", 4: "customer-1.project-2.user-1",
    5: "customer-1.project-2.user-1", 6: "customer-1.project-2.user-2",
    7: "customer-1.project-3.user-1", 8: "customer-1.project-3.user-2",
    9: "customer-2", 10: "customer-3.project-1", 11: "customer-3.project-1",
    12: "customer-3.project-2", 13: "customer-4.project-1.user-1",
    14: "customer-4.project-1.user-2", 15: "customer-4.project-2.user-2",
}


class TestRoundRobinIndex:
    def test_single_customer_is_a_priority_queue(self) -> None:
        index = RoundRobinIndex()
        prios = [901, 86, 1543, 10123, 1, 435, 3, 6585, 54, 99]
        for i, p in enumerate(prios):
            index.add(i, "customer-1", p)
        out = []
        for _ in prios:
            mid = index.pop(NOW)
            assert mid is not None
            assert not index.contains(mid)
            assert all(index.contains(i) for i in range(len(prios)) if i not in out + [mid])
            out.append(mid)
        assert out == [4, 6, 8, 1, 9, 5, 0, 2, 7, 3]
        assert index.pop(NOW) is None

    def test_round_robin_groups(self) -> None:      # TestFairRoundRobinQueue
        index = RoundRobinIndex()
        layout = {"c1": [1, 2, 3, 4], "c2": [5, 6], "c3": [7, 8], "c4": [9], "c5": [10]}
        fill(index, [(m, g, 10) for g, ids in layout.items() for m in ids])
        assert drain(index) == [1, 5, 7, 9, 10, 2, 6, 8, 3, 4]

    def test_round_robin_then_empty(self) -> None:  # TestFairRoundRobinQueue1
        index = RoundRobinIndex()
        fill(index, [(1, "c1", 10), (2, "c1", 10), (3, "c2", 10)])
        assert [index.pop(NOW) for _ in range(4)] == [1, 3, 2, None]
        assert not index.has_ready(NOW)

    def test_spec_worked_example(self) -> None:      # SPEC §5.3, test_fair_priority_queue
        index = RoundRobinIndex()
        groups = ["customer-1"] * 4 + ["customer-2"] * 2 + ["customer-3", "customer-4"]
        fill(index, [(m, g, 10) for m, g in enumerate(groups)])
        assert drain(index) == [0, 4, 6, 7, 1, 5, 2, 3]

    def test_hierarchical_subgroups(self) -> None:  # TestFairRoundRobinQueueWithSubgroups
        index = RoundRobinIndex()
        fill(index, [(m, g, 10) for m, g in SUBGROUPS.items()])
        assert drain(index) == [1, 9, 10, 13, 4, 12, 15, 7, 11, 14, 3, 6, 8, 2, 5]

    def test_no_time_gating(self) -> None:
        index = RoundRobinIndex()
        index.add(1, "g", NOW + 3600)
        assert index.has_ready(NOW) and index.pop(NOW) == 1

    def test_group_and_prefix_group_are_both_served(self) -> None:
        """Own-leaf design (deliberate deviation from the reference, SPEC §5.3 last bullet):
        ``a`` is served alongside ``a.b`` instead of being stranded."""
        index = RoundRobinIndex()
        fill(index, [(1, "a", 1), (2, "a", 2), (3, "a.b", 1), (4, "a.b", 2), (5, "c", 1)])
        assert index.group_of(1) == "a" and index.group_of(3) == "a.b"
        # root rotates a, c; node a rotates its own leaf and child b
        assert drain(index) == [1, 5, 3, 2, 4]
        index = RoundRobinIndex()
        fill(index, [(1, "a.b", 1), (2, "a", 1), (3, "a.b", 2), (4, "a", 2)])
        assert drain(index) == [1, 2, 3, 4]

    def test_delete_by_id(self) -> None:              # TestFairRoundRobinQueueDelete
        index = RoundRobinIndex()
        fill(index, [(1, "c1", 10), (2, "c1", 10), (3, "c2", 10), (4, "c3", 10)])
        assert index.remove(2) and not index.remove(2) and not index.remove(99)
        assert index.remove(3)                    # c2 disappears entirely
        assert index.ready == 2
        assert drain(index) == [1, 4]
        assert index.bookkeeping_size() == 0

    def test_delete_of_cursor_group_resets_to_first(self) -> None:
        index = RoundRobinIndex()
        fill(index, [(1, "c1", 1), (2, "c1", 2), (3, "c2", 1), (4, "c3", 1), (5, "c3", 2)])
        assert index.pop(NOW) == 1                # cursor -> c2
        assert index.remove(3)                    # the cursor child is removed -> first child
        assert drain(index) == [2, 4, 5]

    def test_reappearing_group_goes_to_the_end(self) -> None:
        index = RoundRobinIndex()
        fill(index, [(1, "c1", 1), (2, "c2", 1), (3, "c2", 2), (4, "c3", 1), (5, "c3", 2)])
        assert index.pop(NOW) == 1                # c1 emptied and removed; cursor c2
        index.add(6, "c1", 1)                     # c1 again: appended after c3
        assert drain(index) == [2, 4, 6, 3, 5]

    def test_reprioritize_moves_behind_peers(self) -> None:   # ...UpdatePriority
        index = RoundRobinIndex()
        fill(index, [(1, "c1", 10), (4, "c1", 10), (5, "c2", 10)])
        index.reprioritize(1, 20)
        assert drain(index) == [4, 5, 1]

    def test_max_unacked_blocks_group(self) -> None:           # ...MaxUnacked
        index = RoundRobinIndex(max_unacked=2)
        fill(index, [(1, "c1", 1), (2, "c1", 2), (3, "c1", 3)])
        assert index.pop(NOW, hold=True) == 1
        assert index.pop(NOW, hold=True) == 2
        assert not index.has_ready(NOW)
        assert index.pop(NOW, hold=True) is None
        assert index.ready == 1
        index.add(4, "c2", 9)                     # another group is not blocked
        assert index.pop(NOW, hold=True) == 4
        index.inflight_remove("c1")
        assert index.has_ready(NOW)
        assert index.pop(NOW, hold=True) == 3

    def test_max_unacked_is_per_group_string(self) -> None:
        index = RoundRobinIndex(max_unacked=1)
        fill(index, [(1, "a", 1), (2, "a", 2), (3, "a.b", 1), (4, "a.b", 2)])
        assert index.pop(NOW, hold=True) == 1
        assert index.pop(NOW, hold=True) == 3
        assert index.pop(NOW, hold=True) is None
        index.inflight_remove("a.b")
        assert index.pop(NOW, hold=True) == 4
        assert index.pop(NOW, hold=True) is None

    def test_set_max_unacked_changes_eligibility(self) -> None:
        index = RoundRobinIndex(max_unacked=0)
        fill(index, [(m, "g", m) for m in range(1, 5)])
        assert index.pop(NOW, hold=True) == 1
        assert index.pop(NOW, hold=True) == 2
        index.set_max_unacked(2)
        assert not index.has_ready(NOW)
        index.set_max_unacked(3)
        assert index.pop(NOW, hold=True) == 3
        index.set_max_unacked(0)
        assert index.pop(NOW, hold=True) == 4

    def test_has_ready_is_read_only(self) -> None:       # ...PeekReady
        a, b = RoundRobinIndex(), RoundRobinIndex()
        items = [(m, g, 10) for m, g in SUBGROUPS.items()]
        fill(a, items)
        fill(b, items)
        out_a, out_b = [], []
        while True:
            for _ in range(3):
                a.has_ready(NOW)
            x, y = a.pop(NOW), b.pop(NOW)
            out_a.append(x)
            out_b.append(y)
            if x is None:
                break
        assert out_a == out_b
        assert a.drain_changes() == b.drain_changes()

    def test_memory_cleanup(self) -> None:              # TestFairRoundRobinQueue_MemoryCleanup
        index = RoundRobinIndex(max_unacked=3)
        _fill_and_drain(index, [f"c{k % 300}.p{k % 7}" for k in range(2100)])
        assert index.ready == 0
        assert index.bookkeeping_size() == 0
        assert index.root.order == [] and index.root.eligible == 0
        assert not index.has_ready(NOW)


# -- Weighted --------------------------------------------------------------------------------------
class TestCalculateWeight:
    @pytest.mark.parametrize("ready, unacked, max_unacked, weight", [
        (0, 0, 10, 0),          # empty
        (0, 0, 0, 0),
        (5, 0, 0, 10),          # unlimited
        (5, 1000, 0, 10),
        (5, 11, 10, 0),         # over the limit
        (5, 0, 10, 10),
        (5, 5, 10, 5),
        (5, 3, 10, 7),
        (5, 9, 10, 1),
        (5, 10, 10, 0),
        (5, 19, 20, 0),         # truncation: ineligible one before the limit
        (5, 18, 20, 1),
        (5, 17, 20, 1),
        (1, 0, 1, 10),
        (1, 1, 1, 0),
    ])
    def test_table(self, ready: int, unacked: int, max_unacked: int, weight: int) -> None:
        assert calculate_weight(ready, unacked, max_unacked) == weight

    def test_matches_spec_formula(self) -> None:
        for m in range(1, 40):
            for u in range(0, m + 2):
                expected = 0 if u >= m else int(10 * (1 - u / (m + 1)) + 1e-9)
                assert calculate_weight(3, u, m) == expected, (u, m)


class TestWeightedIndex:
    def test_all_messages_delivered(self) -> None:          # TestFairWeightedQueueBasic/Groups
        index = WeightedIndex()
        items = [(m, f"g{m % 4}", m % 3) for m in range(1, 20)]
        fill(index, items)
        out = drain(index)
        assert sorted(out) == list(range(1, 20))
        assert index.ready == 0 and index.bookkeeping_size() == 0

    def test_all_delivered_with_acks(self) -> None:           # ...GroupsAck
        index = WeightedIndex(max_unacked=2)
        fill(index, [(m, f"g{m % 3}", 0) for m in range(1, 31)])
        out = []
        while True:
            mid = index.pop(NOW, hold=True)
            if mid is None:
                break
            out.append(mid)
            index.inflight_remove(f"g{mid % 3}")
        assert sorted(out) == list(range(1, 31))
        assert index.bookkeeping_size() == 0

    def test_unacked_limit_without_acks(self) -> None:      # ...MultipleGroups/UnackedHandling
        index = WeightedIndex(max_unacked=8)
        sizes = {"a": 10, "b": 8, "c": 3, "d": 1}
        mid = 0
        for group, size in sizes.items():
            for _ in range(size):
                mid += 1
                index.add(mid, group, 0)
        delivered: dict[str, int] = {}
        for m in drain(index, hold=True):
            group = "a" if m <= 10 else "b" if m <= 18 else "c" if m <= 21 else "d"
            delivered[group] = delivered.get(group, 0) + 1
        assert delivered == {"a": 8, "b": 8, "c": 3, "d": 1}
        assert index.ready == 2 and not index.has_ready(NOW)
        index.inflight_remove("a")
        assert index.pop(NOW, hold=True) in (9, 10)

    def test_priority_within_group(self) -> None:           # ...Priority
        index = WeightedIndex()
        rng = random.Random(3)
        prios = {m: rng.randrange(-50, 50) for m in range(1, 41)}
        fill(index, [(m, "one" if m % 2 else "two", p) for m, p in prios.items()])
        out = drain(index)
        for parity in (0, 1):
            got = [m for m in out if m % 2 == parity]
            assert got == sorted(got, key=lambda m: (prios[m], m))

    def test_get_delete_update_priority(self) -> None:     # ...GetAndDelete/UpdatePriority
        index = WeightedIndex()
        fill(index, [(1, "g", 1), (2, "g", 2), (3, "g", 3), (4, "h", 1)])
        assert index.contains(2) and index.group_of(4) == "h"
        assert index.remove(2) and not index.remove(2) and not index.remove(77)
        assert not index.contains(2)
        index.reprioritize(1, 10)
        assert index.remove(4)                    # group h vanishes
        assert "h" not in index.groups
        assert drain(index) == [3, 1]
        assert index.bookkeeping_size() == 0

    def test_max_unacked_blocks_group(self) -> None:      # TestFairWeightedQueueMaxUnacked
        index = WeightedIndex(max_unacked=2)
        fill(index, [(1, "c1", 1), (2, "c1", 2), (3, "c1", 3)])
        assert index.pop(NOW, hold=True) == 1
        assert index.pop(NOW, hold=True) == 2
        assert not index.has_ready(NOW)
        assert index.pop(NOW, hold=True) is None
        index.inflight_remove("c1")
        assert index.has_ready(NOW)
        assert index.pop(NOW, hold=True) == 3

    def test_proportional_share(self) -> None:
        """Weights 10 (no in-flight) and 5 (5 of 10 in flight) are served 2:1, deterministically."""
        index = WeightedIndex(max_unacked=10)
        for m in range(3000):
            index.add(m, "A", 0)
            index.add(10_000 + m, "B", 0)
        for _ in range(5):
            index.inflight_add("B")
        assert index.weight(index.groups["A"]) == 10
        assert index.weight(index.groups["B"]) == 5
        served = ["A" if index.pop(NOW) < 10_000 else "B" for _ in range(3000)]
        assert served.count("A") == 2000 and served.count("B") == 1000
        assert "".join(served[:9]) == "ABAABAABA"
        # every prefix stays within one pick of the exact 2:1 share
        a = 0
        for n, who in enumerate(served, 1):
            a += who == "A"
            assert abs(3 * a - 2 * n) <= 3

    def test_new_group_is_not_starved_nor_starving(self) -> None:
        index = WeightedIndex()
        fill(index, [(m, "old", 0) for m in range(1, 101)])
        drain_first = [index.pop(NOW) for _ in range(50)]
        assert drain_first == list(range(1, 51))
        fill(index, [(m, "new", 0) for m in range(1001, 1011)])
        nxt = [index.pop(NOW) for _ in range(20)]
        new = [m for m in nxt if m > 1000]
        assert len(new) == 10
        # strict alternation while both groups have work
        assert [m > 1000 for m in nxt] == [i % 2 == 1 for i in range(20)] or \
            [m > 1000 for m in nxt] == [i % 2 == 0 for i in range(20)]

    def test_idle_group_gets_no_credit(self) -> None:
        """A group kept alive only by an in-flight message must not come back with the pass it
        had long ago: that would starve every other group until it caught up."""
        index = WeightedIndex()
        index.add(1, "A", 0)
        assert index.pop(NOW, hold=True) == 1            # A: nothing ready, one in flight
        fill(index, [(m, "B", 0) for m in range(100, 5100)])
        for _ in range(3000):
            assert index.pop(NOW) >= 100
        fill(index, [(m, "A", 0) for m in range(10_000, 10_100)])
        served = ["A" if index.pop(NOW) >= 10_000 else "B" for _ in range(100)]
        assert abs(served.count("A") - 50) <= 1

    def test_blocked_group_gets_no_credit(self) -> None:
        index = WeightedIndex(max_unacked=20)
        fill(index, [(m, "A", 0) for m in range(1, 1001)])
        fill(index, [(m, "B", 0) for m in range(2001, 5001)])
        a_held = 0
        for _ in range(400):                             # A reaches its limit and stays there
            mid = index.pop(NOW, hold=True)
            if mid <= 1000:
                a_held += 1
            else:
                index.inflight_remove("B")
        assert a_held == 19                              # weight 0 from 19 of 20 in flight
        for _ in range(a_held):
            index.inflight_remove("A")
        served = ["A" if index.pop(NOW) <= 1000 else "B" for _ in range(100)]
        assert 40 <= served.count("A") <= 60

    def test_memory_cleanup(self) -> None:        # TestFairWeightedQueue_MemoryCleanup
        index = WeightedIndex(max_unacked=4)
        _fill_and_drain(index, [f"g{k}" for k in range(500)])
        assert index.ready == 0 and index.eligible_groups == 0
        assert index.groups == {}
        assert index.bookkeeping_size() == 0


# -- Invariants under random operations -----------------------------------------------------------
RR_GROUPS = ["a", "a.b", "a.b.c", "a.c", "x.y", "x.z", "k", "k.l.m"]
W_GROUPS = ["g1", "g2", "g3", "g4", "g5"]


class Model:
    """Brute-force reference: ready messages, in-flight counts, the limit."""

    def __init__(self, weighted: bool, limit: int) -> None:
        self.weighted = weighted
        self.limit = limit
        self.ready: dict[int, tuple[str, int]] = {}
        self.inflight: dict[str, int] = {}

    def group_ok(self, group: str) -> bool:
        if not any(g == group for g, _ in self.ready.values()):
            return False
        unacked = self.inflight.get(group, 0)
        if self.limit == 0:
            return True
        if unacked >= self.limit:
            return False
        if self.weighted:        # SPEC §5.4 formula, written independently
            return 10 * (self.limit + 1 - unacked) // (self.limit + 1) > 0
        return True

    def any_ready(self) -> bool:
        return any(self.group_ok(g) for g in {g for g, _ in self.ready.values()})

    def head(self, group: str) -> int:
        return min((p, m) for m, (g, p) in self.ready.items() if g == group)[1]


def random_ops(index: Index, model: Model, rng: random.Random, steps: int,
               groups: list[str], next_id: list[int], check: bool = True,
               limits: tuple[int, ...] = (0, 1, 2, 3, 5)) -> list[object]:
    """Drive ``index`` and ``model`` together; returns the trace of observable outcomes."""
    trace: list[object] = []
    for _ in range(steps):
        r = rng.random()
        if r < 0.35 or not model.ready:
            mid = next_id[0]
            next_id[0] += 1
            group, prio = rng.choice(groups), rng.randrange(-5, 20)
            index.add(mid, group, prio)
            model.ready[mid] = (group, prio)
        elif r < 0.60:
            hold = rng.random() < 0.7
            expect_some = model.any_ready()
            mid = index.pop(NOW, hold=hold)
            trace.append(("pop", mid))
            if check:
                assert (mid is not None) == expect_some
            if mid is not None:
                group, _ = model.ready[mid]
                if check:
                    assert model.group_ok(group)
                    assert model.head(group) == mid
                del model.ready[mid]
                if hold:
                    model.inflight[group] = model.inflight.get(group, 0) + 1
        elif r < 0.72 and model.inflight:
            group = rng.choice(sorted(model.inflight))
            index.inflight_remove(group)
            model.inflight[group] -= 1
            if not model.inflight[group]:
                del model.inflight[group]
        elif r < 0.82:
            mid = rng.choice(sorted(model.ready))
            assert index.remove(mid)
            del model.ready[mid]
        elif r < 0.94:
            mid = rng.choice(sorted(model.ready))
            prio = rng.randrange(-5, 20)
            index.reprioritize(mid, prio)
            model.ready[mid] = (model.ready[mid][0], prio)
        else:
            limit = rng.choice(limits)
            index.set_max_unacked(limit)
            model.limit = limit
        if check:
            assert index.ready == len(model.ready)
            assert index.has_ready(NOW) == model.any_ready()
    return trace


@pytest.mark.parametrize("cls, groups", [(RoundRobinIndex, RR_GROUPS), (WeightedIndex, W_GROUPS)])
def test_ready_counter_invariant(cls: Callable[[int], Index], groups: list[str]) -> None:
    """TestFairRoundRobinQueueReadyCounterInvariant: exact through 20 000 random operations."""
    rng = random.Random(20_000)
    model = Model(cls is WeightedIndex, 2)
    index = cls(2)
    random_ops(index, model, rng, 20_000, groups, [1], limits=(0, 1, 2, 3, 5, 20))
    for mid in list(model.ready):
        assert index.remove(mid)
    for group, count in model.inflight.items():
        for _ in range(count):
            index.inflight_remove(group)
    index.drain_changes()
    assert index.bookkeeping_size() == 0


def _apply_changes(records: dict[bytes, bytes], changes: list) -> None:
    for key, value in changes:
        if value is None:
            records.pop(key, None)
        else:
            records[key] = value


@pytest.mark.parametrize("cls, groups", [(RoundRobinIndex, RR_GROUPS), (WeightedIndex, W_GROUPS)])
@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_persistence_round_trip(cls: Callable[[int], Index], groups: list[str], seed: int) -> None:
    """Scheduler records + ready messages + in-flight counts rebuild an identical scheduler."""
    rng = random.Random(seed)
    model = Model(cls is WeightedIndex, 2)
    live = cls(2)
    records: dict[bytes, bytes] = {}
    next_id = [1]
    for _ in range(300):
        random_ops(live, model, rng, 5, groups, next_id, check=False)
        _apply_changes(records, live.drain_changes())

    rebuilt = cls(model.limit)
    rebuilt.load_records(sorted(records.items()))
    for mid in sorted(model.ready):                # the state machine adds in id order
        group, prio = model.ready[mid]
        rebuilt.add(mid, group, prio)
    for group, count in sorted(model.inflight.items()):
        for _ in range(count):
            rebuilt.inflight_add(group)
    if hasattr(rebuilt, "finish_load"):
        rebuilt.finish_load()
    assert rebuilt.drain_changes() == [], "records were incomplete"
    assert rebuilt.ready == live.ready
    assert rebuilt.has_ready(NOW) == live.has_ready(NOW)

    # the same future operations give the same outcomes and the same records
    twin_model = Model(model.weighted, model.limit)
    twin_model.ready, twin_model.inflight = dict(model.ready), dict(model.inflight)
    state = rng.getstate()
    trace_live = random_ops(live, model, rng, 400, groups, [next_id[0]], check=False)
    rng.setstate(state)
    trace_rebuilt = random_ops(rebuilt, twin_model, rng, 400, groups, [next_id[0]], check=False)
    assert trace_live == trace_rebuilt
    assert drain(live, hold=True) == drain(rebuilt, hold=True)
    records_b = dict(records)
    _apply_changes(records, live.drain_changes())
    _apply_changes(records_b, rebuilt.drain_changes())
    assert records == records_b


@pytest.mark.parametrize("cls", [RoundRobinIndex, WeightedIndex])
def test_record_keys_stay_small_for_long_group_names(cls: Callable[[int], Index]) -> None:
    """Scheduler records end up as LMDB keys (max 511 bytes): their size must not depend on
    group names, which are unbounded."""
    groups = ["g" * 5000, "é" * 3000, ".".join(["level"] * 500), "x." + "y" * 2000]
    index = cls(1)
    fill(index, [(m, groups[m % 4], m) for m in range(1, 41)])
    held = index.pop(NOW, hold=True)
    assert held is not None
    records: dict[bytes, bytes] = {}
    _apply_changes(records, index.drain_changes())
    assert records and max(len(k) for k in records) <= 16
    rebuilt = cls(1)
    rebuilt.load_records(sorted(records.items()))
    for m in range(1, 41):
        if index.contains(m):
            rebuilt.add(m, groups[m % 4], m)
    rebuilt.inflight_add(groups[held % 4])
    if hasattr(rebuilt, "finish_load"):
        rebuilt.finish_load()
    assert rebuilt.drain_changes() == []
    assert drain(rebuilt, hold=True) == drain(index, hold=True)


# -- Rates -----------------------------------------------------------------------------------------
class TestQueueStats:
    def test_rates(self) -> None:               # TestNewQueueStats / TestQueueStats_GetRPS
        stats = QueueStats(10)
        for kind, n in (("enqueue", 5000), ("dequeue", 2500), ("ack", 3561), ("nack", 2140)):
            stats.count(kind, NOW, n)
        assert stats.rates(NOW) == {"enqueue": 0.0, "dequeue": 0.0, "ack": 0.0, "nack": 0.0}
        assert stats.rates(NOW + 1) == pytest.approx(
            {"enqueue": 500.0, "dequeue": 250.0, "ack": 356.1, "nack": 214.0})
        assert stats.rates(NOW + 10)["enqueue"] == pytest.approx(500.0)
        assert stats.rates(NOW + 11)["enqueue"] == 0.0
        assert stats.totals() == {"enqueue": 5000, "dequeue": 2500, "ack": 3561, "nack": 2140}

    def test_spec_small_example_and_current_second_hidden(self) -> None:
        stats = QueueStats(10)
        for kind, n in (("enqueue", 10), ("dequeue", 5), ("ack", 3), ("nack", 2)):
            for _ in range(n):
                stats.count(kind, NOW)
        assert stats.rates(NOW + 1) == pytest.approx(
            {"enqueue": 1.0, "dequeue": 0.5, "ack": 0.3, "nack": 0.2})
        stats.count("enqueue", NOW + 1, 100)       # the current second is not visible yet
        assert stats.rates(NOW + 1)["enqueue"] == pytest.approx(1.0)
        assert stats.rates(NOW + 2)["enqueue"] == pytest.approx(11.0)

    def test_sliding_window(self) -> None:
        stats = QueueStats(3)
        for s in range(10):
            stats.count("enqueue", NOW + s, s + 1)
        # window of 3 at NOW+10 covers seconds 7, 8, 9 -> 8 + 9 + 10
        assert stats.rates(NOW + 10)["enqueue"] == pytest.approx(27 / 3)
        stats.count("enqueue", NOW + 5, 1000)      # a clock step back lands in the last bucket
        assert stats.totals()["enqueue"] == 55 + 1000


def _fill_and_drain(index: Any, groups: list[str]) -> None:
    """CLEANUP_N enqueues over ``groups``, every fifth removed, the rest popped (some held and
    released); afterwards nothing may be left over."""
    n, size = CLEANUP_N, len(groups)
    for mid in range(1, n + 1):
        index.add(mid, groups[mid % size], mid * 7919 % 100)
        if mid % 50_000 == 0:
            index.drain_changes()
    for mid in range(1, n + 1, 5):
        index.remove(mid)
    delivered = 0
    while True:
        hold = delivered % 8 == 0
        mid = index.pop(NOW, hold=hold)
        if mid is None:
            break
        delivered += 1
        if hold:
            index.inflight_remove(groups[mid % size])
    assert delivered == n - len(range(1, n + 1, 5))
    index.drain_changes()


def test_oldest_id_follows_the_waiting_messages() -> None:
    """Every index tells its smallest waiting id, through adds, pops, removals and returns."""
    rng = random.Random(7)
    for index in (DelayedIndex(), RoundRobinIndex(), WeightedIndex()):
        waiting: set[int] = set()
        next_id = 1
        for _ in range(3000):
            r = rng.random()
            if r < 0.5 or not waiting:
                index.add(next_id, f"g{next_id % 3}", rng.randrange(0, 5))
                waiting.add(next_id)
                next_id += 1
            elif r < 0.75:
                mid = index.pop(10**10)
                if mid is not None:
                    waiting.discard(mid)
                    if rng.random() < 0.3:          # nacked: back, same id
                        index.add(mid, index_group(mid), 1)
                        waiting.add(mid)
            else:
                mid = rng.choice(sorted(waiting))
                assert index.remove(mid)
                waiting.discard(mid)
            assert index.oldest_id() == (min(waiting) if waiting else None)


def index_group(mid: int) -> str:
    return f"g{mid % 3}"

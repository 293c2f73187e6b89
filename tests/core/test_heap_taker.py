"""HeapTaker, the reader behind the lazy delivery orders of browse and explain.

It takes from many heaps without changing them, re-sorting a small heap at each take and
copying a big one once. Whatever happens to a heap between takes, it must never give a
message twice nor one the heap no longer holds, and a heap that only loses messages is
given in (priority, id) order — on both sides of the small/big boundary.
"""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from doq_lib.queues.base import HeapTaker, PriorityHeap

SIZES = [0, 1, HeapTaker.SMALL - 1, HeapTaker.SMALL, HeapTaker.SMALL + 1, 3 * HeapTaker.SMALL]


def _heap(entries: list[tuple[int, int]]) -> PriorityHeap:
    heap = PriorityHeap()
    for mid, priority in entries:
        heap.push(mid, priority)
    return heap


def test_each_heap_is_taken_whole_in_order_and_left_as_it_was() -> None:
    heaps = [_heap([(1000 * n + i, (i * 7919) % 13) for i in range(size)])
             for n, size in enumerate(SIZES)]
    before = [(list(h._heap), dict(h.prio)) for h in heaps]
    taker = HeapTaker()
    for heap in heaps:
        taken = []
        while (got := taker.take(heap)) is not None:
            taken.append((got[1], got[0]))
        assert taken == list(heap.ordered())
        assert taker.take(heap) is None
    assert [(list(h._heap), dict(h.prio)) for h in heaps] == before


ops = st.lists(st.tuples(st.sampled_from(["take", "push", "remove", "move"]),
                         st.integers(0, len(SIZES) - 1), st.integers(0, 200),
                         st.integers(-5, 5)), max_size=120)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_takes_between_changes_follow_the_heaps(steps: list[tuple[str, int, int, int]]) -> None:
    heaps = [_heap([(1000 * n + i, i % 5) for i in range(size)]) for n, size in enumerate(SIZES)]
    taker = HeapTaker()
    given_ids: set[int] = set()
    last: dict[int, tuple[int, int]] = {}      # per heap: (priority, id) given last
    # heaps that gained or re-prioritised a message: what a big heap's copy was taken
    # before may be missed (as a page of a changing queue may miss it), the rest still holds
    moved: set[int] = set()
    for op, which, value, priority in steps:
        heap = heaps[which]
        if op == "take":
            got = taker.take(heap)
            if got is None:
                # nothing left that was not given already
                assert all(mid in given_ids for mid in heap.prio)
                continue
            mid, p = got
            assert heap.prio.get(mid) == p, "given a message the heap no longer holds"
            assert mid not in given_ids, "given a message twice"
            given_ids.add(mid)
            if which not in moved:
                # the least of what this heap holds and was not given yet, after the last
                assert (p, mid) == min((q, m) for m, q in heap.prio.items()
                                       if m not in given_ids or m == mid)
                assert which not in last or (p, mid) > last[which]
            last[which] = (p, mid)
        elif op == "push":
            heap.push(1000 * which + 500 + value, priority)
            moved.add(which)
        elif op == "remove" and heap.prio:
            heap.remove(sorted(heap.prio)[value % len(heap.prio)])
        elif op == "move" and heap.prio:
            heap.push(sorted(heap.prio)[value % len(heap.prio)], priority)
            moved.add(which)

"""DELAYED queues (SPEC §5.2): one heap, priority ascending then id; a head whose priority is a
unix second in the future is not deliverable before that second."""
from __future__ import annotations

from typing import Iterator

from doq_lib.models import DEFAULT_GROUP
from doq_lib.queues.base import HeapOrder, OldestIds, PriorityHeap, SchedChange


class DelayedIndex:
    def __init__(self) -> None:
        self._heap = PriorityHeap()
        self._oldest = OldestIds()
        self.limited = False          # the queue's one group is out of its rate

    def oldest_id(self, skip: frozenset[int] = frozenset()) -> int | None:
        """The smallest id waiting (ready or scheduled) not in ``skip``; writer thread only."""
        return self._oldest.oldest(self._heap.prio, skip)

    @property
    def ready(self) -> int:
        return len(self._heap)

    def add(self, mid: int, group: str, priority: int) -> None:
        self._heap.push(mid, priority)
        self._oldest.note(mid)

    def remove(self, mid: int) -> bool:
        return self._heap.remove(mid)

    def reprioritize(self, mid: int, priority: int) -> None:
        self._heap.push(mid, priority)

    def pop(self, now_s: int, hold: bool = False) -> int | None:
        head = self._heap.peek()
        if head is None or head[0] > now_s or self.limited:
            return None
        return self._heap.pop()

    def has_ready(self, now_s: int) -> bool:
        head = self._heap.peek()
        return head is not None and head[0] <= now_s and not self.limited

    def priority_of(self, mid: int) -> int | None:
        return self._heap.prio.get(mid)

    def head_priority(self) -> int | None:
        head = self._heap.peek()
        return None if head is None else head[0]

    def seconds_until_due(self, now_s: int) -> float | None:
        """Seconds until the head becomes deliverable (0 if it is), None when empty."""
        head = self._heap.peek()
        if head is None:
            return None
        return float(max(head[0] - now_s, 0))

    def contains(self, mid: int) -> bool:
        return mid in self._heap

    def group_of(self, mid: int) -> str:
        return DEFAULT_GROUP

    def inflight_add(self, group: str) -> None:
        """Delayed queues have no per-group limits."""

    def inflight_remove(self, group: str) -> None:
        """Delayed queues have no per-group limits."""

    def set_max_unacked(self, limit: int) -> None:
        """Ignored for delayed queues (SPEC §5.1)."""

    def drain_changes(self) -> list[SchedChange]:
        return []

    def load_records(self, records: list[tuple[bytes, bytes]]) -> None:
        """Delayed queues keep no scheduler records."""

    def bookkeeping_size(self) -> int:
        return len(self._heap) + self._heap.stale_entries()

    def set_paused(self, groups: tuple[str, ...]) -> None:
        """Delayed queues have no groups to pause."""

    def in_flight(self, group: str) -> int:
        return 0

    def set_limited(self, group: str, limited: bool) -> None:
        self.limited = limited

    def ready_ids(self) -> list[int]:
        return list(self._heap.prio)

    def ready_by_group(self) -> dict[str, int]:
        return {DEFAULT_GROUP: len(self._heap)} if len(self._heap) else {}

    def delivery_order(self, as_is: bool) -> Iterator[int]:
        """Every waiting id in the order dequeues take them (priority, then id), whatever the
        time (a scheduled message comes at its place); the index is not changed."""
        order = self.group_order(DEFAULT_GROUP)
        while (row := order.next()) is not None:
            yield row[0]

    def order(self, as_is: bool = True) -> HeapOrder:
        """Every waiting message in order, lazily: (id, group, priority) rows."""
        return self.group_order(DEFAULT_GROUP)

    def group_order(self, group: str) -> HeapOrder:
        """The waiting messages in order (priority, id) with their priorities, lazily (one
        group: ``default``)."""
        return HeapOrder(self._heap if group == DEFAULT_GROUP else None, DEFAULT_GROUP)

    def group_size(self, group: str) -> int:
        return len(self._heap) if group == DEFAULT_GROUP else 0

    def group_names(self) -> list[str]:
        return [DEFAULT_GROUP] if len(self._heap) else []

    def blocked(self, group: str) -> bool:
        """Whether the queue's one group is out of its rate (a scheduled message's wait is
        its priority: the caller tells by the time)."""
        return self.limited and group == DEFAULT_GROUP and len(self._heap) > 0

    def ordered_ids(self) -> list[int]:
        return [mid for _, mid in self._heap.ordered()]

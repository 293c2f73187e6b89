"""Building blocks of the in-memory queue indexes (L2).

Everything here is deterministic: no clock, no randomness. Time is passed in as ``now_s`` (whole
unix seconds, SPEC conventions). Indexes hold only ids, groups and priorities; message bodies
stay in the store.
"""
from __future__ import annotations

import heapq
import struct
from typing import Any, Iterator, Mapping, Protocol

SchedChange = tuple[bytes, "bytes | None"]   # (record key suffix, value or None = delete)
_U32 = struct.Struct(">I")
_OWN_MARK = b"\xff\xff\xff\xff"
_TWO_U64 = struct.Struct(">QQ")


class OldestIds:
    """The smallest id among the messages an index holds (ids grow with time, so: the oldest),
    kept as a lazy min-heap: ids are pushed as they arrive and skipped once gone. For the
    writer thread only (it pops)."""

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: list[int] = []

    def note(self, mid: int) -> None:
        heapq.heappush(self._ids, mid)

    def oldest(self, present: Mapping[int, object],
               skip: frozenset[int] = frozenset()) -> int | None:
        """The smallest id in ``present`` that is not in ``skip``."""
        ids = self._ids
        if len(ids) > 2 * len(present) + 64:
            ids[:] = present
            heapq.heapify(ids)
        while ids and ids[0] not in present:
            heapq.heappop(ids)
        if not ids or ids[0] not in skip:
            return ids[0] if ids else None
        passed = []                        # the skipped ones go back afterwards
        while ids and (ids[0] not in present or ids[0] in skip):
            mid = heapq.heappop(ids)
            if mid in present:
                passed.append(mid)
        found = ids[0] if ids else None
        for mid in passed:
            heapq.heappush(ids, mid)
        return found


class PriorityHeap:
    """Ready messages ordered by (priority, id) with O(log n) push/pop and O(1) removal.

    Removal is lazy: the id leaves ``prio`` at once and its heap entry is skipped when it
    surfaces; the heap is rebuilt when stale entries outnumber live ones.
    """

    __slots__ = ("_heap", "prio")

    def __init__(self) -> None:
        self._heap: list[tuple[int, int]] = []
        self.prio: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self.prio)

    def __contains__(self, mid: int) -> bool:
        return mid in self.prio

    def push(self, mid: int, priority: int) -> None:
        """Insert, or move an id already present to a new priority."""
        moved = mid in self.prio
        self.prio[mid] = priority
        heapq.heappush(self._heap, (priority, mid))
        if moved:
            self._maybe_compact()

    def remove(self, mid: int) -> bool:
        if self.prio.pop(mid, None) is None:
            return False
        self._maybe_compact()
        return True

    def peek(self) -> tuple[int, int] | None:
        """(priority, id) of the head, or None."""
        heap, prio = self._heap, self.prio
        while heap:
            p, mid = heap[0]
            if prio.get(mid) == p:
                return p, mid
            heapq.heappop(heap)
        return None

    def pop(self) -> int | None:
        head = self.peek()
        if head is None:
            return None
        heapq.heappop(self._heap)
        del self.prio[head[1]]
        return head[1]

    def stale_entries(self) -> int:
        return len(self._heap) - len(self.prio)

    def _maybe_compact(self) -> None:
        if len(self._heap) > 2 * len(self.prio) + 64:
            self._heap = [(p, m) for m, p in self.prio.items()]
            heapq.heapify(self._heap)

    def ordered(self) -> Iterator[tuple[int, int]]:
        """(priority, id) in delivery order (for inspection and tests)."""
        return iter(sorted((p, m) for m, p in self.prio.items()))


class HeapTaker:
    """Takes the messages of many priority heaps, each in (priority, id) order, without
    changing them (the lazy delivery orders of browse and explain). A small heap's next
    message is found by sorting its few entries again (nothing is kept for it but the ids
    given); a big one's heap is copied once. So an order over many groups creates almost no
    objects that outlive a step: the cyclic GC's full collections, which a node holding
    many groups pays for in tenths of a second, are not set off by it. A message gone from
    its heap meanwhile is skipped; none is given twice."""

    SMALL = 16

    __slots__ = ("_copies", "_given")

    def __init__(self) -> None:
        self._copies: dict[int, tuple[PriorityHeap, list[tuple[int, int]]]] = {}
        self._given: set[int] = set()

    def take(self, heap: PriorityHeap) -> tuple[int, int] | None:
        """(id, priority) of ``heap``'s next message, or None when it has no more."""
        given, prio = self._given, heap.prio
        kept = self._copies.get(id(heap))
        if kept is None:
            if len(heap._heap) <= self.SMALL:
                for priority, mid in sorted(heap._heap):
                    if prio.get(mid) == priority and mid not in given:
                        given.add(mid)
                        return mid, priority
                return None
            kept = self._copies[id(heap)] = (heap, list(heap._heap))   # keeps the id unique
        copy = kept[1]
        while copy:
            priority, mid = heapq.heappop(copy)
            if prio.get(mid) == priority and mid not in given:
                given.add(mid)
                return mid, priority
        return None


class HeapOrder:
    """A priority heap's messages in (priority, id) order, lazily, from a copy of the heap
    checked against what the heap holds when each is taken (a message gone meanwhile is
    skipped); ``next`` gives (id, group, priority)."""

    __slots__ = ("_heap", "_prio", "_given", "group")

    def __init__(self, heap: PriorityHeap | None, group: str) -> None:
        self._heap = list(heap._heap) if heap is not None else []   # already a heap
        self._prio = heap.prio if heap is not None else {}
        self._given: set[int] = set()
        self.group = group

    def next(self) -> tuple[int, str, int] | None:
        heap, prio, given = self._heap, self._prio, self._given
        while heap:
            priority, mid = heapq.heappop(heap)
            if prio.get(mid) == priority and mid not in given:
                given.add(mid)
                return mid, self.group, priority
        return None


class QueueIndex(Protocol):
    """What the state machine needs from a queue's in-memory index."""

    @property
    def ready(self) -> int: ...

    def add(self, mid: int, group: str, priority: int) -> None: ...
    def remove(self, mid: int) -> bool: ...
    def reprioritize(self, mid: int, priority: int) -> None: ...
    def pop(self, now_s: int, hold: bool = False) -> int | None: ...
    def has_ready(self, now_s: int) -> bool: ...
    def contains(self, mid: int) -> bool: ...
    def group_of(self, mid: int) -> str: ...
    def priority_of(self, mid: int) -> int | None: ...
    def inflight_add(self, group: str) -> None: ...
    def inflight_remove(self, group: str) -> None: ...
    def set_max_unacked(self, limit: int) -> None: ...
    def drain_changes(self) -> list[SchedChange]: ...
    def load_records(self, records: list[tuple[bytes, bytes]]) -> None: ...
    def bookkeeping_size(self) -> int: ...
    def oldest_id(self, skip: frozenset[int] = frozenset()) -> int | None: ...
    def set_paused(self, groups: tuple[str, ...]) -> None: ...
    def ready_ids(self) -> list[int]: ...
    def ready_by_group(self) -> dict[str, int]: ...
    def delivery_order(self, as_is: bool) -> Iterator[int]: ...
    def order(self, as_is: bool = True) -> Any: ...
    def group_names(self) -> list[str]: ...
    def group_size(self, group: str) -> int: ...
    def blocked(self, group: str) -> bool: ...
    def group_order(self, group: str) -> HeapOrder: ...
    def in_flight(self, group: str) -> int: ...
    def set_limited(self, group: str, limited: bool) -> None: ...


def paused_match(group: str, paused: frozenset[str]) -> str | None:
    """The paused group that covers ``group`` (itself, or the nearest dotted prefix: pausing
    ``a`` pauses ``a.b``), or None."""
    if group in paused:
        return group
    end = group.rfind(".")
    while end > 0:
        if group[:end] in paused:
            return group[:end]
        end = group.rfind(".", 0, end)
    return None


def encode_path(parts: tuple[str, ...], own: bool) -> bytes:
    """Record key for a node of a group tree; ``own`` marks the leaf that holds a group's messages.

    Length-prefixed components, so no group name can make two keys collide.
    """
    out = b"".join(_U32.pack(len(b)) + b for b in (p.encode() for p in parts))
    return out + _OWN_MARK if own else out


def decode_path(key: bytes) -> tuple[tuple[str, ...], bool]:
    parts: list[str] = []
    pos = 0
    while pos < len(key):
        if key[pos:pos + 4] == _OWN_MARK:
            return tuple(parts), True
        (n,) = _U32.unpack_from(key, pos)
        parts.append(key[pos + 4:pos + 4 + n].decode())
        pos += 4 + n
    return tuple(parts), False


def pack_pair(a: int, b: int) -> bytes:
    return _TWO_U64.pack(a, b)


def unpack_pair(raw: bytes) -> tuple[int, int]:
    a, b = _TWO_U64.unpack(raw)
    return a, b

"""FAIR queues, WEIGHTED strategy (SPEC §5.4), made deterministic.

Groups are flat. A group's weight is derived from its load exactly as in SPEC §5.4
(``floor(10 * (1 - unacked / (max_unacked + 1)))``, 10 when unlimited, 0 when empty or at the
limit). Instead of sampling at random (which would make replicas diverge), groups are served by
stride scheduling: each group has a *pass*; the eligible group with the smallest (pass, creation
sequence) is served and its pass grows by ``STRIDE // weight``. Over time every group is served in
proportion to its weight, and every replica makes the same choice. A new group starts at the
pass of the most recently served group, so it neither starves others nor is starved; so does a
group that becomes eligible again after being idle or at its limit, if its pass fell behind (no
credit for time it could not be served).
"""
from __future__ import annotations

import heapq
import struct
from typing import Iterator

from doq_lib.queues.base import (
    HeapOrder,
    HeapTaker,
    OldestIds,
    PriorityHeap,
    SchedChange,
    pack_pair,
    paused_match,
    unpack_pair,
)

STRIDE = 2520          # lcm(1..10): every weight divides it exactly
MAX_WEIGHT = 10
_ROOT_KEY = b"r"
_SEQ = struct.Struct(">Q")     # group records are keyed by sequence: names are unbounded


def calculate_weight(ready: int, unacked: int, max_unacked: int) -> int:
    if ready == 0:
        return 0
    if max_unacked == 0:
        return MAX_WEIGHT
    if unacked >= max_unacked:
        return 0
    return MAX_WEIGHT * (max_unacked + 1 - unacked) // (max_unacked + 1)


class _Group:
    __slots__ = ("name", "seq", "pass_", "heap", "inflight", "eligible", "queued", "key")

    def __init__(self, name: str, seq: int, pass_: int) -> None:
        self.name = name
        self.seq = seq
        self.pass_ = pass_
        self.heap = PriorityHeap()
        self.inflight = 0
        self.eligible = False
        self.queued: tuple[int, int] | None = None   # (pass, seq) of its live candidate entry
        self.key = b"g" + _SEQ.pack(seq)


class WeightedIndex:
    def __init__(self, max_unacked: int = 0) -> None:
        self.max_unacked = max_unacked
        self.paused: frozenset[str] = frozenset()     # groups skipped with their sub-groups
        self.limited: set[str] = set()                # groups out of their delivery rate
        self.groups: dict[str, _Group] = {}
        self.next_seq = 1
        self.vpass = 0
        self.ready = 0
        self.eligible_groups = 0
        self._cand: list[tuple[int, int, str]] = []
        self._loc: dict[int, _Group] = {}
        self._oldest = OldestIds()
        self._dirty: dict[bytes, _Group | None] = {}   # None = the root record
        self._loading = False

    def weight(self, group: _Group) -> int:
        """0 for a paused group: not served, as if it had nothing ready."""
        if self.paused and paused_match(group.name, self.paused):
            return 0
        if self.limited and group.name in self.limited:
            return 0
        return calculate_weight(len(group.heap), group.inflight, self.max_unacked)

    def _group(self, name: str) -> _Group:
        group = self.groups.get(name)
        if group is None:
            group = _Group(name, self.next_seq, self.vpass)
            self.next_seq += 1
            self.groups[name] = group
            self._dirty[group.key] = group
            self._dirty[_ROOT_KEY] = None
        return group

    def _refresh(self, group: _Group) -> None:
        ok = self.weight(group) > 0
        if ok != group.eligible:
            group.eligible = ok
            self.eligible_groups += 1 if ok else -1
            if not self.eligible_groups:
                self._cand.clear()       # every entry is stale now
            if ok and group.pass_ < self.vpass and not self._loading:
                group.pass_ = self.vpass
                self._dirty[group.key] = group
        if not ok:
            group.queued = None
        elif group.queued != (group.pass_, group.seq):
            group.queued = (group.pass_, group.seq)
            heapq.heappush(self._cand, (group.pass_, group.seq, group.name))
        if not len(group.heap) and not group.inflight:
            del self.groups[group.name]
            self._dirty[group.key] = group   # written as a deletion: it is no longer in groups

    def add(self, mid: int, group: str, priority: int) -> None:
        g = self._group(group)
        g.heap.push(mid, priority)
        self._loc[mid] = g
        self._oldest.note(mid)
        self.ready += 1
        self._refresh(g)

    def remove(self, mid: int) -> bool:
        g = self._loc.pop(mid, None)
        if g is None:
            return False
        g.heap.remove(mid)
        self.ready -= 1
        self._refresh(g)
        return True

    def reprioritize(self, mid: int, priority: int) -> None:
        self._loc[mid].heap.push(mid, priority)

    def _best(self) -> _Group | None:
        cand = self._cand
        while cand:
            pass_, seq, name = cand[0]
            g = self.groups.get(name)
            if g is not None and g.seq == seq and g.queued == (pass_, seq) and g.eligible:
                return g
            heapq.heappop(cand)
            if g is not None and g.queued == (pass_, seq):
                g.queued = None
        return None

    def pop(self, now_s: int, hold: bool = False) -> int | None:
        if not self.eligible_groups:
            return None
        g = self._best()
        assert g is not None, "eligible count out of sync"
        stride = STRIDE // self.weight(g)
        mid = g.heap.pop()
        assert mid is not None
        del self._loc[mid]
        self.ready -= 1
        self.vpass = g.pass_
        g.pass_ += stride
        g.queued = None
        if hold:
            g.inflight += 1
        self._dirty[g.key] = g
        self._dirty[_ROOT_KEY] = None
        self._refresh(g)
        return mid

    def has_ready(self, now_s: int) -> bool:
        return self.eligible_groups > 0

    def contains(self, mid: int) -> bool:
        return mid in self._loc

    def oldest_id(self, skip: frozenset[int] = frozenset()) -> int | None:
        """The smallest id waiting not in ``skip``; writer thread only."""
        return self._oldest.oldest(self._loc, skip)

    def group_of(self, mid: int) -> str:
        return self._loc[mid].name

    def priority_of(self, mid: int) -> int | None:
        """The priority of a ready message (None: not ready here)."""
        place = self._loc.get(mid)
        return None if place is None else place.heap.prio.get(mid)

    def inflight_add(self, group: str) -> None:
        g = self._group(group)
        g.inflight += 1
        self._refresh(g)

    def inflight_remove(self, group: str) -> None:
        g = self.groups.get(group)
        if g is None or g.inflight == 0:
            return
        g.inflight -= 1
        self._refresh(g)

    def set_max_unacked(self, limit: int) -> None:
        self.max_unacked = limit
        for g in list(self.groups.values()):
            self._refresh(g)

    def set_paused(self, groups: tuple[str, ...]) -> None:
        """Skip ``groups`` and their sub-groups; a resumed group starts again at the pass of
        the group served last (no credit for the time it was paused)."""
        self.paused = frozenset(groups)
        for g in list(self.groups.values()):
            self._refresh(g)

    def delivery_order(self, as_is: bool) -> Iterator[int]:
        """Ids in the order stride scheduling hands them out from now (this index is not
        changed): ``as_is`` keeps the pauses, rates and in-flight limits (consumers that ack
        at once), else every group takes its turn."""
        order = WeightedOrder(self, as_is)
        while (row := order.next()) is not None:
            yield row[0]

    def order(self, as_is: bool = True) -> "WeightedOrder":
        """The delivery order from now, computed lazily (:class:`WeightedOrder`)."""
        return WeightedOrder(self, as_is)

    def group_order(self, group: str) -> HeapOrder:
        """``group``'s ready messages in the order it delivers them, lazily."""
        g = self.groups.get(group)
        return HeapOrder(g.heap if g is not None else None, group)

    def group_size(self, group: str) -> int:
        """How many ready messages ``group`` has."""
        g = self.groups.get(group)
        return len(g.heap) if g is not None else 0

    def group_names(self) -> list[str]:
        """Every group with ready messages or deliveries (a copy)."""
        return list(self.groups)

    def blocked(self, group: str) -> bool:
        """Whether ``group`` has ready messages that are not deliverable now (paused, out
        of its rate, at max_unacked)."""
        g = self.groups.get(group)
        return g is not None and len(g.heap) > 0 and not g.eligible

    def in_flight(self, group: str) -> int:
        g = self.groups.get(group)
        return g.inflight if g is not None else 0

    def set_limited(self, group: str, limited: bool) -> None:
        """Skip ``group`` while it is out of its delivery rate."""
        if limited:
            self.limited.add(group)
        else:
            self.limited.discard(group)
        g = self.groups.get(group)
        if g is not None:
            self._refresh(g)

    def ready_ids(self) -> list[int]:
        return list(self._loc)

    def ready_by_group(self) -> dict[str, int]:
        return {name: len(g.heap) for name, g in list(self.groups.items()) if len(g.heap)}

    def drain_changes(self) -> list[SchedChange]:
        out: list[SchedChange] = []
        for key, g in self._dirty.items():
            if g is None:
                out.append((key, pack_pair(self.next_seq, self.vpass)))
            elif self.groups.get(g.name) is g:
                out.append((key, pack_pair(g.seq, g.pass_) + g.name.encode()))
            else:
                out.append((key, None))
        self._dirty.clear()
        return out

    def load_records(self, records: list[tuple[bytes, bytes]]) -> None:
        """Restore groups and passes; messages and deliveries are re-added, then finish_load."""
        self._loading = True      # transient states while re-adding must not move any pass
        for key, raw in records:
            a, b = unpack_pair(raw[:16])
            if key == _ROOT_KEY:
                self.next_seq, self.vpass = a, b
            else:
                name = raw[16:].decode()
                self.groups[name] = _Group(name, a, b)

    def finish_load(self) -> None:
        """Drop groups that came back with neither messages nor deliveries (none expected)."""
        self._loading = False
        for g in list(self.groups.values()):
            self._refresh(g)

    def bookkeeping_size(self) -> int:
        stale = sum(g.heap.stale_entries() for g in self.groups.values())
        return len(self.groups) + len(self._loc) + len(self._cand) + stale


class WeightedOrder:
    """The order stride scheduling hands messages out from now, computed lazily and never
    on the index itself: a group's pass and stride are noted when the walk first reaches
    it (and its messages taken through a :class:`HeapTaker`), so a page costs about what it
    lists. With ``as_is`` the groups deliverable now take their turns, else every group
    with messages (a group that is not deliverable now starts at the pass the index would
    give it). The index may change between calls (a read taken in slices): what was noted
    stays, the rest is read as it is then, and a message gone meanwhile is skipped."""

    __slots__ = ("index", "as_is", "_cand", "_pass", "_stride", "_taker")

    def __init__(self, index: WeightedIndex, as_is: bool) -> None:
        self.index = index
        self.as_is = as_is
        self._pass: dict[str, int] = {}           # ints only: nothing for the GC to track
        self._stride: dict[str, int] = {}
        self._taker = HeapTaker()
        if as_is:
            self._cand = list(index._cand)       # already a heap; checked entry by entry
        else:
            vpass = index.vpass
            self._cand = [(g.pass_ if g.eligible else max(g.pass_, vpass), g.seq, g.name)
                          for g in list(index.groups.values()) if len(g.heap)]
            heapq.heapify(self._cand)

    def next(self) -> tuple[int, str] | None:
        """The next (id, group) (None: nothing more)."""
        cand, index = self._cand, self.index
        while cand:
            pass_, seq, name = cand[0]
            g = index.groups.get(name)
            noted = self._pass.get(name)
            if noted is None:
                weight = index.weight(g) if g is not None and self.as_is else MAX_WEIGHT
                if g is None or g.seq != seq or weight <= 0 or (
                        self.as_is and g.queued != (pass_, seq)):
                    heapq.heappop(cand)            # superseded, gone or not deliverable
                    continue
                self._stride[name] = STRIDE // weight
            elif noted != pass_:
                heapq.heappop(cand)
                continue
            got = self._taker.take(g.heap) if g is not None and g.seq == seq else None
            if got is None:
                heapq.heappop(cand)                # the group has nothing more
                continue
            self._pass[name] = pass_ + self._stride[name]
            heapq.heapreplace(cand, (self._pass[name], seq, name))
            return got[0], name
        return None

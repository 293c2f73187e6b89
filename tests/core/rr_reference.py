"""FAIR queues, ROUND_ROBIN strategy (SPEC §5.3): hierarchical round robin over dot-groups.

The group ``a.b`` is the path ``a`` -> ``b``; its messages live in an *own leaf* under node
``a.b``. Giving every group its own leaf means a group that is also the prefix of another
(``a`` and ``a.b``) is served too instead of being stranded: node ``a`` rotates between its own
leaf and child ``b``.

Every node keeps its children in order of first appearance (a creation sequence number) and a
cursor: the sequence number of the next child to try. The cursors and sequence numbers are the
scheduler state; they change deterministically with each operation and are persisted as records
(:meth:`drain_changes`) so a restarted replica rebuilds exactly the same rotation.

A record is keyed by the node's sequence number (never reused within a queue), not by its path:
group names are unbounded and LMDB keys are not. Its value holds (sequence, cursor) and, except
for the root, the parent's sequence number, the own-leaf flag and the node's name.
"""
from __future__ import annotations

import bisect
import copy
import struct
from typing import Iterator

from doq_lib.queues.base import (
    OldestIds,
    PriorityHeap,
    SchedChange,
    pack_pair,
    paused_match,
    unpack_pair,
)

_SEQ = struct.Struct(">Q")
_ROOT_KEY = _SEQ.pack(0)


class _Node:
    __slots__ = ("parts", "own", "seq", "parent", "children", "order", "seqs", "cursor",
                 "heap", "group", "eligible", "key")

    def __init__(self, parts: tuple[str, ...], own: bool, seq: int,
                 parent: "_Node | None") -> None:
        self.parts = parts
        self.own = own
        self.seq = seq
        self.parent = parent
        self.children: dict[str | None, _Node] = {}   # None = the own leaf
        self.order: list[_Node] = []                   # children by creation sequence
        self.seqs: list[int] = []
        self.cursor = 0                                # 0 = unset: start at the first child
        self.heap = PriorityHeap() if own else None
        self.group = ".".join(parts)
        self.eligible = 0                              # deliverable leaves in this subtree
        self.key = _SEQ.pack(seq)

    def attach(self, name: str | None, child: "_Node") -> None:
        self.children[name] = child
        pos = bisect.bisect_left(self.seqs, child.seq)
        self.seqs.insert(pos, child.seq)
        self.order.insert(pos, child)

    def detach(self, name: str | None, child: "_Node") -> None:
        del self.children[name]
        pos = bisect.bisect_left(self.seqs, child.seq)
        del self.seqs[pos]
        del self.order[pos]


class RoundRobinIndex:
    def __init__(self, max_unacked: int = 0) -> None:
        self.max_unacked = max_unacked
        self.paused: frozenset[str] = frozenset()     # groups skipped with their sub-groups
        self.limited: set[str] = set()                # groups out of their delivery rate
        self.root = _Node((), False, 0, None)
        self.next_seq = 1
        self.ready = 0
        self.inflight: dict[str, int] = {}
        self._loc: dict[int, _Node] = {}
        self._oldest = OldestIds()
        self._dirty: dict[bytes, _Node] = {}
        self._deleted: dict[bytes, None] = {}

    # -- structure -------------------------------------------------------------------------
    def _touch(self, node: _Node) -> None:
        self._dirty[node.key] = node
        self._deleted.pop(node.key, None)

    def _new_child(self, parent: _Node, name: str | None) -> _Node:
        parts = parent.parts if name is None else parent.parts + (name,)
        child = _Node(parts, name is None, self.next_seq, parent)
        self.next_seq += 1
        parent.attach(name, child)
        self._touch(child)
        self._touch(self.root)       # next_seq lives in the root record
        return child

    def _leaf(self, group: str, create: bool) -> _Node | None:
        node = self.root
        for name in (*group.split("."), None):
            child = node.children.get(name)
            if child is None:
                if not create:
                    return None
                child = self._new_child(node, name)
            node = child
        return node

    def _prune(self, node: _Node) -> None:
        """Remove emptied nodes upward (never the root)."""
        while node.parent is not None and (not node.heap if node.own else not node.order):
            parent = node.parent
            parent.detach(None if node.own else node.parts[-1], node)
            self._dirty.pop(node.key, None)
            self._deleted[node.key] = None
            if parent.cursor == node.seq:
                parent.cursor = parent.order[0].seq if parent.order else 0
                self._touch(parent)
            node = parent

    # -- eligibility ----------------------------------------------------------------------
    def _leaf_ok(self, leaf: _Node) -> int:
        if len(leaf.heap) == 0:  # type: ignore[arg-type]
            return 0
        if self.paused and paused_match(leaf.group, self.paused):
            return 0
        if self.limited and leaf.group in self.limited:
            return 0
        limit = self.max_unacked
        return 1 if limit == 0 or self.inflight.get(leaf.group, 0) < limit else 0

    def _refresh(self, leaf: _Node | None) -> None:
        if leaf is None:
            return
        delta = self._leaf_ok(leaf) - leaf.eligible
        if delta:
            node: _Node | None = leaf
            while node is not None:
                node.eligible += delta
                node = node.parent

    # -- QueueIndex ----------------------------------------------------------------------------
    def add(self, mid: int, group: str, priority: int) -> None:
        leaf = self._leaf(group, create=True)
        assert leaf is not None and leaf.heap is not None
        leaf.heap.push(mid, priority)
        self._loc[mid] = leaf
        self._oldest.note(mid)
        self.ready += 1
        self._refresh(leaf)

    def remove(self, mid: int) -> bool:
        leaf = self._loc.pop(mid, None)
        if leaf is None:
            return False
        leaf.heap.remove(mid)  # type: ignore[union-attr]
        self.ready -= 1
        self._refresh(leaf)
        self._prune(leaf)
        return True

    def reprioritize(self, mid: int, priority: int) -> None:
        """New priority for a ready message; it keeps its group and the group its place."""
        self._loc[mid].heap.push(mid, priority)  # type: ignore[union-attr]

    def _choose(self, node: _Node) -> _Node:
        order = node.order
        n = len(order)
        start = bisect.bisect_left(node.seqs, node.cursor)
        if start >= n or order[start].seq != node.cursor:
            start = 0
        for k in range(n):
            child = order[(start + k) % n]
            if child.eligible:
                nxt = order[(start + k + 1) % n].seq
                if nxt != node.cursor:
                    node.cursor = nxt
                    self._touch(node)
                return child
        raise AssertionError("eligible count out of sync")

    def pop(self, now_s: int, hold: bool = False) -> int | None:
        if not self.root.eligible:
            return None
        node = self.root
        while not node.own:
            node = self._choose(node)
        mid = node.heap.pop()  # type: ignore[union-attr]
        assert mid is not None
        del self._loc[mid]
        self.ready -= 1
        if hold:
            self.inflight[node.group] = self.inflight.get(node.group, 0) + 1
        self._refresh(node)
        self._prune(node)
        return mid

    def has_ready(self, now_s: int) -> bool:
        return self.root.eligible > 0

    def contains(self, mid: int) -> bool:
        return mid in self._loc

    def oldest_id(self) -> int | None:
        """The smallest id waiting; writer thread only."""
        return self._oldest.oldest(self._loc)

    def group_of(self, mid: int) -> str:
        return self._loc[mid].group

    def priority_of(self, mid: int) -> int | None:
        """The priority of a ready message (None: not ready here)."""
        place = self._loc.get(mid)
        return None if place is None else place.heap.prio.get(mid)  # type: ignore[union-attr]

    def inflight_add(self, group: str) -> None:
        self.inflight[group] = self.inflight.get(group, 0) + 1
        self._refresh(self._leaf(group, create=False))

    def inflight_remove(self, group: str) -> None:
        count = self.inflight.get(group, 0) - 1
        if count > 0:
            self.inflight[group] = count
        else:
            self.inflight.pop(group, None)
        self._refresh(self._leaf(group, create=False))

    def set_max_unacked(self, limit: int) -> None:
        self.max_unacked = limit
        self._refresh_all()

    def set_paused(self, groups: tuple[str, ...]) -> None:
        """Skip ``groups`` and their sub-groups: the rotation goes on as if they were absent
        (their place in it is kept for when they are resumed)."""
        self.paused = frozenset(groups)
        self._refresh_all()

    def in_flight(self, group: str) -> int:
        return self.inflight.get(group, 0)

    def set_limited(self, group: str, limited: bool) -> None:
        """Skip ``group`` (not its sub-groups) while it is out of its delivery rate."""
        if limited:
            self.limited.add(group)
        else:
            self.limited.discard(group)
        self._refresh(self._leaf(group, create=False))

    def ready_ids(self) -> list[int]:
        return list(self._loc)

    def ready_by_group(self) -> dict[str, int]:
        out: dict[str, int] = {}
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.own and len(node.heap):  # type: ignore[arg-type]
                out[node.group] = len(node.heap)  # type: ignore[arg-type]
            stack.extend(node.order)
        return out

    def delivery_order(self, as_is: bool) -> Iterator[int]:
        """Ids in the order the rotation hands them out from now, on a copy (this index is
        not changed): ``as_is`` keeps the pauses and in-flight limits (what consumers that
        ack at once would get: blocked groups never come), else every group takes its turn."""
        twin = copy.deepcopy(self)
        if not as_is:
            twin.paused, twin.inflight, twin.max_unacked = frozenset(), {}, 0
            twin.limited = set()
            twin._refresh_all()
        while (mid := twin.pop(0)) is not None:
            yield mid

    def _refresh_all(self) -> None:
        stack = [self.root]
        while stack:
            node = stack.pop()
            if node.own:
                self._refresh(node)
            stack.extend(node.order)

    # -- persistence ---------------------------------------------------------------------------
    def drain_changes(self) -> list[SchedChange]:
        out: list[SchedChange] = []
        for key, node in self._dirty.items():
            if node.parent is None:
                out.append((key, pack_pair(self.next_seq, node.cursor)))
                continue
            name = b"" if node.own else node.parts[-1].encode()
            out.append((key, pack_pair(node.seq, node.cursor) + _SEQ.pack(node.parent.seq)
                        + (b"\x01" if node.own else b"\x00") + name))
        out.extend((key, None) for key in self._deleted)
        self._dirty.clear()
        self._deleted.clear()
        return out

    def load_records(self, records: list[tuple[bytes, bytes]]) -> None:
        """Rebuild the tree skeleton from persisted records (before messages are added)."""
        parsed = []
        for key, raw in records:
            first, cursor = unpack_pair(raw[:16])
            if key == _ROOT_KEY:
                self.next_seq, self.root.cursor = first, cursor
                continue
            parent_seq = _SEQ.unpack_from(raw, 16)[0]
            parsed.append((first, cursor, parent_seq, raw[24] == 1, raw[25:].decode()))
        parsed.sort()                 # a parent is always created before its children
        nodes = {0: self.root}
        for seq, cursor, parent_seq, own, name in parsed:
            parent = nodes[parent_seq]
            node = _Node(parent.parts if own else parent.parts + (name,), own, seq, parent)
            node.cursor = cursor
            parent.attach(None if own else name, node)
            nodes[seq] = node

    def bookkeeping_size(self) -> int:
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += 1 + (node.heap.stale_entries() if node.heap is not None else 0)
            stack.extend(node.order)
        return count - 1 + len(self._loc) + len(self.inflight)

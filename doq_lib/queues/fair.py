"""FAIR queues, ROUND_ROBIN strategy: hierarchical round robin over dot-groups.

The group ``a.b`` is the path ``a`` -> ``b``. Every node of the path rotates between its
children in the order they first appeared (a group that is also the prefix of another, ``a``
and ``a.b``, is served as a child of its own, its *own leaf*, beside ``b``), with a cursor
naming the child to try next. The cursors and the children's order are the scheduler state;
they change deterministically with each operation and are persisted as records
(:meth:`drain_changes`) so a restarted replica rebuilds exactly the same rotation.

**The tree is path-compressed**: a node that would have a single child (a chain
of labels no other group branches from) is not kept; its child's edge carries the labels of
the whole chain. A rotation over one child is no rotation, and a node that gets a second
child takes the same place and starts its rotation at its older child, exactly as a kept
node would, so the order of deliveries is that of the full tree (``tests/core/
test_rr_compressed.py`` checks it against the full tree's implementation); but a new group
adds at most two nodes whatever its depth, and no node holds its whole path. Every node has
a *rank* among its siblings (in the order they appeared; a node that takes another's place
takes its rank), and a cursor is the rank of the child to try next.

A record is keyed by the node's sequence number (never reused within a queue), not by its
path: ``seq, cursor, parent seq, rank, next rank, flags`` and the edge's labels; the root's
record holds the next sequence number, its cursor and next rank. Records of the earlier,
uncompressed format (one node per label) are converted when loaded and rewritten whole at
the queue's next change.
"""
from __future__ import annotations

import bisect
import struct
from typing import Iterator

from doq_lib.queues.base import (
    HeapOrder,
    OldestIds,
    PriorityHeap,
    SchedChange,
    paused_match,
    unpack_pair,
)
from doq_lib.queues.fair_order import RoundRobinOrder

_SEQ = struct.Struct(">Q")
_ROOT_KEY = _SEQ.pack(0)
_ROOT = struct.Struct(">QQQB")           # next seq, cursor (a rank), next rank, flags
_NODE = struct.Struct(">QQQQQB")         # seq, cursor, parent seq, rank, next rank, flags
_LABEL = struct.Struct(">I")
_OWN, _V2 = 0x01, 0x02


class FairNode:
    __slots__ = ("edge", "first", "skip", "own", "seq", "rank", "parent", "children", "order",
                 "ranks", "next_rank", "cursor", "heap", "group", "eligible", "key")

    def __init__(self, labels: tuple[str, ...], own: bool, seq: int) -> None:
        # The edge from the parent: a group node keeps its labels; a leaf keeps only where
        # its edge starts among its group's labels (``skip``), so a group costs the same
        # whatever its depth (its name is kept anyway). ``first``: the edge's first label,
        # the parent's key for it (None: an own leaf's empty edge).
        self.edge: tuple[str, ...] | None = labels
        self.first = labels[0] if labels else None
        self.skip = 0
        self.own = own                       # a leaf: holds one group's messages
        self.seq = seq
        self.rank = 0                        # place among its siblings (1, 2, ...)
        self.parent: FairNode | None = None
        self.children: dict[str | None, FairNode] = {}    # by first label; None: an own leaf
        self.order: list[FairNode] = []                   # children by rank
        self.ranks: list[int] = []
        self.next_rank = 1
        self.cursor = 0                      # rank of the child to try next (0: the first)
        self.heap = PriorityHeap() if own else None
        self.group = ""                      # a leaf's group
        self.eligible = 0                    # deliverable leaves in this subtree
        self.key = _SEQ.pack(seq)

    @property
    def labels(self) -> tuple[str, ...]:
        """The edge's labels (a leaf's, computed from its group's name)."""
        if self.edge is not None:
            return self.edge
        return tuple(self.group.split(".")[self.skip:])

    def set_labels(self, labels: tuple[str, ...], skip: int = 0) -> None:
        """A new edge (``skip``: for a leaf, where it starts among its group's labels)."""
        self.first = labels[0] if labels else None
        if self.own and self.group:
            self.edge, self.skip = None, skip
        else:
            self.edge = labels

    def attach(self, child: "FairNode") -> None:
        self.children[child.first] = child
        child.parent = self
        pos = bisect.bisect_left(self.ranks, child.rank)
        self.ranks.insert(pos, child.rank)
        self.order.insert(pos, child)

    def detach(self, child: "FairNode") -> None:
        del self.children[child.first]
        pos = bisect.bisect_left(self.ranks, child.rank)
        del self.ranks[pos]
        del self.order[pos]


def _encode_labels(labels: tuple[str, ...]) -> bytes:
    return b"".join(_LABEL.pack(len(raw)) + raw for raw in (label.encode() for label in labels))


def _decode_labels(raw: bytes) -> tuple[str, ...]:
    labels, pos = [], 0
    while pos < len(raw):
        (size,) = _LABEL.unpack_from(raw, pos)
        if pos + 4 + size > len(raw):
            raise ValueError("a scheduler record's labels are cut short")
        labels.append(raw[pos + 4:pos + 4 + size].decode())
        pos += 4 + size
    return tuple(labels)


class RoundRobinIndex:
    def __init__(self, max_unacked: int = 0) -> None:
        self.max_unacked = max_unacked
        self.paused: frozenset[str] = frozenset()     # groups skipped with their sub-groups
        self.limited: set[str] = set()                # groups out of their delivery rate
        self.root = FairNode((), False, 0)
        self.next_seq = 1
        self.ready = 0
        self.inflight: dict[str, int] = {}
        self._leaves: dict[str, FairNode] = {}           # group -> its leaf
        self._loc: dict[int, FairNode] = {}
        self._oldest = OldestIds()
        self._dirty: dict[bytes, FairNode] = {}
        self._deleted: dict[bytes, None] = {}
        # records of the old format were loaded: all of them are written anew (and the old
        # chain nodes' deleted) at the first change after the load (see finish_load)
        self._rewrite = False
        self._stale: list[bytes] = []
        self._armed = True

    # -- structure -------------------------------------------------------------------------
    def _touch(self, node: FairNode) -> None:
        self._dirty[node.key] = node
        self._deleted.pop(node.key, None)

    def _drop(self, node: FairNode) -> None:
        self._dirty.pop(node.key, None)
        self._deleted[node.key] = None

    def _new_node(self, labels: tuple[str, ...], own: bool) -> FairNode:
        node = FairNode(labels, own, self.next_seq)
        self.next_seq += 1
        self._touch(self.root)                    # next_seq lives in the root record
        self._touch(node)
        return node

    def _append(self, parent: FairNode, child: FairNode) -> None:
        """``child`` becomes ``parent``'s newest child."""
        child.rank = parent.next_rank
        parent.next_rank += 1
        parent.attach(child)
        self._touch(parent)                       # its next rank changed

    def _leaf(self, group: str) -> FairNode:
        """The leaf of ``group``, made (with at most one more node) if it has none."""
        leaf = self._leaves.get(group)
        if leaf is not None:
            return leaf
        labels = tuple(group.split("."))
        node, i = self.root, 0
        while True:
            rest = labels[i:]
            child = node.children.get(rest[0] if rest else None)
            if child is None:
                leaf = self._new_node(rest, True)
                leaf.group = group
                leaf.set_labels(rest, i)
                self._append(node, leaf)
                self._leaves[group] = leaf
                return leaf
            edge = child.labels
            common = 0
            while common < len(edge) and common < len(rest) and edge[common] == rest[common]:
                common += 1
            if common == len(edge) and not child.own:
                node, i = child, i + common       # the whole edge matches: go down
                continue
            # the group branches off inside the edge (or goes on past a leaf): a node takes
            # the edge's place and rank, the old child and the new leaf hang from it
            node = self._split(child, common)
            i += common

    def _split(self, child: FairNode, at: int) -> FairNode:
        parent = child.parent
        assert parent is not None
        parent.detach(child)
        labels = child.labels
        middle = self._new_node(labels[:at], False)
        middle.rank = child.rank
        middle.eligible = child.eligible
        parent.attach(middle)
        child.set_labels(labels[at:], child.skip + at)
        child.rank = middle.next_rank
        middle.next_rank += 1
        middle.attach(child)
        self._touch(child)
        return middle

    def _remove_leaf(self, leaf: FairNode) -> None:
        """Take an emptied leaf out; a node left with one child gives it its place."""
        parent = leaf.parent
        assert parent is not None
        parent.detach(leaf)
        self._drop(leaf)
        del self._leaves[leaf.group]
        if parent.cursor == leaf.rank:
            parent.cursor = parent.ranks[0] if parent.ranks else 0
            self._touch(parent)
        if parent is self.root or len(parent.order) != 1:
            return
        (only,) = parent.order
        above = parent.parent
        assert above is not None
        above.detach(parent)
        parent.detach(only)
        self._drop(parent)
        above_labels = parent.labels
        only.set_labels(above_labels + only.labels, only.skip - len(above_labels))
        only.rank = parent.rank
        above.attach(only)
        self._touch(only)

    # -- eligibility ----------------------------------------------------------------------
    def _leaf_ok(self, leaf: FairNode) -> int:
        if len(leaf.heap) == 0:  # type: ignore[arg-type]
            return 0
        if self.paused and paused_match(leaf.group, self.paused):
            return 0
        if self.limited and leaf.group in self.limited:
            return 0
        limit = self.max_unacked
        return 1 if limit == 0 or self.inflight.get(leaf.group, 0) < limit else 0

    def _refresh(self, leaf: FairNode | None) -> None:
        if leaf is None:
            return
        delta = self._leaf_ok(leaf) - leaf.eligible
        if delta:
            node: FairNode | None = leaf
            while node is not None:
                node.eligible += delta
                node = node.parent

    def _refresh_all(self) -> None:
        for leaf in list(self._leaves.values()):
            self._refresh(leaf)

    # -- QueueIndex ----------------------------------------------------------------------------
    def add(self, mid: int, group: str, priority: int) -> None:
        leaf = self._leaf(group)
        assert leaf.heap is not None
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
        if not leaf.heap:
            self._remove_leaf(leaf)
        return True

    def reprioritize(self, mid: int, priority: int) -> None:
        """New priority for a ready message; it keeps its group and the group its place."""
        self._loc[mid].heap.push(mid, priority)  # type: ignore[union-attr]

    def _choose(self, node: FairNode) -> FairNode:
        order = node.order
        n = len(order)
        start = bisect.bisect_left(node.ranks, node.cursor)
        if start >= n or node.ranks[start] != node.cursor:
            start = 0
        for k in range(n):
            child = order[(start + k) % n]
            if child.eligible:
                nxt = node.ranks[(start + k + 1) % n]
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
        if not node.heap:
            self._remove_leaf(node)
        return mid

    def has_ready(self, now_s: int) -> bool:
        return self.root.eligible > 0

    def contains(self, mid: int) -> bool:
        return mid in self._loc

    def oldest_id(self, skip: frozenset[int] = frozenset()) -> int | None:
        """The smallest id waiting not in ``skip``; writer thread only."""
        return self._oldest.oldest(self._loc, skip)

    def group_of(self, mid: int) -> str:
        return self._loc[mid].group

    def priority_of(self, mid: int) -> int | None:
        """The priority of a ready message (None: not ready here)."""
        place = self._loc.get(mid)
        return None if place is None else place.heap.prio.get(mid)  # type: ignore[union-attr]

    def inflight_add(self, group: str) -> None:
        self.inflight[group] = self.inflight.get(group, 0) + 1
        self._refresh(self._leaves.get(group))

    def inflight_remove(self, group: str) -> None:
        count = self.inflight.get(group, 0) - 1
        if count > 0:
            self.inflight[group] = count
        else:
            self.inflight.pop(group, None)
        self._refresh(self._leaves.get(group))

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
        self._refresh(self._leaves.get(group))

    def ready_ids(self) -> list[int]:
        return list(self._loc)

    def ready_by_group(self) -> dict[str, int]:
        return {group: len(leaf.heap) for group, leaf in list(self._leaves.items())
                if leaf.heap}

    def group_size(self, group: str) -> int:
        """How many ready messages ``group`` has."""
        leaf = self._leaves.get(group)
        return len(leaf.heap) if leaf is not None else 0  # type: ignore[arg-type]

    def group_names(self) -> list[str]:
        """Every group with ready messages (a copy)."""
        return list(self._leaves)

    def blocked(self, group: str) -> bool:
        """Whether ``group`` has ready messages that are not deliverable now (paused, out
        of its rate, at max_unacked)."""
        leaf = self._leaves.get(group)
        return leaf is not None and bool(leaf.heap) and not self._leaf_ok(leaf)

    def delivery_order(self, as_is: bool) -> Iterator[int]:
        """Ids in the order the rotation hands them out from now (this index is not
        changed); ``as_is``: only what is deliverable now (pauses, rates and in-flight
        limits kept: what consumers that ack at once would get), else every group."""
        sim = RoundRobinOrder(self, as_is)
        while (row := sim.next()) is not None:
            yield row[0]

    def order(self, as_is: bool = True) -> RoundRobinOrder:
        """The delivery order from now, computed lazily (:class:`RoundRobinOrder`)."""
        return RoundRobinOrder(self, as_is)

    def group_order(self, group: str) -> "HeapOrder":
        """``group``'s ready messages in the order it delivers them, lazily."""
        leaf = self._leaves.get(group)
        return HeapOrder(leaf.heap if leaf is not None else None, group)

    # -- persistence ---------------------------------------------------------------------------
    def drain_changes(self) -> list[SchedChange]:
        if self._rewrite and self._armed:         # records of the old format: all anew
            self._rewrite = False
            stack = [self.root]
            while stack:
                node = stack.pop()
                self._dirty[node.key] = node
                stack.extend(node.order)
            for key in self._stale:
                self._deleted[key] = None
            self._stale.clear()
        self._armed = True
        out: list[SchedChange] = []
        for key, node in self._dirty.items():
            if node is self.root:
                out.append((key, _ROOT.pack(self.next_seq, node.cursor, node.next_rank, _V2)))
                continue
            assert node.parent is not None
            flags = _V2 | (_OWN if node.own else 0)
            out.append((key, _NODE.pack(node.seq, node.cursor, node.parent.seq, node.rank,
                                        node.next_rank, flags) + _encode_labels(node.labels)))
        out.extend((key, None) for key in self._deleted)
        self._dirty.clear()
        self._deleted.clear()
        return out

    def load_records(self, records: list[tuple[bytes, bytes]]) -> None:
        """Rebuild the tree skeleton from persisted records (before messages are added)."""
        root = dict(records).get(_ROOT_KEY)
        if root is None:
            if records:
                raise ValueError("scheduler records without the root's")
            return
        if len(root) == 16:
            self._load_old(records)
            return
        self.next_seq, self.root.cursor, self.root.next_rank, _ = _ROOT.unpack(root)
        nodes: dict[int, tuple[FairNode, int]] = {}
        for key, raw in records:
            if key == _ROOT_KEY:
                continue
            seq, cursor, parent_seq, rank, next_rank, flags = _NODE.unpack_from(raw)
            node = FairNode(_decode_labels(raw[_NODE.size:]), bool(flags & _OWN), seq)
            node.cursor, node.rank, node.next_rank = cursor, rank, next_rank
            nodes[seq] = (node, parent_seq)
        for node, parent_seq in nodes.values():
            parent = self.root if parent_seq == 0 else nodes[parent_seq][0]
            if parent.own:
                raise ValueError("a scheduler record hangs from a leaf")
            parent.attach(node)
        self._name_leaves()

    def _name_leaves(self) -> None:
        """Every leaf's group, from the labels on its path (no recursion)."""
        stack: list[tuple[FairNode, tuple[str, ...]]] = [(self.root, ())]
        while stack:
            node, path = stack.pop()
            edge = node.labels
            path = path + edge
            if node.own:
                node.group = ".".join(path)
                node.set_labels(edge, len(path) - len(edge))      # keeps only where it starts
                self._leaves[node.group] = node
            elif node is not self.root and not node.order:
                raise ValueError("a scheduler record of a group node has no children")
            stack.extend((child, path) for child in node.order)

    def _load_old(self, records: list[tuple[bytes, bytes]]) -> None:
        """Records of the uncompressed format: one node per label, keyed by a sequence
        number that also ordered siblings; a cursor named the next child's sequence. Each
        chain of single children becomes one edge; the rest keep their sequence numbers."""
        self._armed = False                       # not the drain that ends the load
        first, cursor = unpack_pair(dict(records)[_ROOT_KEY][:16])
        self.next_seq = first
        children: dict[int, list[tuple[int, int, bool, str]]] = {}
        for key, raw in records:
            if key == _ROOT_KEY:
                continue
            seq, cur = unpack_pair(raw[:16])
            parent_seq = _SEQ.unpack_from(raw, 16)[0]
            children.setdefault(parent_seq, []).append((seq, cur, raw[24] == 1,
                                                        raw[25:].decode()))
        for kids in children.values():
            kids.sort()
        old_cursor = {0: cursor}
        for kids in children.values():
            for seq, cur, _, _ in kids:
                old_cursor[seq] = cur
        # (old node seq, the new parent, the labels of the chain above it) to convert
        stack: list[tuple[int, FairNode, tuple[str, ...], int]] = []

        def place(parent_seq: int, node: FairNode) -> None:
            kids = children.get(parent_seq, [])
            for rank, (seq, _, own, name) in enumerate(kids, start=1):
                stack.append((seq, node, () if own else (name,), rank))
            node.next_rank = len(kids) + 1
            wanted = old_cursor.get(parent_seq, 0)
            node.cursor = next((rank for rank, kid in enumerate(kids, start=1)
                                if kid[0] == wanted), 0)

        place(0, self.root)
        while stack:
            seq, parent, labels, rank = stack.pop()
            own = not labels
            kids = children.get(seq, [])
            while not own and len(kids) == 1:         # a chain: one edge
                self._stale.append(_SEQ.pack(seq))
                seq, _, own, name = kids[0]
                if not own:
                    labels += (name,)
                kids = children.get(seq, [])
            if not own and not kids:
                self._stale.append(_SEQ.pack(seq))    # an empty node: nothing hangs there
                continue
            node = FairNode(labels, own, seq)
            node.rank = rank
            parent.attach(node)
            if not own:
                place(seq, node)
        self._prune_empty()
        self._name_leaves()
        self._rewrite = True

    def _prune_empty(self) -> None:
        """Group nodes left without children after a conversion (none expected) go."""
        stack = list(self.root.order)
        empty = []
        while stack:
            node = stack.pop()
            if not node.own and not node.order:
                empty.append(node)
            stack.extend(node.order)
        for node in empty:
            if node.parent is not None:
                node.parent.detach(node)
                self._stale.append(node.key)

    def finish_load(self) -> None:
        """Messages and deliveries are back. The state machine then drains what loading
        touched (records found missing: none expected; it writes nothing while loading);
        records of the old format are rewritten at the drain after that one, the queue's
        next change, which every replica makes at the same entry."""

    def bookkeeping_size(self) -> int:
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += 1 + (node.heap.stale_entries() if node.heap is not None else 0)
            stack.extend(node.order)
        return count - 1 + len(self._loc) + len(self.inflight)

    def node_count(self) -> int:
        """Nodes of the tree, the root included (the memory a group costs: tests)."""
        count, stack = 0, [self.root]
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(node.order)
        return count

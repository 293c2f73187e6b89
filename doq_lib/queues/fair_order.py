"""The delivery order of a round-robin index without changing it (L2): what browse and
explain list, computed lazily from copies of the nodes a walk reaches.
"""
from __future__ import annotations

import bisect
from typing import TYPE_CHECKING, Callable

from doq_lib.queues.base import HeapTaker

if TYPE_CHECKING:
    from doq_lib.queues.fair import FairNode, RoundRobinIndex


class RoundRobinOrder:
    """The order the rotation hands messages out from now, computed lazily and never on the
    index itself: each node and leaf the walk reaches is copied when first reached (its
    cursor, its children in order, its messages' heap), so a page costs about what it lists,
    not the queue's size, and nothing of the index changes. With ``as_is`` only deliverable
    groups take turns (pauses, rates, in-flight limits as they are when the walk reaches
    them), else every group. The index may change between calls to :meth:`next` (a read
    taken in slices): what was copied stays as it was, the rest is read as it is then, and
    a message gone meanwhile is skipped."""

    __slots__ = ("index", "as_is", "_nodes", "_taker")

    def __init__(self, index: RoundRobinIndex, as_is: bool) -> None:
        self.index = index
        self.as_is = as_is
        self._nodes: dict[int, _View] = {}
        self._taker = HeapTaker()

    def _view(self, node: FairNode) -> "_View":
        view = self._nodes.get(id(node))
        if view is None:
            view = self._nodes[id(node)] = _View(node)
        return view

    def _alive(self, node: FairNode) -> bool:
        if node.own:
            return bool(node.heap) and (not self.as_is or bool(self.index._leaf_ok(node)))
        return not self.as_is or node.eligible > 0

    def _take(self, leaf: FairNode) -> int | None:
        """The leaf's next message in (priority, id) order; None when it has no more."""
        got = self._taker.take(leaf.heap)  # type: ignore[arg-type]
        return None if got is None else got[0]

    def next(self) -> tuple[int, str] | None:
        """The next (id, group) (None: nothing more). A walk down that finds a subtree empty marks
        it so and starts again from the top, having moved no cursor (the index would have
        pruned that subtree when it emptied: it would never have been chosen); each mark is
        for good, so the work is bounded by what the walks reach."""
        while True:
            view = self._view(self.index.root)
            path: list[tuple[_View, int]] = []
            while True:
                pos = view.choose(self._alive)
                if pos is None:
                    if not path:
                        return None               # the root: nothing more anywhere
                    _View.dead(path)
                    break
                path.append((view, pos))
                child = view.kids[pos]
                if child.own:
                    mid = self._take(child)
                    if mid is None:
                        _View.dead(path)
                        break
                    for chosen, at in path:           # as the index's choices move them
                        chosen.cursor = chosen.ranks[(at + 1) % len(chosen.ranks)]
                    return mid, child.group
                view = self._view(child)


class _View:
    """A node as :class:`RoundRobinOrder` sees it: copied once, then changed by the walk."""

    __slots__ = ("cursor", "ranks", "kids", "state", "dead_count")

    UNKNOWN, ALIVE, DEAD = 0, 1, 2

    def __init__(self, node: FairNode) -> None:
        self.ranks = list(node.ranks)
        self.kids = list(node.order)
        cursor = node.cursor
        if cursor and not self._has(cursor):
            cursor = 0                      # a cursor naming no child: start at the first
        self.cursor = cursor
        self.state = bytearray(len(self.kids))
        self.dead_count = 0

    def _has(self, rank: int) -> bool:
        pos = bisect.bisect_left(self.ranks, rank)
        return pos < len(self.ranks) and self.ranks[pos] == rank

    def choose(self, alive: "Callable[[FairNode], bool]") -> int | None:
        """The position of the child to walk into (as the index's _choose picks it; the
        cursor moves once the walk delivered), or None when no child has anything left."""
        n = len(self.kids)
        if not n:
            return None
        start = bisect.bisect_left(self.ranks, self.cursor)
        if start >= n:
            start = 0
        state = self.state
        for k in range(n):
            pos = (start + k) % n
            if state[pos] == _View.UNKNOWN:
                state[pos] = _View.ALIVE if alive(self.kids[pos]) else _View.DEAD
                if state[pos] == _View.DEAD:
                    self.dead_count += 1
            if state[pos] == _View.ALIVE:
                return pos
        return None

    @staticmethod
    def dead(path: list[tuple["_View", int]]) -> None:
        """The last child on ``path`` has nothing more; a node whose children all have
        nothing more is marked in turn (on the next walk, by choose)."""
        view, pos = path[-1]
        if view.state[pos] != _View.DEAD:
            view.state[pos] = _View.DEAD
            view.dead_count += 1
            if view.dead_count * 2 > len(view.kids) > 16:
                view.compact()

    def compact(self) -> None:
        """Drop the dead children (the cursor, a rank, still finds its place by bisect)."""
        keep = [i for i, state in enumerate(self.state) if state != _View.DEAD]
        self.ranks = [self.ranks[i] for i in keep]
        self.kids = [self.kids[i] for i in keep]
        self.state = bytearray(self.state[i] for i in keep)
        self.dead_count = 0

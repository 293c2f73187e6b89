"""Looking into a queue without changing it (L3): browse its messages,
explain why one is (not) delivered. Reads of this replica's state, never proposed.

A read is a *job* taken in steps of bounded work (:data:`STEP` rows looked at), each run
where no apply runs meanwhile (``StateMachine.serialize``); the service runs the steps one
after another, yielding between them, stops them for a client that left, and lets only a
few run at once. The delivery order comes from the indexes' lazy orders (``index.order``),
which copy only what they reach: a page costs about what it lists, never the queue's size
at once, and nothing of the queue is changed.

Browse lists, in this order: the messages a dequeue would hand out now, in that order
(``ready``); then the held-back ones (``blocked``: a paused group's, one out of its rate or
at max_unacked, group by group; a delayed message not due yet, by its time; one held back
by a nack delay or back-off, by the time it is released); then the delivered ones by id
(``unacked``). Browse, explain and dequeue agree: what browse lists as ready first is what
a dequeue takes first, and a message explain calls blocked is listed as blocked.
"""
from __future__ import annotations

import heapq
import time
from typing import Any, Iterator, NamedTuple

from doq_lib.errors import InvalidArgument
from doq_lib.fsm.base import MachineState
from doq_lib.fsm.limits import rate_interval_us
from doq_lib.fsm.state import QueueState
from doq_lib.models import DEFAULT_GROUP, Message, QueueType
from doq_lib.queues.base import paused_match
from doq_lib.queues.delayed import DelayedIndex
from doq_lib.store import U64, decode_message

BROWSE_STATES = ("ready", "unacked", "all")
UNTIL_MAX = (1 << 63) - 1         # a delay past it (priority > ~2.9e8 years) says "never"
STEP = 1000                       # rows (or groups) a step of a read looks at, at most
STEP_SECONDS = 0.001              # ... and about how long a step of a served read may take
_WORK = None                      # what a row generator yields for work that lists nothing

Row = tuple[int, str, str, int]   # (id, group, state, deadline)


class Listed(NamedTuple):
    """A browsed message: its state (ready, blocked, unacked), and for a delivered one its
    ack deadline (unix ms), its consumer ("": unnamed) and when it was delivered."""

    message: Message
    state: str
    deadline: int = 0
    consumer: str = ""
    since: int = 0


class Explained(NamedTuple):
    state: str                    # ready | unacked | blocked
    reasons: list[dict[str, Any]]
    ahead: int                    # deliverable messages handed out before it
    held_by: str = ""             # unacked: its consumer ("": unnamed)
    held_since: int = 0           # unacked: when it was delivered (unix ms)


class Job:
    """A read taken in steps: :meth:`step` until it says done, then :meth:`result`."""

    def __init__(self, machine: MachineState, qs: QueueState) -> None:
        self.machine = machine
        self.qs = qs
        self.done = False

    def _check(self) -> None:
        if self.machine.queues.get(self.qs.defn.name) is not self.qs:
            raise LookupError(f"queue {self.qs.defn.name!r} was deleted meanwhile")


class BrowseJob(Job):
    def __init__(self, machine: MachineState, qs: QueueState, state: str, group: str | None,
                 after: int | None, limit: int, max_bytes: int, now_ms: int) -> None:
        super().__init__(machine, qs)
        self.group, self.after, self.limit, self.max_bytes = group, after, limit, max_bytes
        self.picked: list[Row] = []
        self.found = after is None
        self.rows = _rows(qs, state, group, now_ms)

    def step(self, budget: int = STEP, seconds: float = 0.0) -> bool:
        """Look at up to ``budget`` more rows (and for about ``seconds`` at most, when
        given); whether the page is complete."""
        if self.done:
            return True
        self._check()
        until = time.perf_counter() + seconds if seconds else 0.0
        for row in self.rows:
            if row is not _WORK:
                if not self.found:
                    self.found = row[0] == self.after
                elif self.group is None or row[1] == self.group:
                    self.picked.append(row)
                    if len(self.picked) > self.limit:
                        self.done = True
                        return True
            # the row is dealt with: only now may the step end (the generator moved past it)
            budget -= 1
            if budget <= 0 or (until and not budget % 64 and time.perf_counter() > until):
                return False
        self.done = True
        return True

    def result(self) -> tuple[list[Listed], int | None]:
        """The page: the messages (read from the store now) and the id to continue after
        (None: no more)."""
        qs = self.qs
        more = len(self.picked) > self.limit
        picked = self.picked[:self.limit]
        listed: list[Listed] = []
        size = 0
        with self.machine.store.read() as txn:
            for mid, _, row_state, deadline in picked:
                raw = txn.get("messages", qs.prefix + U64.pack(mid))
                if raw is None:
                    continue                       # taken or deleted since: skip
                size += len(raw) + 64
                if self.max_bytes and listed and size > self.max_bytes:
                    return listed, listed[-1].message.id      # the rest on the next page
                priority, msg_group, content, metadata = decode_message(raw)
                entry = qs.unacked.get(mid)
                past = qs.attempts.get(mid, (0, ""))
                deliveries = entry.deliveries if entry is not None else past[0]
                held = entry is not None and row_state == "unacked"
                listed.append(Listed(Message(mid, msg_group, priority, content, metadata,
                                             deliveries, past[1],
                                             expires_at=qs.expires.get(mid, 0)),
                                     row_state, deadline,
                                     entry.consumer if held else "",  # type: ignore[union-attr]
                                     entry.since if held else 0))  # type: ignore[union-attr]
        return listed, (picked[-1][0] if more and picked else None)


def _rows(qs: QueueState, state: str, group: str | None,
          now_ms: int) -> Iterator[Row | None]:
    """The rows of a browse in order (``None`` for work that lists nothing: a group looked
    at, a held message gathered), lazily."""
    if state in ("ready", "all"):
        yield from _waiting(qs, group, now_ms)
    if state in ("unacked", "all"):
        for mid in sorted(qs.unacked):             # ints: a C sort, fast for any count
            entry = qs.unacked.get(mid)
            if entry is not None and (group is None or entry.group == group):
                yield mid, entry.group, "unacked", entry.deadline
            else:
                yield _WORK


def _waiting(qs: QueueState, group: str | None, now_ms: int) -> Iterator[Row | None]:
    index = qs.index
    cap = qs.defn.settings.max_in_flight
    paused = qs.defn.paused or bool(cap and len(qs.unacked) >= cap)   # nothing deliverable
    if isinstance(index, DelayedIndex):
        if group is not None and group != DEFAULT_GROUP:
            return
        now_s = now_ms // 1000
        order = index.group_order(DEFAULT_GROUP)
        held_back = paused or index.limited
        while (found := order.next()) is not None:
            mid, _, priority = found
            yield mid, DEFAULT_GROUP, "blocked" if held_back or priority > now_s else "ready", 0
    elif group is not None:                        # one group: its messages in its order
        state = "blocked" if paused or index.blocked(group) else "ready"
        order = index.group_order(group)
        while (found := order.next()) is not None:
            yield found[0], group, state, 0
    else:
        if not paused:
            lazy = index.order(True)
            while (row := lazy.next()) is not None:
                yield row[0], row[1], "ready", 0
        names = index.group_names()
        blocked: list[str] = []
        for n, name in enumerate(names):
            if paused or index.blocked(name):
                blocked.append(name)
            if n % 64 == 63:
                yield _WORK
        for name in sorted(blocked):
            order = index.group_order(name)
            while (found := order.next()) is not None:
                yield found[0], name, "blocked", 0
    held: list[tuple[int, int, str]] = []
    for n, (mid, (until, held_group, _)) in enumerate(list(qs.held.items())):
        if group is None or held_group == group:
            held.append((until, mid, held_group))
        if n % 64 == 63:
            yield _WORK
    heapq.heapify(held)
    while held:
        _, mid, held_group = heapq.heappop(held)
        if mid in qs.held:
            yield mid, held_group, "blocked", 0


class ExplainJob(Job):
    def __init__(self, machine: MachineState, qs: QueueState, mid: int, now_ms: int) -> None:
        super().__init__(machine, qs)
        self.mid = mid
        self.ahead = 0
        self.reasons: list[dict[str, Any]] = []
        self.state = "unacked"
        self.work: Iterator[bool] | None = None
        self.held_by, self.held_since = "", 0
        entry = qs.unacked.get(mid)
        if entry is not None:
            self.held_by, self.held_since = entry.consumer, entry.since
            self.done = True
            return
        self.reasons = _reasons(qs, mid, now_ms)
        self.state = "blocked" if self.reasons else "ready"
        self.work = self._count_blocked(now_ms) if self.reasons else self._count_ahead()

    def _count_ahead(self) -> Iterator[bool]:
        """The deliverable messages before this one in the order dequeues take them."""
        lazy = self.qs.index.order(True)
        while (row := lazy.next()) is not None:
            if row[0] == self.mid:
                return
            self.ahead += 1
            yield False

    def _count_blocked(self, now_ms: int) -> Iterator[bool]:
        """A held-back message: every deliverable message comes first."""
        index = self.qs.index
        if isinstance(index, DelayedIndex):
            if index.limited:
                return
            order = index.group_order(DEFAULT_GROUP)
            while (row := order.next()) is not None and row[2] <= now_ms // 1000:
                self.ahead += 1
                yield False
            return
        deliverable = index.ready
        for n, name in enumerate(index.group_names()):
            if index.blocked(name):
                deliverable -= index.group_size(name)
            if n % 64 == 63:
                yield False
        self.ahead = max(deliverable, 0)

    def step(self, budget: int = STEP, seconds: float = 0.0) -> bool:
        if self.done:
            return True
        self._check()
        assert self.work is not None
        until = time.perf_counter() + seconds if seconds else 0.0
        for _ in self.work:
            budget -= 1
            if budget <= 0 or (until and not budget % 64 and time.perf_counter() > until):
                return False
        self.done = True
        return True

    def result(self) -> Explained:
        return Explained(self.state, self.reasons, self.ahead, self.held_by, self.held_since)


def _reasons(qs: QueueState, mid: int, now_ms: int) -> list[dict[str, Any]]:
    """Why waiting message ``mid`` is not delivered now (none: it is deliverable); raises
    LookupError when the queue does not hold it."""
    reasons: list[dict[str, Any]] = []
    if qs.defn.paused:
        reasons.append({"code": "queue_paused"})
    cap = qs.defn.settings.max_in_flight
    if cap and len(qs.unacked) >= cap:
        reasons.append({"code": "queue_at_max_in_flight", "in_flight": len(qs.unacked),
                        "max": cap})
    index = qs.index
    if mid in qs.held:
        # never delivered and no error: held by its enqueue's delay; else a nack's or back-off
        fresh = qs.attempts.get(mid, (0, ""))[0] == 0 and not qs.attempts.get(mid, (0, ""))[1]
        reasons.append({"code": "delayed_until" if fresh else "backoff_until",
                        "until": qs.held[mid][0]})
        group = qs.held[mid][1]
    elif index.contains(mid):
        group = index.group_of(mid)
    else:
        raise LookupError(mid)
    if isinstance(index, DelayedIndex):
        priority = index.priority_of(mid)
        if priority is not None and priority * 1000 > now_ms:     # unix seconds
            reasons.append({"code": "delayed_until", "until": min(priority * 1000, UNTIL_MAX)})
    elif qs.defn.type is QueueType.FAIR:
        paused_by = paused_match(group, frozenset(qs.defn.paused_groups))
        if paused_by is not None:
            reasons.append({"code": "group_paused", "group": paused_by})
        limit = qs.defn.settings.max_unacked
        in_flight = index.in_flight(group)
        if limit and in_flight >= limit:
            reasons.append({"code": "group_at_max_unacked", "group": group,
                            "unacked": in_flight, "max": limit})
    settings = qs.defn.settings
    tat = qs.rate_tat.get(group) if settings.group_rate else None
    if tat is not None:
        release = tat - (settings.group_burst - 1) * rate_interval_us(settings.group_rate)
        if release > now_ms * 1000:
            reasons.append({"code": "group_rate_limited", "group": group,
                            "next_at": -(-release // 1000)})
    return reasons


class InspectOps:
    def __init__(self, sm: MachineState) -> None:
        self.sm = sm

    def browse_job(self, name: str, state: str, group: str | None, after: int | None,
                   limit: int, max_bytes: int = 0, now_ms: int | None = None,
                   ) -> BrowseJob | None:
        """A browse of up to ``limit`` messages of the queue in ``state`` (ready: waiting
        ones, deliverable first; unacked; all: both), of ``group`` when given, after the
        message ``after``, and at most about ``max_bytes`` of them (0: any; one at least).
        None: no such queue. Raises InvalidArgument for an ``after`` that is not there."""
        qs = self.sm.queues.get(name)
        if qs is None:
            return None
        if after is not None:
            if not qs.contains(after):
                raise InvalidArgument(f"after: message {after} is no longer in the queue "
                                      "(delivered, acked or deleted since): browse from the "
                                      "start")
            if state == "ready" and after in qs.unacked:
                raise InvalidArgument(f"after: message {after} is delivered now, not "
                                      "waiting: browse from the start")
        return BrowseJob(self.sm, qs, state, group, after, limit, max_bytes,
                         self.sm.last_now_ms if now_ms is None else now_ms)

    def explain_job(self, name: str, mid: int, now_ms: int) -> ExplainJob | None:
        """Why message ``mid`` of the queue is, or is not, being delivered. None: no such
        queue; raises LookupError when it holds no such message."""
        qs = self.sm.queues.get(name)
        if qs is None:
            return None
        return ExplainJob(self.sm, qs, mid, now_ms)

    def browse(self, name: str, state: str, group: str | None, after: int | None,
               limit: int, max_bytes: int = 0,
               ) -> tuple[list[Listed], int | None] | None:
        """:meth:`browse_job` run to its end at once (tests, tools)."""
        job = self.browse_job(name, state, group, after, limit, max_bytes)
        if job is None:
            return None
        while not job.step():
            pass
        return job.result()

    def explain(self, name: str, mid: int, now_ms: int) -> Explained | None:
        """:meth:`explain_job` run to its end at once (tests, tools)."""
        job = self.explain_job(name, mid, now_ms)
        if job is None:
            return None
        while not job.step():
            pass
        return job.result()

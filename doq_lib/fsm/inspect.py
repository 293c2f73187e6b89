"""Looking into a queue without changing it (issue 18, L3): browse its messages, explain why
one is not delivered. Reads of this replica's state, never proposed; they walk the indexes,
so callers run them through ``StateMachine.serialize``."""
from __future__ import annotations

import itertools
from typing import Any, Iterator, NamedTuple

from doq_lib.errors import InvalidArgument
from doq_lib.fsm.base import Machine
from doq_lib.fsm.limits import rate_interval_us
from doq_lib.fsm.state import QueueState
from doq_lib.models import Message, QueueType
from doq_lib.queues.base import paused_match
from doq_lib.queues.delayed import DelayedIndex
from doq_lib.store import U64, decode_message

BROWSE_STATES = ("ready", "unacked", "all")
UNTIL_MAX = (1 << 63) - 1         # a delay past it (priority > ~2.9e8 years) says "never"


class Listed(NamedTuple):
    """A browsed message: its state, and for a delivered one its ack deadline (unix ms)."""

    message: Message
    state: str                    # ready | unacked
    deadline: int = 0


class Explained(NamedTuple):
    state: str                    # ready | unacked | blocked
    reasons: list[dict[str, Any]]
    ahead: int                    # deliverable messages handed out before it


class InspectOps(Machine):
    def browse(self, name: str, state: str, group: str | None, after: int | None,
               limit: int, max_bytes: int = 0,
               ) -> tuple[list[Listed], int | None] | None:
        """Up to ``limit`` messages of the queue in ``state`` (ready: in delivery order, held
        back ones last by release time; unacked: by id; all: both, in that order), of
        ``group`` when given, after the message ``after``, and at most about ``max_bytes``
        of them (0: any; at least one message); and the id to continue after (None: no
        more). None: no such queue."""
        qs = self.queues.get(name)
        if qs is None:
            return None
        rows = self._rows(qs, state, after)
        picked: list[tuple[int, str, str, int]] = []
        for row in rows:
            if group is None or row[1] == group:
                picked.append(row)
                if len(picked) > limit:
                    break
        more = len(picked) > limit
        picked = picked[:limit]
        listed: list[Listed] = []
        size = 0
        with self.store.read() as txn:
            for mid, _, row_state, deadline in picked:
                raw = txn.get("messages", qs.prefix + U64.pack(mid))
                if raw is None:
                    continue                       # a record the index still names: skip
                size += len(raw) + 64
                if max_bytes and listed and size > max_bytes:
                    return listed, listed[-1].message.id      # the rest on the next page
                priority, msg_group, content, metadata = decode_message(raw)
                entry = qs.unacked.get(mid)
                past = qs.attempts.get(mid, (0, ""))
                deliveries = entry.deliveries if entry is not None else past[0]
                listed.append(Listed(Message(mid, msg_group, priority, content, metadata,
                                             deliveries, past[1],
                                             expires_at=qs.expires.get(mid, 0)),
                                     row_state, deadline))
        return listed, (picked[-1][0] if more and picked else None)

    def _rows(self, qs: QueueState, state: str,
              after: int | None) -> Iterator[tuple[int, str, str, int]]:
        """(id, group, state, deadline) of the messages to list, from the one after
        ``after`` (a waiting message must still be waiting to be found)."""
        unacked = sorted(qs.unacked)
        delivered = ((mid, qs.unacked[mid].group, "unacked", qs.unacked[mid].deadline)
                     for mid in unacked if after is None or state != "unacked" or mid > after)
        if state == "unacked":
            return delivered
        index = qs.index
        waiting = itertools.chain(
            ((mid, index.group_of(mid), "ready", 0) for mid in index.delivery_order(False)),
            ((mid, held[1], "ready", 0) for mid, held in
             sorted(qs.held.items(), key=lambda item: (item[1][0], item[0]))))
        rows = itertools.chain(waiting, delivered) if state == "all" else waiting
        if after is None:
            return rows
        if not (qs.contains(after)):
            raise InvalidArgument(f"after: message {after} is no longer in the queue "
                                  "(delivered, acked or deleted since): browse from the start")
        if state == "ready" and after in qs.unacked:
            raise InvalidArgument(f"after: message {after} is delivered now, not waiting: "
                                  "browse from the start")
        for row in rows:
            if row[0] == after:
                return rows
        return iter(())

    def explain(self, name: str, mid: int, now_ms: int) -> Explained | None:
        """Why message ``mid`` of the queue is, or is not, being delivered. None: no such
        queue; raises LookupError when it holds no such message."""
        qs = self.queues.get(name)
        if qs is None:
            return None
        reasons: list[dict[str, Any]] = []
        if mid in qs.unacked:
            return Explained("unacked", reasons, 0)
        if qs.defn.paused:
            reasons.append({"code": "queue_paused"})
        cap = qs.defn.settings.max_in_flight
        if cap and len(qs.unacked) >= cap:
            reasons.append({"code": "queue_at_max_in_flight", "in_flight": len(qs.unacked),
                            "max": cap})
        index = qs.index
        if mid in qs.held:
            reasons.append({"code": "backoff_until", "until": qs.held[mid][0]})
            group = qs.held[mid][1]
        elif index.contains(mid):
            group = index.group_of(mid)
        else:
            raise LookupError(mid)
        if isinstance(index, DelayedIndex):
            priority = index.priority_of(mid)
            if priority is not None and priority * 1000 > now_ms:     # unix seconds
                reasons.append({"code": "delayed_until",
                                "until": min(priority * 1000, UNTIL_MAX)})
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
        ahead = 0                     # held back, or never handed out: all that is, is ahead
        for other in index.delivery_order(True):
            if other == mid:
                break
            ahead += 1
        return Explained("blocked" if reasons else "ready", reasons, ahead)

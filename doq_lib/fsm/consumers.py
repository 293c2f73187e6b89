"""The consumers a queue knows (L3): who holds which deliveries, and what each did.

A consumer names itself on a dequeue (``consumer``; "" leaves it unnamed and unrecorded).
Each queue keeps, per name, the deliveries it took, the acks and nacks of its leases (a
reject counts as a nack), when it was last seen (the log's time of its last delivery or
settle) and the messages it holds now. It is replicated state like the rest: changed only by
operations at the log's time, stored in the ``consumers`` database (the held messages come
back from the delivery records at start-up) and carried in backups.

A consumer that holds nothing and was not seen for :data:`IDLE_MS` is forgotten; a queue
keeps at most :data:`MAX_CONSUMERS` names (past it, the least recently seen one that holds
nothing makes room; one holding messages is never dropped, so the registry is also bounded
by the queue's deliveries in flight). Both happen as operations apply, at the log's time, so
every replica forgets the same consumers at the same point.
"""
from __future__ import annotations

import contextlib
import itertools
from typing import Any, Iterator, NamedTuple

from doq_lib.fsm.state import Ctx, QueueState, Unacked
from doq_lib.store import decode_consumer, encode_consumer

IDLE_MS = 3_600_000           # a consumer holding nothing is forgotten after an hour unseen
MAX_CONSUMERS = 10_000        # names a queue keeps at most (holders of messages aside)
LISTED_IDS = 100              # held messages listed per consumer at most (all are counted)


class KnownConsumer:
    """What a queue knows of one consumer. ``held``: the ids it holds, oldest delivery
    first (a dict used as an ordered set)."""

    __slots__ = ("deliveries", "acks", "nacks", "last_ms", "held")

    def __init__(self, deliveries: int = 0, acks: int = 0, nacks: int = 0,
                 last_ms: int = 0) -> None:
        self.deliveries, self.acks, self.nacks, self.last_ms = deliveries, acks, nacks, last_ms
        self.held: dict[int, None] = {}

    def record(self) -> bytes:
        return encode_consumer(self.deliveries, self.acks, self.nacks, self.last_ms)


class ConsumerView(NamedTuple):
    """A consumer as the read API answers it."""

    name: str
    held: int                     # messages it holds now
    messages: list[int]           # the first LISTED_IDS of them, oldest delivery first
    oldest_since: int             # when the oldest of them was delivered (unix ms; 0: none)
    last_seen: int                # unix ms
    deliveries: int
    acks: int
    nacks: int


def _key(qs: QueueState, name: str) -> bytes:
    return qs.prefix + name.encode()


def _save(ctx: Ctx, qs: QueueState, name: str, consumer: KnownConsumer) -> None:
    if qs.consumers_pending is not None:
        qs.consumers_pending.add(name)          # written once, at the end of the operation
        return
    ctx.txn.put("consumers", _key(qs, name), consumer.record())


@contextlib.contextmanager
def batched(ctx: Ctx, qs: QueueState | None) -> Iterator[None]:
    """Within one operation that delivers or settles many messages: each consumer's record
    is written once, when it ends (it changes nothing else)."""
    if qs is None or qs.consumers_pending is not None:
        yield
        return
    qs.consumers_pending = set()
    try:
        yield
        pending = qs.consumers_pending
    finally:
        qs.consumers_pending = None
    for name in sorted(pending):
        consumer = qs.consumers.get(name)
        if consumer is not None:                # (not forgotten meanwhile)
            ctx.txn.put("consumers", _key(qs, name), consumer.record())


def _touch(ctx: Ctx, qs: QueueState, name: str) -> KnownConsumer:
    """The consumer ``name`` (recorded now if new), moved to the most recently seen end."""
    known: KnownConsumer | None = qs.consumers.pop(name, None)
    if known is None:
        forget(ctx, qs, room=True)
        known = KnownConsumer()
    known.last_ms = ctx.now_ms
    qs.consumers[name] = known
    return known


def delivered(ctx: Ctx, qs: QueueState, name: str, mid: int, held: bool) -> None:
    """``name`` took message ``mid`` (``held``: with ack=false, so it holds it now)."""
    if not name:
        return
    consumer = _touch(ctx, qs, name)
    consumer.deliveries += 1
    if held:
        consumer.held[mid] = None
    _save(ctx, qs, name, consumer)


def settled(ctx: Ctx, qs: QueueState, mid: int, entry: Unacked, acked: bool) -> None:
    """The lease of ``mid`` ended by an ack (``acked``) or a nack or reject."""
    name = entry.consumer
    if not name:
        return
    consumer = _touch(ctx, qs, name)
    consumer.held.pop(mid, None)
    if acked:
        consumer.acks += 1
    else:
        consumer.nacks += 1
    _save(ctx, qs, name, consumer)


def lease_ended(ctx: Ctx, qs: QueueState, mid: int, entry: Unacked) -> None:
    """The lease of ``mid`` ended without its consumer (it timed out, or the message was
    deleted or purged): it no longer holds it; nothing is counted."""
    consumer = qs.consumers.get(entry.consumer) if entry.consumer else None
    if consumer is not None:
        consumer.held.pop(mid, None)


def forget(ctx: Ctx, qs: QueueState, room: bool = False, steps: int = 4) -> None:
    """Forget consumers that hold nothing and were not seen for IDLE_MS, looking at a few
    of the least recently seen (``steps``); with ``room``, also make room for one more name
    when the queue is at MAX_CONSUMERS (the least recently seen holding nothing goes)."""
    consumers = qs.consumers
    for _ in range(steps):
        if not consumers:
            return
        name = next(iter(consumers))
        consumer = consumers[name]
        full = room and len(consumers) >= MAX_CONSUMERS
        if consumer.held:
            # it stays while it holds messages; look at it again after the others
            del consumers[name]
            consumers[name] = consumer
            continue
        if not full and consumer.last_ms + IDLE_MS > ctx.now_ms:
            return
        del consumers[name]
        ctx.txn.delete("consumers", _key(qs, name))


def load(qs: QueueState, records: list[tuple[bytes, bytes]]) -> None:
    """The queue's consumers from their records (keys without the qid) and the delivery
    records already loaded into ``qs.unacked``."""
    found = []
    for raw_name, value in records:
        deliveries, acks, nacks, last_ms = decode_consumer(value)
        found.append((last_ms, raw_name.decode(), KnownConsumer(deliveries, acks, nacks, last_ms)))
    found.sort(key=lambda item: (item[0], item[1]))
    qs.consumers = {name: consumer for _, name, consumer in found}
    for mid, entry in sorted(qs.unacked.items(), key=lambda item: (item[1].since, item[0])):
        consumer = qs.consumers.get(entry.consumer) if entry.consumer else None
        if consumer is not None:
            consumer.held[mid] = None


def views(qs: QueueState) -> list[ConsumerView]:
    """Every consumer the queue knows, by name (values read once: see StateMachine's read
    API)."""
    out = []
    unacked = qs.unacked
    for name, consumer in sorted(list(qs.consumers.items())):
        listed = list(itertools.islice(consumer.held, LISTED_IDS))     # one C call
        oldest = next((e.since for e in map(unacked.get, listed) if e is not None), 0)
        out.append(ConsumerView(name, len(consumer.held), listed, oldest, consumer.last_ms,
                                consumer.deliveries, consumer.acks, consumer.nacks))
    return out


def holder(qs: QueueState, mid: int) -> dict[str, Any] | None:
    """Who holds delivered message ``mid`` and since when (None: it is not delivered)."""
    entry = qs.unacked.get(mid)
    if entry is None:
        return None
    return {"consumer": entry.consumer, "since": entry.since}

"""gRPC streams (L5): the requests a stream handler reads (:class:`Inbox`) and the
DequeueStream subscription (credit, batched takes, wake-ups; SPEC §4.5)."""
from __future__ import annotations

import collections
import logging
import time
from typing import Any, Callable, Iterable, Iterator

import gevent.event
import grpc

from doq_lib.auth import shown_metadata
from doq_lib.errors import DoqError, QueueEmpty
from doq_lib.grpc.requests import MalformedRequest
from doq_lib.models import Message
from doq_lib.pb import doq_pb2 as pb
from doq_lib.service import Service

log = logging.getLogger(__name__)

MAX_TAKE = 256              # messages taken from a queue in one operation by DequeueStream
SEQ_GROUP = 512             # EnqueueStream requests committed together at most
WAIT_FALLBACK = 1.0         # DequeueStream: retry at least this often (SPEC §4.5)
END = object()              # a stream's requests end here


class Inbox:
    """A streaming call's requests, from its connection's reader
    (:mod:`doq_lib.grpc.connection`) to its handler: the one buffer between the two, so a
    request costs one hand-off and the handler takes all that wait at once.

    The connection bounds it: past a few requests (or their bytes) not yet taken it stops
    giving the client's flow-control window back, and the bytes held count toward the
    connection's and the node's budgets until the handler takes them (the connection's module
    notes). A malformed request ends the requests the handler sees, and is kept in
    ``malformed`` for the status the call then ends with."""

    def __init__(self, taken: Callable[[int], None] | None = None) -> None:
        """``taken(size)``: told the bytes of what the handler took."""
        self.items: collections.deque[tuple[Any, int]] = collections.deque()
        self.activity = gevent.event.Event()   # set when a request (or the end) arrives
        self.ended = False                     # the handler has reached the end
        self.malformed: MalformedRequest | None = None
        self._taken = taken

    @classmethod
    def of(cls, requests: Iterable[Any]) -> Inbox:
        """An inbox holding ``requests`` and then the end (for calls made in process)."""
        inbox = cls()
        for request in requests:
            inbox.push(request)
        inbox.push(END)
        return inbox

    def push(self, item: Any, size: int = 0) -> None:
        """(reader) A request of ``size`` bytes, a :class:`MalformedRequest` or ``END``."""
        self.items.append((item, size))
        self.activity.set()

    def take(self, limit: int, block: bool = True, timeout: float | None = None) -> list[Any]:
        """Up to ``limit`` requests: waits for the first one (if ``block``, at most
        ``timeout`` seconds), never for more; none once the end is reached."""
        out: list[Any] = []
        items = self.items
        if self.ended:
            return out
        if block and not items:
            deadline = None if timeout is None else time.monotonic() + timeout
            while not items:
                self.activity.clear()
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return out
                self.activity.wait(left)
        size = 0
        while items and len(out) < limit:
            item, n = items[0]
            if item is END:                    # left in place: every later take ends too
                self.ended = True
                break
            items.popleft()
            size += n
            if isinstance(item, MalformedRequest):
                self.malformed = item
                self.ended = True
                break
            out.append(item)
        if size and self._taken is not None:
            self._taken(size)
        return out

    def __iter__(self) -> Iterator[Any]:
        while True:
            got = self.take(1)
            if not got:
                return
            yield got[0]


class Consumer:
    """One DequeueStream subscription: credit, batched takes, wake-ups (SPEC §4.5)."""

    def __init__(self, service: Service, inbox: Inbox, queue: str, ack: bool,
                 credit: int, max_batch: int = 0,
                 covers: Callable[[str], bool] | None = None, name: str = "") -> None:
        self.service, self.inbox, self.queue, self.ack = service, inbox, queue, ack
        self.name = name                    # the consumer's name ("": unnamed)
        self.credit = credit
        self.max_batch = max_batch          # > 1: several messages per response
        self.covers = covers                # the names the caller's key may see

    def _add_credit(self, requests: list[pb.DequeueRequest]) -> None:
        self.credit += sum(max(1, r.credit) for r in requests)

    def run(self, context: grpc.ServicerContext) -> Iterator[pb.DequeueResponse]:
        while context.is_active():
            if self.credit <= 0:
                if self.inbox.ended:
                    return                     # the client half-closed and wants no more
                self._add_credit(self.inbox.take(SEQ_GROUP, timeout=WAIT_FALLBACK))
                continue
            messages = self._take(wait=not self.inbox.ended)
            if not messages:
                if self.inbox.ended:
                    return          # half-closed: deliver what is there, wait for nothing
                continue
            yield from self._deliver(messages)
            self._add_credit(self.inbox.take(SEQ_GROUP, block=False))

    def _take(self, wait: bool) -> list[Message]:
        try:
            return self.service.dequeue_many(self.queue, self.ack, min(self.credit, MAX_TAKE),
                                             self.name)
        except QueueEmpty:
            pass
        except DoqError as exc:        # unknown queue, no leader ...: keep waiting (SPEC §4.5)
            log.debug("dequeue stream on %r: %s", self.queue, exc)
        except Exception:  # noqa: BLE001
            log.exception("dequeue stream on %r failed", self.queue)
        if wait:
            # Woken by the queue, or by the client (more credit, or its half-close: then
            # what is there has been delivered and the stream ends without waiting longer).
            self.inbox.activity.clear()
            self._add_credit(self.inbox.take(SEQ_GROUP, block=False))
            if not self.inbox.ended:
                self.service.wait_ready(self.queue, WAIT_FALLBACK, self.inbox.activity)
        return []

    def _deliver(self, messages: list[Message]) -> Iterator[pb.DequeueResponse]:
        # Taken messages are sent at once (gRPC buffers them). Should the stream break
        # first, unacked ones come back after their ack timeout like any lost delivery.
        if self.max_batch > 1:
            for chunk in _batches(messages, self.max_batch):
                yield pb.DequeueResponse(success=True, messages=[
                    pb.Message(id=m.id, group=m.group, priority=m.priority, content=m.content,
                               metadata=shown_metadata(m.metadata, self.covers),
                               deliveries=m.deliveries,
                               last_error=m.last_error, expires_at=m.expires_at,
                               delivery=m.delivery)
                    for m in chunk])
                self.credit -= len(chunk)
            return
        for message in messages:
            yield pb.DequeueResponse(**delivered_fields(message, self.covers))
            self.credit -= 1



#: A batched DequeueStream response at most, about (gRPC refuses messages over 4 MiB).
BATCH_BYTES = 3 << 20


def _batches(messages: list[Message], count: int) -> Iterator[list[Message]]:
    """``messages`` in runs of at most ``count`` and about BATCH_BYTES (one at least)."""
    run: list[Message] = []
    size = 0
    for m in messages:
        text = m.content
        weight = (len(text) if text.isascii() else len(text.encode())) + 4 * (
            len(m.group) + len(m.last_error) + 16 + sum(len(k) + len(v)
                                                        for k, v in m.metadata.items()))
        if run and (len(run) >= count or size + weight > BATCH_BYTES):
            yield run
            run, size = [], 0
        run.append(m)
        size += weight
    if run:
        yield run


def message_fields(message: Message,
                   covers: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """``covers``: the queue names the caller's key may see (None: every one)."""
    return {"success": True, "id": message.id, "group": message.group,
            "priority": message.priority, "content": message.content,
            "metadata": shown_metadata(message.metadata, covers)}


def delivered_fields(message: Message,
                     covers: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The fields of a DequeueResponse or GetResponse: with the delivery count and the last
    error (DOQ extensions)."""
    return {**message_fields(message, covers), "deliveries": message.deliveries,
            "last_error": message.last_error, "expires_at": message.expires_at,
            "delivery": message.delivery}


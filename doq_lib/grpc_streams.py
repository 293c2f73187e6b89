"""The hub side of gRPC streams (L5): what a stream handler reads ahead, bounded per stream
and per node (back-pressure), and the DequeueStream subscription (credit, batched takes,
wake-ups; SPEC §4.5)."""
from __future__ import annotations

import logging
from typing import Any, Callable, Iterator

import gevent
import gevent.event
import gevent.lock
import gevent.queue
import grpc

from doq_lib.auth import shown_metadata
from doq_lib.errors import DoqError, QueueEmpty
from doq_lib.models import Message
from doq_lib.pb import doq_pb2 as pb
from doq_lib.service import Service

log = logging.getLogger(__name__)

MAX_TAKE = 256              # messages taken from a queue in one operation by DequeueStream
SEQ_GROUP = 512             # EnqueueStream requests committed together at most
SEQ_READ_AHEAD = 256        # EnqueueStream requests read ahead of the handler, at most
CREDIT_READ_AHEAD = 64      # DequeueStream credit grants read ahead of the handler, at most
NODE_READ_AHEAD_BYTES = 64 << 20   # bytes of stream requests read ahead, all streams of a node
WAIT_FALLBACK = 1.0         # DequeueStream: retry at least this often (SPEC §4.5)


class ByteBudget:
    """Bytes of stream requests a node holds unread by their handlers, over all streams:
    a reader takes a request's size before queueing it and waits while the budget is spent;
    the handler gives it back when it takes the request. (Hub only.)"""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.free = limit
        self._changed = gevent.event.Event()

    def take(self, size: int) -> int:
        """Wait for ``size`` bytes (a request larger than the whole budget waits for all of
        it); returns what was taken, to be given back."""
        size = max(1, min(size, self.limit))
        while self.free < size:
            self._changed.clear()
            if self.free >= size:
                break
            self._changed.wait()
        self.free -= size
        return size

    def give(self, size: int) -> None:
        self.free += size
        self._changed.set()


_NODE_BUDGET: ByteBudget | None = None


def node_budget() -> ByteBudget:
    global _NODE_BUDGET
    if _NODE_BUDGET is None:
        _NODE_BUDGET = ByteBudget(NODE_READ_AHEAD_BYTES)
    return _NODE_BUDGET


class Inbox:
    """Reads a request stream in its own greenlet so the handler can wait on it or not.

    Back-pressure: at most ``limit`` requests wait here unread by the handler, and all the
    streams of the node together hold at most ``budget`` bytes of them (by default
    ``NODE_READ_AHEAD_BYTES``). Beyond that the reader stops reading, so gRPC's flow control
    slows the client down instead of the node buffering whatever it is sent."""

    def __init__(self, requests: Iterator[Any], context: grpc.ServicerContext,
                 limit: int, budget: ByteBudget | None = None) -> None:
        self._items: gevent.queue.Queue[Any] = gevent.queue.Queue()
        self._room = gevent.lock.Semaphore(limit)
        self._budget = budget or node_budget()
        self._held = 0                          # bytes of the budget this inbox holds
        self._closed = False
        self.ended = False
        self.activity = gevent.event.Event()    # set when a request (or the end) arrives
        self._reader = gevent.spawn(self._read, requests)
        context.add_callback(self.close)

    def _read(self, requests: Iterator[Any]) -> None:
        try:
            for request in requests:
                self._room.acquire()            # waits while ``limit`` requests are unread
                try:
                    size = self._budget.take(_size_of(request))
                except BaseException:
                    self._room.release()
                    raise
                if self._closed:                # the call ended while this one waited
                    self._budget.give(size)
                    return
                self._held += size
                self._items.put((request, size))
                self.activity.set()
        except Exception:  # noqa: BLE001 - cancelled or broken: the stream is over
            pass
        finally:
            self._items.put(StopIteration)
            self.activity.set()

    def _took(self, item: Any) -> Any:
        if item is StopIteration:
            return item
        request, size = item
        self._room.release()
        self._held -= size
        self._budget.give(size)
        return request

    def take(self, limit: int, block: bool = True, timeout: float | None = None) -> list[Any]:
        """Up to ``limit`` requests: waits for the first one (if ``block``), never for more."""
        out: list[Any] = []
        if self.ended:
            return out
        try:
            item = self._took(self._items.get(block=block, timeout=timeout))
        except gevent.queue.Empty:
            return out
        while True:
            if item is StopIteration:
                self.ended = True
                return out
            out.append(item)
            if len(out) >= limit:
                return out
            try:
                item = self._took(self._items.get_nowait())
            except gevent.queue.Empty:
                return out

    def close(self) -> None:
        """The call is over: stop reading, give back the budget of what was not taken."""
        if self._closed:
            return
        self._closed = True
        if not self._reader.dead:
            self._reader.kill(block=False)
        while not self._items.empty():              # drop what the handler will not take
            self._items.get_nowait()
        self._items.put(StopIteration)              # a later take sees the end
        self._budget.give(self._held)
        self._held = 0


def _size_of(request: Any) -> int:
    try:
        return int(request.ByteSize())
    except AttributeError:                           # not a protobuf message (tests)
        return 1


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


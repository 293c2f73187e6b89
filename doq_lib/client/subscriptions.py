"""The clients' subscriptions: :class:`HttpConsumer` (batch takes with long-poll over HTTP)
and :class:`GrpcConsumer` (a DequeueStream with credit). Both hand out
:class:`~doq_lib.client.delivered.Delivered` messages (``message.ack()``, ``nack``, ``touch``,
``reject``, fenced by the delivery's token), and remember each one's token so that the
consumer's own batched ``ack(message)`` settles only that delivery too. Both keep
:data:`PREFETCH` messages coming unless told otherwise."""
from __future__ import annotations

import collections
import queue as queue_module
import threading
import time
from typing import TYPE_CHECKING, Any, Iterator

from doq_lib.client.common import HTTP_MAX_BATCH, HTTP_MAX_WAIT, Failure, Subscription
from doq_lib.client.delivered import Delivered
from doq_lib.client.rpc_calls import message_of
from doq_lib.errors import DoqError, InvalidArgument
from doq_lib.models import Message

if TYPE_CHECKING:
    from doq_lib.client.rest import HttpClient
    from doq_lib.client.rpc import GrpcClient

TOKENS_KEPT = 16      # a consumer remembers the tokens of this many prefetches' messages
PREFETCH = 64         # messages a consumer keeps coming (HTTP: per take; gRPC: credit)


class HttpConsumer(Subscription):
    """Batch consumption over HTTP: each fetch takes up to ``prefetch`` messages in one
    operation, long-polling up to ``wait`` seconds when the queue is empty.

    :meth:`receive` hands them out one by one. With ``ack=False``, :meth:`ack` collects ids
    and sends them as one batch ack before the next fetch, at :meth:`flush` and at
    :meth:`close`; an ack is durable once the call that sent it returns. ``close()`` (or
    leaving a ``with`` block) also gives back (nacks) the messages fetched but not received,
    so they are delivered again at once instead of after their ack timeout.
    """

    def __init__(self, client: "HttpClient", queue: str, ack: bool, prefetch: int,
                 wait: float) -> None:
        if not 1 <= prefetch <= HTTP_MAX_BATCH:
            raise InvalidArgument(f"prefetch must be from 1 to {HTTP_MAX_BATCH}")
        self._client, self._queue, self._ack = client, queue, ack
        self._prefetch = prefetch
        self._wait = max(0.0, min(wait, HTTP_MAX_WAIT))
        self._buffer: collections.deque[Message] = collections.deque()
        self._acks: list[int] = []
        self._tokens: dict[int, str] = {}     # id -> delivery token of each received one
        self.failed: list[Failure] = []       # acks the server refused (e.g. redelivered)
        self._closed = False

    def receive(self, timeout: float | None = None) -> Delivered | None:
        """The next message; None after ``timeout`` seconds without one (None: wait)."""
        if self._closed:
            raise StopIteration
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buffer:
            self.flush()
            left = self._wait if deadline is None else deadline - time.monotonic()
            self._buffer.extend(self._client.dequeue_many(
                self._queue, self._prefetch, self._ack, max(0.0, min(left, self._wait))))
            if not self._buffer and deadline is not None and time.monotonic() >= deadline:
                return None
        message = self._buffer.popleft()
        if message.delivery:
            self._tokens[message.id] = message.delivery
            if len(self._tokens) > TOKENS_KEPT * self._prefetch:   # settled some other way
                del self._tokens[next(iter(self._tokens))]
        return Delivered.of(message, self._queue, self._client)

    def waiting(self) -> list[Message]:
        """Messages taken and not handed out yet (their leases run)."""
        return list(self._buffer)

    def ack(self, id: int | Message) -> None:
        """Acknowledge a received message (or its id) with the next batch (see the class
        notes), fenced by the token it was delivered with: one whose lease ran out and that
        went to another consumer meanwhile is refused (in ``failed``, stale_delivery)."""
        mid = id.id if isinstance(id, Message) else id
        if isinstance(id, Message) and id.delivery:
            self._tokens[mid] = id.delivery       # that delivery's, not a later one's
        self._acks.append(mid)
        if len(self._acks) >= self._prefetch:
            self.flush()

    def flush(self) -> None:
        """Send the collected acks now."""
        if self._acks:
            ids, self._acks = self._acks, []
            tokens = [self._tokens.pop(i, "") for i in ids]
            self.failed.extend(self._client.ack_many(self._queue, ids, tokens).failed)

    def close(self) -> None:
        """Send the collected acks; nack what was fetched but not received (ack=False)."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        left, self._buffer = list(self._buffer), collections.deque()
        self._tokens.clear()
        if left and not self._ack:
            try:
                self._client.nack_many(self._queue, [m.id for m in left],
                                       deliveries=[m.delivery for m in left])
            except DoqError:
                pass              # they come back after their ack timeout anyway


class GrpcConsumer(Subscription):
    """A DequeueStream subscription: iterate (or :meth:`receive`) to get messages.

    ``prefetch`` is the credit kept granted: up to that many messages may be on their way
    before you have taken them (with ``ack=False`` each must still be acked, nacked or
    touched before its ack timeout). ``close()`` (or leaving a ``with`` block) ends the
    subscription; with ``ack=False`` it nacks the messages that arrived but were not taken,
    so they are delivered again at once instead of after their ack timeout.
    """

    def __init__(self, client: "GrpcClient", queue: str, ack: bool, prefetch: int) -> None:
        self._client = client
        self._queue, self._ack = queue, ack
        self._pb = client.pb
        self._requests: queue_module.Queue[Any] = queue_module.Queue()
        self._inbox: queue_module.Queue[Any] = queue_module.Queue()
        self._prefetch = max(1, prefetch)
        self._owed = 0                  # credit to grant back, sent in chunks
        self._tokens: dict[int, str] = {}     # id -> delivery token of each received one
        self._requests.put(self._pb.DequeueRequest(
            queueName=queue, ack=ack, credit=self._prefetch, consumer=client.consumer,
            max_batch=min(self._prefetch, 256) if self._prefetch > 1 else 0))
        self._stream = client.stub().DequeueStream(self._outgoing(), metadata=client.metadata)
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"doq-consumer-{queue}")
        self._reader.start()

    def _outgoing(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self._stream:
                if response.messages:                     # a batched response
                    for message in response.messages:
                        self._inbox.put(message_of(message))
                else:
                    self._inbox.put(message_of(response))
            self._inbox.put(StopIteration())
        except self._client.rpc_error as exc:
            self._inbox.put(StopIteration() if self._closed else self._client.error(exc))

    def receive(self, timeout: float | None = None) -> Delivered | None:
        """The next message; None after ``timeout`` seconds without one (None: wait).

        Raises StopIteration once the stream has ended, or the error that ended it.
        """
        try:
            item = self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            return None
        if isinstance(item, BaseException):
            self._inbox.put(item)                      # every later call sees the end too
            raise item
        self._owed += 1
        if not self._closed and self._owed >= max(1, self._prefetch // 4):
            self._requests.put(self._pb.DequeueRequest(credit=self._owed))  # top the credit up
            self._owed = 0
        if item.delivery:
            self._tokens[item.id] = item.delivery
            if len(self._tokens) > TOKENS_KEPT * self._prefetch:    # settled some other way
                del self._tokens[next(iter(self._tokens))]
        return Delivered.of(item, self._queue, self._client)

    def waiting(self) -> list[Message]:
        """Messages that reached this consumer and were not handed out yet."""
        return [m for m in list(self._inbox.queue) if isinstance(m, Message)]

    def ack(self, message: Message | int) -> None:
        """Acknowledge a received message (or its id) now, fenced by the token it was
        delivered with: StaleDelivery when its lease ran out and it went to another
        consumer meanwhile."""
        mid = message.id if isinstance(message, Message) else message
        token = self._tokens.pop(mid, "")
        if isinstance(message, Message) and message.delivery:
            token = message.delivery              # that delivery's, not a later one's
        self._client.ack(self._queue, mid, delivery=token)

    def close(self) -> None:
        """End the subscription. With ``ack=False``, messages that reached this consumer but
        were not taken are nacked, so they are delivered again at once."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)        # half-close: the server sends what it took, then ends
        self._reader.join(timeout=5)
        if self._reader.is_alive():
            self._stream.cancel()
            self._reader.join(timeout=5)
        if self._ack:
            return
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue_module.Empty:
                break
            if isinstance(item, Message):
                try:
                    self._client.nack(self._queue, item.id, delivery=item.delivery)
                except DoqError:
                    pass              # e.g. already redelivered: nothing to give back

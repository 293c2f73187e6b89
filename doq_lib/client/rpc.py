"""The gRPC client: :class:`GrpcClient`, with the batch and credit extensions;
:class:`Producer`, enqueues pipelined on one EnqueueStream; :class:`Consumer`, a
DequeueStream with credit."""
from __future__ import annotations

import collections
import concurrent.futures
import queue as queue_module
import threading
from typing import Any, Iterator, Sequence

from doq_lib.client import rpc_calls as calls
from doq_lib.client.calls import RpcCall, blocking
from doq_lib.client.common import (
    DEFAULT_RETRY,
    HTTP_MAX_BATCH,
    HTTP_MAX_WAIT,
    NO_SECURITY,
    ClientBase,
    Closing,
    Failover,
    RetryPolicy,
    Security,
    default_consumer,
    nodes_of,
)
from doq_lib.client.rest import servers_via
from doq_lib.client.rpc_calls import enqueue_request, error_of, message_of
from doq_lib.client.subscriptions import PREFETCH, GrpcConsumer
from doq_lib.errors import (
    DoqError,
    InternalError,
    InvalidArgument,
    NotApplied,
    Unavailable,
)
from doq_lib.models import Message


# -- gRPC ------------------------------------------------------------------------------------------
class GrpcClient(ClientBase):
    """The ``queue.DOQ`` gRPC service, with the batch and credit extensions; its
    unary calls are :mod:`doq_lib.client.rpc_calls`."""

    transport = "grpc"

    def __init__(self, targets: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = DEFAULT_RETRY, leader: str | None = None,
                 discovery: Sequence[str] = (), security: Security = NO_SECURITY,
                 consumer: str | None = None) -> None:
        """``discovery``: http(s):// URLs of nodes, asked for the members' gRPC addresses
        when none of the known ones can take a call (members added or restarted elsewhere).
        grpcs:// targets are reached over TLS. ``consumer``: the name its dequeues give
        (default host:pid:program; "": none)."""
        self.consumer = default_consumer() if consumer is None else consumer
        import grpc  # noqa: F401 - imported lazily: the HTTP client does not need it

        from doq_lib.pb import doq_pb2, doq_pb2_grpc
        self._grpc = grpc
        self._pb = doq_pb2
        self._stub_class: Any = doq_pb2_grpc.DOQStub      # generated code: untyped
        nodes, secure = nodes_of(targets, "grpcs")
        self.timeout = timeout
        self.security = security
        self.metadata = security.metadata()
        self._credentials = security.grpc_credentials() if secure else None
        self._discovery = list(discovery)
        self._failover = Failover(nodes, retry, self._discover if discovery else None)
        if leader:
            self._failover.prefer(leader)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}

    @property
    def pb(self) -> Any:
        """The generated message classes (doq_pb2), loaded with the client."""
        return self._pb

    @property
    def rpc_error(self) -> type[Exception]:
        """The exception class a failed call raises (grpc.RpcError)."""
        return self._grpc.RpcError  # type: ignore[no-any-return]

    def _discover(self) -> list[str]:
        return [s.grpc_addr for s in servers_via(self._discovery, self.timeout,
                                                  security=self.security) if s.grpc_addr]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def stub(self, node: str | None = None) -> Any:
        node = node or self.node
        stub = self._stubs.get(node)
        if stub is None:
            channel = self._grpc.insecure_channel(node) if self._credentials is None else \
                self._grpc.secure_channel(node, self._credentials)
            self._channels[node] = channel
            stub = self._stubs[node] = self._stub_class(channel)
        return stub

    def error(self, exc: Any, safe: bool = False) -> DoqError:
        """The DoqError for a failed call (``grpc.RpcError``); ``safe``: it was a read."""
        return error_of(exc, safe)

    def perform(self, call: RpcCall) -> Any:
        """Make ``call`` on the first node that takes it (failover); its response."""
        def attempt(node: str) -> Any:
            try:
                return getattr(self.stub(node), call.rpc)(call.request, timeout=self.timeout,
                                                          metadata=self.metadata)
            except self._grpc.RpcError as exc:
                raise self.error(exc, call.safe) from None
        return self._failover.call(attempt)

    # -- queues -------------------------------------------------------------------------
    generate_ids = blocking(calls.generate_ids)
    create_queue = blocking(calls.create_queue)
    update_queue = blocking(calls.update_queue)
    delete_queue = blocking(calls.delete_queue)
    queues = blocking(calls.queues)
    queue = blocking(calls.queue)

    # -- messages -----------------------------------------------------------------------
    enqueue = blocking(calls.enqueue)
    enqueue_batch = blocking(calls.enqueue_batch)
    dequeue = blocking(calls.dequeue)
    consumers = blocking(calls.consumers)
    get = blocking(calls.get)
    delete = blocking(calls.delete)
    ack = blocking(calls.ack)
    ack_batch = blocking(calls.ack_batch)
    ack_many = blocking(calls.ack_many)
    nack = blocking(calls.nack)
    nack_many = blocking(calls.nack_many)
    reject = blocking(calls.reject)
    touch = blocking(calls.touch)
    update_priority = blocking(calls.update_priority)

    def enqueue_stream(self, requests: Iterator[dict[str, Any]]) -> Iterator[Message]:
        """Stream enqueues (keyword arguments of :meth:`enqueue`); yields the stored messages
        in order. Not retried: on failure the stream raises the error."""
        stream = self.stub().EnqueueStream((enqueue_request(self, **r) for r in requests),
                                           metadata=self.metadata)
        try:
            for response in stream:
                yield message_of(response)
        except self._grpc.RpcError as exc:
            raise self.error(exc) from None

    def producer(self, window: int = 64) -> "Producer":
        """A pipelined producer on one EnqueueStream: :meth:`Producer.send` returns a future
        at once and blocks only while ``window`` (1-10000) sends are unanswered; see
        :class:`Producer`."""
        if not 1 <= window <= 10_000:
            raise InvalidArgument("window must be from 1 to 10000")
        return Producer(self, window)

    def dequeue_many(self, queue: str, count: int, ack: bool = False,
                     wait: float = 0.0) -> list[Message]:
        """Up to ``count`` (1-1000) messages in delivery order, waiting up to ``wait``
        seconds (0-20) for the first; [] when none came.

        A short DequeueStream with ``count`` credit, half-closed once the first messages
        arrive (or the wait is over): the server then sends what it has taken and ends, so
        nothing taken is left behind. (A missing queue answers [] here: streams wait for
        queues to appear; the HTTP client raises QueueNotFound.)
        """
        if not 1 <= count <= HTTP_MAX_BATCH or not 0 <= wait <= HTTP_MAX_WAIT:
            raise InvalidArgument(f"count must be from 1 to {HTTP_MAX_BATCH}, wait from 0 "
                                  f"to {HTTP_MAX_WAIT:g} s")
        # A node that cannot be reached took nothing: the take moves to the next one.
        taken = self._failover.call(lambda node: self._take(node, queue, count, ack, wait))
        return taken if ack else [self.delivered(m, queue) for m in taken]

    def _take(self, node: str, queue: str, count: int, ack: bool,
              wait: float) -> list[Message]:
        """:meth:`dequeue_many` on ``node``."""
        requests: queue_module.Queue[Any] = queue_module.Queue()
        requests.put(self._pb.DequeueRequest(queueName=queue, ack=ack, credit=count,
                                             consumer=self.consumer,
                                             max_batch=min(count, 256)))

        def outgoing() -> Iterator[Any]:
            while (item := requests.get()) is not None:
                yield item

        if wait <= 0:
            requests.put(None)
        timer = threading.Timer(wait, requests.put, (None,)) if wait > 0 else None
        out: list[Message] = []
        try:
            stream = self.stub(node).DequeueStream(outgoing(), metadata=self.metadata,
                                                   timeout=self.timeout + wait)
            if timer is not None:
                timer.start()
            for response in stream:
                out.extend(message_of(m) for m in response.messages or [response])
                requests.put(None)
        except self._grpc.RpcError as exc:
            if not out:
                raise self.error(exc) from None
        finally:
            if timer is not None:
                timer.cancel()
            requests.put(None)
        return out

    def consume(self, queue: str, ack: bool = False, prefetch: int = PREFETCH) -> GrpcConsumer:
        """Subscribe to ``queue`` with a DequeueStream; see :class:`GrpcConsumer`."""
        return GrpcConsumer(self, queue, ack, prefetch)

    # -- operator controls --------------------------------------------------------------
    purge = blocking(calls.purge)
    pause = blocking(calls.pause)
    resume = blocking(calls.resume)
    pause_group = blocking(calls.pause_group)
    resume_group = blocking(calls.resume_group)
    groups = blocking(calls.groups)
    browse = blocking(calls.browse)
    explain = blocking(calls.explain)
    redrive = blocking(calls.redrive)

    # -- schedules ----------------------------------------------------------------------
    put_schedule = blocking(calls.put_schedule)
    schedules = blocking(calls.schedules)
    schedule = blocking(calls.schedule)
    delete_schedule = blocking(calls.delete_schedule)
    pause_schedule = blocking(calls.pause_schedule)
    resume_schedule = blocking(calls.resume_schedule)


class Producer(Closing):
    """Enqueues pipelined on one EnqueueStream, answered by futures, in order.

    ``send`` puts the message on the stream and returns a ``concurrent.futures.Future``
    that resolves to the stored :class:`Message` once the cluster has committed it. Up to
    ``window`` sends may be unanswered; the next ``send`` waits for an answer (flow
    control: a producer never holds more than ``window`` messages, and the server commits
    what arrived together as one replicated operation).

    Failures: the server stops the stream at its first failed message. That message's
    future raises the server's error (``QueueNotFound``, ``InvalidArgument`` ...); every
    later one raises :class:`~doq_lib.errors.NotApplied` (not stored: safe to send again),
    unless the failure left the outcome unknown (``Unavailable(maybe_applied=True)``, or
    the connection broke), which the later futures then raise too. After a failure the
    producer is broken: ``send`` raises the error that ended the stream. A producer talks to
    one node and does not fail over; make a new one (enqueue with your own ids to make
    resending safe).

    ``flush()`` waits for every answer; ``close()`` (or leaving a ``with`` block) half-closes
    the stream once every send is answered.
    """

    def __init__(self, client: GrpcClient, window: int) -> None:
        self._client = client
        self._window = threading.BoundedSemaphore(window)
        self._lock = threading.Lock()
        self._pending: collections.deque[concurrent.futures.Future[Message]] = \
            collections.deque()
        self._requests: queue_module.Queue[Any] = queue_module.Queue()
        self._closed = False
        self._error: DoqError | None = None
        self.max_in_flight = 0          # the most sends unanswered at once (observed)
        self._stream = client.stub().EnqueueStream(self._outgoing(), metadata=client.metadata)
        self._reader = threading.Thread(target=self._read, daemon=True, name="doq-producer")
        self._reader.start()

    def _outgoing(self) -> Iterator[Any]:
        while (item := self._requests.get()) is not None:
            yield item

    def send(self, queue: str, content: str, priority: int = 0, group: str = "",
             metadata: dict[str, str] | None = None, id: int = 0,
             timeout: float | None = None) -> "concurrent.futures.Future[Message]":
        """Send one enqueue; waits at most ``timeout`` seconds (default: the client's) for
        room in the window, then raises ``Unavailable`` (that message was not sent)."""
        if self._closed:
            raise InvalidArgument("the producer is closed")
        request = enqueue_request(self._client, queue, content, priority, group, metadata, id)
        wait = self._client.timeout if timeout is None else timeout
        if not self._window.acquire(timeout=wait):
            raise Unavailable(f"no answer within {wait:g} s: {self.in_flight} sends are "
                              f"unanswered (the window is full); this one was not sent")
        future: concurrent.futures.Future[Message] = concurrent.futures.Future()
        with self._lock:
            if self._error is not None:
                self._window.release()
                raise self._error
            self._pending.append(future)
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
            self._requests.put(request)
        return future

    @property
    def in_flight(self) -> int:
        """Sends not answered yet."""
        return len(self._pending)

    def _read(self) -> None:
        try:
            for response in self._stream:
                with self._lock:
                    future = self._pending.popleft()
                self._window.release()
                future.set_result(message_of(response))
            self._break(Unavailable("the stream ended before every message was answered",
                                    maybe_applied=True), None)
        except self._client._grpc.RpcError as exc:
            error = self._client.error(exc)
            answered_by_doq = any(k == "doq-error-code" for k, _ in exc.trailing_metadata() or ())
            unknown = not answered_by_doq or getattr(error, "maybe_applied", False)
            later = Unavailable(f"outcome unknown: {error.message}", maybe_applied=True) \
                if unknown else NotApplied(f"not stored: an earlier message of the stream "
                                           f"failed ({error.message})")
            self._break(error, later)
        except IndexError:                              # an answer nobody asked for
            self._break(InternalError("the server answered more messages than were sent"),
                        None)

    def _break(self, first: DoqError, later: DoqError | None) -> None:
        """Fail every unanswered future: the first with ``first``, the rest with ``later``
        (``first`` too when None); later sends raise ``first``."""
        with self._lock:
            if self._error is None:
                self._error = first
            pending, self._pending = self._pending, collections.deque()
        for n, future in enumerate(pending):
            future.set_exception(first if n == 0 or later is None else later)
            self._window.release()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is answered (stored or failed)."""
        with self._lock:
            waiting = list(self._pending)
        done, not_done = concurrent.futures.wait(waiting, timeout)
        if not_done:
            raise Unavailable(f"{len(not_done)} sends unanswered after {timeout} s",
                              maybe_applied=True)

    def close(self, timeout: float | None = None) -> None:
        """Half-close once every send is answered (waits at most ``timeout`` seconds,
        default the client's); what is still unanswered then fails with
        ``Unavailable(maybe_applied=True)``."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        self._reader.join(self._client.timeout if timeout is None else timeout)
        if self._reader.is_alive():
            self._stream.cancel()
            self._reader.join(5)
        self._break(Unavailable("the producer was closed before the answer came",
                                maybe_applied=True), None)

"""The gRPC client (SPEC §4): :class:`GrpcClient`, with the batch and credit extensions;
:class:`Producer`, enqueues pipelined on one EnqueueStream; :class:`Consumer`, a
DequeueStream with credit."""
from __future__ import annotations

import collections
import concurrent.futures
import queue as queue_module
import threading
from typing import Any, Iterator, Sequence

from doq_lib.client.common import (
    DEFAULT_RETRY,
    HTTP_MAX_BATCH,
    HTTP_MAX_WAIT,
    NO_SECURITY,
    Browsed,
    ClientBase,
    Closing,
    ConsumerInfo,
    Explanation,
    Failover,
    Failure,
    Nacked,
    RetryPolicy,
    Security,
    Settled,
    default_consumer,
    lifecycle_given,
    nodes_of,
    to_strategy,
)
from doq_lib.client.rest import servers_via
from doq_lib.client.schedules import GrpcSchedules
from doq_lib.client.subscriptions import PREFETCH, GrpcConsumer, grpc_message
from doq_lib.errors import (
    DoqError,
    InternalError,
    InvalidArgument,
    MessageNotFound,
    NotApplied,
    NotUnacked,
    StaleDelivery,
    Unavailable,
    error_for_wire_code,
)
from doq_lib.models import (
    LIFECYCLE_SETTINGS,
    GroupInfo,
    Message,
    QueueInfo,
    QueueSettings,
    QueueType,
    Strategy,
)

# gRPC failures that mean the call never reached a server (so it cannot have been applied)
UNSENT_TEXTS = ("failed to connect", "Connection refused", "DNS resolution failed")


# -- gRPC ------------------------------------------------------------------------------------------
class GrpcClient(ClientBase, GrpcSchedules):
    """The ``queue.DOQ`` gRPC service (SPEC §4), with the batch and credit extensions."""

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
        trailer = dict(exc.trailing_metadata() or ())
        code = trailer.get("doq-error-code")
        message = exc.details() or str(exc.code())
        status = exc.code().name
        if code is None:
            # Not answered by DOQ's handler: transport trouble (refused, reset, deadline).
            unsent = status == "UNAVAILABLE" and any(
                text in message for text in UNSENT_TEXTS)
            code = "unavailable" if status in ("UNAVAILABLE", "DEADLINE_EXCEEDED",
                                               "CANCELLED") else "internal"
            return error_for_wire_code(code, message, maybe_applied=not (unsent or safe))
        return error_for_wire_code(code, message, trailer.get("doq-maybe-applied") == "1")

    def _call(self, rpc: str, request: Any, safe: bool = False) -> Any:
        def attempt(node: str) -> Any:
            try:
                return getattr(self.stub(node), rpc)(request, timeout=self.timeout,
                                                     metadata=self.metadata)
            except self._grpc.RpcError as exc:
                raise self.error(exc, safe) from None
        return self._failover.call(attempt)

    # -- queues --------------------------------------------------------------------------------
    def generate_ids(self, number: int) -> list[int]:
        return list(self._call("GenerateIDs", self._pb.GenerateIDsRequest(number=number),
                               safe=True).ids)

    def _settings(self, strategy: Strategy | str | None, max_unacked: int,
                  ack_timeout: int, lifecycle: dict[str, Any]) -> Any:
        return self._pb.QueueSettings(strategy=to_strategy(strategy).name,
                                      max_unacked=max_unacked, ack_timeout=ack_timeout,
                                      **lifecycle_given(lifecycle))

    def create_queue(self, name: str, qtype: str = "delayed",
                     strategy: Strategy | str | None = None, max_unacked: int = 0,
                     ack_timeout: int = 0, **lifecycle: Any) -> None:
        """``lifecycle``: max_deliveries, dead_letter_queue, max_messages, overflow."""
        self._call("CreateQueue", self._pb.CreateQueueRequest(
            name=name, type=qtype, settings=self._settings(
                strategy, max_unacked, ack_timeout, lifecycle)))

    def update_queue(self, name: str, strategy: Strategy | str | None = None,
                     max_unacked: int = 0, ack_timeout: int = 0, **lifecycle: Any) -> None:
        """The lifecycle settings not given (or None) keep the queue's values."""
        self._call("UpdateQueue", self._pb.UpdateQueueRequest(
            name=name, settings=self._settings(strategy, max_unacked, ack_timeout, lifecycle)))

    def delete_queue(self, name: str) -> None:
        self._call("DeleteQueue", self._pb.DeleteQueueRequest(name=name))

    def queues(self) -> list[QueueInfo]:
        response = self._call("GetQueues", self._pb.GetQueuesRequest(), safe=True)
        return [_grpc_queue_info(q) for q in response.queues]

    def queue(self, name: str) -> QueueInfo:
        return _grpc_queue_info(self._call("GetQueue", self._pb.GetQueueRequest(name=name),
                                           safe=True))

    # -- messages ------------------------------------------------------------------------------
    def _enqueue_request(self, queue: str, content: str, priority: int = 0, group: str = "",
                         metadata: dict[str, str] | None = None, id: int = 0,
                         dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Any:
        return self._pb.EnqueueRequest(queueName=queue, id=id, group=group, priority=priority,
                                       content=content, metadata=metadata or {},
                                       dedup_key=dedup_key, ttl=ttl, delay=delay)

    def enqueue(self, queue: str, content: str, priority: int = 0, group: str = "",
                metadata: dict[str, str] | None = None, id: int = 0,
                dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Message:
        """As :meth:`HttpClient.enqueue`."""
        request = self._enqueue_request(queue, content, priority, group, metadata, id,
                                        dedup_key, ttl, delay)
        return grpc_message(self._call("Enqueue", request))

    def enqueue_batch(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Enqueue items (keyword arguments of :meth:`enqueue`) all or nothing, in one call;
        returns the ids in order."""
        request = self._pb.EnqueueBatchRequest(
            messages=[self._enqueue_request(**item) for item in items])
        return list(self._call("EnqueueBatch", request).ids)

    def enqueue_stream(self, requests: Iterator[dict[str, Any]]) -> Iterator[Message]:
        """Stream enqueues (keyword arguments of :meth:`enqueue`); yields the stored messages
        in order. Not retried: on failure the stream raises the error."""
        stream = self.stub().EnqueueStream((self._enqueue_request(**r) for r in requests),
                                           metadata=self.metadata)
        try:
            for response in stream:
                yield grpc_message(response)
        except self._grpc.RpcError as exc:
            raise self.error(exc) from None

    def producer(self, window: int = 64) -> "Producer":
        """A pipelined producer on one EnqueueStream: :meth:`Producer.send` returns a future
        at once and blocks only while ``window`` (1-10000) sends are unanswered; see
        :class:`Producer`."""
        if not 1 <= window <= 10_000:
            raise InvalidArgument("window must be from 1 to 10000")
        return Producer(self, window)

    def dequeue(self, queue: str, ack: bool = False) -> Message:
        request = self._pb.DequeueRequest(queueName=queue, ack=ack, consumer=self.consumer)
        return grpc_message(self._call("Dequeue", request))

    def consumers(self, queue: str) -> list[ConsumerInfo]:
        """The consumers the queue knows: what each holds and did."""
        out = self._call("GetConsumers", self._pb.GetConsumersRequest(queueName=queue),
                         safe=True)
        return [ConsumerInfo(c.name, c.held, list(c.messages), c.oldest_lease_ms, c.last_seen,
                             c.deliveries, c.acks, c.nacks) for c in out.consumers]

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
            stream = self.stub().DequeueStream(outgoing(), metadata=self.metadata,
                                               timeout=self.timeout + wait)
            if timer is not None:
                timer.start()
            for response in stream:
                out.extend(grpc_message(m) for m in response.messages or [response])
                requests.put(None)
        except self._grpc.RpcError as exc:
            if not out:
                raise self.error(exc) from None
        finally:
            if timer is not None:
                timer.cancel()
            requests.put(None)
        return out

    def nack_many(self, queue: str, ids: Sequence[int], priority: int = 0,
                  metadata: dict[str, str] | None = None, error: str = "",
                  delay: int = 0, deliveries: Sequence[str] | None = None) -> Settled:
        """Give ``ids`` back: one Nack call each (the gRPC API has no batch nack);
        ``deliveries``: each one's delivery token, in the same order ("": none)."""
        done, failed = [], []
        tokens = dict(zip(ids, deliveries)) if deliveries else {}
        for mid in dict.fromkeys(ids):
            try:
                self.nack(queue, mid, priority, metadata, error, delay, tokens.get(mid, ""))
                done.append(mid)
            except (NotUnacked, MessageNotFound, StaleDelivery) as exc:
                failed.append(Failure(mid, exc.code, exc.message))
        return Settled(done, failed)

    def consume(self, queue: str, ack: bool = False, prefetch: int = PREFETCH) -> GrpcConsumer:
        """Subscribe to ``queue`` with a DequeueStream; see :class:`GrpcConsumer`."""
        return GrpcConsumer(self, queue, ack, prefetch)

    def get(self, queue: str, id: int) -> Message:
        return grpc_message(self._call("Get", self._pb.GetRequest(queueName=queue, id=id),
                                        safe=True))

    def delete(self, queue: str, id: int) -> None:
        self._call("Delete", self._pb.DeleteRequest(queueName=queue, id=id))

    def ack(self, queue: str, id: int, delivery: str = "",
            enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """Acknowledge a delivered message; ``delivery``: the token it was delivered with
        (then StaleDelivery when that delivery is no longer current, and nothing changes);
        ``enqueue``: up to 100 messages (keyword arguments of :meth:`enqueue` each) stored
        with the ack, all or nothing. Returns their ids."""
        response = self._call("Ack", self._pb.AckRequest(
            queueName=queue, id=id, delivery=delivery,
            enqueue=[self._enqueue_request(**item) for item in enqueue]))
        return list(response.ids)

    def ack_batch(self, queue: str, ids: Sequence[int],
                  deliveries: Sequence[str] | None = None) -> list[int]:
        """Acknowledge ``ids`` in one call (``deliveries``: each one's token, "" for none);
        returns those that were not unacked (or whose delivery was stale)."""
        response = self._call("AckBatch", self._pb.AckBatchRequest(
            queueName=queue, ids=ids, deliveries=list(deliveries or ())))
        return list(response.failed_ids)

    def ack_many(self, queue: str, ids: Sequence[int],
                 deliveries: Sequence[str] | None = None,
                 enqueue: Sequence[Sequence[dict[str, Any]]] | None = None) -> Settled:
        """Acknowledge ``ids`` in one AckBatch call (which does not say why an id failed:
        one sent with a token failed because that delivery is no longer current);
        ``enqueue``: as for :meth:`HttpClient.ack_many`."""
        if enqueue and any(enqueue):
            pb = self._pb
            response = self._call("AckBatch", pb.AckBatchRequest(
                queueName=queue, ids=ids, deliveries=list(deliveries or ()),
                enqueue=[pb.SettleEnqueue(messages=[self._enqueue_request(**i) for i in items])
                         for items in enqueue]))
            bad = dict(zip(response.failed_ids, response.failures))
            return Settled([i for i in ids if i not in bad],
                           [Failure(i, "not_settled", why) for i, why in bad.items()],
                           enqueued={mid: list(got.ids) for mid, got in
                                     zip(ids, response.enqueued) if got.ids})
        failed = set(self.ack_batch(queue, ids, deliveries))
        fenced = {i for i, t in zip(ids, deliveries or ()) if t}
        return Settled([i for i in ids if i not in failed], [
            Failure(i, "stale_delivery", f"message {i}: stale delivery") if i in fenced else
            Failure(i, "message_not_unacked", f"message {i} was not acknowledged")
            for i in ids if i in failed])

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
             delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Nacked:
        """As :meth:`HttpClient.nack`: true when it was dead-lettered instead."""
        response = self._call("Nack", self._pb.NackRequest(
            queueName=queue, id=id, priority=priority, metadata=metadata or {}, error=error,
            delay=delay, delivery=delivery,
            enqueue=[self._enqueue_request(**item) for item in enqueue]))
        return Nacked(bool(response.dead_lettered), list(response.ids))

    def redrive(self, queue: str, to: str = "", ids: Sequence[int] | None = None,
                count: int | None = None) -> Settled:
        """Move dead-lettered messages of ``queue`` back: to ``to`` (default: each to its
        x-dead-from), the ``ids`` given or the first ``count`` (default: up to 10000)."""
        response = self._call("Redrive", self._pb.RedriveRequest(
            queueName=queue, to=to, ids=list(ids or ()), count=count or 0))
        failed = [Failure(f.id, f.code, f.detail) for f in response.failed]
        bad = {f.id for f in failed}
        moved = [i for i in ids if i not in bad] if ids is not None else []
        return Settled(moved, failed, response.moved)

    def reject(self, queue: str, id: int, error: str = "", delivery: str = "",
               enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """As :meth:`HttpClient.reject`: returns the ids stored with it."""
        response = self._call("Reject", self._pb.RejectRequest(
            queueName=queue, id=id, error=error, delivery=delivery,
            enqueue=[self._enqueue_request(**item) for item in enqueue]))
        return list(response.ids)

    # -- operator controls (issue 18): as HttpClient's -----------------------------------------
    def purge(self, queue: str, include_unacked: bool = False) -> int:
        return int(self._call("PurgeQueue", self._pb.PurgeQueueRequest(
            queueName=queue, include_unacked=include_unacked)).purged)

    def pause(self, queue: str) -> None:
        self._call("PauseQueue", self._pb.QueueControlRequest(queueName=queue))

    def resume(self, queue: str) -> None:
        self._call("ResumeQueue", self._pb.QueueControlRequest(queueName=queue))

    def pause_group(self, queue: str, group: str) -> None:
        self._call("PauseGroup", self._pb.GroupControlRequest(queueName=queue, group=group))

    def resume_group(self, queue: str, group: str) -> None:
        self._call("ResumeGroup", self._pb.GroupControlRequest(queueName=queue, group=group))

    def browse(self, queue: str, state: str = "all", group: str | None = None,
               after: int | None = None, limit: int = 100) -> tuple[list[Browsed], int | None]:
        out = self._call("BrowseMessages", self._pb.BrowseRequest(
            queueName=queue, state=state, group=group or "", after=after or 0, limit=limit),
            safe=True)
        return ([Browsed(Message(b.message.id, b.message.group, b.message.priority,
                                 b.message.content, dict(b.message.metadata),
                                 b.message.deliveries, b.message.last_error,
                                 expires_at=b.message.expires_at), b.state, b.deadline,
                         b.consumer, b.delivered_at)
                 for b in out.messages], out.next or None)

    def explain(self, queue: str, id: int) -> Explanation:
        out = self._call("ExplainMessage", self._pb.ExplainRequest(queueName=queue, id=id),
                         safe=True)
        return Explanation(out.state, [
            {k: v for k, v in (("code", r.code), ("group", r.group), ("until", r.until),
                               ("next_at", r.next_at), ("unacked", r.unacked), ("max", r.max),
                               ("in_flight", r.in_flight)) if v or k == "code"}
            for r in out.reasons], out.ahead, out.held_by, out.held_since)

    def groups(self, queue: str) -> list[GroupInfo]:
        out = self._call("GetGroups", self._pb.GetGroupsRequest(queueName=queue), safe=True)
        return [GroupInfo(g.group, g.ready, g.unacked, g.paused_by if g.paused else None)
                for g in out.groups]

    def touch(self, queue: str, id: int, delivery: str = "") -> None:
        """Extend a delivered message's lease (``delivery``: as for ack: StaleDelivery tells
        a worker at once that it lost the message)."""
        self._call("Touch", self._pb.TouchRequest(queueName=queue, id=id, delivery=delivery))

    def update_priority(self, queue: str, id: int, priority: int) -> None:
        self._call("UpdatePriority", self._pb.UpdatePriorityRequest(queueName=queue, id=id,
                                                                    priority=priority))


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
        request = self._client._enqueue_request(queue, content, priority, group, metadata, id)
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
                future.set_result(grpc_message(response))
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


def _grpc_queue_info(q: Any) -> QueueInfo:
    settings = QueueSettings(Strategy(q.settings.strategy), q.settings.max_unacked,
                             q.settings.ack_timeout,
                             **{key: getattr(q.settings, key) for key in LIFECYCLE_SETTINGS
                                if q.settings.HasField(key)})
    return QueueInfo(q.name, QueueType(q.type), settings, q.ready, q.unacked,
                     q.stats.enqueueRPS, q.stats.dequeueRPS, q.stats.ackRPS, q.stats.nackRPS,
                     q.paused, q.paused_groups, q.dead_letter_queue_hidden)

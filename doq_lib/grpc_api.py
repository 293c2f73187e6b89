"""The gRPC API (L5): the ``queue.DOQ`` service of SPEC §4 over :class:`Service`.

Every RPC validates its request, calls the service and builds the response; failures become
gRPC statuses in one place (:func:`_abort`): the error's class decides the status code, and the
message is the RPC's fixed failure text (SPEC §4.3) followed by the cause. Followers serve
every RPC: the service forwards writes to the leader through the log.

Streams (SPEC §4.5):

* ``EnqueueStream`` answers one response per request, in order, and stops at the first
  failure. It reads ahead: requests that arrived while an earlier group was committing are
  committed together as one in-order operation that stops at its first failure, so a client
  that pipelines its requests gets group commit without changing what it observes.
* ``DequeueStream`` subscribes with its first request. Each request grants credit (the
  ``credit`` extension, 0 meaning 1); the server sends while it has credit, taking up to the
  credit in one operation, and waits for a wake-up of the queue when nothing is deliverable.
  With ``max_batch`` > 1 in the first request, one response carries several messages.
"""
from __future__ import annotations

import functools
import logging
import time
from concurrent import futures
from typing import Any, Callable, Iterable, Iterator, NoReturn

import gevent
import gevent.event
import gevent.lock
import gevent.queue
import grpc

from doq_lib import rules
from doq_lib.auth import ANONYMOUS, ApiKey, KeyStore, Permission, Rule, Scope, bearer_token
from doq_lib.errors import DoqError, InvalidArgument, PermissionDenied, QueueEmpty
from doq_lib.failures import GRPC_TEXT
from doq_lib.metrics import Metrics
from doq_lib.models import Message, QueueInfo, Strategy
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.service import EnqueueItem, Service
from doq_lib.tls import TlsError, read_file

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4 * 1024 * 1024
MAX_BATCH = 10_000          # messages per EnqueueBatch / AckBatch call
MAX_TAKE = 256              # messages taken from a queue in one operation by DequeueStream
SEQ_GROUP = 512             # EnqueueStream requests committed together at most
SEQ_READ_AHEAD = 256        # EnqueueStream requests read ahead of the handler, at most
CREDIT_READ_AHEAD = 64      # DequeueStream credit grants read ahead of the handler, at most
NODE_READ_AHEAD_BYTES = 64 << 20   # bytes of stream requests read ahead, all streams of a node
WAIT_FALLBACK = 1.0         # DequeueStream: retry at least this often (SPEC §4.5)

#: Trailing metadata of a failed call: the stable DoqError code, and "1" when a write failed
#: with an unknown outcome (it may still have been applied). doq_lib.client reads them.
CODE_KEY = "doq-error-code"
MAYBE_APPLIED_KEY = "doq-maybe-applied"

_R, _P, _C, _A = Permission.READ, Permission.PRODUCE, Permission.CONSUME, Permission.ADMIN
#: RPC name -> what it needs (a test fails for an RPC of the service without a rule). Queue
#: patterns of a key are checked where the request names its queues.
GRPC_RULES: dict[str, Rule] = {
    "GenerateIDs": Rule(_P, Scope.ANY),
    "CreateQueue": Rule(_A, Scope.QUEUE), "UpdateQueue": Rule(_A, Scope.QUEUE),
    "DeleteQueue": Rule(_A, Scope.QUEUE),
    "GetQueue": Rule(_R, Scope.QUEUE), "GetQueues": Rule(_R, Scope.ANY),
    "Enqueue": Rule(_P, Scope.QUEUE), "EnqueueBatch": Rule(_P, Scope.QUEUE),
    "EnqueueStream": Rule(_P, Scope.QUEUE), "EnqueueBatchStream": Rule(_P, Scope.QUEUE),
    "Dequeue": Rule(_C, Scope.QUEUE), "DequeueStream": Rule(_C, Scope.QUEUE),
    "Get": Rule(_R, Scope.QUEUE), "Delete": Rule(_C, Scope.QUEUE),
    "Ack": Rule(_C, Scope.QUEUE), "AckBatch": Rule(_C, Scope.QUEUE),
    "Nack": Rule(_C, Scope.QUEUE), "Touch": Rule(_C, Scope.QUEUE),
    "UpdatePriority": Rule(_C, Scope.QUEUE),
}


class GrpcAuth:
    """API keys on gRPC: ``authorization: Bearer <key>`` metadata (``keys`` None: open)."""

    def __init__(self, keys: KeyStore | None) -> None:
        self.keys = keys

    def key_of(self, metadata: Iterable[tuple[str, Any]] | None) -> ApiKey | None:
        """The caller's key (ANONYMOUS without a keys file; None: not authenticated)."""
        if self.keys is None:
            return ANONYMOUS
        header = next((str(v) for k, v in metadata or () if k == "authorization"), None)
        return self.keys.authenticate(bearer_token(header))

    def check_queue(self, context: grpc.ServicerContext, rpc: str, queue: str) -> None:
        if self.keys is None:
            return
        key = self.key_of(context.invocation_metadata())
        if key is not None and key.queues:
            problem = key.problem(GRPC_RULES[rpc], queue)
            if problem:
                raise PermissionDenied(problem)

    def refusal(self, method: str, metadata: Iterable[tuple[str, Any]] | None,
                ) -> tuple[grpc.StatusCode, str, str] | None:
        """Why a call of ``method`` ("/queue.DOQ/Enqueue") with ``metadata`` may not run
        at all (status, doq-error-code, message), before its handler: no valid key
        (UNAUTHENTICATED) or a role that may not make it (PERMISSION_DENIED)."""
        if self.keys is None:
            return None
        rpc = method.rsplit("/", 1)[-1]
        rule = GRPC_RULES.get(rpc)
        key = self.key_of(metadata)
        if key is None:
            token = bearer_token(next((str(v) for k, v in metadata or ()
                                       if k == "authorization"), None))
            why = ("an API key is required: send 'authorization: Bearer <key>' metadata"
                   if token is None else "the API key is not valid (unknown or revoked)")
            return grpc.StatusCode.UNAUTHENTICATED, "unauthenticated", why
        if rule is None:
            return grpc.StatusCode.PERMISSION_DENIED, "permission_denied", \
                f"{rpc} has no access rule"
        problem = key.problem(Rule(rule.permission, Scope.ANY))
        if problem:
            return grpc.StatusCode.PERMISSION_DENIED, "permission_denied", problem
        return None

    def visible(self, context: grpc.ServicerContext) -> Callable[[str], bool]:
        """Which queue names the caller may see in listings."""
        key = self.key_of(context.invocation_metadata()) if self.keys is not None else None
        return key.covers if key is not None else (lambda name: True)


class GrpcFailure(Exception):
    """Internal: abort the current RPC with ``status`` and ``message``."""

    def __init__(self, status: grpc.StatusCode, message: str, code: str = "internal",
                 maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.status, self.message, self.code = status, message, code
        self.maybe_applied = maybe_applied


def _status_of(error: DoqError) -> grpc.StatusCode:
    return getattr(grpc.StatusCode, error.grpc_status, grpc.StatusCode.UNKNOWN)


def failure(text: str, error: BaseException) -> GrpcFailure:
    """The status for ``error`` raised by an RPC whose fixed failure text is ``text``."""
    if isinstance(error, GrpcFailure):
        return error
    if isinstance(error, DoqError):
        return GrpcFailure(_status_of(error), f"{text}: {error.message}", error.code,
                           getattr(error, "maybe_applied", False))
    log.exception("unexpected error in a gRPC call")
    return GrpcFailure(grpc.StatusCode.INTERNAL, f"{text}: internal error")


def _abort(context: grpc.ServicerContext, fail: GrpcFailure) -> NoReturn:
    trailer = [(CODE_KEY, fail.code)]
    if fail.maybe_applied:
        trailer.append((MAYBE_APPLIED_KEY, "1"))
    context.set_trailing_metadata(tuple(trailer))
    context.abort(fail.status, fail.message)
    raise AssertionError("context.abort returned")      # it raises


def rpc(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Run a unary handler; any failure aborts with its status and the method's failure text
    (doq_lib/failures.py) before the cause."""
    text = GRPC_TEXT[handler.__name__]

    @functools.wraps(handler)
    def run(self: "DoqServicer", request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return handler(self, request, context)
        except Exception as exc:  # noqa: BLE001 - mapped to a status in one place
            _abort(context, failure(text, exc))
    return run


# -- validation ------------------------------------------------------------------------------------
def invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message)


def queue_name(name: str, field: str = "queueName") -> str:
    message = rules.name_message(name, "grpc", field)
    if message is not None:
        raise invalid(message)
    return name


def message_id(mid: int) -> int:
    if not mid:
        raise invalid("id is required")
    return mid


def strategy_of(settings: pb.QueueSettings) -> Strategy:
    try:
        return Strategy(settings.strategy)
    except ValueError:
        raise invalid(f"unknown strategy {settings.strategy}") from None


def ack_timeout_of(settings: pb.QueueSettings) -> int:
    if not rules.ack_timeout_allowed(settings.ack_timeout):
        raise invalid(f"ack_timeout must be 0 (the default) or at least "
                      f"{rules.MIN_ACK_TIMEOUT} seconds")
    return int(settings.ack_timeout)


def enqueue_item(request: pb.EnqueueRequest) -> EnqueueItem:
    return EnqueueItem(queue_name(request.queueName), request.id, request.group,
                       request.priority, request.content, dict(request.metadata) or None)


# -- responses -------------------------------------------------------------------------------------
def _message_fields(message: Message) -> dict[str, Any]:
    return {"success": True, "id": message.id, "group": message.group,
            "priority": message.priority, "content": message.content,
            "metadata": message.metadata}


def queue_response(info: QueueInfo) -> pb.GetQueueResponse:
    settings = info.settings
    return pb.GetQueueResponse(
        name=info.name, type=info.type.value,
        settings=pb.QueueSettings(strategy=settings.strategy.name,
                                  max_unacked=settings.max_unacked,
                                  ack_timeout=settings.ack_timeout),
        stats=pb.Stats(enqueueRPS=info.enqueue_rps, dequeueRPS=info.dequeue_rps,
                       ackRPS=info.ack_rps, nackRPS=info.nack_rps),
        ready=info.ready, unacked=info.unacked, total=info.total)


class DoqServicer(pb_grpc.DOQServicer):
    def __init__(self, service: Service, auth: GrpcAuth | None = None) -> None:
        self.service = service
        self.auth = auth or GrpcAuth(None)

    def _queue(self, context: Any, rpc: str, name: str, field: str = "queueName") -> str:
        """A valid queue name the caller's key may use."""
        queue = queue_name(name, field)
        self.auth.check_queue(context, rpc, queue)
        return queue

    # -- ids and queues --------------------------------------------------------------------------
    @rpc
    def GenerateIDs(self, request: pb.GenerateIDsRequest, context: Any) -> Any:
        if not 1 <= request.number <= 1000:
            raise invalid("number must be between 1 and 1000")
        return pb.GenerateIDsResponse(success=True,
                                      ids=self.service.generate_ids(request.number))

    @rpc
    def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> Any:
        name = self._queue(context, "CreateQueue", request.name, "name")
        if not request.HasField("settings"):
            raise invalid("invalid settings provided")
        qtype = request.type.lower()
        if qtype not in rules.QUEUE_TYPES:
            raise invalid(f"type must be one of {', '.join(rules.QUEUE_TYPES)}, "
                          f"not {request.type!r}")
        settings = request.settings
        self.service.create_queue(name, qtype, strategy_of(settings), settings.max_unacked,
                                  ack_timeout_of(settings))
        return pb.CreateQueueResponse(success=True)

    @rpc
    def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> Any:
        name = self._queue(context, "UpdateQueue", request.name, "name")
        if not request.HasField("settings"):
            raise invalid("queue settings are required")
        settings = request.settings
        self.service.update_queue(name, strategy_of(settings), settings.max_unacked,
                                  ack_timeout_of(settings))
        return pb.UpdateQueueResponse(success=True)

    @rpc
    def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> Any:
        self.service.delete_queue(self._queue(context, "DeleteQueue", request.name, "name"))
        return pb.DeleteQueueResponse(success=True)

    @rpc
    def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> Any:
        info = self.service.queue_info(self._queue(context, "GetQueue", request.name, "name"))
        return queue_response(info)

    @rpc
    def GetQueues(self, request: pb.GetQueuesRequest, context: Any) -> Any:
        visible = self.auth.visible(context)
        return pb.GetQueuesResponse(queues=[queue_response(q) for q in self.service.list_queues()
                                            if visible(q.name)])

    # -- messages ----------------------------------------------------------------------------------
    @rpc
    def Enqueue(self, request: pb.EnqueueRequest, context: Any) -> Any:
        item = enqueue_item(request)
        self.auth.check_queue(context, "Enqueue", item.queue)
        stored = self.service.enqueue(*item)
        return pb.EnqueueResponse(**_message_fields(stored))

    @rpc
    def EnqueueBatch(self, request: pb.EnqueueBatchRequest, context: Any) -> Any:
        return self._enqueue_batch(request, context)

    def EnqueueBatchStream(self, requests: Iterator[pb.EnqueueBatchRequest],
                           context: grpc.ServicerContext) -> Iterable[pb.EnqueueBatchResponse]:
        for request in requests:
            try:
                response = self._enqueue_batch(request, context, "EnqueueBatchStream")
            except Exception as exc:  # noqa: BLE001 - mapped in one place
                _abort(context, failure(GRPC_TEXT["EnqueueBatchStream"], exc))
            yield response

    def _enqueue_batch(self, request: pb.EnqueueBatchRequest, context: Any,
                       rpc: str = "EnqueueBatch") -> pb.EnqueueBatchResponse:
        messages = request.messages
        if not messages:
            raise invalid("messages must not be empty")
        if len(messages) > MAX_BATCH:
            raise invalid(f"at most {MAX_BATCH} messages per call")
        checked: set[str] = set()
        items = []
        for m in messages:
            name = m.queueName
            if name not in checked:
                checked.add(self._queue(context, rpc, name))
            items.append(EnqueueItem(name, m.id, m.group, m.priority, m.content,
                                     dict(m.metadata) if m.metadata else None))
        return pb.EnqueueBatchResponse(success=True, ids=self.service.enqueue_batch(items))

    @rpc
    def Dequeue(self, request: pb.DequeueRequest, context: Any) -> Any:
        message = self.service.dequeue(self._queue(context, "Dequeue", request.queueName),
                                       request.ack)
        return pb.DequeueResponse(**_message_fields(message))

    @rpc
    def Get(self, request: pb.GetRequest, context: Any) -> Any:
        message = self.service.get(self._queue(context, "Get", request.queueName),
                                   message_id(request.id))
        return pb.GetResponse(**_message_fields(message))

    @rpc
    def Delete(self, request: pb.DeleteRequest, context: Any) -> Any:
        self.service.delete(self._queue(context, "Delete", request.queueName),
                            message_id(request.id))
        return pb.DeleteResponse(success=True)

    @rpc
    def Ack(self, request: pb.AckRequest, context: Any) -> Any:
        self.service.ack(self._queue(context, "Ack", request.queueName),
                         message_id(request.id))
        return pb.AckResponse(success=True)

    @rpc
    def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> Any:
        if len(request.ids) > MAX_BATCH:
            raise invalid(f"at most {MAX_BATCH} ids per call")
        if not all(request.ids):
            raise invalid("ids must not contain 0")
        failed = self.service.ack_many(self._queue(context, "AckBatch", request.queueName),
                                       list(request.ids))
        return pb.AckBatchResponse(success=True, failed_ids=failed)

    @rpc
    def Nack(self, request: pb.NackRequest, context: Any) -> Any:
        self.service.nack(self._queue(context, "Nack", request.queueName),
                          message_id(request.id), request.priority,
                          dict(request.metadata) or None)
        return pb.NackResponse(success=True)

    @rpc
    def Touch(self, request: pb.TouchRequest, context: Any) -> Any:
        self.service.touch(self._queue(context, "Touch", request.queueName),
                           message_id(request.id))
        return pb.TouchResponse(success=True)

    @rpc
    def UpdatePriority(self, request: pb.UpdatePriorityRequest, context: Any) -> Any:
        self.service.update_priority(self._queue(context, "UpdatePriority",
                                                 request.queueName),
                                     message_id(request.id), request.priority)
        return pb.UpdatePriorityResponse(success=True)

    # -- streams -----------------------------------------------------------------------------------
    def EnqueueStream(self, requests: Iterator[pb.EnqueueRequest],
                      context: grpc.ServicerContext) -> Iterable[pb.EnqueueResponse]:
        inbox = _Inbox(requests, context, SEQ_READ_AHEAD)
        try:
            while True:
                group = inbox.take(SEQ_GROUP)
                if not group:
                    return
                stored, error = self._enqueue_group(group, context)
                for message in stored:
                    yield pb.EnqueueResponse(**_message_fields(message))
                if error is not None:
                    _abort(context, failure(GRPC_TEXT["EnqueueStream"], error))
        finally:
            inbox.close()

    def _enqueue_group(self, group: list[pb.EnqueueRequest], context: Any,
                       ) -> tuple[list[Message], BaseException | None]:
        """Commit the valid prefix of ``group`` in order; the first failure, if any."""
        items: list[EnqueueItem] = []
        error: BaseException | None = None
        for request in group:
            try:
                item = enqueue_item(request)
                self.auth.check_queue(context, "EnqueueStream", item.queue)
                items.append(item)
            except DoqError as exc:
                error = exc
                break
        if not items:
            return [], error
        try:
            stored, seq_error = self.service.enqueue_seq(items)
        except Exception as exc:  # noqa: BLE001 - mapped by the caller
            return [], exc
        return stored, seq_error or error

    def DequeueStream(self, requests: Iterator[pb.DequeueRequest],
                      context: grpc.ServicerContext) -> Iterable[pb.DequeueResponse]:
        inbox = _Inbox(requests, context, CREDIT_READ_AHEAD)
        try:
            first = inbox.take(1)
            if not first:
                return
            try:
                queue = self._queue(context, "DequeueStream", first[0].queueName)
            except DoqError as exc:
                _abort(context, failure(GRPC_TEXT["DequeueStream"], exc))
            yield from _Consumer(self.service, inbox, queue, first[0].ack,
                                 max(1, first[0].credit),
                                 min(first[0].max_batch, MAX_TAKE)).run(context)
        finally:
            inbox.close()


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


class _Inbox:
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


class _Consumer:
    """One DequeueStream subscription: credit, batched takes, wake-ups (SPEC §4.5)."""

    def __init__(self, service: Service, inbox: _Inbox, queue: str, ack: bool,
                 credit: int, max_batch: int = 0) -> None:
        self.service, self.inbox, self.queue, self.ack = service, inbox, queue, ack
        self.credit = credit
        self.max_batch = max_batch          # > 1: several messages per response

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
            return self.service.dequeue_many(self.queue, self.ack, min(self.credit, MAX_TAKE))
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
            for start in range(0, len(messages), self.max_batch):
                chunk = messages[start:start + self.max_batch]
                yield pb.DequeueResponse(success=True, messages=[
                    pb.Message(id=m.id, group=m.group, priority=m.priority, content=m.content,
                               metadata=m.metadata) for m in chunk])
                self.credit -= len(chunk)
            return
        for message in messages:
            yield pb.DequeueResponse(**_message_fields(message))
            self.credit -= 1


class MetricsInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Counts every finished call by method and status, and times it (a stream: from its
    start until it ends), into ``doq_grpc_requests_total`` and its duration histogram."""

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method
        observe = self.metrics.observe_grpc

        def outcome(context: Any, failed: bool) -> str:
            code = context.code() if hasattr(context, "code") else None
            if code is not None:
                return str(code.name)
            if not failed:
                return "OK"
            return "UNKNOWN" if context.is_active() else "CANCELLED"

        if handler.response_streaming:
            inner = handler.stream_stream or handler.unary_stream

            def streaming(request: Any, context: Any) -> Iterator[Any]:
                started, failed = time.perf_counter(), True
                try:
                    yield from inner(request, context)
                    failed = False
                finally:
                    observe(method, outcome(context, failed), time.perf_counter() - started)
            factory = (grpc.stream_stream_rpc_method_handler if handler.request_streaming
                       else grpc.unary_stream_rpc_method_handler)
            behaviour: Callable[..., Any] = streaming
        else:
            inner = handler.stream_unary or handler.unary_unary

            def unary(request: Any, context: Any) -> Any:
                started, failed = time.perf_counter(), True
                try:
                    result = inner(request, context)
                    failed = False
                    return result
                finally:
                    observe(method, outcome(context, failed), time.perf_counter() - started)
            factory = (grpc.stream_unary_rpc_method_handler if handler.request_streaming
                       else grpc.unary_unary_rpc_method_handler)
            behaviour = unary
        return factory(behaviour, request_deserializer=handler.request_deserializer,
                       response_serializer=handler.response_serializer)


class AuthInterceptor(grpc.ServerInterceptor):  # type: ignore[misc]
    """Refuses a call without a valid key (UNAUTHENTICATED) or whose key's role may not make
    it (PERMISSION_DENIED), before the handler runs; trailers carry ``doq-error-code``."""

    def __init__(self, auth: GrpcAuth) -> None:
        self.auth = auth

    def intercept_service(self, continuation: Callable[..., Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return handler
        refused = self.auth.refusal(details.method, details.invocation_metadata)
        return handler if refused is None else _refusal(handler, *refused)


def _refusal(handler: Any, status: grpc.StatusCode, code: str, message: str) -> Any:
    def refuse(request: Any, context: grpc.ServicerContext) -> Any:
        context.set_trailing_metadata(((CODE_KEY, code),))
        context.abort(status, message)

    if handler.request_streaming and handler.response_streaming:
        factory: Callable[..., Any] = grpc.stream_stream_rpc_method_handler
    elif handler.request_streaming:
        factory = grpc.stream_unary_rpc_method_handler
    elif handler.response_streaming:
        factory = grpc.unary_stream_rpc_method_handler
    else:
        factory = grpc.unary_unary_rpc_method_handler
    return factory(refuse, request_deserializer=handler.request_deserializer,
                   response_serializer=handler.response_serializer)


def grpc_credentials(cert: str, key: str, client_ca: str = "") -> grpc.ServerCredentials:
    """TLS credentials of the gRPC server; ``client_ca``: clients must present a
    certificate signed by it (mutual TLS)."""
    try:
        pair = (read_file(key), read_file(cert))
        roots = read_file(client_ca) if client_ca else None
    except OSError as exc:
        raise TlsError(f"grpc.tls_cert: cannot read {exc.filename}: {exc.strerror}") from None
    return grpc.ssl_server_credentials([pair], root_certificates=roots,
                                       require_client_auth=bool(client_ca))


def build_server(service: Service, address: str, max_workers: int = 8192,
                 metrics: Metrics | None = None, keys: KeyStore | None = None,
                 credentials: Any = None) -> tuple[grpc.Server, int]:
    """A gRPC server for ``service`` bound to ``address``; returns it and the bound port.
    ``keys``: API keys (None: open); ``credentials``: server TLS credentials (None: plain)."""
    options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
               ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
               ("grpc.so_reuseport", 0),
               # Fixed flow-control windows (no BDP probing, which grows them to megabytes
               # per stream): what a client sends ahead of the node's reading is bounded.
               ("grpc.http2.bdp_probe", 0)]
    # Handlers are greenlets (threading is monkey-patched); each open stream holds one.
    auth = GrpcAuth(keys)
    interceptors: list[Any] = [MetricsInterceptor(metrics)] if metrics is not None else []
    interceptors.append(AuthInterceptor(auth))
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=options,
                         maximum_concurrent_rpcs=max_workers, interceptors=interceptors)
    pb_grpc.add_DOQServicer_to_server(DoqServicer(service, auth), server)
    port = server.add_secure_port(address, credentials) if credentials is not None else \
        server.add_insecure_port(address)
    if port == 0:
        raise OSError(f"cannot bind the gRPC address {address}")
    return server, port


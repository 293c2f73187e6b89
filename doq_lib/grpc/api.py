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
from typing import Any, Callable, Iterable, NoReturn

import grpc

from doq_lib import rules
from doq_lib.auth import ANONYMOUS, ApiKey, KeyStore, Permission, Rule, Scope, bearer_token
from doq_lib.errors import DoqError, PermissionDenied, QueueNotFound
from doq_lib.failures import GRPC_TEXT
from doq_lib.grpc.controls import Controls
from doq_lib.grpc.requests import (
    ack_timeout_of,
    consumer_of,
    delay_of,
    deliveries_of,
    delivery_of,
    enqueue_item,
    error_text,
    invalid,
    lifecycle_of,
    message_id,
    message_parts,
    priority_of,
    queue_name,
    queue_response,
    strategy_of,
)
from doq_lib.grpc.streams import (
    MAX_TAKE,
    SEQ_GROUP,
    Consumer,
    Inbox,
    delivered_fields,
    message_fields,
)
from doq_lib.models import REJECT_REASONS, Message
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from doq_lib.service import EnqueueItem, Service

log = logging.getLogger(__name__)

#: The RPCs whose requests and responses are both streams (the rest are unary).
STREAMING_RPCS = frozenset({"EnqueueStream", "EnqueueBatchStream", "DequeueStream"})
MAX_MESSAGE_BYTES = 4 * 1024 * 1024   # an answer (a batch of messages) at most
MAX_REQUEST_BYTES = rules.MAX_REQUEST  # a request at most: the same bound as an HTTP body
MAX_BATCH = 10_000          # messages per EnqueueBatch / AckBatch call
MAX_BATCH_ENQUEUE = 1000    # messages an AckBatch stores with its acks, in all
MAX_SETTLE_ENQUEUE = 100    # messages stored with one ack, nack or reject

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
    "UpdatePriority": Rule(_C, Scope.QUEUE), "Reject": Rule(_C, Scope.QUEUE),
    "Redrive": Rule(_A, Scope.QUEUE), "PurgeQueue": Rule(_A, Scope.QUEUE),
    "PauseQueue": Rule(_A, Scope.QUEUE), "ResumeQueue": Rule(_A, Scope.QUEUE),
    "PauseGroup": Rule(_A, Scope.QUEUE), "ResumeGroup": Rule(_A, Scope.QUEUE),
    "GetGroups": Rule(_R, Scope.QUEUE), "BrowseMessages": Rule(_R, Scope.QUEUE),
    "ExplainMessage": Rule(_R, Scope.QUEUE), "GetConsumers": Rule(_R, Scope.QUEUE),
    "PutSchedule": Rule(_A, Scope.QUEUE), "GetSchedules": Rule(_R, Scope.QUEUE),
    "DeleteSchedule": Rule(_A, Scope.QUEUE), "PauseSchedule": Rule(_A, Scope.QUEUE),
    "ResumeSchedule": Rule(_A, Scope.QUEUE),
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

    def check_queue(self, context: grpc.ServicerContext, rpc: str, queue: str,
                    role_too: bool = False) -> None:
        """Whether the caller's key may use ``queue`` as ``rpc`` does (its patterns; with
        ``role_too``, its role as well: for what an RPC does beyond its own rule)."""
        if self.keys is None:
            return
        key = self.key_of(context.invocation_metadata())
        if key is not None and (key.queues or role_too):
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

    def limited(self, context: grpc.ServicerContext) -> bool:
        """Whether the caller's key is limited to some queues."""
        if self.keys is None:
            return False
        key = self.key_of(context.invocation_metadata())
        return key is None or bool(key.queues)

    def covers(self, context: grpc.ServicerContext) -> Callable[[str], bool] | None:
        """The queue names the caller's key may see, when it is limited to patterns (None:
        every name)."""
        if self.keys is None:
            return None
        key = self.key_of(context.invocation_metadata())
        return key.covers if key is not None and key.queues else None

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
def control(handler: Callable[..., Any]) -> Callable[..., Any]:
    """A :class:`Controls` RPC, served by the servicer's ``controls`` as its own unary RPCs."""
    def serve(self: "DoqServicer", request: Any, context: grpc.ServicerContext) -> Any:
        return handler(self.controls, request, context)
    serve.__name__ = serve.__qualname__ = handler.__name__
    return rpc(serve)


class DoqServicer(pb_grpc.DOQServicer):
    def __init__(self, service: Service, auth: GrpcAuth | None = None) -> None:
        self.service = service
        self.auth = auth or GrpcAuth(None)
        self.controls = Controls(service, self._queue, self.auth.covers)

    def _queue(self, context: Any, rpc: str, name: str, field: str = "queueName",
               new: bool = False) -> str:
        """A valid queue name the caller's key may use."""
        queue = queue_name(name, field, new)
        self.auth.check_queue(context, rpc, queue)
        return queue

    # -- operator controls (controls.py) ---------------------------------------------------------
    PurgeQueue = control(Controls.PurgeQueue)
    PauseQueue = control(Controls.PauseQueue)
    ResumeQueue = control(Controls.ResumeQueue)
    PauseGroup = control(Controls.PauseGroup)
    ResumeGroup = control(Controls.ResumeGroup)
    GetGroups = control(Controls.GetGroups)
    BrowseMessages = control(Controls.BrowseMessages)
    ExplainMessage = control(Controls.ExplainMessage)
    GetConsumers = control(Controls.GetConsumers)
    PutSchedule = control(Controls.PutSchedule)
    GetSchedules = control(Controls.GetSchedules)
    DeleteSchedule = control(Controls.DeleteSchedule)
    PauseSchedule = control(Controls.PauseSchedule)
    ResumeSchedule = control(Controls.ResumeSchedule)

    # -- ids and queues --------------------------------------------------------------------------
    @rpc
    def GenerateIDs(self, request: pb.GenerateIDsRequest, context: Any) -> Any:
        if not 1 <= request.number <= 1000:
            raise invalid("number must be between 1 and 1000")
        return pb.GenerateIDsResponse(success=True,
                                      ids=self.service.generate_ids(request.number))

    @rpc
    def CreateQueue(self, request: pb.CreateQueueRequest, context: Any) -> Any:
        name = self._queue(context, "CreateQueue", request.name, "name", new=True)
        if not request.HasField("settings"):
            raise invalid("invalid settings provided")
        qtype = request.type.lower()
        if qtype not in rules.QUEUE_TYPES:
            raise invalid(f"type must be one of {', '.join(rules.QUEUE_TYPES)}, "
                          f"not {request.type!r}")
        settings = request.settings
        lifecycle = self._lifecycle(context, "CreateQueue", settings)
        if not self.service.create_queue(name, qtype, strategy_of(settings),
                                         settings.max_unacked, ack_timeout_of(settings),
                                         lifecycle):
            return pb.CreateQueueResponse(success=True)
        try:                                     # it existed: what is stored, flagged
            stored = queue_response(self.service.queue_info(name), self.auth.covers(context))
        except QueueNotFound:                    # deleted since
            return pb.CreateQueueResponse(success=True, existed=True)
        return pb.CreateQueueResponse(success=True, existed=True, type=stored.type,
                                      settings=stored.settings,
                                      dead_letter_queue_hidden=stored.dead_letter_queue_hidden)

    @rpc
    def UpdateQueue(self, request: pb.UpdateQueueRequest, context: Any) -> Any:
        name = self._queue(context, "UpdateQueue", request.name, "name")
        if not request.HasField("settings"):
            raise invalid("queue settings are required")
        settings = request.settings
        lifecycle = self._lifecycle(context, "UpdateQueue", settings)
        self.service.update_queue(name, strategy_of(settings), settings.max_unacked,
                                  ack_timeout_of(settings), lifecycle)
        return pb.UpdateQueueResponse(success=True)

    def _lifecycle(self, context: Any, rpc: str, settings: pb.QueueSettings) -> dict[str, Any]:
        """The lifecycle settings given; the caller's key must cover the dead-letter queue
        too (sending dead letters there is writing to it)."""
        given = lifecycle_of(settings)
        if given.get("dead_letter_queue"):
            self.auth.check_queue(context, rpc, given["dead_letter_queue"])
        return given

    @rpc
    def DeleteQueue(self, request: pb.DeleteQueueRequest, context: Any) -> Any:
        self.service.delete_queue(self._queue(context, "DeleteQueue", request.name, "name"),
                                  self.auth.covers(context))
        return pb.DeleteQueueResponse(success=True)

    @rpc
    def GetQueue(self, request: pb.GetQueueRequest, context: Any) -> Any:
        info = self.service.queue_info(self._queue(context, "GetQueue", request.name, "name"))
        return queue_response(info, self.auth.covers(context))

    @rpc
    def GetQueues(self, request: pb.GetQueuesRequest, context: Any) -> Any:
        visible = self.auth.visible(context)
        covers = self.auth.covers(context)
        return pb.GetQueuesResponse(queues=[queue_response(q, covers)
                                            for q in self.service.list_queues()
                                            if visible(q.name)])

    # -- messages ----------------------------------------------------------------------------------
    @rpc
    def Enqueue(self, request: pb.EnqueueRequest, context: Any) -> Any:
        item = enqueue_item(request)
        self.auth.check_queue(context, "Enqueue", item.queue)
        stored = self.service.enqueue(*item)
        return pb.EnqueueResponse(**message_fields(stored), duplicate=stored.duplicate)

    @rpc
    def EnqueueBatch(self, request: pb.EnqueueBatchRequest, context: Any) -> Any:
        return self._enqueue_batch(request, context)

    def EnqueueBatchStream(self, requests: Inbox,
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
        for n, m in enumerate(messages):
            item = enqueue_item(m, f"messages[{n}].")
            if item.queue not in checked:
                self.auth.check_queue(context, rpc, item.queue)
                checked.add(item.queue)
            items.append(item)
        return pb.EnqueueBatchResponse(success=True, ids=self.service.enqueue_batch(items))

    @rpc
    def Dequeue(self, request: pb.DequeueRequest, context: Any) -> Any:
        message = self.service.dequeue(self._queue(context, "Dequeue", request.queueName),
                                       request.ack, consumer_of(request.consumer))
        return pb.DequeueResponse(**delivered_fields(message, self.auth.covers(context)))

    @rpc
    def Get(self, request: pb.GetRequest, context: Any) -> Any:
        message = self.service.get(self._queue(context, "Get", request.queueName),
                                   message_id(request.id))
        return pb.GetResponse(**delivered_fields(message, self.auth.covers(context)))

    @rpc
    def Delete(self, request: pb.DeleteRequest, context: Any) -> Any:
        self.service.delete(self._queue(context, "Delete", request.queueName),
                            message_id(request.id))
        return pb.DeleteResponse(success=True)

    @rpc
    def Ack(self, request: pb.AckRequest, context: Any) -> Any:
        queue = self._queue(context, "Ack", request.queueName)
        mid = message_id(request.id)
        ids = self.service.ack(queue, mid, delivery_of(request.delivery, mid),
                               self._settle_items(context, request.enqueue))
        return pb.AckResponse(success=True, ids=ids)

    def _settle_items(self, context: Any, requests: Any,
                      field: str = "enqueue") -> list[EnqueueItem]:
        """The messages a settle stores with it: at most MAX_SETTLE_ENQUEUE, each to a
        queue the caller's key may produce to."""
        if len(requests) > MAX_SETTLE_ENQUEUE:
            raise invalid(f"{field}: at most {MAX_SETTLE_ENQUEUE} messages")
        items = [enqueue_item(m, f"{field}[{n}].") for n, m in enumerate(requests)]
        for queue in sorted({item.queue for item in items}):
            self.auth.check_queue(context, "Enqueue", queue, role_too=True)
        return items

    @rpc
    def AckBatch(self, request: pb.AckBatchRequest, context: Any) -> Any:
        if len(request.ids) > MAX_BATCH:
            raise invalid(f"at most {MAX_BATCH} ids per call")
        if not all(request.ids):
            raise invalid("ids must not contain 0")
        queue = self._queue(context, "AckBatch", request.queueName)
        ids = list(request.ids)
        tokens = deliveries_of(request.deliveries, ids)
        if request.enqueue:
            return self._ack_batch_enqueue(request, context, queue, ids, tokens)
        failed = self.service.ack_many(queue, ids, tokens)
        return pb.AckBatchResponse(success=True, failed_ids=failed)

    def _ack_batch_enqueue(self, request: pb.AckBatchRequest, context: Any, queue: str,
                           ids: list[int], tokens: Any) -> Any:
        """AckBatch whose ids store messages with their acks (settle-and-enqueue per id)."""
        if len(request.enqueue) > len(ids):
            raise invalid("enqueue: at most one list of messages per id")
        if sum(len(e.messages) for e in request.enqueue) > MAX_BATCH_ENQUEUE:
            raise invalid(f"enqueue: at most {MAX_BATCH_ENQUEUE} messages per call")
        per_id = [self._settle_items(context, e.messages, f"enqueue[{n}].messages")
                  for n, e in enumerate(request.enqueue)]
        failed, stored = self.service.ack_ids_enqueue(queue, ids, tokens, per_id)
        return pb.AckBatchResponse(
            success=True, failed_ids=[mid for mid, _ in failed],
            failures=[error.message for _, error in failed],
            enqueued=[pb.StoredIds(ids=got) for got in stored])

    @rpc
    def Nack(self, request: pb.NackRequest, context: Any) -> Any:
        mid = message_id(request.id)
        queue = self._queue(context, "Nack", request.queueName)
        _, _, dead, refused, ids = self.service.nack(
            queue, mid, priority_of(request.priority), message_parts("", request.metadata),
            error_text(request.error), delay_of(request.delay),
            delivery_of(request.delivery, mid), self._settle_items(context, request.enqueue))
        return pb.NackResponse(success=True, dead_lettered=dead, dead_letter_refused=refused,
                               ids=ids)

    @rpc
    def Reject(self, request: pb.RejectRequest, context: Any) -> Any:
        mid = message_id(request.id)
        queue = self._queue(context, "Reject", request.queueName)
        reason = request.reason or "rejected"
        if reason not in REJECT_REASONS:
            raise invalid(f"reason: expected one of {', '.join(REJECT_REASONS)}")
        ids = self.service.reject(queue, mid, error_text(request.error),
                                  delivery_of(request.delivery, mid),
                                  self._settle_items(context, request.enqueue), reason)
        return pb.RejectResponse(success=True, ids=ids)

    @rpc
    def Redrive(self, request: pb.RedriveRequest, context: Any) -> Any:
        queue = self._queue(context, "Redrive", request.queueName)
        if request.ids and request.count:
            raise invalid("give ids or count, not both")
        if len(request.ids) > rules.MAX_REDRIVE or request.count > rules.MAX_REDRIVE:
            raise invalid(f"at most {rules.MAX_REDRIVE} messages per call")
        if not all(request.ids):
            raise invalid("ids must not contain 0")
        if request.to:
            self._queue(context, "Redrive", request.to, "to")
        elif self.auth.limited(context):
            raise PermissionDenied("a key limited to some queues must name the target queue "
                                   "(to)")
        moved, failed = self.service.redrive(queue, request.to, list(request.ids) or None,
                                             request.count or rules.MAX_REDRIVE)
        return pb.RedriveResponse(success=True, moved=moved, failed=[
            pb.RedriveFailure(id=mid, code=code, detail=detail) for mid, code, detail in failed])

    @rpc
    def Touch(self, request: pb.TouchRequest, context: Any) -> Any:
        mid = message_id(request.id)
        self.service.touch(self._queue(context, "Touch", request.queueName), mid,
                           delivery_of(request.delivery, mid))
        return pb.TouchResponse(success=True)

    @rpc
    def UpdatePriority(self, request: pb.UpdatePriorityRequest, context: Any) -> Any:
        self.service.update_priority(self._queue(context, "UpdatePriority",
                                                 request.queueName),
                                     message_id(request.id), priority_of(request.priority))
        return pb.UpdatePriorityResponse(success=True)

    # -- streams -----------------------------------------------------------------------------------
    def EnqueueStream(self, inbox: Inbox,
                      context: grpc.ServicerContext) -> Iterable[pb.EnqueueResponse]:
        while True:
            group = inbox.take(SEQ_GROUP)        # all that wait: committed together
            if not group:
                return
            stored, error = self._enqueue_group(group, context)
            for message in stored:
                yield pb.EnqueueResponse(**message_fields(message),
                                         duplicate=message.duplicate)
            if error is not None:
                _abort(context, failure(GRPC_TEXT["EnqueueStream"], error))

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

    def DequeueStream(self, inbox: Inbox,
                      context: grpc.ServicerContext) -> Iterable[pb.DequeueResponse]:
        first = inbox.take(1)
        if not first:
            return
        try:
            queue = self._queue(context, "DequeueStream", first[0].queueName)
            name = consumer_of(first[0].consumer)
        except DoqError as exc:
            _abort(context, failure(GRPC_TEXT["DequeueStream"], exc))
        yield from Consumer(self.service, inbox, queue, first[0].ack,
                             max(1, first[0].credit),
                             min(first[0].max_batch, MAX_TAKE),
                             self.auth.covers(context), name).run(context)


"""The gRPC API's unary calls, written once for
:class:`~doq_lib.client.GrpcClient` and :class:`~doq_lib.client.aio.AsyncGrpcClient` (see
:mod:`doq_lib.client.calls`): each builds its requests, yields them as :class:`RpcCall`, and
reads the responses. The streams (consumers, producers, ``dequeue_many``) are each client's
own."""
from __future__ import annotations

from typing import Any, Protocol, Sequence

from doq_lib.client.calls import Calls, RpcCall
from doq_lib.client.common import (
    Browsed,
    ConsumerInfo,
    Created,
    Explanation,
    Failure,
    Nacked,
    Settled,
    lifecycle_given,
    to_strategy,
)
from doq_lib.client.schedules import ScheduleInfo, definition, schedule_from_rpc
from doq_lib.errors import (
    DoqError,
    MessageNotFound,
    NotUnacked,
    StaleDelivery,
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


class RpcCaller(Protocol):
    """What the calls read of the client that runs them."""

    consumer: str              # the name its dequeues give ("": none)

    def delivered(self, message: Message, queue: str) -> Message:
        """``message``, taken without an ack, as one that settles itself through the
        client."""

    @property
    def pb(self) -> Any:
        """The generated message classes (doq_pb2)."""


# -- queues ----------------------------------------------------------------------------------------
def generate_ids(c: RpcCaller, number: int) -> Calls[list[int]]:
    out = yield RpcCall("GenerateIDs", c.pb.GenerateIDsRequest(number=number), safe=True)
    return list(out.ids)


def _settings(c: RpcCaller, strategy: Strategy | str | None, max_unacked: int,
              ack_timeout: int, lifecycle: dict[str, Any]) -> Any:
    return c.pb.QueueSettings(strategy=to_strategy(strategy).name, max_unacked=max_unacked,
                              ack_timeout=ack_timeout, **lifecycle_given(lifecycle))


def create_queue(c: RpcCaller, /, name: str, qtype: str = "delayed",
                 strategy: Strategy | str | None = None, max_unacked: int = 0,
                 ack_timeout: int = 0, **lifecycle: Any) -> Calls[Created]:
    """``lifecycle``: max_deliveries, dead_letter_queue, max_messages, overflow. A name that
    exists changes nothing: the answer says so, with the stored definition."""
    asked = _settings(c, strategy, max_unacked, ack_timeout, lifecycle)
    answer = yield RpcCall("CreateQueue", c.pb.CreateQueueRequest(name=name, type=qtype,
                                                                   settings=asked))
    stored = answer.existed and answer.HasField("settings")
    return Created(name, QueueType(answer.type if stored else qtype.lower()),
                   _settings_of(answer.settings if stored else asked), answer.existed)


def update_queue(c: RpcCaller, /, name: str, strategy: Strategy | str | None = None,
                 max_unacked: int = 0, ack_timeout: int = 0, **lifecycle: Any) -> Calls[None]:
    """The lifecycle settings not given (or None) keep the queue's values."""
    yield RpcCall("UpdateQueue", c.pb.UpdateQueueRequest(
        name=name, settings=_settings(c, strategy, max_unacked, ack_timeout, lifecycle)))


def delete_queue(c: RpcCaller, name: str) -> Calls[None]:
    yield RpcCall("DeleteQueue", c.pb.DeleteQueueRequest(name=name))


def queues(c: RpcCaller) -> Calls[list[QueueInfo]]:
    out = yield RpcCall("GetQueues", c.pb.GetQueuesRequest(), safe=True)
    return [_queue_info(q) for q in out.queues]


def queue(c: RpcCaller, name: str) -> Calls[QueueInfo]:
    return _queue_info((yield RpcCall("GetQueue", c.pb.GetQueueRequest(name=name), safe=True)))


# -- messages --------------------------------------------------------------------------------------
def enqueue_request(c: RpcCaller, queue: str, content: str, priority: int = 0,
                    group: str = "", metadata: dict[str, str] | None = None, id: int = 0,
                    dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Any:
    """The EnqueueRequest of a message to store."""
    return c.pb.EnqueueRequest(queueName=queue, id=id, group=group, priority=priority,
                               content=content, metadata=metadata or {},
                               dedup_key=dedup_key, ttl=ttl, delay=delay)


def enqueue(c: RpcCaller, queue: str, content: str, priority: int = 0, group: str = "",
            metadata: dict[str, str] | None = None, id: int = 0,
            dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Calls[Message]:
    """The stored message (``duplicate``: seen within the queue's dedup window, with the
    first message's id; nothing stored). ``ttl``: seconds it may wait to be delivered
    (0: the queue's message_ttl); ``delay``: seconds before it may be delivered (any
    queue type; at most 30 days)."""
    request = enqueue_request(c, queue, content, priority, group, metadata, id, dedup_key,
                              ttl, delay)
    return message_of((yield RpcCall("Enqueue", request)))


def enqueue_batch(c: RpcCaller, items: Sequence[dict[str, Any]]) -> Calls[list[int]]:
    """Enqueue items (keyword arguments of :meth:`enqueue`) all or nothing, in one call;
    returns the ids in order."""
    request = c.pb.EnqueueBatchRequest(messages=[enqueue_request(c, **item) for item in items])
    return list((yield RpcCall("EnqueueBatch", request)).ids)


def dequeue(c: RpcCaller, queue: str, ack: bool = False) -> Calls[Message]:
    request = c.pb.DequeueRequest(queueName=queue, ack=ack, consumer=c.consumer)
    message = message_of((yield RpcCall("Dequeue", request)))
    return message if ack else c.delivered(message, queue)


def consumers(c: RpcCaller, queue: str) -> Calls[list[ConsumerInfo]]:
    """The consumers the queue knows: what each holds and did."""
    out = yield RpcCall("GetConsumers", c.pb.GetConsumersRequest(queueName=queue), safe=True)
    return [ConsumerInfo(k.name, k.held, list(k.messages), k.oldest_lease_ms, k.last_seen,
                         k.deliveries, k.acks, k.nacks) for k in out.consumers]


def get(c: RpcCaller, queue: str, id: int) -> Calls[Message]:
    return message_of((yield RpcCall("Get", c.pb.GetRequest(queueName=queue, id=id),
                                     safe=True)))


def delete(c: RpcCaller, queue: str, id: int) -> Calls[None]:
    yield RpcCall("Delete", c.pb.DeleteRequest(queueName=queue, id=id))


def ack(c: RpcCaller, queue: str, id: int, delivery: str = "",
        enqueue: Sequence[dict[str, Any]] = ()) -> Calls[list[int]]:
    """Acknowledge a delivered message; ``delivery``: the token it was delivered with
    (then StaleDelivery when that delivery is no longer current, and nothing changes);
    ``enqueue``: up to 100 messages (keyword arguments of :meth:`enqueue` each) stored
    with the ack, all or nothing. Returns their ids."""
    out = yield RpcCall("Ack", c.pb.AckRequest(
        queueName=queue, id=id, delivery=delivery,
        enqueue=[enqueue_request(c, **item) for item in enqueue]))
    return list(out.ids)


def ack_batch(c: RpcCaller, queue: str, ids: Sequence[int],
              deliveries: Sequence[str] | None = None) -> Calls[list[int]]:
    """Acknowledge ``ids`` in one call (``deliveries``: each one's token, "" for none);
    returns those that were not unacked (or whose delivery was stale)."""
    out = yield RpcCall("AckBatch", c.pb.AckBatchRequest(
        queueName=queue, ids=ids, deliveries=list(deliveries or ())))
    return list(out.failed_ids)


def ack_many(c: RpcCaller, queue: str, ids: Sequence[int],
             deliveries: Sequence[str] | None = None,
             enqueue: Sequence[Sequence[dict[str, Any]]] | None = None) -> Calls[Settled]:
    """Acknowledge ``ids`` in one AckBatch call (which does not say why an id failed:
    one sent with a token failed because that delivery is no longer current);
    ``enqueue``: per id, the messages stored with its ack, all or nothing per id
    (``Settled.enqueued``: their ids by acked id)."""
    if enqueue and any(enqueue):
        pb = c.pb
        out = yield RpcCall("AckBatch", pb.AckBatchRequest(
            queueName=queue, ids=ids, deliveries=list(deliveries or ()),
            enqueue=[pb.SettleEnqueue(messages=[enqueue_request(c, **i) for i in items])
                     for items in enqueue]))
        bad = dict(zip(out.failed_ids, out.failures))
        return Settled([i for i in ids if i not in bad],
                       [Failure(i, "not_settled", why) for i, why in bad.items()],
                       enqueued={mid: list(got.ids) for mid, got in
                                 zip(ids, out.enqueued) if got.ids})
    failed = set((yield from ack_batch(c, queue, ids, deliveries)))
    fenced = {i for i, t in zip(ids, deliveries or ()) if t}
    return Settled([i for i in ids if i not in failed], [
        Failure(i, "stale_delivery", f"message {i}: stale delivery") if i in fenced else
        Failure(i, "message_not_unacked", f"message {i} was not acknowledged")
        for i in ids if i in failed])


def nack(c: RpcCaller, queue: str, id: int, priority: int = 0,
         metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
         delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Calls[Nacked]:
    """Give a delivered message back (``priority`` 0: it keeps its own, and the queue's
    back-off applies without a ``delay``; ``error``: kept as its last_error; ``delay``:
    seconds before it may be delivered again; ``delivery``, ``enqueue``: as for ack);
    true when it was dead-lettered instead, its deliveries used up."""
    out = yield RpcCall("Nack", c.pb.NackRequest(
        queueName=queue, id=id, priority=priority, metadata=metadata or {}, error=error,
        delay=delay, delivery=delivery,
        enqueue=[enqueue_request(c, **item) for item in enqueue]))
    return Nacked(bool(out.dead_lettered), list(out.ids))


def nack_many(c: RpcCaller, queue: str, ids: Sequence[int], priority: int = 0,
              metadata: dict[str, str] | None = None, error: str = "",
              delay: int = 0, deliveries: Sequence[str] | None = None) -> Calls[Settled]:
    """Give ``ids`` back: one Nack call each (the gRPC API has no batch nack);
    ``deliveries``: each one's delivery token, in the same order ("": none)."""
    done, failed = [], []
    tokens = dict(zip(ids, deliveries)) if deliveries else {}
    for mid in dict.fromkeys(ids):
        try:
            yield from nack(c, queue, mid, priority, metadata, error, delay, tokens.get(mid, ""))
            done.append(mid)
        except (NotUnacked, MessageNotFound, StaleDelivery) as exc:
            failed.append(Failure(mid, exc.code, exc.message))
    return Settled(done, failed)


def reject(c: RpcCaller, queue: str, id: int, error: str = "", delivery: str = "",
           enqueue: Sequence[dict[str, Any]] = (), reason: str = "") -> Calls[list[int]]:
    """Dead-letter a delivered message now (``reason``: as the HTTP client's;
    ``delivery``, ``enqueue``: as for ack; returns the ids stored with it)."""
    out = yield RpcCall("Reject", c.pb.RejectRequest(
        queueName=queue, id=id, error=error, delivery=delivery, reason=reason,
        enqueue=[enqueue_request(c, **item) for item in enqueue]))
    return list(out.ids)


def touch(c: RpcCaller, queue: str, id: int, delivery: str = "") -> Calls[None]:
    """Extend a delivered message's lease (``delivery``: as for ack: StaleDelivery tells
    a worker at once that it lost the message)."""
    yield RpcCall("Touch", c.pb.TouchRequest(queueName=queue, id=id, delivery=delivery))


def update_priority(c: RpcCaller, queue: str, id: int, priority: int) -> Calls[None]:
    yield RpcCall("UpdatePriority", c.pb.UpdatePriorityRequest(queueName=queue, id=id,
                                                               priority=priority))


# -- operator controls -----------------------------------------------------------------------------
def purge(c: RpcCaller, queue: str, include_unacked: bool = False) -> Calls[int]:
    """Drop every waiting message (and, asked, every delivered one): how many."""
    return int((yield RpcCall("PurgeQueue", c.pb.PurgeQueueRequest(
        queueName=queue, include_unacked=include_unacked))).purged)


def pause(c: RpcCaller, queue: str) -> Calls[None]:
    """Stop delivery (enqueues, acks and nacks go on)."""
    yield RpcCall("PauseQueue", c.pb.QueueControlRequest(queueName=queue))


def resume(c: RpcCaller, queue: str) -> Calls[None]:
    yield RpcCall("ResumeQueue", c.pb.QueueControlRequest(queueName=queue))


def pause_group(c: RpcCaller, queue: str, group: str) -> Calls[None]:
    """Skip ``group`` and its sub-groups (a fair queue)."""
    yield RpcCall("PauseGroup", c.pb.GroupControlRequest(queueName=queue, group=group))


def resume_group(c: RpcCaller, queue: str, group: str) -> Calls[None]:
    yield RpcCall("ResumeGroup", c.pb.GroupControlRequest(queueName=queue, group=group))


def groups(c: RpcCaller, queue: str) -> Calls[list[GroupInfo]]:
    out = yield RpcCall("GetGroups", c.pb.GetGroupsRequest(queueName=queue), safe=True)
    return [GroupInfo(g.group, g.ready, g.unacked, g.paused_by if g.paused else None)
            for g in out.groups]


def browse(c: RpcCaller, queue: str, state: str = "all", group: str | None = None,
           after: int | None = None,
           limit: int = 100) -> Calls[tuple[list[Browsed], int | None]]:
    """A page of messages, nothing taken: (the page, the id to pass as ``after`` for the
    next one, or None at the end)."""
    out = yield RpcCall("BrowseMessages", c.pb.BrowseRequest(
        queueName=queue, state=state, group=group or "", after=after or 0, limit=limit),
        safe=True)
    return ([Browsed(Message(b.message.id, b.message.group, b.message.priority,
                             b.message.content, dict(b.message.metadata),
                             b.message.deliveries, b.message.last_error,
                             expires_at=b.message.expires_at), b.state, b.deadline,
                     b.consumer, b.delivered_at)
             for b in out.messages], out.next or None)


def explain(c: RpcCaller, queue: str, id: int) -> Calls[Explanation]:
    out = yield RpcCall("ExplainMessage", c.pb.ExplainRequest(queueName=queue, id=id),
                        safe=True)
    return Explanation(out.state, [
        {k: v for k, v in (("code", r.code), ("group", r.group), ("until", r.until),
                           ("next_at", r.next_at), ("unacked", r.unacked), ("max", r.max),
                           ("in_flight", r.in_flight)) if v or k == "code"}
        for r in out.reasons], out.ahead, out.held_by, out.held_since)


def redrive(c: RpcCaller, queue: str, to: str = "", ids: Sequence[int] | None = None,
            count: int | None = None) -> Calls[Settled]:
    """Move dead-lettered messages of ``queue`` back: to ``to`` (default: each to its
    x-dead-from), the ``ids`` given or the first ``count`` (default: up to 10000)."""
    out = yield RpcCall("Redrive", c.pb.RedriveRequest(
        queueName=queue, to=to, ids=list(ids or ()), count=count or 0))
    failed = [Failure(f.id, f.code, f.detail) for f in out.failed]
    bad = {f.id for f in failed}
    moved = [i for i in ids if i not in bad] if ids is not None else []
    return Settled(moved, failed, out.moved)


# -- schedules -------------------------------------------------------------------------------------
def put_schedule(c: RpcCaller, queue: str, name: str, content: str, *,
                 cron: str | None = None, every: int | None = None,
                 timezone: str | None = None, priority: int = 0, group: str = "",
                 metadata: dict[str, str] | None = None, ttl: int = 0,
                 start_at: int | None = None, end_at: int | None = None,
                 catch_up: str | None = None, grace: int | None = None,
                 paused: bool = False) -> Calls[ScheduleInfo]:
    """Create schedule ``name`` of ``queue`` (``cron`` or ``every`` seconds), or replace
    its definition; it stores a message with ``content`` at each occurrence."""
    given = definition(name, content, cron, every, timezone, priority, group, metadata,
                       ttl, start_at, end_at, catch_up, grace)
    pb = c.pb
    given["message"] = pb.ScheduleMessage(**given["message"])
    out = yield RpcCall("PutSchedule", pb.PutScheduleRequest(
        queueName=queue, paused=paused, schedule=pb.ScheduleDefinition(**given)))
    return schedule_from_rpc(out.schedule, out.status.lower())


def schedules(c: RpcCaller, queue: str) -> Calls[list[ScheduleInfo]]:
    out = yield RpcCall("GetSchedules", c.pb.GetSchedulesRequest(queueName=queue), safe=True)
    return [schedule_from_rpc(s) for s in out.schedules]


def schedule(c: RpcCaller, queue: str, name: str) -> Calls[ScheduleInfo]:
    out = yield RpcCall("GetSchedules", c.pb.GetSchedulesRequest(queueName=queue, name=name),
                        safe=True)
    return schedule_from_rpc(out.schedules[0])


def delete_schedule(c: RpcCaller, queue: str, name: str) -> Calls[None]:
    yield RpcCall("DeleteSchedule", c.pb.ScheduleRequest(queueName=queue, name=name))


def pause_schedule(c: RpcCaller, queue: str, name: str) -> Calls[bool]:
    """Whether it was running (and is paused now)."""
    out = yield RpcCall("PauseSchedule", c.pb.ScheduleRequest(queueName=queue, name=name))
    return bool(out.changed)


def resume_schedule(c: RpcCaller, queue: str, name: str) -> Calls[bool]:
    out = yield RpcCall("ResumeSchedule", c.pb.ScheduleRequest(queueName=queue, name=name))
    return bool(out.changed)


# -- decoding --------------------------------------------------------------------------------------
def message_of(response: Any) -> Message:
    """A message from a response (Enqueue's has no delivery count: 0 then)."""
    return Message(response.id, response.group, response.priority, response.content,
                   dict(response.metadata), getattr(response, "deliveries", 0),
                   getattr(response, "last_error", ""), getattr(response, "duplicate", False),
                   getattr(response, "expires_at", 0), getattr(response, "delivery", ""))


def _settings_of(s: Any) -> QueueSettings:
    return QueueSettings(Strategy(s.strategy), s.max_unacked, s.ack_timeout,
                         **{key: getattr(s, key) for key in LIFECYCLE_SETTINGS
                            if s.HasField(key)})


def _queue_info(q: Any) -> QueueInfo:
    settings = _settings_of(q.settings)
    return QueueInfo(q.name, QueueType(q.type), settings, q.ready, q.unacked,
                     q.stats.enqueueRPS, q.stats.dequeueRPS, q.stats.ackRPS, q.stats.nackRPS,
                     q.paused, q.paused_groups, q.dead_letter_queue_hidden)


def error_of(exc: Any, safe: bool = False) -> DoqError:
    """The DoqError for a failed call (a ``grpc.RpcError``, blocking or asyncio);
    ``safe``: it was a read."""
    trailer = dict(exc.trailing_metadata() or ())
    code = trailer.get("doq-error-code")
    message = exc.details() or str(exc.code())
    status = exc.code().name
    if code is None:
        # Not answered by DOQ's handler: transport trouble (refused, reset, deadline).
        unsent = status == "UNAVAILABLE" and any(text in message for text in UNSENT_TEXTS)
        code = "unavailable" if status in ("UNAVAILABLE", "DEADLINE_EXCEEDED",
                                           "CANCELLED") else "internal"
        return error_for_wire_code(code, message, maybe_applied=not (unsent or safe))
    return error_for_wire_code(code, message, trailer.get("doq-maybe-applied") == "1")

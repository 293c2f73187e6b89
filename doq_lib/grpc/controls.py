"""The gRPC API's operator controls (L5): PurgeQueue, Pause/ResumeQueue, Pause/ResumeGroup,
GetGroups, BrowseMessages, ExplainMessage, GetConsumers and the schedules.
:class:`doq_lib.grpc.api.DoqServicer` holds one :class:`Controls` and serves these RPCs
through it, wrapped as its other unary RPCs."""
from __future__ import annotations

import time
from typing import Any, Callable

from doq_lib import rules, schedules
from doq_lib.errors import InvalidArgument
from doq_lib.fsm.inspect import BROWSE_STATES
from doq_lib.fsm.schedules import ScheduleView
from doq_lib.grpc.streams import delivered_fields
from doq_lib.pb import doq_pb2 as pb
from doq_lib.service import Service

BROWSE_LIMIT = 100


def group_name(group: str) -> str:
    """A group to pause or resume: required, and a valid group."""
    message = rules.group_message(group, "grpc") if group else "group is required"
    if message is not None:
        raise InvalidArgument(message)
    return group


#: A BrowseMessages page at most, about: well inside gRPC's 4 MiB per message (a longer
#: page ends early, with ``next``), whatever the messages' sizes.
PAGE_BYTES = 3 << 20


#: ``queue(context, rpc, name)``: the valid queue name the caller's key may use (or raise)
QueueCheck = Callable[[Any, str, str], str]
#: ``covers(context)``: which queues the caller's key covers (None: every queue)
Coverage = Callable[[Any], "Callable[[str], bool] | None"]


class Controls:
    """The operator RPCs; the servicer lends them its queue-name and key checks."""

    def __init__(self, service: Service, queue: QueueCheck, covers: Coverage) -> None:
        self.service = service
        self._queue = queue
        self._covers = covers

    def PurgeQueue(self, request: pb.PurgeQueueRequest, context: Any) -> Any:
        purged = self.service.purge(self._queue(context, "PurgeQueue", request.queueName),
                                    request.include_unacked)
        return pb.PurgeQueueResponse(success=True, purged=purged)

    def PauseQueue(self, request: pb.QueueControlRequest, context: Any) -> Any:
        return self._pause("PauseQueue", request, context, True)

    def ResumeQueue(self, request: pb.QueueControlRequest, context: Any) -> Any:
        return self._pause("ResumeQueue", request, context, False)

    def PauseGroup(self, request: pb.GroupControlRequest, context: Any) -> Any:
        return self._pause("PauseGroup", request, context, True, group_name(request.group))

    def ResumeGroup(self, request: pb.GroupControlRequest, context: Any) -> Any:
        return self._pause("ResumeGroup", request, context, False, group_name(request.group))

    def _pause(self, rpc: str, request: Any, context: Any, paused: bool,
               group: str = "") -> Any:
        changed = self.service.set_paused(self._queue(context, rpc, request.queueName), paused,
                                          group)
        return pb.ControlResponse(success=True, changed=changed)

    def GetConsumers(self, request: pb.GetConsumersRequest, context: Any) -> Any:
        found = self.service.consumers(self._queue(context, "GetConsumers",
                                                   request.queueName))
        now_ms = int(time.time() * 1000)
        return pb.GetConsumersResponse(consumers=[
            pb.ConsumerInfo(name=c.name, held=c.held, messages=c.messages,
                            oldest_lease_ms=max(0, now_ms - c.oldest_since) if c.held else 0,
                            last_seen=c.last_seen, deliveries=c.deliveries, acks=c.acks,
                            nacks=c.nacks) for c in found])

    def PutSchedule(self, request: pb.PutScheduleRequest, context: Any) -> Any:
        queue = self._queue(context, "PutSchedule", request.queueName)
        given = request.schedule
        message = _schedule_message(given.message)
        status, view = self.service.scheduler.put(
            queue, given.name, message, given.cron, given.every or None, given.timezone,
            given.start_at, given.end_at, given.catch_up or schedules.DEFAULT_CATCH_UP,
            given.grace or schedules.DEFAULT_GRACE, request.paused)
        return pb.PutScheduleResponse(success=True, status=status.upper(),
                                      schedule=_schedule_info(view))

    def GetSchedules(self, request: pb.GetSchedulesRequest, context: Any) -> Any:
        queue = self._queue(context, "GetSchedules", request.queueName)
        found = self.service.scheduler.list(queue, _schedule_name(request.name, True))
        return pb.GetSchedulesResponse(schedules=[_schedule_info(v) for v in found])

    def DeleteSchedule(self, request: pb.ScheduleRequest, context: Any) -> Any:
        queue = self._queue(context, "DeleteSchedule", request.queueName)
        self.service.scheduler.delete(queue, _schedule_name(request.name))
        return pb.ControlResponse(success=True, changed=True)

    def PauseSchedule(self, request: pb.ScheduleRequest, context: Any) -> Any:
        queue = self._queue(context, "PauseSchedule", request.queueName)
        changed = self.service.scheduler.set_paused(queue, _schedule_name(request.name), True)
        return pb.ControlResponse(success=True, changed=changed)

    def ResumeSchedule(self, request: pb.ScheduleRequest, context: Any) -> Any:
        queue = self._queue(context, "ResumeSchedule", request.queueName)
        changed = self.service.scheduler.set_paused(queue, _schedule_name(request.name), False)
        return pb.ControlResponse(success=True, changed=changed)

    def GetGroups(self, request: pb.GetGroupsRequest, context: Any) -> Any:
        found = self.service.groups(self._queue(context, "GetGroups", request.queueName))
        return pb.GetGroupsResponse(groups=[
            pb.GroupInfo(group=g.group, ready=g.ready, unacked=g.unacked,
                         paused=g.paused_by is not None, paused_by=g.paused_by or "")
            for g in found])


    def BrowseMessages(self, request: pb.BrowseRequest, context: Any) -> Any:
        queue = self._queue(context, "BrowseMessages", request.queueName)
        state = request.state or "all"
        if state not in BROWSE_STATES:
            raise InvalidArgument(f"state: expected one of {', '.join(BROWSE_STATES)}")
        if request.limit > rules.MAX_BROWSE:
            raise InvalidArgument(f"limit: at most {rules.MAX_BROWSE}")
        group = None
        if request.group:
            message = rules.group_message(request.group, "grpc")
            if message is not None:
                raise InvalidArgument(message)
            group = request.group
        rows, more = self.service.browse(queue, state, group, request.after or None,
                                         request.limit or BROWSE_LIMIT, PAGE_BYTES,
                                         lambda: not context.is_active())
        covers = self._covers(context)
        return pb.BrowseResponse(next=more or 0, messages=[
            pb.BrowsedMessage(message=pb.Message(**_message_fields(r.message, covers)),
                              state=r.state, deadline=r.deadline, consumer=r.consumer,
                              delivered_at=r.since) for r in rows])

    def ExplainMessage(self, request: pb.ExplainRequest, context: Any) -> Any:
        queue = self._queue(context, "ExplainMessage", request.queueName)
        if not request.id:
            raise InvalidArgument("id is required")
        found = self.service.explain(queue, request.id, lambda: not context.is_active())
        return pb.ExplainResponse(id=request.id, state=found.state, ahead=found.ahead,
                                  reasons=[pb.ExplainReason(**r) for r in found.reasons],
                                  held_by=found.held_by, held_since=found.held_since)


def _schedule_name(name: str, optional: bool = False) -> str:
    if optional and not name:
        return ""
    try:
        schedules.check_name(name)
    except schedules.ScheduleError as exc:
        raise InvalidArgument(str(exc)) from None
    return name


def _schedule_message(given: pb.ScheduleMessage) -> dict[str, Any]:
    """A schedule's message from the wire, held to an enqueue's rules."""
    message: dict[str, Any] = {"content": given.content}
    if given.priority:
        message["priority"] = given.priority
    if given.group:
        message["group"] = given.group
    if given.metadata:
        message["metadata"] = dict(given.metadata)
    if given.ttl:
        message["ttl"] = given.ttl
    problem = schedules.message_problem(message)
    if problem is not None:
        raise InvalidArgument(f"schedule.message.{problem}")
    return message


def _schedule_info(view: ScheduleView) -> pb.ScheduleInfo:
    defn = view.defn
    message = defn.message
    return pb.ScheduleInfo(
        schedule=pb.ScheduleDefinition(
            name=defn.name, cron=defn.cron, every=defn.every, timezone=defn.timezone,
            message=pb.ScheduleMessage(content=message["content"],
                                       priority=message.get("priority", 0),
                                       group=message.get("group", ""),
                                       metadata=message.get("metadata") or {},
                                       ttl=message.get("ttl", 0)),
            start_at=defn.start_ms // 1000, end_at=defn.end_ms // 1000,
            catch_up=defn.catch_up, grace=defn.grace),
        paused=view.paused, next_at=view.next_ms // 1000, last_fired=view.last_ms // 1000,
        fired=view.fired, skipped=view.skipped, refused=view.refused,
        last_error=view.last_error, created_at=view.created_ms // 1000)


def _message_fields(message: Any, covers: Callable[[str], bool] | None) -> dict[str, Any]:
    fields = delivered_fields(message, covers)
    return {key: fields[key] for key in ("group", "id", "priority", "content", "metadata",
                                         "deliveries", "last_error", "expires_at")
            if key in fields}



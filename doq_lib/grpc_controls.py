"""The gRPC API's operator controls (issue 18, L5): PurgeQueue, Pause/ResumeQueue,
Pause/ResumeGroup, GetGroups. A mixin of :class:`doq_lib.grpc_api.DoqServicer`."""
from __future__ import annotations

from typing import Any

from doq_lib import rules
from doq_lib.errors import InvalidArgument
from doq_lib.pb import doq_pb2 as pb
from doq_lib.service import Service


def group_name(group: str) -> str:
    """A group to pause or resume: required, and a valid group."""
    message = rules.group_message(group, "grpc") if group else "group is required"
    if message is not None:
        raise InvalidArgument(message)
    return group


class ControlsServicer:
    service: Service

    def _queue(self, context: Any, rpc: str, name: str, field: str = "queueName",
               new: bool = False) -> str:
        raise NotImplementedError                       # DoqServicer's

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

    def GetGroups(self, request: pb.GetGroupsRequest, context: Any) -> Any:
        found = self.service.groups(self._queue(context, "GetGroups", request.queueName))
        return pb.GetGroupsResponse(groups=[
            pb.GroupInfo(group=g.group, ready=g.ready, unacked=g.unacked,
                         paused=g.paused_by is not None, paused_by=g.paused_by or "")
            for g in found])


#: The RPCs of this mixin (grpc_api wraps each as its own unary RPCs).
CONTROL_RPCS = ("PurgeQueue", "PauseQueue", "ResumeQueue", "PauseGroup", "ResumeGroup",
                "GetGroups")

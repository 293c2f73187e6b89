"""How every failure is worded and numbered, in one place (layer 0).

* :data:`RESULTS`: what a state-machine result code means for each replicated operation: the
  :class:`DoqError` class a client sees and its message. The service raises from it
  (:func:`error_for_result`, :func:`error_for_item`).
* :data:`API`: how each API operation reports a failure, where that differs by operation:
  the HTTP status of a business failure and the problem's ``detail`` (SPEC §3.3: the odd
  wording of the original DOQ is the wire contract), and the text gRPC puts before the
  cause (``failed to enqueue a message: Failed to get a queue: q``).
* The HTTP status and gRPC status code of each error class are the class's own
  (``http_status``, ``grpc_status`` in errors.py).

Each transport has one wrapper that reads these: ``http.calls.problem_for`` and
``grpc.api.failure``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from doq_lib.errors import (
    Conflict,
    DoqError,
    InternalError,
    InvalidArgument,
    InvalidLifecycle,
    InvalidSettings,
    MessageNotFound,
    NotUnacked,
    QueueEmpty,
    QueueFull,
    QueueInUse,
    QueueNotFound,
    ResultCode,
    ScheduleNotFound,
    StaleDelivery,
    Unavailable,
)

R = ResultCode
Wording = tuple[type[DoqError], str]
_GET_QUEUE: Wording = (QueueNotFound, "Failed to get a queue: {queue}")
_NOT_UNACKED: Wording = (NotUnacked, "Message not found: {queue}")
_EMPTY: Wording = (QueueEmpty, "Queue is empty: {queue}")
_RESTORE: dict[int, Wording] = {R.RESTORE_CONFLICT: (Conflict, "{detail}")}
_FULL: Wording = (QueueFull, "queue is full: {queue}")
_PAUSED: Wording = (QueueEmpty, "Queue is paused: {queue}")
_STAYS: Wording = (QueueFull, "{detail}: the message stays delivered")
_NO_SCHEDULE: Wording = (ScheduleNotFound, "queue {queue!r} has no schedule {detail!r}")
_STALE: Wording = (StaleDelivery, "stale delivery: the message was delivered again or settled "
                                  "since this delivery (its lease ran out?); nothing changed")

#: operation name (doq_lib.commands.NAMES) -> result code -> (error class, message). Any
#: operation: EXPIRED as in ``"*"``; a code with no entry is a bug (InternalError).
RESULTS: dict[str, dict[int, Wording]] = {
    "*": {R.EXPIRED: (Unavailable, "refused: the write reached the cluster after its deadline")},
    "create_queue": {R.INVALID_SETTINGS: (InvalidSettings,
                                          "Failed to create a queue: {queue}: {detail}"),
                     R.INVALID_LIFECYCLE: (InvalidLifecycle, "{detail}")},
    "update_queue": {R.QUEUE_NOT_FOUND: (QueueNotFound, "Failed to update a queue: {queue}"),
                     R.INVALID_SETTINGS: (InvalidSettings,
                                          "Failed to update a queue: {queue}: {detail}"),
                     R.INVALID_LIFECYCLE: (InvalidLifecycle, "{detail}")},
    "delete_queue": {R.QUEUE_NOT_FOUND: (QueueNotFound, "Failed to delete a queue: {queue}"),
                     R.QUEUE_IN_USE: (QueueInUse, "{detail}")},   # see in_use_message
    "enqueue": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.QUEUE_FULL: _FULL},
    # the detail of a refused batch is the name of the first queue that does not exist (or
    # is full)
    "enqueue_batch": {R.QUEUE_NOT_FOUND: (QueueNotFound, "Failed to get a queue: {detail}"),
                      R.QUEUE_FULL: (QueueFull, "queue is full: {detail}")},
    # enqueue_seq answers OK with the failure of the item it stopped at (error_for_item)
    "enqueue_seq": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.QUEUE_FULL: _FULL,
                    R.INTERNAL: (InternalError, "enqueue failed")},
    "dequeue": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.QUEUE_EMPTY: _EMPTY, R.QUEUE_PAUSED: _PAUSED},
    "dequeue_many": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.QUEUE_EMPTY: _EMPTY,
                     R.QUEUE_PAUSED: _PAUSED},
    "get": {R.QUEUE_NOT_FOUND: _GET_QUEUE,
            R.MESSAGE_NOT_FOUND: (MessageNotFound,
                                  "Failed to get a message from a queue: {queue}")},
    "delete": {R.QUEUE_NOT_FOUND: _GET_QUEUE,
               R.MESSAGE_NOT_FOUND: (MessageNotFound,
                                     "Failed to delete a message from a queue: {queue}")},
    # a settle with items to enqueue: an unknown target queue is named as the queue, a full
    # one (or a full dead-letter queue) in the detail; the message stays delivered
    "ack": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.NOT_UNACKED: _NOT_UNACKED,
            R.STALE_DELIVERY: _STALE, R.QUEUE_FULL: _STAYS},
    "nack": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.NOT_UNACKED: _NOT_UNACKED,
             R.STALE_DELIVERY: _STALE, R.QUEUE_FULL: _STAYS},
    "reject": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.NOT_UNACKED: _NOT_UNACKED,
               R.STALE_DELIVERY: _STALE,
               R.QUEUE_FULL: (QueueFull, "{detail}: the message stays delivered")},
    "redrive": {R.QUEUE_NOT_FOUND: _GET_QUEUE},
    "touch": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.NOT_UNACKED: _NOT_UNACKED,
              R.STALE_DELIVERY: _STALE},
    "update_priority": {R.QUEUE_NOT_FOUND: _GET_QUEUE,
                        R.MESSAGE_NOT_FOUND: (MessageNotFound,
                                              "Failed to dequeue a message from a queue: {queue}")},
    "ack_many": {R.QUEUE_NOT_FOUND: _GET_QUEUE},
    "ack_ids": {R.QUEUE_NOT_FOUND: _GET_QUEUE},
    "nack_ids": {R.QUEUE_NOT_FOUND: _GET_QUEUE},
    "purge": {R.QUEUE_NOT_FOUND: _GET_QUEUE},
    "set_paused": {R.QUEUE_NOT_FOUND: _GET_QUEUE,
                   R.INVALID_CONTROL: (InvalidArgument, "{detail}")},
    "schedule_put": {R.QUEUE_NOT_FOUND: _GET_QUEUE,
                     R.INVALID_CONTROL: (InvalidArgument, "{detail}")},
    "schedule_delete": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.SCHEDULE_NOT_FOUND: _NO_SCHEDULE},
    "schedule_pause": {R.QUEUE_NOT_FOUND: _GET_QUEUE, R.SCHEDULE_NOT_FOUND: _NO_SCHEDULE},
    "restore_begin": _RESTORE, "restore_put": _RESTORE, "restore_commit": _RESTORE,
}

#: The failure of one message of a redrive: its wire code.
REDRIVE_CODES: dict[int, str] = {
    R.MESSAGE_NOT_FOUND: "message_not_found", R.MESSAGE_DELIVERED: "message_delivered",
    R.NO_ORIGIN: "no_origin", R.QUEUE_NOT_FOUND: "queue_not_found",
    R.INVALID_LIFECYCLE: "same_queue", R.QUEUE_FULL: "queue_full",
}

#: The failure of one id of ack_ids / nack_ids (a code not listed: NotUnacked).
ITEM_RESULTS: dict[int, Wording] = {
    R.MESSAGE_NOT_FOUND: (MessageNotFound, "message {id} is not in queue {queue}"),
    R.NOT_UNACKED: (NotUnacked, "message {id} is not delivered and unacknowledged"),
    R.STALE_DELIVERY: (StaleDelivery, "message {id}: stale delivery (delivered again or "
                                      "settled since); nothing changed"),
    # an ack that stores messages with it: a target queue that does not exist, or is full
    R.QUEUE_NOT_FOUND: (QueueNotFound, "message {id}: queue {detail} does not exist; "
                                       "nothing changed"),
    R.QUEUE_FULL: (QueueFull, "message {id}: {detail}; nothing changed"),
}


def error_for_result(operation: str, code: int, queue: str = "", detail: object = None,
                     ) -> DoqError:
    """The error a client sees when ``operation`` (on ``queue``) ended with ``code``."""
    known = RESULTS.get(operation, {}).get(code) or RESULTS["*"].get(code)
    if known is None:
        why = detail or ResultCode(code).name
        return InternalError(f"{operation} failed: {why}")
    cls, template = known
    return cls(template.format(queue=queue, detail=detail))


def in_use_message(queue: str, users: list[str],
                   shown: Callable[[str], bool] | None = None) -> str:
    """Why ``queue`` cannot be deleted: the queues that dead-letter into it, those the
    caller's key may see by name (``shown``: None, every one), the others counted."""
    seen = [u for u in users if shown is None or shown(u)]
    names = ", ".join(map(repr, seen))
    hidden = len(users) - len(seen)
    if hidden:
        others = f"{hidden} queue{'s' if hidden > 1 else ''} your key may not see"
        names = f"{names} and {others}" if names else others
    return (f"queue {queue!r} is the dead-letter queue of {names}: change their "
            "dead_letter_queue first")


def error_for_item(queue: str, mid: int, code: int, detail: object = None) -> DoqError:
    cls, template = ITEM_RESULTS.get(code, ITEM_RESULTS[R.NOT_UNACKED])
    return cls(template.format(id=mid, queue=queue, detail=detail))


# -- the API's wording ---------------------------------------------------------------------------
UNEXPECTED = "unexpected error occurred"     # the detail of a failure that is a bug
MALFORMED = "malformed request"              # the HTTP server's own refusals (before routing)
_BACKUP_DETAILS = {400: "invalid backup file", 409: "Conflict", 422: "validation failed"}


@dataclass(frozen=True)
class ApiFailure:
    """How one API operation reports a failure."""

    http_status: int                 # the status of a business failure on its HTTP route
    detail: str                      # the HTTP problem's detail
    grpc_text: str = ""              # gRPC: "<grpc_text>: <the error's message>"
    rpcs: tuple[str, ...] = ()       # the gRPC methods of this operation
    own_status: bool = False         # HTTP: the error's own status instead of http_status
    details: dict[int, str] = field(default_factory=dict)    # own status -> detail
    own_message: tuple[str, ...] = ()    # error codes whose message is the detail


#: HTTP route op id -> its failure wording (and that of the gRPC methods doing the same).
API: dict[str, ApiFailure] = {
    "create-queue": ApiFailure(409, "Failed to enqueue a message", "failed to create a queue",
                               ("CreateQueue",)),
    "queue-info": ApiFailure(400, "Failed to get stats for a queue", "failed to get a queue",
                             ("GetQueue",)),
    "update-queue": ApiFailure(409, "Failed to update a queue", "failed to update a queue",
                               ("UpdateQueue",)),
    "delete-queue": ApiFailure(400, "Failed to dequeue a message from a queue",
                               "failed to delete a queue", ("DeleteQueue",)),
    "enqueue": ApiFailure(409, "Failed to enqueue a message", "failed to enqueue a message",
                          ("Enqueue", "EnqueueStream")),
    "enqueue-batch": ApiFailure(409, "Failed to enqueue a message", "failed to enqueue messages",
                                ("EnqueueBatch", "EnqueueBatchStream")),
    "dequeue": ApiFailure(400, "Failed to dequeue a message from a queue",
                          "failed to dequeue a message", ("Dequeue", "DequeueStream")),
    "get": ApiFailure(400, "Failed to get a message from a queue", "failed to get a message",
                      ("Get",)),
    "delete": ApiFailure(400, "Failed to delete a message from a queue",
                         "failed to delete a message", ("Delete",)),
    "ack": ApiFailure(400, "Failed to ack a message from a queue", "failed to ack a message",
                      ("Ack",)),
    "nack": ApiFailure(400, "Failed to nack a message from a queue", "failed to nack a message",
                       ("Nack",)),
    "ack-batch": ApiFailure(400, "Failed to ack a message from a queue", "failed to ack messages",
                            ("AckBatch",)),
    "nack-batch": ApiFailure(400, "Failed to nack a message from a queue"),
    "touch": ApiFailure(400, "Failed to touch a message from a queue", "failed to touch a message",
                        ("Touch",)),
    "reject": ApiFailure(400, "Failed to reject a message from a queue",
                         "failed to reject a message", ("Reject",)),
    "redrive": ApiFailure(400, "Failed to redrive messages from a queue",
                          "failed to redrive messages", ("Redrive",)),
    "purge": ApiFailure(400, "Failed to purge a queue", "failed to purge a queue",
                        ("PurgeQueue",)),
    "pause": ApiFailure(400, "Failed to pause a queue", "failed to pause a queue",
                        ("PauseQueue",)),
    "resume": ApiFailure(400, "Failed to resume a queue", "failed to resume a queue",
                         ("ResumeQueue",)),
    "pause-group": ApiFailure(400, "Failed to pause a group", "failed to pause a group",
                              ("PauseGroup",)),
    "resume-group": ApiFailure(400, "Failed to resume a group", "failed to resume a group",
                               ("ResumeGroup",)),
    "browse": ApiFailure(400, "Failed to browse a queue", "failed to browse a queue",
                         ("BrowseMessages",)),
    "explain": ApiFailure(400, "Failed to explain a message", "failed to explain a message",
                          ("ExplainMessage",)),
    "groups": ApiFailure(400, "Failed to list the groups of a queue",
                         "failed to list the groups of a queue", ("GetGroups",)),
    "consumers": ApiFailure(400, "Failed to list the consumers of a queue",
                            "failed to list the consumers of a queue", ("GetConsumers",)),
    # schedules: each error's own status (400 no such queue, 404 no such schedule, 422)
    "put-schedule": ApiFailure(400, "Failed to create a schedule",
                               "failed to create a schedule", ("PutSchedule",),
                               own_status=True),
    "schedules": ApiFailure(400, "Failed to list the schedules of a queue",
                            "failed to list schedules", ("GetSchedules",), own_status=True),
    "schedule": ApiFailure(400, "Failed to get a schedule", own_status=True),
    "delete-schedule": ApiFailure(400, "Failed to delete a schedule",
                                  "failed to delete a schedule", ("DeleteSchedule",),
                                  own_status=True),
    "pause-schedule": ApiFailure(400, "Failed to pause a schedule", "failed to pause a schedule",
                                 ("PauseSchedule",), own_status=True),
    "resume-schedule": ApiFailure(400, "Failed to resume a schedule",
                                  "failed to resume a schedule", ("ResumeSchedule",),
                                  own_status=True),
    "update-priority": ApiFailure(409, "Failed to update priority a message",
                                  "failed to update priority of a message", ("UpdatePriority",)),
    "generate-id": ApiFailure(500, "Failed to generate ids", "failed to generate ids",
                              ("GenerateIDs",)),
    "queues": ApiFailure(500, "Failed to list queues", "failed to get queues", ("GetQueues",)),
    "cluster-servers": ApiFailure(500, UNEXPECTED),
    # 409 a concurrent change, 404 an unknown member, 422 a bad address
    "cluster-join": ApiFailure(500, UNEXPECTED, own_status=True),
    "cluster-leave": ApiFailure(500, UNEXPECTED, own_status=True),
    "internal-status": ApiFailure(500, UNEXPECTED),
    "internal-state": ApiFailure(500, UNEXPECTED),
    # a follower's refusal keeps the SPEC's wording (its message) as the detail
    "db-backup": ApiFailure(500, UNEXPECTED, own_status=True, details=_BACKUP_DETAILS,
                            own_message=("not_leader", "unrestorable_state")),
    "db-restore": ApiFailure(500, "Failed to restore database", own_status=True,
                             details=_BACKUP_DETAILS, own_message=("not_leader",)),
}

#: gRPC method -> the text its failures start with.
GRPC_TEXT: dict[str, str] = {rpc: f.grpc_text for f in API.values() for rpc in f.rpcs}


def http_failure(op_id: str, error: DoqError) -> tuple[int, str]:
    """(status, detail) of the HTTP answer when ``op_id`` failed with ``error``: the
    route's business-failure status, except 503 when the cluster could not commit, 500 for
    a bug, and the error's own status on routes that keep it."""
    failure = API[op_id]
    if isinstance(error, (InvalidArgument, QueueInUse, QueueFull, StaleDelivery)) \
            and not failure.own_status:
        return error.http_status, error.message        # newer than the original's wording
    if isinstance(error, Unavailable):
        status = error.http_status                 # 503; 507 for insufficient storage
    elif isinstance(error, InternalError) or failure.own_status:
        status = error.http_status
    else:
        status = failure.http_status
    if error.code in failure.own_message:
        return status, error.message
    return status, failure.details.get(status, failure.detail)

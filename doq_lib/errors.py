"""The one error hierarchy of DOQ (layer L0).

Every failure a client can see is a :class:`DoqError` subclass. The state machine never raises:
it returns a :class:`ResultCode` per operation, and doq_lib/failures.py says which error (and
which message) that code is for each operation, and how each API operation words a failure on
the wire. Each class carries its default HTTP status and gRPC status code.
"""
from __future__ import annotations

import enum


class ResultCode(enum.IntEnum):
    """Per-operation result codes produced by the state machine (stable: they are replicated)."""

    OK = 0
    QUEUE_NOT_FOUND = 1
    QUEUE_EMPTY = 2
    MESSAGE_NOT_FOUND = 3      # get / delete / update priority: no such id in the queue
    NOT_UNACKED = 4            # ack / nack / touch: the message is not currently delivered
    INVALID_SETTINGS = 5       # create / update queue: the settings are not allowed
    INTERNAL = 6               # an operation hit a bug; nothing of it was applied
    BAD_COMMAND = 7            # unknown operation code or malformed operation
    EXPIRED = 8                # committed after its proposer's deadline: refused, not applied
    RESTORE_CONFLICT = 9       # a restore step that does not fit the restore in progress
    INVALID_LIFECYCLE = 10     # create / update queue: a lifecycle setting refused,
    #                            e.g. a dead-letter queue that does not exist or makes a cycle
    QUEUE_IN_USE = 11          # delete queue: another queue dead-letters into it
    MESSAGE_DELIVERED = 12     # redrive: the message is delivered (unacked), not waiting
    NO_ORIGIN = 13             # redrive: no target given and the message has no x-dead-from
    QUEUE_FULL = 14            # enqueue: the queue holds max_messages and refuses more
    INVALID_CONTROL = 15       # pause / resume a group: not a fair queue, too many paused, ...
    QUEUE_PAUSED = 16          # dequeue: the queue is paused (answered as an empty queue)
    STALE_DELIVERY = 17        # ack / nack / touch / reject with a delivery token that is not
    #                            the message's current delivery (it was delivered again, or
    #                            settled): nothing changed
    SCHEDULE_NOT_FOUND = 18    # a schedule operation naming a schedule the queue does not have


class DoqError(Exception):
    """Base class: a stable ``code``; ``http_status``/``grpc_status`` are transport defaults."""

    code = "internal"
    http_status = 500
    grpc_status = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NotFoundError(DoqError):
    code = "not_found"
    http_status = 400
    grpc_status = "NOT_FOUND"


class QueueNotFound(NotFoundError):
    code = "queue_not_found"


class MessageNotFound(NotFoundError):
    code = "message_not_found"


class ScheduleNotFound(NotFoundError):
    code = "schedule_not_found"
    http_status = 404


class MemberNotFound(NotFoundError):
    code = "member_not_found"
    http_status = 404


class QueueEmpty(DoqError):
    code = "queue_empty"
    http_status = 400
    grpc_status = "NOT_FOUND"


class NotUnacked(DoqError):
    """ack / nack / touch of a message that is not currently delivered and unacknowledged."""

    code = "message_not_unacked"
    http_status = 400
    grpc_status = "FAILED_PRECONDITION"


class StaleDelivery(DoqError):
    """A settle (ack, nack, touch, reject) whose delivery token is not the message's current
    delivery: its lease ran out and it was delivered again, or it was settled already."""

    code = "stale_delivery"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class InvalidSettings(DoqError):
    code = "invalid_settings"
    http_status = 409
    grpc_status = "INVALID_ARGUMENT"


class Conflict(DoqError):
    """The request clashes with another one in progress (e.g. a membership change)."""

    code = "conflict"
    http_status = 409
    grpc_status = "ABORTED"


class QueueFull(DoqError):
    """An enqueue into a queue that holds its max_messages (overflow ``reject``)."""

    code = "queue_full"
    http_status = 429
    grpc_status = "RESOURCE_EXHAUSTED"


class QueueInUse(DoqError):
    """Deleting a queue that another queue names as its dead-letter queue."""

    code = "queue_in_use"
    http_status = 409
    grpc_status = "FAILED_PRECONDITION"


class InvalidArgument(DoqError):
    code = "invalid_argument"
    http_status = 422
    grpc_status = "INVALID_ARGUMENT"


class InvalidSchedule(InvalidArgument):
    """A schedule definition that cannot be accepted; ``field`` names the part."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class InvalidLifecycle(InvalidArgument):
    """A lifecycle setting the state refuses (a dead-letter queue that does not exist, is
    the queue itself or closes a cycle): 422 naming the setting, as a schema refusal is."""

    code = "invalid_settings"


class PeerUnverified(InvalidArgument):
    """A node to add did not prove, on its Raft address, that it can be a member."""

    code = "peer_unverified"


class Unauthenticated(DoqError):
    """No API key, or one that is not in the keys file."""

    code = "unauthenticated"
    http_status = 401
    grpc_status = "UNAUTHENTICATED"


class PermissionDenied(DoqError):
    """The API key's role or queue patterns do not allow the operation."""

    code = "permission_denied"
    http_status = 403
    grpc_status = "PERMISSION_DENIED"


class NotLeader(DoqError):
    """An operation only the leader does (backups, restores), asked of another node."""

    code = "not_leader"
    http_status = 400
    grpc_status = "FAILED_PRECONDITION"


class Unavailable(DoqError):
    """The cluster cannot commit right now (no leader, no quorum, timeout, leadership lost).

    The outcome of a write that fails this way is unknown only when ``maybe_applied`` is set.
    """

    code = "unavailable"
    http_status = 503
    grpc_status = "UNAVAILABLE"

    def __init__(self, message: str, maybe_applied: bool = False) -> None:
        super().__init__(message)
        self.maybe_applied = maybe_applied


class InsufficientStorage(Unavailable):
    """The node's disk is below its reserve (storage.min_free_bytes): a write that would
    grow the data is refused, surely not applied; another node may take it."""

    code = "insufficient_storage"
    http_status = 507
    grpc_status = "RESOURCE_EXHAUSTED"

    def __init__(self, message: str, maybe_applied: bool = False) -> None:
        super().__init__(message, maybe_applied)


class NotApplied(DoqError):
    """A streamed write the server did not apply because an earlier write of the same
    stream failed (an EnqueueStream stops at its first failure). Sending it again is safe."""

    code = "not_applied"
    http_status = 409
    grpc_status = "ABORTED"


class InternalError(DoqError):
    code = "internal"
    http_status = 500
    grpc_status = "INTERNAL"


def _subclasses(cls: type[DoqError]) -> list[type[DoqError]]:
    out = [cls]
    for sub in cls.__subclasses__():
        out.extend(_subclasses(sub))
    return out


def error_for_wire_code(code: str, message: str, maybe_applied: bool = False) -> DoqError:
    """The exception for a stable ``code`` received over the wire (clients)."""
    for cls in _subclasses(DoqError)[1:]:
        if cls.code == code:
            if issubclass(cls, Unavailable):
                return cls(message, maybe_applied)
            return cls(message)
    return DoqError(message)

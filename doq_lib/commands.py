"""Replicated commands (L3): versioned plain data, cheap to pickle.

A Raft entry carries one ``apply_batch(ops, now_ms, expires_ms)`` call. ``ops`` is a list of
tuples whose first element is the operation code below; ``now_ms`` is the proposer's time, the
only clock the state machine ever sees; ``expires_ms`` (0 = never) is the proposer's deadline:
an entry that commits after the cluster's clock has passed it is refused as a whole (its
callers were told the write failed, so it must not take effect later). The proposer resolves
all that is not deterministic (time, ids, the default ack timeout) into the operation.

Adding an operation: give it a new code (never reuse one) and keep old codes applicable, so a
journal written by an older version replays identically (tests/core/test_commands.py replays one).

On the wire an operation is a plain tuple ``(code, field, ...)`` (the Raft log's loader refuses
any class), made by the constructors below and read by :func:`decode` as its code's typed view
(``Enqueue``, ...); nothing outside this module indexes an operation by position.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Sequence

FORMAT_VERSION = 1

# Each operation's fields, in wire order, are its typed view's (below); here: what it does.
CREATE_QUEUE = 1      # ack_timeout 0 = the proposer's configured default (the next field;
UPDATE_QUEUE = 2      # absent = 1800); lifecycle settings: a dict of the keys given, or None
DELETE_QUEUE = 3
ENQUEUE = 4           # dedup key "": the client id, if any, in a queue with a dedup window;
#                       ttl 0: the queue's message_ttl; delay: seconds held back (0: none)
DEQUEUE = 5           # consumer "": unnamed
GET = 6               # read through the log: linearizable
DELETE = 7
ACK = 8               # token: a delivery's (deliveries, delivered at ms); a settle whose token
#                       is not the message's current delivery is refused (STALE_DELIVERY);
#                       None: any delivery. enqueue: items (as ENQUEUE_BATCH's) stored with the
#                       settle, all or nothing; the result is then (the settle's result, [ids])
NACK = 9              # priority 0 / metadata None: kept; delay: seconds before it is
#                       deliverable again (0: none, or back-off); token, enqueue: as ACK's
TOUCH = 10
UPDATE_PRIORITY = 11
REQUEUE_EXPIRED = 12  # the leader's round (Round); (op,): unbounded, every queue (entries
#                       written before rounds were bounded)
LEADER_CONFIG = 13
MEMBER_INFO = 14      # who a member is
MEMBER_FORGET = 15    # after it left
TICK = 16             # the leader's clock, when nothing else moved it for a second
ENQUEUE_BATCH = 17    # all or nothing: refused whole when one of the queues does not exist
DEQUEUE_MANY = 18     # up to max_count, at least one
ACK_MANY = 19         # result: the ids that were not unacked
ENQUEUE_SEQ = 20      # items as ENQUEUE_BATCH's, in order, stopping at the first failure;
#                       result: (values of the applied prefix, (code, detail) or None)
RESTORE_BEGIN = 21    # start staging a restore (drops any older one)
RESTORE_PUT = 22      # [(db code, key, value or None = deleted), ...]
RESTORE_COMMIT = 23   # full: replace the queue state with the staged records; else apply them
#                       on top, only right after the restore that ended at version since - 1
RESTORE_ABORT = 24    # drop what was staged
ACK_IDS = 25          # tokens, enqueue: None or one per id (its items: all or nothing); result:
#                       [(id, code), ...] of the ids that failed (with enqueue: ([(id, code,
#                       detail)], [ids]))
NACK_IDS = 26         # result as ACK_IDS
REJECT = 27           # dead-letter a delivered message now
REDRIVE = 28          # dead letters back (to "": each to its x-dead-from); None ids: the first
#                       ``limit`` by id. Result: (moved, [(id, code, detail), ...])
PURGE = 29            # drop every waiting (and, asked, delivered) message; result: how many
SET_PAUSED = 30       # pause or resume delivery of a queue (group "") or of a fair queue's
#                       group and its sub-groups
CLUSTER_ID = 31       # the first leader names the cluster (32 hex digits); later ones change
#                       nothing. Result: the cluster's id
# schedules (fsm/schedules.py; times: the leader's unix ms). PUT creates or replaces; FIRE
# applies only while the schedule's next occurrence is ``after`` and stores a message per
# occurrence (result: the ids; None: none)
SCHEDULE_PUT, SCHEDULE_DELETE, SCHEDULE_PAUSE, SCHEDULE_FIRE = 32, 33, 34, 35

#: code -> name (create_queue, ...): each constant above, lowercased
NAMES: dict[int, str] = {code: name.lower() for name, code in dict(globals()).items()
                         if name.isupper() and name != "FORMAT_VERSION"
                         and isinstance(code, int)}
READ_ONLY = frozenset({GET})
#: Operations that grow the stored data: refused while the disk is below its reserve.
GROWS = frozenset({CREATE_QUEUE, ENQUEUE, ENQUEUE_BATCH, ENQUEUE_SEQ, RESTORE_BEGIN,
                   RESTORE_PUT, SCHEDULE_PUT, SCHEDULE_FIRE})

Op = tuple[Any, ...]
_SETTLES = {ACK: 4, NACK: 8, REJECT: 5}      # settles that may carry items: where they are


def grows(op: Op) -> bool:
    """Whether ``op`` may grow the stored data (an enqueue, or a settle with items)."""
    at = _SETTLES.get(op[0])
    return op[0] in GROWS or (at is not None and len(op) > at and isinstance(op[at], list)
                              and bool(op[at]))


def op_size(op: Op) -> int:
    """Rough encoded size of an operation, for capping batches by bytes."""
    size = 16
    for field in op:
        if isinstance(field, (list, tuple)):
            size += sum(op_size(item) if isinstance(item, tuple) else 9 for item in field)
        elif isinstance(field, str):
            size += len(field) + 6
        elif isinstance(field, dict):
            size += sum(len(k) + (len(v) if isinstance(v, str) else 8) + 12
                        for k, v in field.items()) + 4
        else:
            size += 9
    return size


# -- typed views --------------------------------------------------------------------------------
# One NamedTuple per operation: its fields in wire order (after the code). Trailing fields an
# older version did not write have defaults, so its operations still decode.
class CreateQueue(NamedTuple):
    name: str
    type: str
    strategy: int
    max_unacked: int
    ack_timeout: int             # 0: the proposer's default (next field)
    default_ack_timeout: int = 0     # absent in old operations: FALLBACK_ACK_TIMEOUT
    lifecycle: dict[str, Any] | None = None     # the lifecycle settings; None: all defaults


class UpdateQueue(NamedTuple):
    name: str
    strategy: int
    max_unacked: int
    ack_timeout: int
    default_ack_timeout: int = 0
    lifecycle: dict[str, Any] | None = None     # the ones to change; None: keep them all


class DeleteQueue(NamedTuple):
    name: str


class Enqueue(NamedTuple):
    queue: str
    id: int                      # 0: the state machine assigns one
    group: str
    priority: int
    content: str
    metadata: dict[str, str] | None
    dedup_key: str = ""          # seen within the queue's dedup window: a duplicate
    ttl: int = 0                 # seconds it may wait to be delivered (0: the queue's)
    delay: int = 0               # seconds a new message is held back (0: deliverable now)


#: One message of ENQUEUE_BATCH / ENQUEUE_SEQ: the fields of ENQUEUE.
Item = Enqueue


#: A delivery's token in an operation: (deliveries, delivered at: unix ms); see rules.
Token = Any


class Dequeue(NamedTuple):
    queue: str
    ack: bool
    consumer: str = ""           # who takes it ("": unnamed; older operations)


class MessageRef(NamedTuple):
    """GET, DELETE: one message of one queue."""
    queue: str
    id: int


class Settle(NamedTuple):
    """ACK, TOUCH: one delivered message of one queue."""
    queue: str
    id: int
    token: Token = None          # None: whichever delivery it is in (older operations)
    enqueue: list[Any] | None = None     # ACK: items stored with it, all or nothing


class Nack(NamedTuple):
    queue: str
    id: int
    priority: int                # 0: keep the message's own
    metadata: dict[str, str] | None      # None: keep the message's own
    error: str = ""              # kept as the message's last error ("" = keep the one it has)
    delay: int = 0               # seconds it is held back (0: at once, or the queue's back-off)
    token: Token = None
    enqueue: list[Any] | None = None


class RejectMessage(NamedTuple):
    queue: str
    id: int
    error: str
    token: Token = None
    enqueue: list[Any] | None = None
    reason: str = "rejected"     # its x-dead-reason: one of models.REJECT_REASONS


class UpdatePriority(NamedTuple):
    queue: str
    id: int
    priority: int


class NoFields(NamedTuple):
    """TICK: the entry's time is all it needs."""


class Round(NamedTuple):
    """REQUEUE_EXPIRED (fsm/messages.py's requeue_expired); budget 0: the first form."""

    budget: int = 0               # messages handled at most
    expiring: Any = None          # qids of queues whose TTL expiry is due (the leader's)
    forget: Any = None            # qids of queues whose idle consumers are looked at


class PublishLeader(NamedTuple):
    node_id: str
    raft_addr: str
    grpc_addr: str
    http_addr: str


class PutMember(NamedTuple):
    node_id: str
    raft_addr: str
    http_addr: str
    grpc_addr: str
    client_http_addr: str = ""       # later fields (older entries lack them)
    client_grpc_addr: str = ""


class MemberForget(NamedTuple):
    raft_addr: str


class Items(NamedTuple):
    """ENQUEUE_BATCH (all or nothing) and ENQUEUE_SEQ (in order, to the first failure)."""
    items: list[Any]             # plain tuples on the wire; :meth:`typed` reads them


class DequeueMany(NamedTuple):
    queue: str
    ack: bool
    max_count: int
    consumer: str = ""


class Ids(NamedTuple):
    """ACK_MANY, ACK_IDS: several messages of one queue."""
    queue: str
    ids: list[int]
    tokens: list[Token] | None = None    # one per id (a token or None); None: no tokens
    enqueue: list[Any] | None = None     # ACK_IDS: per id, the items stored with its ack


class Redrive(NamedTuple):
    queue: str
    to: str                      # "": each message back to the queue in its x-dead-from
    ids: list[int] | None        # None: the first ``limit`` waiting messages, in id order
    limit: int


class Purge(NamedTuple):
    queue: str
    include_unacked: bool


class SetPaused(NamedTuple):
    queue: str
    group: str                   # "": the whole queue
    paused: bool


class NackIds(NamedTuple):
    queue: str
    ids: list[int]
    priority: int
    metadata: dict[str, str] | None
    error: str = ""
    delay: int = 0
    tokens: list[Token] | None = None


class RestoreToken(NamedTuple):
    """RESTORE_BEGIN, RESTORE_ABORT."""
    token: str


class RestorePut(NamedTuple):
    token: str
    records: list[Any]           # (database code, key, value or None = deleted)


class ClusterId(NamedTuple):
    cluster_id: str


class SchedulePut(NamedTuple):
    queue: str
    definition: dict[str, Any]
    next_ms: int
    paused: bool = False


class ScheduleRef(NamedTuple):
    queue: str
    name: str


class SchedulePause(NamedTuple):
    queue: str
    name: str
    paused: bool


class ScheduleFire(NamedTuple):
    queue: str
    name: str
    after: int                   # the next occurrence its proposer saw
    fired: list[int]             # the occurrences to fire, in order
    skipped: int                 # missed occurrences not fired (catch_up)
    next_ms: int                 # its next occurrence afterwards (0: none)


class RestoreCommit(NamedTuple):
    token: str
    full: bool
    since: int
    last_version: int
    last_id: int
    next_qid: int


VIEWS: dict[int, Any] = {
    CREATE_QUEUE: CreateQueue, UPDATE_QUEUE: UpdateQueue, DELETE_QUEUE: DeleteQueue,
    ENQUEUE: Enqueue, DEQUEUE: Dequeue, GET: MessageRef, DELETE: MessageRef, ACK: Settle,
    NACK: Nack, TOUCH: Settle, UPDATE_PRIORITY: UpdatePriority, REQUEUE_EXPIRED: Round,
    LEADER_CONFIG: PublishLeader, MEMBER_INFO: PutMember, MEMBER_FORGET: MemberForget,
    TICK: NoFields, ENQUEUE_BATCH: Items, DEQUEUE_MANY: DequeueMany, ACK_MANY: Ids,
    ENQUEUE_SEQ: Items, RESTORE_BEGIN: RestoreToken, RESTORE_PUT: RestorePut,
    RESTORE_COMMIT: RestoreCommit, RESTORE_ABORT: RestoreToken, ACK_IDS: Ids,
    NACK_IDS: NackIds, REJECT: RejectMessage, REDRIVE: Redrive, PURGE: Purge, SET_PAUSED: SetPaused,
    CLUSTER_ID: ClusterId, SCHEDULE_PUT: SchedulePut, SCHEDULE_DELETE: ScheduleRef,
    SCHEDULE_PAUSE: SchedulePause, SCHEDULE_FIRE: ScheduleFire,
}


class MalformedOp(ValueError):
    """An operation that is not a known code with the fields of its view."""


def decode(op: Op) -> tuple[int, Any]:
    """``(code, typed view)`` of a wire operation; fields beyond the view's are ignored (as
    older code did), missing ones take the view's defaults or make it :class:`MalformedOp`."""
    if not isinstance(op, tuple) or not op:
        raise MalformedOp("an operation is a non-empty tuple")
    view = VIEWS.get(op[0])
    if view is None:
        raise MalformedOp(f"unknown operation {op[0]!r}")
    try:
        return op[0], view(*op[1:1 + len(view._fields)])
    except TypeError as exc:
        raise MalformedOp(f"{NAMES[op[0]]}: {exc}") from None


def name_of(op: Any) -> str:
    """The operation's name for logs ("?" when it has no known code)."""
    try:
        return NAMES.get(op[0], "?")
    except (TypeError, IndexError, KeyError):
        return "?"


def describe(op: Any, limit: int = 400) -> str:
    """The operation for a log line: its name and fields, long ones cut (content may be
    large), lone surrogates and control characters escaped."""
    try:
        code, view = decode(op)
        fields = view._asdict()
    except MalformedOp:
        return f"malformed {ascii(op)[:limit]}"
    parts = []
    for key, value in fields.items():
        text = ascii(value)
        parts.append(f"{key}={text[:80] + '…' if len(text) > 80 else text}")
    out = f"{NAMES[code]}({', '.join(parts)})"
    return out if len(out) <= limit else out[:limit] + "…"


def items_of(op: Items) -> list[Item]:
    """The typed items of an ENQUEUE_BATCH / ENQUEUE_SEQ view."""
    return [Item(*item[:9]) for item in op.items]


# -- constructors (plain data only: what the Raft log may carry) ---------------------------------
def _meta(metadata: dict[str, str] | None) -> dict[str, str] | None:
    """Metadata as operations carry it: None when empty (the transports build plain dicts,
    so there is nothing to copy)."""
    return metadata or None


def create_queue(name: str, qtype: str, strategy: int, max_unacked: int, ack_timeout: int,
                 default_ack_timeout: int, lifecycle: dict[str, Any] | None = None) -> Op:
    return (CREATE_QUEUE, name, qtype, int(strategy), max_unacked, ack_timeout,
            default_ack_timeout, dict(lifecycle) if lifecycle else None)


def update_queue(name: str, strategy: int, max_unacked: int, ack_timeout: int,
                 default_ack_timeout: int, lifecycle: dict[str, Any] | None = None) -> Op:
    return (UPDATE_QUEUE, name, int(strategy), max_unacked, ack_timeout, default_ack_timeout,
            dict(lifecycle) if lifecycle else None)


def delete_queue(name: str) -> Op:
    return (DELETE_QUEUE, name)


def enqueue(queue: str, mid: int, group: str, priority: int, content: str,
            metadata: dict[str, str] | None, dedup_key: str = "", ttl: int = 0,
            delay: int = 0) -> Op:
    return (ENQUEUE, *item(queue, mid, group, priority, content, metadata, dedup_key, ttl,
                           delay))


def item(queue: str, mid: int, group: str, priority: int, content: str,
         metadata: dict[str, str] | None, dedup_key: str = "", ttl: int = 0, delay: int = 0,
         ) -> tuple[Any, ...]:
    """One item of :func:`enqueue_batch` / :func:`enqueue_seq`, as a plain tuple (the
    trailing fields only when set: the fast path's operations stay as short as before)."""
    if delay:
        return (queue, mid, group, priority, content, _meta(metadata), dedup_key, ttl, delay)
    if ttl:
        return (queue, mid, group, priority, content, _meta(metadata), dedup_key, ttl)
    if dedup_key:
        return (queue, mid, group, priority, content, _meta(metadata), dedup_key)
    return (queue, mid, group, priority, content, _meta(metadata))


def enqueue_batch(items: Sequence[tuple[Any, ...]]) -> Op:
    return (ENQUEUE_BATCH, [item(*i) for i in items])


def enqueue_seq(items: Sequence[tuple[Any, ...]]) -> Op:
    return (ENQUEUE_SEQ, [item(*i) for i in items])


def dequeue(queue: str, ack: bool, consumer: str = "") -> Op:
    return (DEQUEUE, queue, bool(ack), consumer) if consumer else (DEQUEUE, queue, bool(ack))


def dequeue_many(queue: str, ack: bool, max_count: int, consumer: str = "") -> Op:
    op = (DEQUEUE_MANY, queue, bool(ack), max(1, max_count))
    return (*op, consumer) if consumer else op


def _token(token: Token) -> Token:
    return None if token is None else (int(token[0]), int(token[1]))


def _tokens(tokens: Sequence[Token] | None) -> list[Token] | None:
    if tokens is None or all(t is None for t in tokens):
        return None
    return [_token(t) for t in tokens]


def get(queue: str, mid: int) -> Op:
    return (GET, queue, mid)


def delete(queue: str, mid: int) -> Op:
    return (DELETE, queue, mid)


def _tail(token: Token, enqueue: Sequence[tuple[Any, ...]] | None) -> tuple[Any, ...]:
    """The trailing token and items of a settle (left out when not set)."""
    if enqueue:
        return (_token(token), [item(*i) for i in enqueue])
    return () if token is None else (_token(token),)


def ack(queue: str, mid: int, token: Token = None,
        enqueue: Sequence[tuple[Any, ...]] | None = None) -> Op:
    return (ACK, queue, mid, *_tail(token, enqueue))


def nack(queue: str, mid: int, priority: int, metadata: dict[str, str] | None,
         error: str = "", delay: int = 0, token: Token = None,
         enqueue: Sequence[tuple[Any, ...]] | None = None) -> Op:
    return (NACK, queue, mid, priority, metadata if metadata is None else dict(metadata), error,
            delay, *_tail(token, enqueue))


def reject(queue: str, mid: int, error: str = "", token: Token = None,
           enqueue: Sequence[tuple[Any, ...]] | None = None, reason: str = "rejected") -> Op:
    tail = _tail(token, enqueue) if reason == "rejected" else \
        (_token(token), [item(*i) for i in enqueue] if enqueue else None, reason)
    return (REJECT, queue, mid, error, *tail)


def touch(queue: str, mid: int, token: Token = None) -> Op:
    return (TOUCH, queue, mid) if token is None else (TOUCH, queue, mid, _token(token))


def update_priority(queue: str, mid: int, priority: int) -> Op:
    return (UPDATE_PRIORITY, queue, mid, priority)


def ack_many(queue: str, ids: list[int], tokens: Sequence[Token] | None = None) -> Op:
    tokens = _tokens(tokens)
    return (ACK_MANY, queue, list(ids)) if tokens is None else (ACK_MANY, queue, list(ids),
                                                                 tokens)


def ack_ids(queue: str, ids: list[int], tokens: Sequence[Token] | None = None,
            enqueue: Sequence[Sequence[tuple[Any, ...]]] | None = None) -> Op:
    tokens = _tokens(tokens)
    if enqueue is not None:
        return (ACK_IDS, queue, list(ids), tokens,
                [[tuple(item) for item in items] for items in enqueue])
    return (ACK_IDS, queue, list(ids)) if tokens is None else (ACK_IDS, queue, list(ids),
                                                               tokens)


def nack_ids(queue: str, ids: list[int], priority: int,
             metadata: dict[str, str] | None, error: str = "", delay: int = 0,
             tokens: Sequence[Token] | None = None) -> Op:
    op = (NACK_IDS, queue, list(ids), priority, _meta(metadata), error, delay)
    tokens = _tokens(tokens)
    return op if tokens is None else (*op, tokens)


def redrive(queue: str, to: str, ids: list[int] | None, limit: int) -> Op:
    return (REDRIVE, queue, to, None if ids is None else list(ids), limit)


def purge(queue: str, include_unacked: bool) -> Op:
    return (PURGE, queue, bool(include_unacked))


def set_paused(queue: str, group: str, paused: bool) -> Op:
    return (SET_PAUSED, queue, group, bool(paused))


def cluster_id(value: str) -> Op:
    return (CLUSTER_ID, value)


def requeue_expired(budget: int = 0, expiring: Sequence[int] = (),
                    forget: Sequence[int] = ()) -> Op:
    """The leader's round; budget 0: its first form (unbounded, every queue)."""
    return (REQUEUE_EXPIRED, budget, list(expiring), list(forget)) if budget else \
        (REQUEUE_EXPIRED,)


def tick() -> Op:
    return (TICK,)


def leader_config(node_id: str, raft_addr: str, grpc_addr: str, http_addr: str) -> Op:
    return (LEADER_CONFIG, node_id, raft_addr, grpc_addr, http_addr)


def member_info(node_id: str, raft_addr: str, *addresses: str) -> Op:   # PutMember's order
    return (MEMBER_INFO, node_id, raft_addr, *addresses)


def member_forget(raft_addr: str) -> Op:
    return (MEMBER_FORGET, raft_addr)


def restore_begin(token: str) -> Op:
    return (RESTORE_BEGIN, token)


def restore_put(token: str, records: list[tuple[int, bytes, bytes | None]]) -> Op:
    return (RESTORE_PUT, token, list(records))


def restore_commit(token: str, full: bool, since: int, last_version: int, last_id: int,
                   next_qid: int) -> Op:
    return (RESTORE_COMMIT, token, bool(full), since, last_version, last_id, next_qid)


def schedule_put(queue: str, definition: dict[str, Any], next_ms: int,
                 paused: bool = False) -> Op:
    return (SCHEDULE_PUT, queue, definition, next_ms, paused)


def schedule_delete(queue: str, name: str) -> Op:
    return (SCHEDULE_DELETE, queue, name)


def schedule_pause(queue: str, name: str, paused: bool) -> Op:
    return (SCHEDULE_PAUSE, queue, name, paused)


def schedule_fire(queue: str, name: str, after: int, fired: list[int], skipped: int,
                  next_ms: int) -> Op:
    return (SCHEDULE_FIRE, queue, name, after, list(fired), skipped, next_ms)


def restore_abort(token: str) -> Op:
    return (RESTORE_ABORT, token)

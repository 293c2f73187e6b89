"""Replicated commands (L3): versioned plain data, cheap to pickle.

A Raft entry carries one ``apply_batch(ops, now_ms, expires_ms)`` call. ``ops`` is a list of
tuples whose first element is the operation code below; ``now_ms`` is the proposer's time, the
only clock the state machine ever sees; ``expires_ms`` (0 = never) is the proposer's deadline:
an entry that commits after the cluster's clock has passed it is refused as a whole (its
callers were told the write failed, so it must not take effect later). Everything
non-deterministic (time, ids the proposer chooses, the configured default ack timeout) is
resolved by the proposer and travels in the operation.

Adding an operation: give it a new code (never reuse one) and keep old codes applicable, so a
journal written by an older version replays identically.
"""
from __future__ import annotations

from typing import Any

FORMAT_VERSION = 1

CREATE_QUEUE = 1      # (op, name, type, strategy, max_unacked, ack_timeout, default_ack_timeout)
UPDATE_QUEUE = 2      # (op, name, strategy, max_unacked, ack_timeout, default_ack_timeout)
# ack_timeout 0 = the proposer's configured default (the last field; absent = 1800)
DELETE_QUEUE = 3      # (op, name)
ENQUEUE = 4           # (op, queue, id or 0, group, priority, content, metadata or None)
DEQUEUE = 5           # (op, queue, ack)
GET = 6               # (op, queue, id)           read through the log: linearizable
DELETE = 7            # (op, queue, id)
ACK = 8               # (op, queue, id)
NACK = 9              # (op, queue, id, priority (0 = keep), metadata or None (= keep))
TOUCH = 10            # (op, queue, id)
UPDATE_PRIORITY = 11  # (op, queue, id, priority)
REQUEUE_EXPIRED = 12  # (op,)                      leader-proposed redelivery at command time
LEADER_CONFIG = 13    # (op, node_id, raft_addr, grpc_addr, http_addr)
MEMBER_INFO = 14      # (op, node_id, raft_addr, http_addr, grpc_addr)   who a member is
MEMBER_FORGET = 15    # (op, raft_addr)                                  after it left
TICK = 16             # (op,)   the leader's clock, when nothing else moved it for a second
ENQUEUE_BATCH = 17    # (op, [(queue, id or 0, group, priority, content, metadata), ...])
#                       all or nothing: refused whole when one of the queues does not exist
DEQUEUE_MANY = 18     # (op, queue, ack, max_count)   up to max_count messages, at least one
ACK_MANY = 19         # (op, queue, [id, ...])       result: the ids that were not unacked
ENQUEUE_SEQ = 20      # (op, [items as in ENQUEUE_BATCH])  in order, stopping at the first
#                       failure; result: (values of the applied prefix, (code, detail) or None)
RESTORE_BEGIN = 21    # (op, token)            start staging a restore (drops any older one)
RESTORE_PUT = 22      # (op, token, [(db code, key, value or None = deleted), ...])
RESTORE_COMMIT = 23   # (op, token, full, since, last_version, last_id, next_qid)
#                       full: replace the queue state with the staged records; else apply them
#                       on top, only right after the restore that ended at version since - 1
RESTORE_ABORT = 24    # (op, token)            drop what was staged
ACK_IDS = 25          # (op, queue, [id, ...])  result: [(id, code), ...] for each id that failed
#                       (MESSAGE_NOT_FOUND: no such message; NOT_UNACKED: not delivered)
NACK_IDS = 26         # (op, queue, [id, ...], priority (0 = keep), metadata or None (= keep))
#                       result as ACK_IDS

NAMES = {
    CREATE_QUEUE: "create_queue", UPDATE_QUEUE: "update_queue", DELETE_QUEUE: "delete_queue",
    ENQUEUE: "enqueue", DEQUEUE: "dequeue", GET: "get", DELETE: "delete", ACK: "ack",
    NACK: "nack", TOUCH: "touch", UPDATE_PRIORITY: "update_priority",
    REQUEUE_EXPIRED: "requeue_expired", LEADER_CONFIG: "leader_config",
    MEMBER_INFO: "member_info", MEMBER_FORGET: "member_forget", TICK: "tick",
    ENQUEUE_BATCH: "enqueue_batch", DEQUEUE_MANY: "dequeue_many", ACK_MANY: "ack_many",
    ENQUEUE_SEQ: "enqueue_seq", RESTORE_BEGIN: "restore_begin", RESTORE_PUT: "restore_put",
    RESTORE_COMMIT: "restore_commit", RESTORE_ABORT: "restore_abort", ACK_IDS: "ack_ids",
    NACK_IDS: "nack_ids",
}
READ_ONLY = frozenset({GET})

Op = tuple[Any, ...]


def op_size(op: Op) -> int:
    """Rough encoded size of an operation, for capping batches by bytes."""
    size = 16
    for field in op:
        if isinstance(field, (list, tuple)):
            size += sum(op_size(item) if isinstance(item, tuple) else 9 for item in field)
        elif isinstance(field, str):
            size += len(field) + 6
        elif isinstance(field, dict):
            size += sum(len(k) + len(v) + 12 for k, v in field.items()) + 4
        else:
            size += 9
    return size

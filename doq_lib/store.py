"""The storage contract of the state machine (L1) and the record encodings.

Layout (named databases; every key of a queue starts with its 8-byte ``qid``, a number assigned
at creation and never reused, so one queue's keys can never be a prefix of another's):

=========  ==========================  ===============================================
database   key                         value
=========  ==========================  ===============================================
meta       ``applied``                 u64 Raft index of the last applied entry
meta       ``clock``                   u64 largest command time (ms), u64 last id
meta       ``next_qid``                u64
meta       ``leader``                  JSON leader configuration
queues     :func:`queue_key` of name   qid, type, strategy, max_unacked, ack_timeout, name
                                       [, lifecycle settings as JSON: see encode_queue]
messages   qid + id (u64 BE)           priority, group, content, metadata
unacked    qid + id                    0xFF, deadline (ms), delivered at (ms), the group
                                       holding the in-flight slot, consumer (older
                                       records: deadline and the group only)
sched      qid + scheduler key         scheduler record of a fair queue
attempts   qid + id                    deliveries so far (u32), not deliverable before
                                       (unix ms, u64; 0: deliverable), last error: only
                                       for a message delivered before and given back
dedup      qid + dedup key (UTF-8)     first id (u64), first seen (unix ms, u64): queues
                                       with a dedup window
expiry     qid + id                    unix ms after which the message is never delivered
                                       (a message with a TTL)
rates      qid + group (UTF-8)         the group's theoretical arrival time (unix µs, u64):
                                       queues with a group_rate, until the bucket is full
consumers  qid + name (UTF-8)          deliveries, acks, nacks (u64 each), last seen (unix
                                       ms, u64): the consumers a queue knows (fsm/consumers)
schedules  qid + name (UTF-8)          JSON: the definition, paused, next and last
                                       occurrence (unix ms), counts (fsm/schedules)
changes    version + db code + key     b"" (or the key, when it was too long: see below)
staging    db code + key               b"\\x01" + value, or b"\\x00" for a deletion
=========  ==========================  ===============================================

``changes`` is the change history behind incremental backups: every write of a queue-state
database (``TRACKED``) records the key under the Raft index (the *version*) of the entry that
wrote it. Keys that would be too long are recorded as a SHA-256 digest, with the key as the
value. Version 0 holds bookkeeping: ``HISTORY_FROM`` (the oldest version whose records are
complete; older ones were pruned) and, per version, a first record with code 0 holding the
entry's time, so pruning can go by age. ``staging`` holds a restore while its chunks arrive
through the log. Neither is part of the state digest: they are not queue state.
"""
from __future__ import annotations

import hashlib
import json
import struct
from typing import Any, Iterator, Protocol

from doq_lib.models import LIFECYCLE_SETTINGS, QueueDef, QueueSettings, QueueType, Strategy

DB_NAMES = ("meta", "queues", "messages", "unacked", "sched", "attempts", "dedup", "expiry",
            "rates", "consumers", "schedules")
CHANGES_DB = "changes"
STAGING_DB = "staging"
TRACKED = {"queues": 1, "messages": 2, "unacked": 3, "sched": 4,     # db -> code (stable)
           "attempts": 5, "dedup": 6, "expiry": 7, "rates": 8, "consumers": 9,
           "schedules": 10}
TRACKED_NAMES = {code: name for name, code in TRACKED.items()}
TIME_CODE = 0                  # the per-version record that holds the entry's time
HISTORY_FROM = b"\x00" * 8 + b"h"
U64 = struct.Struct(">Q")
U32 = struct.Struct(">I")
_MSG_HEAD = struct.Struct(">qII")
_QUEUE = struct.Struct(">QBBII")
_EXTENDED = 0x80               # in the type byte: lifecycle settings follow the name
_ATTEMPTS = struct.Struct(">IQ")
_TWO_U64 = struct.Struct(">QQ")
MAX_KEY = 511                  # LMDB's default maximum key size, in bytes
_CLOCK = struct.Struct(">QQ")
_TYPE_CODES = {QueueType.DELAYED: 0, QueueType.FAIR: 1}
_CODE_TYPES = {v: k for k, v in _TYPE_CODES.items()}


class WriteTxn(Protocol):
    def get(self, db: str, key: bytes) -> bytes | None: ...
    def put(self, db: str, key: bytes, value: bytes) -> None: ...
    def delete(self, db: str, key: bytes) -> bool: ...
    def items(self, db: str, prefix: bytes = b"") -> Iterator[tuple[bytes, bytes]]: ...
    def delete_prefix(self, db: str, prefix: bytes) -> int: ...


class Store(Protocol):
    """What the state machine needs from storage: atomic write transactions, read snapshots."""

    def write(self) -> "TxnContext": ...
    def read(self) -> "TxnContext": ...
    def applied_index(self) -> int: ...


class TxnContext(Protocol):
    def __enter__(self) -> WriteTxn: ...
    def __exit__(self, *exc: object) -> None: ...


# -- record encodings ------------------------------------------------------------------------
def encode_message(priority: int, group: str, content: str,
                   metadata: dict[str, str] | None) -> bytes:
    g, c = group.encode(), content.encode()
    meta = json.dumps(metadata, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode() if metadata else b""
    return _MSG_HEAD.pack(priority, len(g), len(c)) + g + c + meta


def decode_message(raw: bytes) -> tuple[int, str, str, dict[str, str]]:
    """(priority, group, content, metadata)"""
    priority, glen, clen = _MSG_HEAD.unpack_from(raw)
    pos = _MSG_HEAD.size
    group = raw[pos:pos + glen].decode()
    pos += glen
    content = raw[pos:pos + clen].decode()
    pos += clen
    metadata = json.loads(raw[pos:]) if len(raw) > pos else {}
    return priority, group, content, metadata


def decode_message_head(raw: bytes) -> tuple[int, str]:
    """(priority, group) without decoding the body."""
    priority, glen, _ = _MSG_HEAD.unpack_from(raw)
    return priority, raw[_MSG_HEAD.size:_MSG_HEAD.size + glen].decode()


def queue_key(name: str) -> bytes:
    """Key of a queue definition: the UTF-8 name, or for a name too long to be an LMDB key a
    hash of it behind a 0xff byte (which never starts UTF-8 text, so the two kinds never meet)."""
    raw = name.encode()
    return raw if len(raw) <= MAX_KEY else b"\xff" + hashlib.sha256(raw).digest()


def encode_queue(defn: QueueDef) -> bytes:
    """The base record (fixed fields, then the name), as before the message lifecycle existed,
    when the queue has no lifecycle settings and no controls; else the type byte carries
    ``_EXTENDED`` and the name is length-prefixed (u32), followed by the lifecycle settings
    and the operator controls (``paused``, ``paused_groups``) as JSON."""
    s = defn.settings
    extra: dict[str, Any] = dict(s.lifecycle())
    if defn.paused:
        extra["paused"] = defn.paused
    if defn.paused_groups:
        extra["paused_groups"] = sorted(defn.paused_groups)
    name = defn.name.encode()
    if not extra:
        return _QUEUE.pack(defn.qid, _TYPE_CODES[defn.type], int(s.strategy), s.max_unacked,
                           s.ack_timeout) + name
    return (_QUEUE.pack(defn.qid, _TYPE_CODES[defn.type] | _EXTENDED, int(s.strategy),
                        s.max_unacked, s.ack_timeout) + U32.pack(len(name)) + name
            + json.dumps(extra, sort_keys=True, separators=(",", ":")).encode())


def decode_queue(name: str, raw: bytes) -> QueueDef:
    """The definition; the name stored in the value wins over ``name`` (the key may be a hash)."""
    qid, type_code, strategy, max_unacked, ack_timeout = _QUEUE.unpack_from(raw)
    extra: dict[str, Any] = {}
    if type_code & _EXTENDED:
        pos = _QUEUE.size
        (length,) = U32.unpack_from(raw, pos)
        pos += U32.size
        name = raw[pos:pos + length].decode()
        extra = json.loads(raw[pos + length:])
        type_code &= ~_EXTENDED
    elif len(raw) > _QUEUE.size:
        name = raw[_QUEUE.size:].decode()
    return QueueDef(name, qid, _CODE_TYPES[type_code],
                    QueueSettings(Strategy(strategy), max_unacked, ack_timeout,
                                  **{k: v for k, v in extra.items() if k in LIFECYCLE_SETTINGS}),
                    paused=extra.get("paused", False),
                    paused_groups=tuple(extra.get("paused_groups", ())))


_ID_KEY = b"\xff"                 # never the first byte of UTF-8 text


def dedup_key(key: str, mid: int) -> bytes:
    """The record key (after the qid) an enqueue is remembered under in a queue with a dedup
    window: its dedup_key as UTF-8, or, without one, its id in a namespace of its own (0xFF
    and the id: no text starts with that byte, so ``dedup_key: "555"`` and ``id: 555`` never
    meet). Empty: neither, nothing to remember."""
    if key:
        return key.encode()
    return _ID_KEY + U64.pack(mid) if mid else b""


def dedup_key_text(raw: bytes) -> str | int:
    """What a dedup record key names: the dedup key (text) or the id; ValueError if it is
    neither (a crafted record)."""
    if raw[:1] == _ID_KEY:
        if len(raw) != 9:
            raise ValueError("an id dedup key is 9 bytes")
        return int(U64.unpack_from(raw, 1)[0])
    return raw.decode()


def encode_dedup(mid: int, seen_ms: int) -> bytes:
    return _TWO_U64.pack(mid, seen_ms)


def decode_dedup(raw: bytes) -> tuple[int, int]:
    """(first id, first seen in unix ms)"""
    mid, seen = _TWO_U64.unpack(raw)
    return mid, seen


def encode_attempts(deliveries: int, last_error: str, not_before: int = 0) -> bytes:
    return _ATTEMPTS.pack(deliveries, not_before) + last_error.encode()


def decode_attempts(raw: bytes) -> tuple[int, str, int]:
    """(deliveries so far, last error, not deliverable before: unix ms, 0 = deliverable)"""
    deliveries, not_before = _ATTEMPTS.unpack_from(raw)
    return deliveries, raw[_ATTEMPTS.size:].decode(), not_before


_UNACKED = struct.Struct(">BQQH")
_UNACKED_V2 = 0xFF             # first byte of the second form: no deadline (< 2^63) starts so


def encode_unacked(deadline_ms: int, slot_group: str, since_ms: int = 0,
                   consumer: str = "") -> bytes:
    """A delivery record: when it is due back, the group holding the in-flight slot, when
    it was delivered (the log's unix ms: its token's) and to which consumer ("": unnamed)."""
    slot = slot_group.encode()
    return _UNACKED.pack(_UNACKED_V2, deadline_ms, since_ms, len(slot)) + slot + \
        consumer.encode()


def decode_unacked(raw: bytes) -> tuple[int, str, int, str]:
    """(deadline ms, slot group, delivered at ms, consumer); a record of the first form
    (deadline and slot only, before delivery tokens) has 0 and ""."""
    if raw[:1] != b"\xff":
        return U64.unpack_from(raw)[0], raw[8:].decode(), 0, ""
    _, deadline, since, size = _UNACKED.unpack_from(raw)
    start = _UNACKED.size
    return (deadline, raw[start:start + size].decode(), since,
            raw[start + size:].decode())


_CONSUMER = struct.Struct(">QQQQ")


def encode_consumer(deliveries: int, acks: int, nacks: int, last_ms: int) -> bytes:
    return _CONSUMER.pack(deliveries, acks, nacks, last_ms)


def decode_consumer(raw: bytes) -> tuple[int, int, int, int]:
    """(deliveries, acks, nacks, last seen: unix ms)"""
    a, b, c, d = _CONSUMER.unpack(raw)
    return a, b, c, d


def encode_clock(now_ms: int, last_id: int) -> bytes:
    return _CLOCK.pack(now_ms, last_id)


def decode_clock(raw: bytes | None) -> tuple[int, int]:
    if raw is None:
        return 0, 0
    a, b = _CLOCK.unpack(raw)
    return a, b


_MAX_CHANGE_KEY = MAX_KEY - 9


def change_key(version: int, code: int, key: bytes) -> tuple[bytes, bytes]:
    """(key, value) of the change record of ``key`` of database ``code`` at ``version``."""
    if len(key) <= _MAX_CHANGE_KEY:
        return U64.pack(version) + bytes((code,)) + key, b""
    return U64.pack(version) + bytes((code,)) + hashlib.sha256(key).digest(), key


def parse_change(ckey: bytes, cvalue: bytes) -> tuple[int, int, bytes]:
    """(version, code, key) of a change record."""
    return U64.unpack_from(ckey)[0], ckey[8], cvalue or ckey[9:]


def message_key(qid: int, mid: int) -> bytes:
    return U64.pack(qid) + U64.pack(mid)

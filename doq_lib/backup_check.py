"""The checks a restore makes on every record of a backup before anything changes (L4), the
way the store will read each record; a backup is checked the same way before it is written
(:class:`doq_lib.backup.BackupStream`), so what a backup carries, a restore accepts.
"""
from __future__ import annotations

import json
import struct
from typing import Protocol

from doq_lib.errors import InvalidArgument
from doq_lib.fsm import new_index
from doq_lib.models import QueueDef, QueueType, queue_name_problem
from doq_lib.rules import (
    MAX_PAUSED_GROUPS,
    consumer_problem,
    dedup_key_problem,
    error_problem,
    group_problem,
    lifecycle_problems,
)
from doq_lib.schedules import record_problem
from doq_lib.store import (
    TRACKED_NAMES,
    U64,
    decode_attempts,
    decode_consumer,
    decode_dedup,
    decode_message,
    decode_queue,
    decode_unacked,
    dedup_key_text,
    queue_key,
)

INT63_MAX = (1 << 63) - 1
U64_MAX = (1 << 64) - 1                  # message ids: a store may hold any (gRPC took them)


class HeaderView(Protocol):
    """What the checks need of a backup's header (doq_lib.backup.Header)."""

    @property
    def kind(self) -> str: ...            # "full" or "incremental"

    @property
    def next_qid(self) -> int: ...


class BadBackup(InvalidArgument):
    """The file is not a complete, intact DOQ backup."""

    code = "bad_backup"
    http_status = 400



class RecordChecker:
    """Checks restored records the way the store will read them, before anything changes.

    ``existing`` maps the qid of every queue the target already has to its definition; it
    counts only when the first backup is incremental (a full one replaces everything). Call
    :meth:`start` per backup, :meth:`check` per record, then :meth:`finish`.
    """

    def __init__(self, existing: dict[int, QueueDef]) -> None:
        self._existing = existing
        self._queues: dict[int, QueueDef] = {}
        self._referenced: dict[int, str] = {}          # qid -> what refers to it (first seen)
        self._sched: dict[int, list[tuple[bytes, bytes]]] = {}
        self._first: HeaderView | None = None
        self._next_qid = 1

    def start(self, header: HeaderView) -> None:
        if self._first is None:
            self._first = header
            if header.kind == "incremental":
                self._queues.update(self._existing)
        self._next_qid = max(self._next_qid, header.next_qid)

    def check(self, code: int, key: bytes, value: bytes | None) -> None:
        name = TRACKED_NAMES[code]
        try:
            _CHECKS_BY_DB[name](self, key, value)
        except BadBackup:
            raise
        except (ValueError, KeyError, IndexError, TypeError, struct.error) as exc:
            raise BadBackup(f"invalid: a {name} record cannot be read ({exc})") from None

    def _queue(self, key: bytes, value: bytes | None) -> None:
        if value is None:
            return
        defn = decode_queue(key.decode("utf-8", "replace"), value)
        problem = queue_name_problem(defn.name)
        if problem:
            raise BadBackup(f"invalid: queue name {defn.name[:80]!r}: {problem}")
        if queue_key(defn.name) != key:
            raise BadBackup(f"invalid: the record of queue {defn.name[:80]!r} has another key")
        if not 1 <= defn.qid <= INT63_MAX:
            raise BadBackup(f"invalid: queue {defn.name[:80]!r} has qid {defn.qid}")
        if defn.type == QueueType.DELAYED and defn.settings.strategy != 0:
            raise BadBackup(f"invalid: delayed queue {defn.name[:80]!r} has a strategy")
        for setting, why in lifecycle_problems(defn.settings.lifecycle(), stored=True):
            raise BadBackup(f"invalid: queue {defn.name[:80]!r}: settings.{setting}: {why}")
        problem = _controls_problem(defn)
        if problem:
            raise BadBackup(f"invalid: queue {defn.name[:80]!r}: {problem}")
        self._queues[defn.qid] = defn

    def _message(self, key: bytes, value: bytes | None) -> None:
        qid, mid = self._qid_and_id(key, "message")
        if value is not None:
            _, group, _, metadata = decode_message(value)
            if not isinstance(metadata, dict) or not all(
                    isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
                raise BadBackup(f"invalid: message {mid} has metadata that is not a map of "
                                f"strings")
            self._referenced.setdefault(qid, f"message {mid}")

    def _unacked(self, key: bytes, value: bytes | None) -> None:
        qid, mid = self._qid_and_id(key, "delivery record")
        if value is not None:
            deadline, _, since, _ = decode_unacked(value)
            if deadline > INT63_MAX:
                raise BadBackup(f"invalid: the delivery record of message {mid} has deadline "
                                f"{deadline}")
            if since > INT63_MAX:
                raise BadBackup(f"invalid: the delivery record of message {mid} was made at "
                                f"{since}")
            self._referenced.setdefault(qid, f"the delivery record of message {mid}")

    def _attempts(self, key: bytes, value: bytes | None) -> None:
        qid, mid = self._qid_and_id(key, "delivery count")
        if value is not None:
            deliveries, error, not_before = decode_attempts(value)
            if deliveries < 1 and not not_before:     # (0: held by its enqueue's delay)
                raise BadBackup(f"invalid: the delivery count of message {mid} is {deliveries}")
            if error_problem(error) is not None:
                raise BadBackup(f"invalid: the delivery count of message {mid} carries an "
                                "error text that is not allowed")
            if not_before > INT63_MAX:
                raise BadBackup(f"invalid: message {mid} is held until {not_before}")
            self._referenced.setdefault(qid, f"the delivery count of message {mid}")

    def _expiry(self, key: bytes, value: bytes | None) -> None:
        qid, mid = self._qid_and_id(key, "expiry")
        if value is not None:
            (expires_at,) = U64.unpack(value)
            if not 0 < expires_at <= INT63_MAX:
                raise BadBackup(f"invalid: message {mid} expires at {expires_at}")
            self._referenced.setdefault(qid, f"the expiry of message {mid}")

    def _dedup(self, key: bytes, value: bytes | None) -> None:
        if len(key) <= 8:
            raise BadBackup("invalid: a dedup record has a short key")
        qid = U64.unpack_from(key)[0]
        name = dedup_key_text(key[8:])
        if isinstance(name, str) and dedup_key_problem(name) is not None or name == 0:
            raise BadBackup(f"invalid: a dedup key of queue id {qid} is not allowed")
        if value is not None:
            mid, _ = decode_dedup(value)
            if not 1 <= mid <= U64_MAX:
                raise BadBackup(f"invalid: a dedup record names message id {mid}")
            self._referenced.setdefault(qid, "a dedup record")

    def _rates(self, key: bytes, value: bytes | None) -> None:
        if len(key) <= 8:
            raise BadBackup("invalid: a rate record has a short key")
        qid = U64.unpack_from(key)[0]
        group = key[8:].decode()
        if group_problem(group, stored=True) is not None:
            raise BadBackup(f"invalid: a rate record of queue id {qid} names no group")
        if value is not None:
            (tat,) = U64.unpack(value)
            if not 0 < tat <= INT63_MAX:
                raise BadBackup(f"invalid: a rate record of group {group[:80]!r} holds {tat}")
            self._referenced.setdefault(qid, "a rate record")

    def _consumer(self, key: bytes, value: bytes | None) -> None:
        if len(key) <= 8:
            raise BadBackup("invalid: a consumer record has a short key")
        qid = U64.unpack_from(key)[0]
        name = key[8:].decode()
        if consumer_problem(name) is not None:
            raise BadBackup(f"invalid: a consumer record of queue id {qid} names no consumer")
        if value is not None:
            _, _, _, last_ms = decode_consumer(value)
            if last_ms > INT63_MAX:
                raise BadBackup(f"invalid: consumer {name[:80]!r} was last seen at {last_ms}")
            self._referenced.setdefault(qid, "a consumer record")

    def _schedule(self, key: bytes, value: bytes | None) -> None:
        if len(key) <= 8:
            raise BadBackup("invalid: a schedule record has a short key")
        qid = U64.unpack_from(key)[0]
        name = key[8:].decode()
        if value is not None:
            problem = record_problem(name, json.loads(value))
            if problem:
                raise BadBackup(f"invalid: schedule {name[:80]!r} of queue id {qid}: {problem}")
            self._referenced.setdefault(qid, "a schedule record")

    def _scheduler(self, key: bytes, value: bytes | None) -> None:
        if len(key) <= 8:
            raise BadBackup("invalid: a scheduler record has a short key")
        qid = U64.unpack_from(key)[0]
        if value is not None:
            self._referenced.setdefault(qid, "a scheduler record")
            self._sched.setdefault(qid, []).append((key[8:], value))

    @staticmethod
    def _qid_and_id(key: bytes, what: str) -> tuple[int, int]:
        if len(key) != 16:
            raise BadBackup(f"invalid: a {what} key has {len(key)} bytes, not 16")
        qid, mid = U64.unpack_from(key)[0], U64.unpack_from(key, 8)[0]
        if not 1 <= mid:
            raise BadBackup(f"invalid: a {what} has id 0")
        return qid, mid

    def finish(self) -> None:
        """The checks that need every record: known queues, complete scheduler records."""
        for qid, what in self._referenced.items():
            if qid not in self._queues:
                raise BadBackup(f"invalid: {what} belongs to no queue of the backup "
                                f"(qid {qid})")
        for qid, defn in self._queues.items():
            if qid >= self._next_qid and qid not in self._existing:
                raise BadBackup(f"invalid: queue {defn.name[:80]!r} has qid {qid}, not below "
                                f"the header's next_qid {self._next_qid}")
        if self._first is not None and self._first.kind == "full":
            for qid, records in self._sched.items():
                self._load_scheduler(self._queues[qid], records)

    @staticmethod
    def _load_scheduler(defn: QueueDef, records: list[tuple[bytes, bytes]]) -> None:
        try:
            new_index(defn).load_records(records)
        except (ValueError, KeyError, IndexError, TypeError, struct.error,
                UnicodeDecodeError) as exc:
            raise BadBackup(f"invalid: the scheduler records of queue {defn.name[:80]!r} "
                            f"cannot be loaded ({exc!r})") from None


def _controls_problem(defn: QueueDef) -> str | None:
    """What is wrong with a queue record's operator controls, if anything."""
    if not isinstance(defn.paused, bool):
        return "paused: expected true or false"
    groups = defn.paused_groups
    if not groups:
        return None
    if defn.type is not QueueType.FAIR:
        return "paused_groups: only a fair queue has groups to pause"
    if len(groups) > MAX_PAUSED_GROUPS:
        return f"paused_groups: more than {MAX_PAUSED_GROUPS}"
    if not all(isinstance(g, str) and g and group_problem(g, stored=True) is None
               for g in groups):
        return "paused_groups: expected group names"
    if list(groups) != sorted(set(groups)):
        return "paused_groups: expected distinct names in order"
    return None


_CHECKS_BY_DB = {"queues": RecordChecker._queue, "messages": RecordChecker._message,
                 "unacked": RecordChecker._unacked, "sched": RecordChecker._scheduler,
                 "attempts": RecordChecker._attempts, "dedup": RecordChecker._dedup,
                 "expiry": RecordChecker._expiry, "rates": RecordChecker._rates,
                 "consumers": RecordChecker._consumer, "schedules": RecordChecker._schedule}

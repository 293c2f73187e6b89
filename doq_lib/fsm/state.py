"""The state machine's in-memory state and the types its parts share (L3)."""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, NamedTuple

from doq_lib.errors import ResultCode
from doq_lib.ids import id_time_ms
from doq_lib.lmdb_store import LmdbTxn
from doq_lib.models import QueueDef, QueueInfo, QueueType, Strategy
from doq_lib.queues.base import QueueIndex
from doq_lib.queues.delayed import DelayedIndex
from doq_lib.queues.fair import RoundRobinIndex
from doq_lib.queues.stats import QueueStats
from doq_lib.queues.weighted import WeightedIndex
from doq_lib.store import U64, encode_unacked

INT63_MAX = (1 << 63) - 1

Result = tuple[int, Any]
# (raft index, ops, now_ms[, expires_ms[, batch id[, layout]]]); a merged entry's layout lists
# each batch's (operation count, expires_ms): its batches expire one by one.
Entry = tuple[Any, ...]
OK = ResultCode.OK


class StoredMessage(NamedTuple):
    """An enqueue's value: the message stored (a duplicate within the dedup window: the
    first one's, with ``duplicate`` true)."""

    id: int
    group: str
    priority: int
    content: str
    metadata: dict[str, str]
    duplicate: bool = False


class DeliveredMessage(NamedTuple):
    """A dequeue's or a get's value: the message with its delivery count, last error and
    expiry; ``delivered_at``: when its current delivery was made (ms, the delivery token's
    time), None when it is not delivered (or was acknowledged at once)."""

    id: int
    group: str
    priority: int
    content: str
    metadata: dict[str, str]
    deliveries: int
    last_error: str
    expires_at: int
    delivered_at: int | None


class NackValue(NamedTuple):
    """A nack's value: the message's priority now, its metadata as given, whether it was
    dead-lettered instead, and why not when its dead-letter queue refused it."""

    priority: int
    metadata: dict[str, str] | None
    dead_lettered: bool
    refused: str = ""
FAULT_CONTENT = "__doq_inject_fault__"


class InjectedFault(RuntimeError):
    """Raised inside an operation when fault injection is on (tests of bug containment)."""


def new_index(defn: QueueDef) -> QueueIndex:
    if defn.type is QueueType.DELAYED:
        return DelayedIndex()
    index: QueueIndex
    if defn.settings.strategy is Strategy.WEIGHTED:
        index = WeightedIndex(defn.settings.max_unacked)
    else:
        index = RoundRobinIndex(defn.settings.max_unacked)
    if defn.paused_groups:
        index.set_paused(defn.paused_groups)
    return index


class Unacked:
    """A delivered message waiting for its ack: when it is due back (unix ms), the group whose
    in-flight slot it holds, the group and priority it returns with, how many times it
    has been delivered (this delivery included), when this delivery was made (the log's unix
    ms; 0 in records older than delivery tokens) and to which consumer ("": unnamed). The
    delivery's token is (deliveries, since)."""

    __slots__ = ("deadline", "slot", "group", "priority", "deliveries", "since", "consumer")

    def __init__(self, deadline: int, slot: str, group: str, priority: int,
                 deliveries: int = 1, since: int = 0, consumer: str = "") -> None:
        self.deadline, self.slot, self.group, self.priority = deadline, slot, group, priority
        self.deliveries, self.since, self.consumer = deliveries, since, consumer

    def holds(self, token: Any) -> bool:
        """Whether a settle carrying ``token`` (None: none) may settle this delivery; a
        token that is not a pair of numbers settles none."""
        if token is None:
            return True
        try:
            return tuple(token) == (self.deliveries, self.since)
        except TypeError:
            return False

    def record(self) -> bytes:
        return encode_unacked(self.deadline, self.slot, self.since, self.consumer)


class QueueState:
    __slots__ = ("defn", "index", "unacked", "attempts", "held", "dedup", "dedup_order",
                 "expires", "expiry_heap", "stats", "prefix", "deliverable_ms", "oldest_ms",
                 "rate_tat", "rate_release", "rate_forget", "consumers",
                 "consumers_pending", "schedules")

    def __init__(self, defn: QueueDef, window: int) -> None:
        self.defn = defn
        self.index = new_index(defn)
        self.unacked: dict[int, Unacked] = {}
        # id -> (deliveries so far, last error) of each message that was delivered and given
        # back (its "attempts" record); a message never delivered has none
        self.attempts: dict[int, tuple[int, str]] = {}
        # id -> (not deliverable before: unix ms, group, priority) of each message given back
        # with a delay or a back-off: out of the index until the leader's time passes it
        self.held: dict[int, tuple[int, str, int]] = {}
        # dedup key (its record key: store.dedup_key) -> (first id, first seen ms), and a
        # min-heap of (time seen, key) that every replica prunes in the same order (a key
        # seen again after its window is found twice: the older entry is skipped)
        self.dedup: dict[bytes, tuple[int, int]] = {}
        self.dedup_order: list[tuple[int, bytes]] = []
        # id -> unix ms after which it is never delivered (messages with a TTL), and a lazy
        # min-heap of (that time, id) to sweep them out when it passes
        self.expires: dict[int, int] = {}
        self.expiry_heap: list[tuple[int, int]] = []
        # group_rate: each group's theoretical arrival time (unix µs) of the
        # generic cell rate algorithm, and lazy min-heaps of (unix µs, group): when an
        # out-of-rate group may deliver again, and when a group's record can be forgotten
        self.rate_tat: dict[str, int] = {}
        self.rate_release: list[tuple[int, str]] = []
        self.rate_forget: list[tuple[int, str]] = []
        # the consumers the queue knows, least recently seen first (fsm/consumers.py)
        self.consumers: dict[str, Any] = {}
        self.consumers_pending: set[str] | None = None   # records to write (consumers.batched)
        self.schedules: dict[str, Any] = {}      # name -> its schedule (fsm/schedules.py)
        self.stats = QueueStats(window)
        self.prefix = U64.pack(defn.qid)
        self.deliverable_ms: int | None = None
        self.oldest_ms = 0            # time in the id of the oldest waiting message; 0: none

    def contains(self, mid: int) -> bool:
        return self.index.contains(mid) or mid in self.unacked or mid in self.held

    @property
    def waiting(self) -> int:
        """Messages not delivered: ready now, scheduled (delayed) or held back."""
        return self.index.ready + len(self.held)

    def refresh_hint(self) -> None:
        """Publish when the queue has something deliverable (writer thread only).

        ``deliverable_ms`` is the unix ms from which a dequeue can succeed (None: nothing
        deliverable whatever the time, until something changes). Other threads read this
        attribute for the dequeue fast path instead of touching the index, which only the
        writer thread may mutate.
        """
        index = self.index
        oldest = index.oldest_id()
        self.oldest_ms = id_time_ms(oldest) if oldest else 0
        cap = self.defn.settings.max_in_flight
        if self.defn.paused or (cap and len(self.unacked) >= cap):
            self.deliverable_ms = None
            return
        release = -(-self.rate_release[0][0] // 1000) if self.rate_release else None
        if isinstance(index, DelayedIndex):
            head = index.head_priority()
            due = None if head is None else head * 1000
            if due is not None and index.limited:
                due = max(due, release) if release is not None else None
            self.deliverable_ms = due
        elif index.has_ready(0):
            self.deliverable_ms = 0
        else:                    # out-of-rate groups may have messages: look again then
            self.deliverable_ms = release if index.ready and release is not None else None


@dataclass
class Ctx:
    txn: LmdbTxn
    now_ms: int
    now_s: int
    rules: int = 1               # the entry's (RULES)
    # the ids the operation being applied names, which none of its drop_oldest takes
    protected: frozenset[int] = frozenset()


#: The rules an entry is applied by, carried by the entry itself (``apply_batch``'s
#: ``rules``), so that a journal written by an older version replays as it applied then:
#: 1, entries written before they carried it; 2, every loop over due work that one
#: operation runs (redelivery, holds, TTL expiry, forgetting idle consumers) is bounded
#: per operation, and what is left waits for the next one (fsm/lifecycle.py's budgets);
#: 3, a multi-item operation counts exactly what its moves will do (lifecycle.Moves), and
#: no drop_oldest of it takes a message whose id it names.
RULES = 3


def entry_rules(entry: Entry) -> int:
    """The rules ``entry`` is applied by: ``(index, ops, now_ms, expires_ms, batch id,
    layout, rules)``, 1 when it carries none."""
    return int(entry[6]) if len(entry) > 6 else 1


class Missing(enum.Enum):
    MISSING = "missing"


MISSING = Missing.MISSING


class QueueCounters(NamedTuple):
    name: str
    ready: int
    unacked: int
    totals: dict[str, int]          # operations applied since start, by kind
    oldest_ms: int                  # time in the id of the oldest waiting message; 0: none
    redelivered: int
    dead_lettered: dict[str, int]   # messages dead-lettered since start, by reason
    rejected_full: int              # enqueues refused since start: the queue was full
    deduplicated: int               # enqueues answered as duplicates since start
    purged: int = 0                 # messages purged since start
    paused: bool = False
    paused_groups: int = 0
    rate_limited: int = 0           # times a group ran out of its delivery rate
    dead_letter_refused: dict[str, int] | None = None   # reason -> refused by a full DLQ
    consumers: int = 0              # consumers the queue knows (fsm/consumers.py)
    schedules: int = 0              # schedules the queue has (fsm/schedules.py)
    occurrences: dict[str, int] | None = None   # fired / skipped / refused, its schedules' sums


def info_of(qs: QueueState, now_s: int) -> QueueInfo:
    rates = qs.stats.rates(now_s)
    defn = qs.defn
    return QueueInfo(defn.name, defn.type, defn.settings, qs.waiting,
                     len(qs.unacked), rates["enqueue"], rates["dequeue"], rates["ack"],
                     rates["nack"], defn.paused, len(defn.paused_groups))


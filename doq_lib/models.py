"""Plain data types shared by every layer (L0)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

DEFAULT_GROUP = "default"


class QueueType(str, enum.Enum):
    DELAYED = "delayed"
    FAIR = "fair"


class Strategy(enum.IntEnum):
    """Fair-queue strategy; names and numbers are those of the gRPC enum QueueSettings.Strategy."""

    STRATEGY_UNSPECIFIED = 0
    ROUND_ROBIN = 1
    WEIGHTED = 2


@dataclass(frozen=True)
class QueueSettings:
    strategy: Strategy = Strategy.STRATEGY_UNSPECIFIED
    max_unacked: int = 0          # fair queues: per-group in-flight limit, 0 = unlimited
    ack_timeout: int = 0          # seconds; 0 on input means "the configured default"
    max_deliveries: int = 0       # deliveries before a message is dead-lettered; 0 = unlimited
    dead_letter_queue: str = ""   # where dead-lettered messages go; "" = dropped (counted)
    max_messages: int = 0         # most messages held (ready + unacked); 0 = unlimited
    overflow: str = "reject"      # an enqueue into a full queue: "reject" or "drop_oldest"
    dedup_window: int = 0         # seconds an enqueue's dedup key (or client id) is remembered
    backoff_initial: int = 0      # seconds: a redelivery waits min(backoff_max, initial x
    backoff_max: int = 0          #   2^(deliveries-1)) plus up to 20 % jitter; 0 = at once
    message_ttl: int = 0          # seconds a message may wait to be delivered; 0 = forever
    max_in_flight: int = 0        # most unacked messages of the whole queue; 0 = unlimited
    group_rate: float = 0.0       # deliveries per second of each group; 0 = unlimited
    group_burst: int = 1          # deliveries a group may take at once within its rate

    def lifecycle(self) -> dict[str, int | str | float]:
        """The message-lifecycle settings and delivery limits that
        differ from their defaults, by their wire names: what a queue record stores beside
        the base settings."""
        out: dict[str, int | str | float] = {}
        if self.max_deliveries:
            out["max_deliveries"] = self.max_deliveries
        if self.dead_letter_queue:
            out["dead_letter_queue"] = self.dead_letter_queue
        if self.max_messages:
            out["max_messages"] = self.max_messages
        if self.overflow != "reject":
            out["overflow"] = self.overflow
        if self.dedup_window:
            out["dedup_window"] = self.dedup_window
        if self.backoff_initial:
            out["backoff_initial"] = self.backoff_initial
        if self.backoff_max:
            out["backoff_max"] = self.backoff_max
        if self.message_ttl:
            out["message_ttl"] = self.message_ttl
        if self.max_in_flight:
            out["max_in_flight"] = self.max_in_flight
        if self.group_rate:
            out["group_rate"] = self.group_rate
        if self.group_burst != 1:
            out["group_burst"] = self.group_burst
        return out


#: The lifecycle settings' wire names and types (the keys of QueueSettings.lifecycle()).
LIFECYCLE_SETTINGS: dict[str, type] = {"max_deliveries": int, "dead_letter_queue": str,
                                       "max_messages": int, "overflow": str,
                                       "dedup_window": int, "backoff_initial": int,
                                       "backoff_max": int, "message_ttl": int,
                                       "max_in_flight": int, "group_rate": float,
                                       "group_burst": int}
#: What an enqueue into a full queue does (the ``overflow`` setting).
OVERFLOW_POLICIES = ("reject", "drop_oldest")
#: Why a message was dead-lettered (its ``x-dead-reason``): its queue's max_deliveries
#: were spent, its TTL passed, a drop_oldest queue made room, or a consumer rejected it —
#: for a reason of its own (``rejected``), its task's retries spent (``retries_spent``) or
#: unreadable to it (``unreadable``).
DEAD_REASONS = ("max_deliveries", "expired", "overflow", "rejected", "retries_spent",
                "unreadable")
#: The reasons a consumer's reject may give (the first is the default).
REJECT_REASONS = ("rejected", "retries_spent", "unreadable")


@dataclass(frozen=True)
class QueueDef:
    """A stored queue definition. ``qid`` is the internal, never-reused storage key."""

    name: str
    qid: int
    type: QueueType
    settings: QueueSettings
    paused: bool = False                    # delivers nothing until resumed
    paused_groups: tuple[str, ...] = ()     # fair queues: groups (and their sub-groups) skipped


@dataclass(frozen=True)
class Message:
    id: int
    group: str
    priority: int
    content: str
    metadata: dict[str, str] = field(default_factory=dict)
    deliveries: int = 0           # times delivered (this delivery included, in an answer to one)
    last_error: str = ""          # what the last nack or reject said, if anything
    duplicate: bool = False       # an enqueue answer: seen within the dedup window, not stored
    expires_at: int = 0           # unix ms after which it is never delivered (0: never)
    delivery: str = ""            # the token of its current delivery ("": not delivered)


@dataclass(frozen=True)
class QueueInfo:
    name: str
    type: QueueType
    settings: QueueSettings
    ready: int
    unacked: int
    enqueue_rps: float
    dequeue_rps: float
    ack_rps: float
    nack_rps: float
    paused: bool = False          # the queue delivers nothing until resumed
    paused_groups: int = 0        # fair queues: how many groups are paused
    # its dead-letter queue is one the caller's key may not see (settings show none)
    dead_letter_queue_hidden: bool = False

    @property
    def total(self) -> int:
        return self.ready + self.unacked


@dataclass(frozen=True)
class GroupInfo:
    """A group of a queue (the groups listing): its waiting and delivered messages, and the
    paused group that covers it (itself or a parent; None: not paused)."""

    group: str
    ready: int
    unacked: int
    paused_by: str | None = None


@dataclass(frozen=True)
class LeaderConfig:
    """What a new leader publishes through the log so every node can reach it (SPEC §6.5)."""

    node_id: str
    raft_addr: str
    grpc_addr: str
    http_addr: str


@dataclass(frozen=True)
class MemberInfo:
    """Who a cluster member is, replicated so that every node can name and reach it."""

    node_id: str
    raft_addr: str
    http_addr: str                 # what the nodes use between themselves
    grpc_addr: str
    client_http_addr: str = ""     # what clients should use (http.advertise); "" = http_addr
    client_grpc_addr: str = ""     # likewise grpc.advertise


@dataclass(frozen=True)
class ServerInfo:
    id: str
    addr: str
    leader_addr: str
    is_leader: bool
    suffrage: str = "Voter"
    http_addr: str = ""
    grpc_addr: str = ""
    lag: int | None = None         # entries behind the leader's commit index (leader's view)
    connected: bool | None = None  # the leader has a live connection to it (leader's view)
    # http_addr and grpc_addr are the addresses clients should use (http.advertise,
    # grpc.advertise); these are the ones the nodes use between themselves
    peer_http_addr: str = ""
    peer_grpc_addr: str = ""


MAX_QUEUE_NAME = 1024             # characters (SPEC §3.2)


def queue_name_problem(name: str) -> str | None:
    """What is wrong with a queue name, or None if it is acceptable."""
    if not name:
        return "expected length >= 1"
    if len(name) > MAX_QUEUE_NAME:
        return f"expected length <= {MAX_QUEUE_NAME}"
    if "/" in name:
        return "expected a name without '/'"
    return None

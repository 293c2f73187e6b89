"""Reading gRPC requests and building responses (L5): each field checked against the
domain's rules (doq_lib/rules.py) with a message naming it, a tolerant request parser, and
the queue and message fields of the answers. doq_lib/grpc/api.py serves the RPCs with these.
"""
from __future__ import annotations

from typing import Any, Callable

from doq_lib import rules
from doq_lib.errors import InvalidArgument
from doq_lib.models import QueueInfo, Strategy
from doq_lib.pb import doq_pb2 as pb
from doq_lib.service import EnqueueItem


def invalid(message: str) -> InvalidArgument:
    return InvalidArgument(message)


def queue_name(name: str, field: str = "queueName", new: bool = False) -> str:
    """``name`` if it is a valid queue name (``new``: of a queue to create), else raises."""
    message = rules.name_message(name, "grpc", field, new)
    if message is not None:
        raise invalid(message)
    return name


def message_parts(group: str, metadata: Any, prefix: str = "") -> dict[str, str] | None:
    """Check a message's group and metadata (a protobuf map) against the domain's rules;
    the metadata as a dict (None when empty). ``prefix`` locates the message in a batch."""
    message = rules.group_message(group, "grpc", prefix + "group")
    if message is not None:
        raise invalid(message)
    if not metadata:
        return None
    values = dict(metadata)
    problems = rules.metadata_problems(values)
    if problems:
        raise invalid(rules.metadata_message(*problems[0], "grpc", prefix + "metadata"))
    return values


def message_id(mid: int) -> int:
    if not mid:
        raise invalid("id is required")
    return mid


def new_message_id(mid: int, field: str = "id") -> int:
    """The id an enqueue gives its message (0: the server picks one); the same rule as
    HTTP's: at most 2^63-1."""
    if mid > rules.MAX_ID:
        raise invalid(f"{field} must be at most {rules.MAX_ID} (0: a new id)")
    return mid


def priority_of(priority: int, field: str = "priority") -> int:
    """A message's priority: 0 to 2^63-1 on both transports (a negative one is refused)."""
    if priority < 0:
        raise invalid(f"{field} must be 0 or more (at most {rules.MAX_PRIORITY}), "
                      f"not {priority}")
    return priority


def strategy_of(settings: pb.QueueSettings) -> Strategy:
    try:
        return Strategy(settings.strategy)
    except ValueError:
        raise invalid(f"unknown strategy {settings.strategy}") from None


def ack_timeout_of(settings: pb.QueueSettings) -> int:
    if not rules.ack_timeout_allowed(settings.ack_timeout):
        raise invalid(f"ack_timeout must be 0 (the default) or at least "
                      f"{rules.MIN_ACK_TIMEOUT} seconds")
    return int(settings.ack_timeout)


def lifecycle_of(settings: pb.QueueSettings) -> dict[str, Any]:
    """The lifecycle settings a CreateQueue or UpdateQueue request sets (fields
    left unset are not included), checked against the domain's rules."""
    given: dict[str, Any] = {}
    if settings.HasField("max_deliveries"):
        given["max_deliveries"] = int(settings.max_deliveries)
    if settings.HasField("dead_letter_queue"):
        given["dead_letter_queue"] = settings.dead_letter_queue
    if settings.HasField("max_messages"):
        given["max_messages"] = int(settings.max_messages)
    if settings.HasField("overflow"):
        given["overflow"] = settings.overflow
    for key in ("dedup_window", "backoff_initial", "backoff_max", "message_ttl",
                "max_in_flight", "group_burst"):
        if settings.HasField(key):
            given[key] = int(getattr(settings, key))
    if settings.HasField("group_rate"):
        given["group_rate"] = float(settings.group_rate)
    for key, why in rules.lifecycle_problems(given):
        raise invalid(f"settings.{key}: {why}")
    return given


def error_text(error: str, field: str = "error") -> str:
    why = rules.error_problem(error)
    if why is not None:
        raise invalid(f"{field}: {why}")
    return error


def consumer_of(name: str) -> str:
    """A consumer's name ("": unnamed), or INVALID_ARGUMENT."""
    problem = rules.consumer_problem(name)
    if problem is not None:
        raise invalid(f"consumer: {problem}")
    return name


def delivery_of(text: str, mid: int, field: str = "delivery") -> rules.Token | None:
    """The delivery token a settle of message ``mid`` carries ("": none)."""
    if not text:
        return None
    problem = rules.token_problem(text, mid)
    if problem is not None:
        raise invalid(f"{field}: {problem}")
    return rules.parse_token(text, mid)[1]


def deliveries_of(texts: Any, ids: list[int]) -> list[rules.Token | None] | None:
    """The tokens of a batch settle, one per id ("" for none); empty: none."""
    if not texts:
        return None
    if len(texts) != len(ids):
        raise invalid(f"deliveries: give one per id ({len(ids)}), or none; not {len(texts)}")
    tokens = [delivery_of(text, mid, f"deliveries[{n}]")
              for n, (text, mid) in enumerate(zip(texts, ids))]
    return tokens if any(t is not None for t in tokens) else None


def delay_of(seconds: int, field: str = "delay") -> int:
    if seconds > rules.MAX_DELAY:
        raise invalid(f"{field}: at most {rules.MAX_DELAY} seconds")
    return int(seconds)


def ttl_of(seconds: int, field: str = "ttl") -> int:
    if seconds > rules.MAX_TTL:
        raise invalid(f"{field}: at most {rules.MAX_TTL} seconds")
    return int(seconds)


def dedup_key_of(key: str, field: str = "dedup_key") -> str:
    why = rules.dedup_key_problem(key)
    if why is not None:
        raise invalid(f"{field}: {why}")
    return key


def enqueue_item(request: pb.EnqueueRequest, prefix: str = "") -> EnqueueItem:
    name = queue_name(request.queueName, prefix + "queueName")
    metadata = message_parts(request.group, request.metadata, prefix)
    return EnqueueItem(name, new_message_id(request.id, prefix + "id"), request.group,
                       priority_of(request.priority, prefix + "priority"), request.content,
                       metadata, dedup_key_of(request.dedup_key, prefix + "dedup_key"),
                       ttl_of(request.ttl, prefix + "ttl"),
                       delay_of(request.delay, prefix + "delay"))


class MalformedRequest:
    """A request that did not parse: the handler refuses it with INVALID_ARGUMENT (grpcio
    would answer INTERNAL or UNKNOWN, naming a Python exception, and log a traceback)."""

    def __init__(self, type_name: str) -> None:
        self.message = f"malformed request: not a valid {type_name} message"


def tolerant_parser(message_class: Any) -> Callable[[bytes], Any]:
    """A request deserializer that returns :class:`MalformedRequest` instead of raising."""
    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except Exception:  # noqa: BLE001 - DecodeError and friends: refused by the handler
            return MalformedRequest(message_class.DESCRIPTOR.full_name)
    return parse


# -- responses -------------------------------------------------------------------------------------


def queue_response(info: QueueInfo,
                   covers: Callable[[str], bool] | None = None) -> pb.GetQueueResponse:
    """``covers``: the queue names the caller's key may see (None: every one); a dead-letter
    queue outside them is left unset and flagged hidden."""
    settings = info.settings
    out = pb.QueueSettings(strategy=settings.strategy.name, max_unacked=settings.max_unacked,
                           ack_timeout=settings.ack_timeout)
    lifecycle = settings.lifecycle()
    hidden = covers is not None and bool(settings.dead_letter_queue) \
        and not covers(settings.dead_letter_queue)
    if hidden:
        del lifecycle["dead_letter_queue"]
    for key, value in lifecycle.items():                # set when not the default
        setattr(out, key, value)
    return pb.GetQueueResponse(
        name=info.name, type=info.type.value,
        settings=out,
        stats=pb.Stats(enqueueRPS=info.enqueue_rps, dequeueRPS=info.dequeue_rps,
                       ackRPS=info.ack_rps, nackRPS=info.nack_rps),
        ready=info.ready, unacked=info.unacked, total=info.total, paused=info.paused,
        paused_groups=info.paused_groups, dead_letter_queue_hidden=hidden)

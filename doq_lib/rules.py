"""The domain's rules, one definition each (layer 0).

What a queue name, a queue type, queue settings, a message id and a priority may be. The state
machine relies on them, and both transports check a request against them before anything is
proposed; a transport keeps only the checks of its own wire (JSON types, protobuf field
presence, query syntax) and its own wording of a problem (SPEC §3.1 for HTTP).
"""
from __future__ import annotations

import enum
import re
from typing import Any

MAX_NAME = 1024                   # characters of a queue name (SPEC §3.2)
QUEUE_TYPES = ("delayed", "fair")

# Ack timeouts, in seconds. 0 means the configured default (queue.default_acknowledgement_
# timeout). The original DOQ accepts 10 and more over gRPC, but its HTTP API asks for at least
# 60 and refuses an explicit 0 (SPEC §2 and §3.4); both are kept, as the wire contract.
MIN_ACK_TIMEOUT = 10
HTTP_MIN_ACK_TIMEOUT = 60
MAX_ACK_TIMEOUT = 2 ** 32 - 1
FALLBACK_ACK_TIMEOUT = 1800       # the default of an operation written before it carried one

MAX_UNACKED = 2 ** 32 - 1         # fair queues: in flight per group (0: unlimited)
MAX_PRIORITY = 2 ** 63 - 1        # priorities are non-negative int64
MAX_ID = 2 ** 63 - 1              # message ids: positive int64 (0 asks for a new one)


# Limits of a message's parts, alike on both transports. A request as a whole is at most
# MAX_REQUEST bytes: an HTTP body must stay below it, a gRPC message may not pass it.
# A fair group is a dot path of labels (tenant.user): at most MAX_GROUP bytes of UTF-8 and
# MAX_GROUP_DEPTH labels, none empty. Versions before this rule took any 1024 characters: a
# store may hold such groups, a restore accepts them, the scheduler serves them.
MAX_GROUP = 256                   # bytes (UTF-8) of a group, the whole dotted path
MAX_GROUP_DEPTH = 16              # labels of a group (a.b.c: 3)
MAX_STORED_GROUP = 1024           # characters of a group a store may hold
MAX_METADATA = 64                 # keys of a message's metadata
MAX_METADATA_KEY = 256            # characters of a metadata key
MAX_METADATA_VALUE = 16384        # characters of a metadata value
MAX_REQUEST = 1 << 20             # bytes
# Metadata keys only the server writes (a dead letter's origin, reason, time, deliveries and
# last error; the schedule that stored a message and its occurrence): refused on input, so
# that a message cannot claim to be a dead letter or a schedule's, and not counted against
# MAX_METADATA (a dead letter of a message with 64 keys has up to 71).
RESERVED_METADATA_PREFIX = "x-dead-"
RESERVED_METADATA = ("x-deliveries", "x-last-error", "x-schedule", "x-scheduled-at")

# The message lifecycle.
MAX_DELIVERIES = 2 ** 32 - 1      # max_deliveries (0: unlimited); delivery counts are u32
MAX_ERROR = 4096                  # bytes (UTF-8) of the error a nack or reject may carry
MAX_REDRIVE = 10000               # messages one redrive moves at most
MAX_MESSAGES = 2 ** 32 - 1        # max_messages (0: unlimited)
MAX_DEDUP_WINDOW = 7 * 86400      # seconds (a week: what a retried producer needs, bounded)
MAX_DEDUP_KEY = 256               # bytes (UTF-8) of an enqueue's dedup_key
MAX_DELAY = 30 * 86400            # seconds: a nack's delay, backoff_initial and backoff_max
MAX_TTL = 365 * 86400             # seconds: message_ttl, an enqueue's ttl
OVERFLOW_POLICIES = ("reject", "drop_oldest")

# Operator controls.
MAX_PAUSED_GROUPS = 1000          # groups of one queue paused at once
MAX_GROUP_RATE = 1_000_000.0      # group_rate: deliveries per second of a group
MAX_RATE_INTERVAL = MAX_DELAY     # seconds between two deliveries of a group at most (30 days)
MIN_GROUP_RATE = 1 / MAX_RATE_INTERVAL   # the slowest group_rate a request may set (not 0)
MAX_GROUP_BURST = 100_000         # group_burst
MAX_BROWSE = 1000                 # messages one browse page lists at most

_SURROGATE = re.compile("[\ud800-\udfff]")
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


class NameProblem(enum.Enum):
    """What can be wrong with a name (a queue's, a group's, a metadata key)."""

    EMPTY = "empty"
    TOO_LONG = "too long"
    SLASH = "contains '/'"
    NOT_TEXT = "a lone surrogate"
    CONTROL = "a control character"
    DOTS = "'.' or '..'"
    BLANK = "only spaces"
    RESERVED = "the server's own"
    TOO_DEEP = "too many labels"
    EMPTY_LABEL = "an empty label"


def lone_surrogate(text: str) -> int | None:
    """Where ``text`` has a lone UTF-16 surrogate (which no UTF-8 can carry), else None.
    Such text comes from JSON escapes like ``"\\udfff"``; it cannot be stored."""
    if text.isascii():                   # a flag of the string: no scan
        return None
    found = _SURROGATE.search(text)
    return None if found is None else found.start()


def _label_problem(text: str, limit: int) -> NameProblem | None:
    """The checks a new name, a group and a metadata key share."""
    if len(text) > limit:
        return NameProblem.TOO_LONG
    if _SURROGATE.search(text):
        return NameProblem.NOT_TEXT
    if _CONTROL.search(text):
        return NameProblem.CONTROL
    if text in (".", ".."):
        return NameProblem.DOTS
    if not text.strip():
        return NameProblem.BLANK
    return None


def name_problem(name: str, new: bool = False) -> NameProblem | None:
    """What is wrong with ``name`` as a queue name (None: nothing). ``new``: the name of a
    queue to create, which is also held to the label rules (no control characters, not
    ``.``, ``..`` or blank); a queue that exists is found by any name it was created with."""
    if not name:
        return NameProblem.EMPTY
    if len(name) > MAX_NAME:
        return NameProblem.TOO_LONG
    if "/" in name:
        return NameProblem.SLASH
    if new:
        return _label_problem(name, MAX_NAME)
    return NameProblem.NOT_TEXT if _SURROGATE.search(name) else None


def group_problem(group: str, stored: bool = False) -> NameProblem | None:
    """What is wrong with a message's group (empty: no group, allowed). ``stored``: the rule
    of what a store may hold (versions before the path rule took any 1024 characters)."""
    if not group:
        return None
    if stored:
        return _label_problem(group, MAX_STORED_GROUP)
    if len(group) > MAX_GROUP or (not group.isascii() and
                                  len(group.encode("utf-8", "surrogatepass")) > MAX_GROUP):
        return NameProblem.TOO_LONG
    problem = _label_problem(group, MAX_GROUP)
    if problem is not None:
        return problem
    labels = group.split(".")
    if len(labels) > MAX_GROUP_DEPTH:
        return NameProblem.TOO_DEEP
    if "" in labels:
        return NameProblem.EMPTY_LABEL
    return None


def key_problem(key: str, stored: bool = False) -> NameProblem | None:
    """What is wrong with a metadata key. ``stored``: a key already stored (a backup's, a
    schedule's record), held to the rule it was accepted by (reserved keys in lower case
    only), so that what was stored before can always be restored."""
    if not key:
        return NameProblem.EMPTY
    if reserved_key(key if stored else key.lower()):
        return NameProblem.RESERVED
    return _label_problem(key, MAX_METADATA_KEY)


def reserved_key(key: str) -> bool:
    """Whether ``key`` is one of the server's own metadata keys (as the server writes them:
    a client's key is compared in lower case)."""
    return key.startswith(RESERVED_METADATA_PREFIX) or key in RESERVED_METADATA


#: The server's own metadata keys, as the refusals name them.
RESERVED_WORDS = ", ".join([RESERVED_METADATA_PREFIX + "*", *RESERVED_METADATA]) + \
    ", in any case"


def metadata_problems(metadata: dict[str, str], stored: bool = False,
                      ) -> list[tuple[str | None, str, Any]]:
    """What is wrong with a message's metadata: (key or None for the whole map, problem,
    limit) triples, worded by :func:`metadata_message`. Values may be any text. ``stored``:
    as :func:`key_problem`'s."""
    if len(metadata) > MAX_METADATA:
        return [(None, "count", MAX_METADATA)]
    out: list[tuple[str | None, str, Any]] = []
    for key, value in metadata.items():
        problem = key_problem(key, stored)
        if problem is not None:
            out.append((key, "key", problem))
        elif len(value) > MAX_METADATA_VALUE:
            out.append((key, "value", MAX_METADATA_VALUE))
        elif lone_surrogate(value) is not None:
            out.append((key, "value", NameProblem.NOT_TEXT))
    return out


#: How each transport words a name problem (HTTP: SPEC §3.1's wording; gRPC names the field).
#: ``{what}``: name, group, key; ``{limit}``: its length limit.
NAME_WORDING = {
    "http": {NameProblem.EMPTY: "expected length >= 1",
             NameProblem.TOO_LONG: "expected length <= {limit}",
             NameProblem.SLASH: "expected a name without '/'",
             NameProblem.NOT_TEXT: "expected valid Unicode text (found a lone surrogate)",
             NameProblem.CONTROL: "expected a {what} without control characters",
             NameProblem.DOTS: "expected a {what} other than '.' and '..'",
             NameProblem.BLANK: "expected a {what} that is not only spaces",
             NameProblem.RESERVED: "expected a {what} other than the server's own "
                                   f"({RESERVED_WORDS})",
             NameProblem.TOO_DEEP: "expected a {what} of fewer labels",
             NameProblem.EMPTY_LABEL: "expected a {what} without empty labels"},
    "grpc": {NameProblem.EMPTY: "{field} is required",
             NameProblem.TOO_LONG: "{field} is longer than {limit} characters",
             NameProblem.SLASH: "{field} must not contain '/'",
             NameProblem.NOT_TEXT: "{field} is not valid Unicode text (a lone surrogate)",
             NameProblem.CONTROL: "{field} must not contain control characters",
             NameProblem.DOTS: "{field} must not be '.' or '..'",
             NameProblem.BLANK: "{field} must not be only spaces",
             NameProblem.RESERVED: f"{{field}} is the server's own ({RESERVED_WORDS}): a "
                                   "client may not set it",
             NameProblem.TOO_DEEP: "{field} has too many labels",
             NameProblem.EMPTY_LABEL: "{field} must not have empty labels"},
}
_LIMITS = {"name": MAX_NAME, "group": MAX_GROUP, "key": MAX_METADATA_KEY}


#: How each transport words what only a group's path rule refuses.
GROUP_WORDING = {
    "http": {NameProblem.TOO_LONG: f"expected a group of at most {MAX_GROUP} bytes (UTF-8)",
             NameProblem.TOO_DEEP: f"expected a group of at most {MAX_GROUP_DEPTH} "
                                   "dot-separated labels",
             NameProblem.EMPTY_LABEL: "expected a group without empty labels (as in a..b, "
                                      ".a or a.)"},
    "grpc": {NameProblem.TOO_LONG: f"{{field}} is longer than {MAX_GROUP} bytes (UTF-8)",
             NameProblem.TOO_DEEP: f"{{field}} has more than {MAX_GROUP_DEPTH} dot-separated "
                                   "labels",
             NameProblem.EMPTY_LABEL: "{field} must not have empty labels (as in a..b, .a "
                                      "or a.)"},
}


def worded(problem: NameProblem, transport: str, what: str = "name", field: str = "") -> str:
    """``problem`` of a ``what`` (name, group, key) in ``transport``'s words."""
    if what == "group" and problem in GROUP_WORDING[transport]:
        return GROUP_WORDING[transport][problem].format(field=field)
    return NAME_WORDING[transport][problem].format(what=what, field=field, limit=_LIMITS[what])


def name_message(name: str, transport: str, field: str = "", new: bool = False) -> str | None:
    """What is wrong with ``name``, in ``transport``'s words (None: nothing)."""
    problem = name_problem(name, new)
    return None if problem is None else worded(problem, transport, "name", field)


def group_message(group: str, transport: str, field: str = "group") -> str | None:
    problem = group_problem(group)
    return None if problem is None else worded(problem, transport, "group", field)


def metadata_message(key: str | None, part: str, detail: Any, transport: str,
                     field: str = "metadata") -> str:
    """One of :func:`metadata_problems` in ``transport``'s words."""
    http = transport == "http"
    if part == "count":
        return (f"expected at most {detail} properties" if http
                else f"{field} has more than {detail} keys")
    if part == "key":
        if detail is NameProblem.EMPTY:
            return "expected length >= 1" if http else f"{field} keys must not be empty"
        return worded(detail, transport, "key", f"{field} key {_short(key)}")
    if isinstance(detail, NameProblem):
        return worded(detail, transport, "name", f"{field}[{_short(key)}]")
    return (f"expected length <= {detail}" if http
            else f"{field}[{_short(key)}] is longer than {detail} characters")


def _short(key: str | None) -> str:
    """A key as a message quotes it: repr, cut after 40 characters."""
    text = repr(key)
    return text if len(text) <= 42 else text[:40] + "…'"


def ack_timeout_allowed(seconds: int, minimum: int = MIN_ACK_TIMEOUT) -> bool:
    """0 (the default) or from ``minimum`` to MAX_ACK_TIMEOUT."""
    return seconds == 0 or minimum <= seconds <= MAX_ACK_TIMEOUT


#: The integer lifecycle settings: (largest value, what the value is).
_LIFECYCLE_INTS = {"max_deliveries": (MAX_DELIVERIES, "an integer"),
                   "max_messages": (MAX_MESSAGES, "an integer"),
                   "backoff_initial": (MAX_DELAY, "seconds"),
                   "backoff_max": (MAX_DELAY, "seconds"),
                   "message_ttl": (MAX_TTL, "seconds"),
                   "dedup_window": (MAX_DEDUP_WINDOW, "seconds"),
                   "max_in_flight": (MAX_MESSAGES, "an integer")}


def group_rate_problem(rate: Any, stored: bool = False) -> str | None:
    """What is wrong with a group_rate (None: nothing). A request may set 0 (unlimited) or
    a rate from MIN_GROUP_RATE (one delivery per MAX_RATE_INTERVAL) to MAX_GROUP_RATE.
    ``stored``: the rule of a stored queue record (any number from 0 to MAX_GROUP_RATE, as
    versions before the lower bound may have written; the state machine treats a rate
    slower than MIN_GROUP_RATE as MIN_GROUP_RATE)."""
    if type(rate) not in (int, float) or not 0 <= rate <= MAX_GROUP_RATE:   # NaN fails too
        return (f"expected 0 or a number from {MIN_GROUP_RATE:.4g} (one delivery per "
                f"{MAX_RATE_INTERVAL // 86400} days) to {MAX_GROUP_RATE:g} "
                "(deliveries per second)")
    if rate and not stored and rate < MIN_GROUP_RATE:
        return (f"expected 0 or a number from {MIN_GROUP_RATE:.4g} (one delivery per "
                f"{MAX_RATE_INTERVAL // 86400} days) to {MAX_GROUP_RATE:g}: {rate:g} per "
                "second leaves more than that between two deliveries")
    return None


def lifecycle_problems(settings: dict[str, Any], stored: bool = False) -> list[tuple[str, str]]:
    """(setting, what is wrong) for each lifecycle setting of a create or update request
    that breaks a rule the request alone can tell: types, ranges, the dead-letter
    queue's name. Whether that queue exists and leads nowhere in a cycle is for the state.
    ``stored``: the rules of a stored queue record (a restore), see group_rate_problem."""
    out = []
    for key, (most, unit) in _LIFECYCLE_INTS.items():
        value = settings.get(key, 0)
        if type(value) is not int or not 0 <= value <= most:
            out.append((key, f"expected {unit} from 0 to {most}"))
    burst = settings.get("group_burst", 1)
    if type(burst) is not int or not 1 <= burst <= MAX_GROUP_BURST:
        out.append(("group_burst", f"expected an integer from 1 to {MAX_GROUP_BURST}"))
    why = group_rate_problem(settings.get("group_rate", 0), stored)
    if why is not None:
        out.append(("group_rate", why))
    if not out and settings.get("backoff_max", MAX_DELAY) < settings.get("backoff_initial", 0):
        out.append(("backoff_max", "must be at least backoff_initial"))
    if settings.get("overflow", "reject") not in OVERFLOW_POLICIES:
        out.append(("overflow", f"expected one of {', '.join(OVERFLOW_POLICIES)}"))
    dlq = settings.get("dead_letter_queue", "")
    if not isinstance(dlq, str):
        out.append(("dead_letter_queue", "expected a queue name"))
    elif dlq:
        problem = name_problem(dlq)
        if problem is not None:
            out.append(("dead_letter_queue", f"not a queue name: {problem.value}"))
    return out


def _text_problem(text: str, most: int) -> str | None:
    """Text that must be valid Unicode and at most ``most`` bytes of UTF-8."""
    if lone_surrogate(text) is not None:
        return "a lone surrogate"
    if len(text) > most or len(text.encode()) > most:
        return f"longer than {most} bytes"
    return None


def error_problem(error: str) -> str | None:
    """What is wrong with the error text of a nack or reject (None: nothing)."""
    return _text_problem(error, MAX_ERROR)


def dedup_key_problem(key: str) -> str | None:
    """What is wrong with an enqueue's dedup_key (None: nothing; empty means none)."""
    return _text_problem(key, MAX_DEDUP_KEY)


# -- delivery tokens ------------------------------------------------------------------------------
# A delivery of a message with ack=false is named by a token a settle (ack, nack, touch,
# reject) may carry: the message id, its delivery count (this delivery included) and the log's
# time of the delivery (unix ms), "<id>-<deliveries>-<ms>". Opaque to clients; the state
# machine compares the last two with the message's current lease, so a settle by a worker
# whose lease ran out (and whose message went to another one since) is refused.
MAX_TOKEN = 64                    # characters of a token
MAX_DELIVERIES_COUNT = 2 ** 32 - 1
INT63_MAX = 2 ** 63 - 1
Token = tuple[int, int]           # (deliveries, delivered at: unix ms)
_TOKEN = re.compile(r"([0-9]{1,20})-([0-9]{1,10})-([0-9]{1,19})")


def delivery_token(mid: int, deliveries: int, since_ms: int) -> str:
    """The token of the delivery of message ``mid`` numbered ``deliveries``, made at
    ``since_ms``."""
    return f"{mid}-{deliveries}-{since_ms}"


def token_problem(text: Any, mid: int | None = None) -> str | None:
    """What is wrong with ``text`` as a delivery token (of message ``mid``, when given)."""
    if not isinstance(text, str) or len(text) > MAX_TOKEN:
        return "expected a delivery token as answered with the message"
    found = _TOKEN.fullmatch(text)
    if found is None:
        return "expected a delivery token as answered with the message"
    of, deliveries, since = (int(part) for part in found.groups())
    if not 1 <= deliveries <= MAX_DELIVERIES_COUNT or since > INT63_MAX:
        return "expected a delivery token as answered with the message"
    if mid is not None and of != mid:
        return f"the delivery token is one of message {of}, not of message {mid}"
    return None


def parse_token(text: str, mid: int | None = None) -> tuple[int, Token]:
    """(message id, (deliveries, delivered at)) of a token; ValueError with the problem."""
    problem = token_problem(text, mid)
    if problem is not None:
        raise ValueError(problem)
    of, deliveries, since = (int(part) for part in text.split("-"))
    return of, (deliveries, since)


# -- consumer names -------------------------------------------------------------------------------
MAX_CONSUMER = 200                # bytes (UTF-8) of a consumer's name


def consumer_problem(name: Any) -> str | None:
    """What is wrong with ``name`` as a consumer's name ("" is none: unnamed)."""
    if not isinstance(name, str):
        return "expected a string"
    if not name:
        return None
    if len(name) > MAX_CONSUMER or (not name.isascii() and
                                    len(name.encode("utf-8", "surrogatepass")) > MAX_CONSUMER):
        return f"expected a consumer name of at most {MAX_CONSUMER} bytes (UTF-8)"
    problem = _label_problem(name, MAX_CONSUMER)
    if problem is not None and problem is not NameProblem.DOTS:
        return f"expected a consumer name without {problem.value}" \
            if problem in (NameProblem.CONTROL, NameProblem.NOT_TEXT) else \
            "expected a consumer name that is not blank"
    return None

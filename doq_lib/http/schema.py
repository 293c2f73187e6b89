"""Request-body schemas and their validation for the REST API (L5, used by the HTTP API only).

A schema is a small dict (a subset of JSON Schema) so the same definitions can later be
rendered into the OpenAPI document. Validation collects every problem with the wording of SPEC
§3.1 (``expected required property x to be present``, ``expected number >= 0``, ...), each with
its ``location`` (``body.priority``) and offending ``value``.
"""
from __future__ import annotations

from typing import Any, Callable

from doq_lib import rules, schedules
from doq_lib.models import REJECT_REASONS

INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1
UINT64_MAX = 2 ** 64 - 1

STRING: dict[str, Any] = {"type": "string"}
NAME: dict[str, Any] = {"type": "string", "maxLength": rules.MAX_NAME}
PRIORITY: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": rules.MAX_PRIORITY}
GROUP: dict[str, Any] = {
    "type": "string", "maxLength": rules.MAX_GROUP, "x-rule": "group",
    "description": f"a dot path (tenant.user) of at most {rules.MAX_GROUP_DEPTH} non-empty "
                   f"labels and {rules.MAX_GROUP} bytes (UTF-8), no control characters"}
# A message's metadata; "x-rule" checks a string against doq_lib.rules (a group; a key: no
# control characters, not ".", ".." or blank).
METADATA: dict[str, Any] = {
    "type": "object", "maxProperties": rules.MAX_METADATA,
    "description": f"string keys and values; the server's own keys ({rules.RESERVED_WORDS})"
                   " are refused, and do not count against the limit when the server adds "
                   "them",
    "propertyNames": {"type": "string", "minLength": 1, "maxLength": rules.MAX_METADATA_KEY,
                      "x-rule": "key"},
    "additionalProperties": {"type": "string", "maxLength": rules.MAX_METADATA_VALUE},
}
NULLABLE_METADATA: dict[str, Any] = {**METADATA, "type": ["object", "null"]}

SETTINGS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "strategy": {"type": "string", "enum": ["round_robin", "weighted"]},
        "max_unacked": {"type": "integer", "minimum": 0, "maximum": rules.MAX_UNACKED},
        # stricter than the domain (rules.MIN_ACK_TIMEOUT): the original's HTTP contract
        "ack_timeout": {"type": "integer", "minimum": rules.HTTP_MIN_ACK_TIMEOUT,
                        "maximum": rules.MAX_ACK_TIMEOUT},
        # the message lifecycle; on update, a key left out keeps its value
        "max_deliveries": {"type": "integer", "minimum": 0, "maximum": rules.MAX_DELIVERIES,
                           "description": "deliveries before a message is dead-lettered "
                                          "(0: unlimited)"},
        "dedup_window": {"type": "integer", "minimum": 0, "maximum": rules.MAX_DEDUP_WINDOW,
                         "description": "seconds an enqueue's dedup_key (or client id) is "
                                        "remembered (0: off; a client id then replaces a "
                                        "waiting message, as before)"},
        "message_ttl": {"type": "integer", "minimum": 0, "maximum": rules.MAX_TTL,
                        "description": "seconds a message may wait to be delivered; an "
                                       "expired one is never delivered and is dead-lettered "
                                       "with reason expired (0: no limit)"},
        "backoff_initial": {"type": "integer", "minimum": 0, "maximum": rules.MAX_DELAY,
                            "description": "seconds a message given back without a priority "
                                           "(or timed out) waits after its first delivery; "
                                           "doubling with each delivery (0: at once)"},
        "backoff_max": {"type": "integer", "minimum": 0, "maximum": rules.MAX_DELAY,
                        "description": "the longest back-off, seconds (>= backoff_initial); "
                                       "every back-off adds up to 20 % jitter"},
        "max_messages": {"type": "integer", "minimum": 0, "maximum": rules.MAX_MESSAGES,
                         "description": "most messages the queue holds, ready + unacked "
                                        "(0: unlimited)"},
        "overflow": {"type": "string", "enum": list(rules.OVERFLOW_POLICIES),
                     "description": "an enqueue into a full queue: reject (429, nothing "
                                    "stored) or drop_oldest (the oldest waiting message is "
                                    "dead-lettered, reason overflow)"},
        # delivery limits
        "max_in_flight": {"type": "integer", "minimum": 0, "maximum": rules.MAX_MESSAGES,
                          "description": "most unacked messages of the whole queue; at the "
                                         "cap it delivers nothing until one is settled "
                                         "(0: unlimited)"},
        "group_rate": {"type": "number", "minimum": 0, "maximum": rules.MAX_GROUP_RATE,
                       "x-rule": "rate",
                       "description": "deliveries per second of each group, a token bucket "
                                      "driven by the leader's time; a group out of it is "
                                      "skipped, the others are served (0: unlimited; "
                                      f"otherwise at least {rules.MIN_GROUP_RATE:.4g}, one "
                                      "delivery per 30 days)"},
        "group_burst": {"type": "integer", "minimum": 1, "maximum": rules.MAX_GROUP_BURST,
                        "description": "deliveries a group may take at once within its "
                                       "group_rate (default 1)"},
        "dead_letter_queue": {"type": "string", "maxLength": rules.MAX_NAME,
                              "x-rule": "queue",
                              "description": "an existing queue that receives dead-lettered "
                                             "messages (empty: they are dropped and counted)"},
    },
}
DELAY: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": rules.MAX_DELAY,
                         "description": "seconds before the message may be delivered again "
                                        "(any queue type; 0 or absent: at once, or after "
                                        "the queue's back-off when no priority is given)"}
ERROR: dict[str, Any] = {"type": "string", "x-rule": "error",
                         "description": f"at most {rules.MAX_ERROR} bytes, kept as the "
                                        "message's last_error"}

DEDUP_KEY: dict[str, Any] = {
    "type": "string", "x-rule": "dedup",
    "description": f"at most {rules.MAX_DEDUP_KEY} bytes: in a queue with a dedup_window, an "
                   "enqueue whose key was seen within the window stores nothing and answers "
                   "the first message's id with duplicate: true (without a key: the id, if "
                   "given)"}
ENQUEUE: dict[str, Any] = {
    "type": "object", "required": ["priority", "content"],
    "properties": {"id": STRING, "group": GROUP, "priority": PRIORITY,
                   "content": STRING, "metadata": METADATA, "dedup_key": DEDUP_KEY,
                   "ttl": {"type": "integer", "minimum": 0, "maximum": rules.MAX_TTL,
                           "description": "seconds it may wait to be delivered, then it is "
                                          "dead-lettered (reason expired); 0 or absent: the "
                                          "queue's message_ttl"},
                   "delay": {"type": "integer", "minimum": 0, "maximum": rules.MAX_DELAY,
                             "description": "seconds before a new message may be delivered "
                                            "(any queue type; 0 or absent: at once); an "
                                            "enqueue that replaces a waiting message by its "
                                            "id keeps its time"}},
}
MAX_BATCH = 1000
IDS: dict[str, Any] = {
    "type": "array", "minItems": 1, "maxItems": MAX_BATCH,
    "items": {"type": ["string", "integer"],
              "description": "a message id: decimal string (as answered) or integer"},
}

DELIVERY: dict[str, Any] = {
    "type": "string", "maxLength": rules.MAX_TOKEN,
    "description": "the delivery token answered with the message (delivery); a settle whose "
                   "token is not the message's current delivery (its lease ran out and it "
                   "was delivered again, or it was settled) is refused with 409 "
                   "stale_delivery and changes nothing"}
SETTLE_IDS: dict[str, Any] = {
    **IDS, "items": {
        "type": ["string", "integer", "object"], "required": ["id"],
        "properties": {"id": {"type": ["string", "integer"]}, "delivery": DELIVERY},
        "description": "a message id (decimal string or integer), or {id, delivery}"}}

MAX_SETTLE_ENQUEUE = 100
SETTLE_ENQUEUE: dict[str, Any] = {
    "type": "array", "maxItems": MAX_SETTLE_ENQUEUE,
    "description": f"at most {MAX_SETTLE_ENQUEUE} messages stored with the settle in one "
                   "replicated operation: the settle and every one of them happen, or none "
                   "(an unknown or full queue, a stale delivery token refuse the whole)",
    "items": {**ENQUEUE, "required": ["queue", "priority", "content"],
              "properties": {**ENQUEUE["properties"], "queue": {
                  "type": "string", "minLength": 1, "maxLength": rules.MAX_NAME,
                  "x-rule": "queue", "description": "the queue to store it in"}}}}

_UNIX_SECONDS: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": schedules.MAX_TIME}
SCHEDULE: dict[str, Any] = {
    "type": "object", "required": ["name", "message"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": schedules.MAX_NAME,
                 "description": "letters, digits and _ . : - (starting with a letter or "
                                "digit); posting a name again replaces its definition (the "
                                "same definition changes nothing)"},
        "cron": {"type": "string", "maxLength": schedules.MAX_CRON,
                 "description": "five fields (minute hour day-of-month month day-of-week) "
                                f"or one of {', '.join(schedules.ALIASES)}, in timezone; "
                                "give cron or every"},
        "every": {"type": "integer", "minimum": 1, "maximum": schedules.MAX_EVERY,
                  "description": "seconds between occurrences, counted from start_at (or "
                                 "from the creation, to the second)"},
        "timezone": {"type": "string", "maxLength": 64,
                     "description": "cron only: an IANA time zone (default UTC); in a "
                                    "daylight-saving gap a wall time fires as far past the "
                                    "gap as it was in it, a repeated wall time fires once"},
        "message": {"type": "object", "required": ["content"],
                    "description": "the message stored at each occurrence (x-schedule and "
                                   "x-scheduled-at are added to its metadata)",
                    "properties": {key: ENQUEUE["properties"][key] for key in
                                   ("content", "priority", "group", "metadata", "ttl")}},
        "start_at": {**_UNIX_SECONDS, "description": "unix seconds: no occurrence before"},
        "end_at": {**_UNIX_SECONDS, "description": "unix seconds: no occurrence after"},
        "catch_up": {"type": "string", "enum": list(schedules.CATCH_UP),
                     "description": "occurrences missed by more than grace (the cluster "
                                    "was down, it or its queue was paused): all fires each, "
                                    "one fires the latest once, none fires none (default "
                                    f"{schedules.DEFAULT_CATCH_UP})"},
        "grace": {"type": "integer", "minimum": 1, "maximum": schedules.MAX_GRACE,
                  "description": "seconds an occurrence may be late and still fire "
                                 f"(default {schedules.DEFAULT_GRACE})"},
        "paused": {"type": "boolean", "description": "create it paused"},
    },
}

SCHEMAS: dict[str, dict[str, Any]] = {
    "CreateQueueInputBody": {
        "type": "object", "required": ["name", "type"],
        "properties": {"name": NAME, "type": {"type": "string", "enum": list(rules.QUEUE_TYPES)},
                       "settings": SETTINGS},
    },
    "UpdateQueueInputBody": {
        "type": "object", "required": ["settings"], "properties": {"settings": SETTINGS},
    },
    "EnqueueInputBody": ENQUEUE,
    "EnqueueBatchInputBody": {
        "type": "object", "required": ["messages"],
        "properties": {"messages": {"type": "array", "minItems": 1, "maxItems": MAX_BATCH,
                                    "items": ENQUEUE}},
    },
    "NackInputBody": {
        "type": "object",
        "properties": {"priority": {**PRIORITY, "description": "its new priority (0 or "
                                    "absent: it keeps its own, and the queue's back-off "
                                    "applies unless a delay is given)"},
                       "metadata": NULLABLE_METADATA, "error": ERROR, "delay": DELAY,
                       "delivery": DELIVERY, "enqueue": SETTLE_ENQUEUE},
    },
    "PurgeInputBody": {
        "type": "object", "properties": {"include_unacked": {
            "type": "boolean", "description": "drop the delivered (unacked) messages too "
            "(default false: they stay with their consumers)"}},
    },
    "RejectInputBody": {
        "type": "object", "properties": {
            "error": ERROR, "delivery": DELIVERY, "enqueue": SETTLE_ENQUEUE,
            "reason": {"type": "string", "enum": list(REJECT_REASONS),
                       "description": "the dead letter's x-dead-reason (default rejected: "
                       "retries_spent for a task whose last try failed, unreadable for a "
                       "message its consumer cannot read)"}},
    },
    "SettleInputBody": {
        "type": "object", "properties": {"delivery": DELIVERY, "enqueue": SETTLE_ENQUEUE},
        "description": "optional; any other body is ignored, as the original's",
    },
    "RedriveInputBody": {
        "type": "object",
        "properties": {
            "to": {"type": "string", "minLength": 1, "maxLength": rules.MAX_NAME,
                   "x-rule": "queue",
                   "description": "the queue to move them to (default: each message's "
                                  "x-dead-from)"},
            "ids": {**IDS, "maxItems": rules.MAX_REDRIVE},
            "count": {"type": "integer", "minimum": 1, "maximum": rules.MAX_REDRIVE,
                      "description": "move the first N waiting messages, in id order "
                                     f"(default and at most {rules.MAX_REDRIVE})"}},
    },
    "AckBatchInputBody": {
        "type": "object", "required": ["ids"], "properties": {"ids": {
            **SETTLE_IDS, "items": {
                **SETTLE_IDS["items"],
                "properties": {**SETTLE_IDS["items"]["properties"], "enqueue": {
                    **SETTLE_ENQUEUE, "description": "messages stored with this id's ack: "
                    "the ack and every one of them happen, or none (that id alone fails); "
                    f"at most {MAX_SETTLE_ENQUEUE} per id, {MAX_BATCH} per request"}},
                "description": "a message id (decimal string or integer), or {id, delivery, "
                               "enqueue}"}}},
    },
    "NackBatchInputBody": {
        "type": "object", "required": ["ids"],
        "properties": {"ids": SETTLE_IDS, "priority": PRIORITY,
                       "metadata": NULLABLE_METADATA, "error": ERROR, "delay": DELAY},
    },
    "ScheduleInputBody": SCHEDULE,
    "UpdatePriorityInputBody": {
        "type": "object", "required": ["priority"], "properties": {"priority": PRIORITY},
    },
    "JoinInputBody": {
        "type": "object", "required": ["id", "addr"],
        "properties": {"id": STRING, "addr": STRING, "http_addr": STRING, "grpc_addr": STRING,
                       "client_http_addr": STRING, "client_grpc_addr": STRING},
    },
    "LeaveInputBody": {
        "type": "object", "required": ["id"], "properties": {"id": STRING},
    },
    "BackupInputBody": {
        "type": "object",
        "properties": {"since": {"type": "integer", "minimum": 0, "maximum": UINT64_MAX}},
    },
    "GenerateIdsInputBody": {
        "type": "object", "required": ["number"],
        "properties": {"number": {"type": "integer", "minimum": 1, "maximum": 1000}},
    },
}

_TYPE_CHECKS = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool)
    or isinstance(v, float) and v.is_integer(),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "boolean": lambda v: isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}

Problem = dict[str, Any]


def validate(schema: dict[str, Any], value: Any, location: str = "body") -> list[Problem]:
    problems: list[Problem] = []
    _check(schema, value, location, problems)
    return problems


def _problem(message: str, location: str, value: Any) -> Problem:
    return {"message": message, "location": location, "value": value}


# Derived views of a schema, computed once; each entry holds the schema itself, so its id
# cannot be reused by another object while it is cached.
_TYPES: dict[int, tuple[dict[str, Any], list[str]]] = {}
_LOWERED: dict[int, tuple[dict[str, Any], dict[str, str]]] = {}


def _types(schema: dict[str, Any]) -> list[str]:
    cached = _TYPES.get(id(schema))
    if cached is None or cached[0] is not schema:
        raw = schema.get("type", [])
        cached = _TYPES[id(schema)] = (schema, [raw] if isinstance(raw, str) else list(raw))
    return cached[1]


def _lowered(schema: dict[str, Any], props: dict[str, Any]) -> dict[str, str]:
    """Lower-cased property name -> property name (``props`` is schema["properties"])."""
    cached = _LOWERED.get(id(schema))
    if cached is None or cached[0] is not schema:
        cached = _LOWERED[id(schema)] = (schema, {k.lower(): k for k in props})
    return cached[1]


def _check(schema: dict[str, Any], value: Any, location: str, out: list[Problem]) -> None:
    types = _types(schema)
    if types and not any(_TYPE_CHECKS[t](value) for t in types):
        out.append(_problem("expected " + " or ".join(types), location, value))
        return
    if value is None:
        return
    if "enum" in schema and value not in schema["enum"]:
        choices = ", ".join(schema["enum"])
        out.append(_problem(f'expected value to be one of "{choices}"', location, value))
    if isinstance(value, str):
        _check_string(schema, value, location, out)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_range(schema, value, location, out)
    if isinstance(value, dict):
        _check_object(schema, value, location, out)
    if isinstance(value, list):
        _check_array(schema, value, location, out)


def _queue_rule(value: str) -> rules.NameProblem | None:
    return rules.name_problem(value) if value else None      # empty: no dead-letter queue


_RULES: dict[str, Callable[[str], rules.NameProblem | None]] = {
    "group": rules.group_problem, "key": rules.key_problem, "queue": _queue_rule}


def _check_string(schema: dict[str, Any], value: str, location: str,
                  out: list[Problem]) -> None:
    if len(value) < schema.get("minLength", 0):
        out.append(_problem(f"expected length >= {schema['minLength']}", location, value))
    elif len(value) > schema.get("maxLength", len(value)):
        out.append(_problem(f"expected length <= {schema['maxLength']}", location, value))
    elif schema.get("x-rule") == "dedup":
        why = rules.dedup_key_problem(value)
        if why is not None:
            out.append(_problem(f"expected a dedup key of at most {rules.MAX_DEDUP_KEY} bytes "
                                f"of valid Unicode ({why})", location, value))
    elif schema.get("x-rule") == "error":
        why = rules.error_problem(value)
        if why is not None:
            out.append(_problem(f"expected an error text of at most {rules.MAX_ERROR} bytes "
                                f"of valid Unicode ({why})", location, value))
    elif "x-rule" in schema:
        what = schema["x-rule"]
        problem = _RULES[what](value)
        if problem is not None:
            word = "name" if what == "queue" else what
            out.append(_problem(rules.worded(problem, "http", word), location, value))
    elif rules.lone_surrogate(value) is not None:
        out.append(_problem(rules.worded(rules.NameProblem.NOT_TEXT, "http"), location, value))


def _check_array(schema: dict[str, Any], value: list[Any], location: str,
                 out: list[Problem]) -> None:
    if len(value) < schema.get("minItems", 0):
        out.append(_problem(f"expected at least {schema['minItems']} items", location, value))
    if "maxItems" in schema and len(value) > schema["maxItems"]:
        out.append(_problem(f"expected at most {schema['maxItems']} items", location,
                            len(value)))
        return
    items = schema.get("items")
    if items is not None:
        for n, item in enumerate(value):
            _check(items, item, f"{location}[{n}]", out)


def _check_range(schema: dict[str, Any], value: float, location: str,
                 out: list[Problem]) -> None:
    if "minimum" in schema and value < schema["minimum"]:
        out.append(_problem(f"expected number >= {schema['minimum']}", location, value))
    elif "maximum" in schema and value > schema["maximum"]:
        out.append(_problem(f"expected number <= {schema['maximum']}", location, value))
    elif schema.get("x-rule") == "rate":
        why = rules.group_rate_problem(value)
        if why is not None:
            out.append(_problem(why, location, value))


def _check_object(schema: dict[str, Any], value: dict[str, Any], location: str,
                  out: list[Problem]) -> None:
    props: dict[str, Any] = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    lowered = _lowered(schema, props)
    present = {k.lower() for k in value}
    for name in schema.get("required", []):
        if name.lower() not in present:
            out.append(_problem(f"expected required property {name} to be present",
                                location, value))
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        out.append(_problem(f"expected at most {schema['maxProperties']} properties", location,
                            len(value)))
        return
    names = schema.get("propertyNames")
    for key, item in value.items():
        where = f"{location}.{key}"
        if names is not None:
            _check_string(names, key, where, out)
        if key in props:
            _check(props[key], item, where, out)
        elif extra is not None:
            _check(extra, item, where, out)
        elif key == "$schema":
            continue
        elif props and key.lower() in lowered:
            _check(props[lowered[key.lower()]], item, where, out)
        else:
            out.append(_problem("unexpected property", where, item))


def normalized(schema: dict[str, Any], value: dict[str, Any]) -> dict[str, Any]:
    """The body with property names case-folded to the schema's spelling, ``$schema`` dropped."""
    props: dict[str, Any] = schema.get("properties", {})
    lowered = _lowered(schema, props)
    out: dict[str, Any] = {}
    for key, item in value.items():
        if key == "$schema":
            continue
        name = key if key in props else lowered.get(key.lower(), key)
        if isinstance(item, dict) and isinstance(props.get(name), dict) \
                and props[name].get("properties"):
            item = normalized(props[name], item)
        elif isinstance(item, list) and isinstance(props.get(name), dict) \
                and props[name].get("items", {}).get("properties"):
            item = [normalized(props[name]["items"], x) if isinstance(x, dict) else x
                    for x in item]
        if isinstance(item, float) and item.is_integer() and \
                props.get(name, {}).get("type") == "integer":
            item = int(item)
        out[name] = item
    return out

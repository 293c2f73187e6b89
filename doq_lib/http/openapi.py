"""The OpenAPI description of the REST API (L5), built from the routes the app registers.

``document()`` walks the same ``ROUTES`` list that ``build_app`` registers, takes request
bodies from the validation schemas (``schema.SCHEMAS``) and failure statuses from the
same table the error mapping uses, so the description cannot drift from the server. Each
route's prose (tag, summary, answer) sits in ``ROUTE_DOCS`` beside it; a route without one
is an error at start-up (and in the tests).
"""
from __future__ import annotations

import copy
import re
from typing import Any, NamedTuple

from doq_lib.auth import ROLE_PERMISSIONS, ROLES, Rule, Scope
from doq_lib.http.auth import ROUTE_RULES

TITLE = "DOQ a distributed priority queue servie"      # sic: the original's title (SPEC §3.5)
VERSION = "1.0.0"


TAGS = ("Queues", "Messages", "Schedules", "Cluster", "Database", "Diagnostics")  # in order


class RouteDoc(NamedTuple):
    tag: str
    summary: str
    body: str | None          # request schema name in SCHEMAS, or None
    success: int              # status of success
    answer: str               # what success returns
    query: tuple[tuple[str, str, str], ...] = ()      # (name, type, description)


MESSAGE = ("the message: status, id (decimal string), group, priority, content, metadata, "
           "deliveries (times delivered, this one included), last_error (when a nack or "
           "reject gave one), delivery (while it is delivered and unacked: the delivery's "
           "token, to settle only this delivery)")
DELIVERY_QUERY = (("delivery", "string",
                   "the delivery token answered with the message (or in the body): settles "
                   "only that delivery; 409 stale_delivery when it is no longer current"),)
#: Routes whose body may be left out.
OPTIONAL_BODIES = frozenset({"db-backup", "ack", "touch", "reject", "purge"})
ROUTE_DOCS: dict[str, RouteDoc] = {
    "generate-id": RouteDoc("Messages", "Generate message ids", "GenerateIdsInputBody", 200,
                            "ids: snowflake ids as decimal strings"),
    "db-backup": RouteDoc("Database", "Stream a full or incremental backup (from the leader; a "
                          "follower relays it)",
                          "BackupInputBody", 200,
                          "the backup file (application/octet-stream); header X-Last-Version. "
                          "400 unrestorable_state: the store holds a record a restore would "
                          "refuse, so no file is written"),
    "db-restore": RouteDoc("Database", "Restore backups in order through Raft (on the leader; "
                           "a follower relays it)",
                           None, 200, "status SUCCEDED, backups, records, last_version"),
    "cluster-servers": RouteDoc("Cluster", "List the cluster's servers", None, 200,
                                "servers: id, addr, leader_addr, is_leader, suffrage, "
                                "http_addr, grpc_addr, lag, connected",
                                (("local", "boolean", "this node's own view, no proxying"),)),
    "cluster-join": RouteDoc("Cluster", "Add a node to the cluster", "JoinInputBody", 200,
                             "the joined node's id and address"),
    "cluster-leave": RouteDoc("Cluster", "Remove a node from the cluster", "LeaveInputBody",
                              200, "the removed node's id"),
    "create-queue": RouteDoc("Queues", "Create a queue", "CreateQueueInputBody", 200,
                             "status CREATED, name, type, settings; for a name that "
                             "existed: existed true, and its stored type and settings"),
    "queues": RouteDoc("Queues", "List queues", None, 200,
                       "queues: name, type, settings, rates, ready, unacked, total"),
    "queue-info": RouteDoc("Queues", "Queue settings, counts and rates", None, 200,
                           "name, type, settings, enqueue/dequeue/ack/nack rates, ready, "
                           "unacked, total"),
    "update-queue": RouteDoc("Queues", "Update a queue's settings", "UpdateQueueInputBody",
                             200, "status UPDATED, name, settings"),
    "delete-queue": RouteDoc("Queues", "Delete a queue and its messages", None, 200,
                             "status DELETED"),
    "enqueue": RouteDoc("Messages", "Enqueue a message", "EnqueueInputBody", 200,
                        "status ENQUEUED and the message as sent, with its id"),
    "enqueue-batch": RouteDoc("Messages", "Enqueue up to 1000 messages at once (all or none)",
                              "EnqueueBatchInputBody", 200,
                              "status ENQUEUED, ids: the ids in the order sent"),
    "dequeue": RouteDoc("Messages", "Dequeue the next message", None, 200, MESSAGE,
                        (("ack", "boolean",
                          "true: acknowledged at once (at most once); false (default): "
                          "must be acked before its ack timeout"),
                         ("consumer", "string",
                          "who takes (at most 200 bytes): each lease records it, see "
                          "GET .../consumers"),
                         ("count", "integer",
                          "1-1000: up to that many messages in one operation, answered as "
                          "{\"messages\": [...]} in delivery order (possibly empty)"),
                         ("wait", "number",
                          "0-20 seconds: when nothing is deliverable, wait up to that long "
                          "and answer as soon as a message is; without count an empty wait "
                          "answers 400 (the queue is empty)"),
                         ("browse", "boolean",
                          "true: list messages without taking any (role reader suffices): "
                          "{\"messages\": [...with state, and deadline when unacked], "
                          "\"next\": id or null}; served by any node from its replica"),
                         ("state", "string", "browse: ready (the waiting messages: those a "
                          "dequeue hands out now in that order, state ready, then the held-"
                          "back ones, state blocked), unacked (id order) or all (both; the "
                          "default)"),
                         ("group", "string", "browse: only this group's messages"),
                         ("after", "string", "browse: continue after this id (a page's next)"),
                         ("limit", "integer", "browse: 1-1000 messages (default 100)"))),
    "ack-batch": RouteDoc("Messages", "Acknowledge up to 1000 delivered messages at once",
                          "AckBatchInputBody", 200,
                          "acked: the ids acknowledged; failed: id, code, detail of each "
                          "that was not (its state is unchanged)"),
    "nack-batch": RouteDoc("Messages", "Give up to 1000 delivered messages back at once",
                           "NackBatchInputBody", 200,
                           "nacked: the ids given back; failed: id, code, detail of each "
                           "that was not (its state is unchanged)"),
    "get": RouteDoc("Messages", "Get a message by id", None, 200, MESSAGE),
    "delete": RouteDoc("Messages", "Delete a message", None, 204, "no content"),
    "ack": RouteDoc("Messages", "Acknowledge a delivered message", "SettleInputBody", 200,
                    "status ACKNOWLEDGED, id; ids: the messages stored with it (enqueue)",
                    DELIVERY_QUERY),
    "nack": RouteDoc("Messages", "Give a delivered message back (its error kept as "
                     "last_error; dead-lettered instead when its deliveries are used up)",
                     "NackInputBody", 200,
                     "status UNACKNOWLEDGED, id, priority, metadata; dead_lettered: true when "
                     "the queue's max_deliveries was reached; dead_letter_refused: why not "
                     "when its dead-letter queue is full and refuses more (it was given "
                     "back instead); ids: the messages stored with it (enqueue)"),
    "redrive": RouteDoc("Queues", "Move dead-lettered messages back (to 'to', or each to "
                        "its x-dead-from), deliveries reset and x-dead-* metadata removed",
                        "RedriveInputBody", 200,
                        "moved: how many; failed: id, code (message_not_found, "
                        "message_delivered, no_origin, queue_not_found, same_queue, "
                        "queue_full), detail"),
    "reject": RouteDoc("Messages", "Dead-letter a delivered message now (reason rejected); "
                       "429 queue_full when its dead-letter queue is full and refuses more "
                       "(it stays delivered)",
                       "RejectInputBody", 200,
                       "status REJECTED, id; ids: the messages stored with it (enqueue)"),
    "touch": RouteDoc("Messages", "Extend a delivered message's ack deadline",
                      "SettleInputBody", 200, "status TOUCHED, id", DELIVERY_QUERY),
    "update-priority": RouteDoc("Messages", "Change a message's priority",
                                "UpdatePriorityInputBody", 200, "status UPDATED, id, priority"),
    "purge": RouteDoc("Queues", "Drop every waiting message (ready, scheduled, held back) "
                      "and, with include_unacked, every delivered one, in one operation",
                      "PurgeInputBody", 200, "status PURGED, purged: how many"),
    "pause": RouteDoc("Queues", "Pause delivery: enqueues, acks and nacks go on; a dequeue "
                      "answers as an empty queue does, waiting consumers wait for the resume",
                      None, 200, "status PAUSED"),
    "resume": RouteDoc("Queues", "Resume delivery of a paused queue", None, 200,
                       "status RESUMED"),
    "explain": RouteDoc("Messages", "Why a message is, or is not, being delivered", None,
                        200, "id, state (ready, unacked, blocked), reasons: [{code, ...}] "
                        "(delayed_until, queue_paused, group_paused, group_at_max_unacked, "
                        "queue_at_max_in_flight, group_rate_limited, backoff_until), ahead: "
                        "deliverable messages handed out before it"),
    "consumers": RouteDoc("Queues", "The consumers a queue knows (named on dequeue with "
                          "?consumer=): what each holds and did; one holding nothing is "
                          "forgotten after an hour unseen", None, 200,
                          "consumers: name, held (messages it holds), messages (the first "
                          "100 of their ids, oldest delivery first), oldest_lease_ms (the "
                          "age of its oldest delivery), last_seen (unix ms), deliveries, "
                          "acks, nacks (a reject counts as a nack)"),
    "put-schedule": RouteDoc(
        "Schedules", "Create a schedule (cron in a time zone, or every N seconds) that stores a "
        "message in the queue at each occurrence, or replace the definition of the one of "
        "that name (its counts stay; posting the same definition changes nothing). The "
        "leader fires each occurrence once, across failovers and restarts",
        "ScheduleInputBody", 200, "status CREATED, REPLACED or UNCHANGED, schedule: "
        + "the schedule as GET answers it"),
    "schedules": RouteDoc("Schedules", "The schedules of a queue, by name", None, 200,
                          "schedules: [" + "the definition, then paused, next_at and "
                          "last_fired (unix seconds; next_at null: it has ended), fired, "
                          "skipped (missed and not caught up), refused (the queue was full), "
                          "last_error, created_at]"),
    "schedule": RouteDoc("Schedules", "One schedule", None, 200,
                         "the schedule, as in the listing"),
    "delete-schedule": RouteDoc("Schedules", "Delete a schedule (stored messages stay)", None,
                                200, "status DELETED, name"),
    "pause-schedule": RouteDoc("Schedules", "Pause a schedule: it fires nothing until resumed; "
                               "then its catch_up rule says what happens to what it missed",
                               None, 200, "status PAUSED, name, changed"),
    "resume-schedule": RouteDoc("Schedules", "Resume a paused schedule", None, 200,
                                "status RESUMED, name, changed"),
    "groups": RouteDoc("Queues", "The groups of a queue: with messages, or paused", None, 200,
                       "groups: group, ready, unacked, paused (paused_by: the parent group "
                       "whose pause covers it)"),
    "pause-group": RouteDoc("Queues", "Pause a group of a fair queue and its sub-groups ('a' "
                            "covers 'a.b'): the scheduler serves the others as if it were "
                            "absent", None, 200, "status PAUSED, group"),
    "resume-group": RouteDoc("Queues", "Resume a paused group of a fair queue", None, 200,
                             "status RESUMED, group"),
    "internal-status": RouteDoc("Diagnostics", "This node's Raft and group-commit status",
                                None, 200, "node_id, addresses, raft, committer"),
    "internal-state": RouteDoc("Diagnostics", "Applied index and digests of this replica",
                               None, 200, "node_id, applied_index, digest, queue_digest"),
}

PROBLEM = {
    "type": "object",
    "description": "RFC 9457 problem details",
    "properties": {
        "title": {"type": "string"}, "status": {"type": "integer"},
        "detail": {"type": "string"},
        "errors": {"type": "array", "items": {"type": "object", "properties": {
            "message": {"type": "string"}, "location": {"type": "string"}, "value": {}}}},
        "code": {"type": "string", "description": "stable error code (DOQ extension)"},
        "maybe_applied": {"type": "boolean"},
    },
}
_PARAM = re.compile(r"<([a-z_]+)(?::[^>]*)?>")


def openapi_path(rule: str) -> str:
    """A Bottle rule as an OpenAPI path template: <queue_name> -> {queue_name}."""
    return _PARAM.sub(r"{\1}", rule)


def _path_params(rule: str) -> list[dict[str, Any]]:
    params = []
    for name in _PARAM.findall(rule):
        schema: dict[str, Any] = ({"type": "string", "maxLength": 1024}
                                  if name in ("queue_name", "group")
                                  else {"type": "string", "pattern": "^[0-9]+$",
                                        "description": "uint64, decimal"})
        params.append({"name": name, "in": "path", "required": True, "schema": schema})
    return params


def _access(rule: Rule) -> str:
    roles = [r for r in ROLES if rule.permission in ROLE_PERMISSIONS[r]]
    scope = {Scope.QUEUE: "a key limited to queue patterns must cover the queue",
             Scope.ANY: "keys limited to queue patterns see their queues only",
             Scope.CLUSTER: "not with a key limited to queue patterns"}[rule.scope]
    text = f"With API keys: role {' or '.join(roles)} ({scope})."
    if rule.loopback:
        text += " Without keys: only from loopback clients (or other nodes)."
    return text


def _forbidden(rule: Rule) -> str:
    what = "the key's role or queue patterns do not allow it"
    return what + ("; or, without keys, a client that is not on loopback"
                   if rule.loopback else "")


#: Routes whose writes grow the stored data: refused with 507 while the disk is low.
GROWING = frozenset({"create-queue", "enqueue", "enqueue-batch", "db-restore"})
#: Routes that settle one delivery, fenced by its token: 409 stale_delivery.
FENCED = frozenset({"ack", "nack", "touch", "reject"})


def document(routes: list[tuple[str, str, str, str]], schemas: dict[str, dict[str, Any]],
             failures: dict[str, tuple[int, str]]) -> dict[str, Any]:
    """OpenAPI 3.1 for ``routes`` ((method, rule, op id, handler) as registered)."""
    paths: dict[str, dict[str, Any]] = {}
    used: set[str] = set()
    for method, rule, op_id, _ in routes:
        doc = ROUTE_DOCS.get(op_id)
        if doc is None:
            raise KeyError(f"route {op_id} has no entry in ROUTE_DOCS")
        params = _path_params(rule) + [
            {"name": name, "in": "query", "required": False, "schema": {"type": kind},
             "description": text} for name, kind, text in doc.query]
        content_type = ("application/octet-stream" if op_id == "db-backup"
                        else "application/json")
        responses: dict[str, Any] = {
            str(doc.success): {"description": doc.answer} if doc.success == 204 else {
                "description": doc.answer, "content": {content_type: {"schema": {
                    "type": "string", "format": "binary"} if op_id == "db-backup" else {
                    "type": "object"}}}}}
        problem = {"content": {"application/problem+json": {
            "schema": {"$ref": "#/components/schemas/Problem"}}}}
        status, detail = failures[op_id]
        responses[str(status)] = {"description": detail, **problem}
        if doc.body or rule.count("<"):
            responses.setdefault("422", {"description": "validation failed", **problem})
        if op_id in FENCED:
            responses["409"] = {"description": "stale_delivery: the delivery token given is "
                                "not the message's current delivery (its lease ran out and "
                                "it was delivered again, or it was settled); nothing "
                                "changed", **problem}
        responses.setdefault("503", {"description": "no leader or no quorum: retry",
                                     **problem})
        if op_id in GROWING:
            responses["507"] = {"description": "the node's disk is below its reserve "
                                "(storage.min_free_bytes): retry on another node or later",
                                **problem}
        access = ROUTE_RULES[op_id]
        responses["401"] = {"description": "with a keys file: no valid API key", **problem}
        responses["403"] = {"description": _forbidden(access), **problem}
        operation: dict[str, Any] = {"operationId": op_id, "tags": [doc.tag],
                                     "summary": doc.summary, "responses": responses,
                                     "description": _access(access)}
        if params:
            operation["parameters"] = params
        if doc.body:
            used.add(doc.body)
            operation["requestBody"] = {
                "required": op_id not in OPTIONAL_BODIES,
                "content": {"application/json": {
                    "schema": {"$ref": f"#/components/schemas/{doc.body}"}}}}
        elif op_id == "db-restore":
            operation["requestBody"] = {"required": True, "content": {
                "multipart/form-data": {"schema": {"type": "object", "required": ["file"],
                                                   "properties": {"file": {
                                                       "type": "array", "items": {
                                                           "type": "string",
                                                           "format": "binary"}}}}},
                "application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}}}
        paths.setdefault(openapi_path(rule), {})[method.lower()] = operation
    components = {name: copy.deepcopy(schemas[name]) for name in sorted(used)}
    components["Problem"] = PROBLEM
    return {
        "openapi": "3.1.0",
        "info": {"title": TITLE, "version": VERSION,
                 "description": "DOQ: a durable, replicated work queue. Writes are answered "
                                "after a majority of nodes stored them durably."},
        "paths": paths,
        "components": {"schemas": components, "securitySchemes": {"bearerAuth": {
            "type": "http", "scheme": "bearer",
            "description": "An API key (doq keys add), when the node has auth.keys_file"}}},
        "security": [{"bearerAuth": []}, {}],
        "tags": [{"name": t} for t in TAGS],
    }


def downgrade(doc: dict[str, Any]) -> dict[str, Any]:
    """The same description as OpenAPI 3.0 (type lists with null become nullable; 3.0 has no
    ``propertyNames``, so the key rules move into the description)."""
    out = copy.deepcopy(doc)
    out["openapi"] = "3.0.3"

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            kind = node.get("type")
            if isinstance(kind, list):
                rest = [k for k in kind if k != "null"]
                node["type"] = rest[0] if len(rest) == 1 else rest
                if "null" in kind:
                    node["nullable"] = True
            names = node.pop("propertyNames", None)
            if isinstance(names, dict):
                rule = (f"keys: 1 to {names.get('maxLength')} characters, no control "
                        "characters, not '.', '..' or blank")
                said = node.get("description")
                node["description"] = f"{said}; {rule}" if said else rule
            for value in node.values():
                fix(value)
        elif isinstance(node, list):
            for value in node:
                fix(value)
    fix(out)
    return out

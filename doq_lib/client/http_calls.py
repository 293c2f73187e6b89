"""The REST API's calls, written once for :class:`~doq_lib.client.HttpClient` and
:class:`~doq_lib.client.aio.AsyncHttpClient` (see :mod:`doq_lib.client.calls`): each builds
its requests, yields them as :class:`HttpCall`, and reads the answers."""
from __future__ import annotations

import json
import urllib.parse
from typing import Any, Protocol, Sequence

from doq_lib.client.calls import Calls, HttpCall
from doq_lib.client.common import (
    HTTP_MAX_BATCH,
    Browsed,
    ConsumerInfo,
    Created,
    Explanation,
    Failure,
    Nacked,
    Settled,
    settings_json,
    to_strategy,
)
from doq_lib.client.schedules import ScheduleInfo, definition, schedule_from_rest, schedule_path
from doq_lib.errors import error_for_wire_code
from doq_lib.models import (
    LIFECYCLE_SETTINGS,
    GroupInfo,
    Message,
    QueueInfo,
    QueueSettings,
    QueueType,
    ServerInfo,
    Strategy,
)


class HttpCaller(Protocol):
    """What the calls read of the client that runs them."""

    consumer: str              # the name its dequeues give ("": none)

    def delivered(self, message: Message, queue: str) -> Message:
        """``message``, taken without an ack, as one that settles itself through the
        client."""


# -- cluster ---------------------------------------------------------------------------------------
def servers(c: HttpCaller) -> Calls[list[ServerInfo]]:
    body = yield HttpCall("GET", "/API/v1/cluster/servers", safe=True)
    return [ServerInfo(s["id"], s["addr"], s.get("leader_addr", ""), s["is_leader"],
                       s.get("suffrage", "Voter"), s.get("http_addr", ""),
                       s.get("grpc_addr", ""), s.get("lag"), s.get("connected"),
                       s.get("peer_http_addr", ""), s.get("peer_grpc_addr", ""))
            for s in body.get("servers", [])]


def generate_ids(c: HttpCaller, number: int) -> Calls[list[int]]:
    body = yield HttpCall("POST", "/API/v1/ids", {"number": number}, safe=True)
    return [int(i) for i in body["ids"]]


# -- queues ----------------------------------------------------------------------------------------
def create_queue(c: HttpCaller, /, name: str, qtype: str = "delayed",
                 strategy: Strategy | str | None = None, max_unacked: int = 0,
                 ack_timeout: int = 0, **lifecycle: Any) -> Calls[Created]:
    """``lifecycle``: max_deliveries, dead_letter_queue, max_messages, overflow. A name that
    exists changes nothing: the answer says so, with the stored definition."""
    body = yield HttpCall("POST", "/API/v1/queues", {
        "name": name, "type": qtype,
        "settings": settings_json(strategy, max_unacked, ack_timeout, lifecycle)})
    return Created(name, QueueType(body.get("type") or qtype.lower()),
                   _settings(body.get("settings") or {}), bool(body.get("existed")))


def update_queue(c: HttpCaller, /, name: str, strategy: Strategy | str | None = None,
                 max_unacked: int = 0, ack_timeout: int = 0, **lifecycle: Any) -> Calls[None]:
    """The lifecycle settings not given (or None) keep the queue's values."""
    yield HttpCall("PUT", queue_path(name), {"settings": settings_json(
        strategy, max_unacked, ack_timeout, lifecycle)})


def delete_queue(c: HttpCaller, name: str) -> Calls[None]:
    yield HttpCall("DELETE", queue_path(name))


def queues(c: HttpCaller) -> Calls[list[QueueInfo]]:
    body = yield HttpCall("GET", "/API/v1/queues", safe=True)
    return [_queue_info(q) for q in body["queues"]]


def queue(c: HttpCaller, name: str) -> Calls[QueueInfo]:
    return _queue_info((yield HttpCall("GET", queue_path(name), safe=True)))


# -- messages --------------------------------------------------------------------------------------
def enqueue(c: HttpCaller, queue: str, content: str, priority: int = 0, group: str = "",
            metadata: dict[str, str] | None = None, id: int = 0,
            dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Calls[Message]:
    """The stored message (``duplicate``: seen within the queue's dedup window, with the
    first message's id; nothing stored). ``ttl``: seconds it may wait to be delivered
    (0: the queue's message_ttl); ``delay``: seconds before it may be delivered (any
    queue type; at most 30 days)."""
    body = batch_item({"content": content, "priority": priority, "group": group,
                       "metadata": metadata, "id": id, "dedup_key": dedup_key,
                       "ttl": ttl, "delay": delay})
    out = yield HttpCall("POST", queue_path(queue, "/messages"), body)
    return Message(int(out["id"]), out.get("group", group), out.get("priority", priority),
                   out.get("content", content), out.get("metadata") or {},
                   duplicate=bool(out.get("duplicate")))


def enqueue_batch(c: HttpCaller, items: Sequence[dict[str, Any]]) -> Calls[list[int]]:
    """Enqueue items (keyword arguments of :meth:`enqueue`); returns the ids in order.

    Consecutive items of one queue travel together, up to 1000 per request, through
    ``POST .../messages/batch``: each such request is stored all or nothing (so a batch
    for one queue of at most 1000 items is atomic, as the gRPC client's always is).
    """
    ids: list[int] = []
    start = 0
    while start < len(items):
        name = items[start]["queue"]
        end = start
        while end < len(items) and end - start < HTTP_MAX_BATCH \
                and items[end]["queue"] == name:
            end += 1
        body = {"messages": [batch_item(item) for item in items[start:end]]}
        answer = yield HttpCall("POST", queue_path(name, "/messages/batch"), body)
        ids.extend(int(i) for i in answer["ids"])
        start = end
    return ids


def dequeue(c: HttpCaller, queue: str, ack: bool = False) -> Calls[Message]:
    path = queue_path(queue, "/messages") + ("?ack=true" if ack else "?ack=false")
    message = message_of((yield HttpCall("GET", path + _named(c))))
    return message if ack else c.delivered(message, queue)


def dequeue_many(c: HttpCaller, queue: str, count: int, ack: bool = False,
                 wait: float = 0.0) -> Calls[list[Message]]:
    """Up to ``count`` (1-1000) messages in delivery order, taken in one operation.

    ``wait`` (0-20 s): when nothing is deliverable, wait up to that long for a message
    (long-poll); [] when none came.
    """
    query = f"?count={count}&ack={'true' if ack else 'false'}" + _named(c)
    if wait > 0:
        query += f"&wait={wait:.3f}"
    body = yield HttpCall("GET", queue_path(queue, "/messages") + query, extra_time=wait)
    taken = [message_of(m) for m in body["messages"]]
    return taken if ack else [c.delivered(m, queue) for m in taken]


def _named(c: HttpCaller) -> str:
    """The query part that names this client's consumer."""
    return "&consumer=" + urllib.parse.quote(c.consumer, safe="") if c.consumer else ""


def consumers(c: HttpCaller, queue: str) -> Calls[list[ConsumerInfo]]:
    """The consumers the queue knows: what each holds and did."""
    out = yield HttpCall("GET", queue_path(queue, "/consumers"), safe=True)
    return [ConsumerInfo(k["name"], k["held"], [int(i) for i in k["messages"]],
                         k["oldest_lease_ms"], k["last_seen"], k["deliveries"], k["acks"],
                         k["nacks"]) for k in out["consumers"]]


def get(c: HttpCaller, queue: str, id: int) -> Calls[Message]:
    return message_of((yield HttpCall("GET", queue_path(queue, f"/messages/{id}"), safe=True)))


def delete(c: HttpCaller, queue: str, id: int) -> Calls[None]:
    yield HttpCall("DELETE", queue_path(queue, f"/messages/{id}"))


def ack(c: HttpCaller, queue: str, id: int, delivery: str = "",
        enqueue: Sequence[dict[str, Any]] = ()) -> Calls[list[int]]:
    """Acknowledge a delivered message; ``delivery``: the token it was delivered with
    (then StaleDelivery when that delivery is no longer current, and nothing changes);
    ``enqueue``: up to 100 messages (``queue`` and the keyword arguments of
    :meth:`enqueue` each) stored with the ack, all or nothing. Returns their ids."""
    path = queue_path(queue, f"/messages/{id}/ack")
    if not enqueue:
        yield HttpCall("POST", path + _token_query(delivery))
        return []
    body: dict[str, Any] = {"enqueue": _targets(enqueue)}
    if delivery:
        body["delivery"] = delivery
    return [int(i) for i in (yield HttpCall("POST", path, body))["ids"]]


def ack_batch(c: HttpCaller, queue: str, ids: Sequence[int]) -> Calls[list[int]]:
    """Acknowledge ``ids``; returns those that were not delivered and unacked."""
    return [f.id for f in (yield from ack_many(c, queue, ids)).failed]


def ack_many(c: HttpCaller, queue: str, ids: Sequence[int],
             deliveries: Sequence[str] | None = None,
             enqueue: Sequence[Sequence[dict[str, Any]]] | None = None) -> Calls[Settled]:
    """Acknowledge ``ids`` (1000 per request, each request one operation);
    ``deliveries``: each one's delivery token, in the same order ("": none);
    ``enqueue``: per id, the messages (as for :meth:`ack`) stored with its ack, all or
    nothing per id (``Settled.enqueued``: their ids by acked id)."""
    if enqueue and any(enqueue):
        return (yield from _ack_and_enqueue(queue, ids, deliveries, enqueue))
    return (yield from _settle(queue, "ack", "acked", ids, {}, deliveries))


def _ack_and_enqueue(queue: str, ids: Sequence[int], deliveries: Sequence[str] | None,
                     enqueue: Sequence[Sequence[dict[str, Any]]]) -> Calls[Settled]:
    done: list[int] = []
    failed: list[Failure] = []
    stored: dict[int, list[int]] = {}
    chunks: list[list[dict[str, Any]]] = [[]]
    size = 0
    for n, mid in enumerate(ids):
        items = list(enqueue[n]) if n < len(enqueue) else []
        if chunks[-1] and (len(chunks[-1]) >= HTTP_MAX_BATCH or
                           size + len(items) > HTTP_MAX_BATCH):
            chunks.append([])
            size = 0
        entry: dict[str, Any] = {"id": str(mid)}
        if deliveries and n < len(deliveries) and deliveries[n]:
            entry["delivery"] = deliveries[n]
        if items:
            entry["enqueue"] = _targets(items)
        chunks[-1].append(entry)
        size += len(items)
    for chunk in chunks:
        if not chunk:
            continue
        answer = yield HttpCall("POST", queue_path(queue, "/messages/ack"), {"ids": chunk})
        done.extend(int(i) for i in answer["acked"])
        failed.extend(_failures(answer))
        stored.update({int(k): [int(i) for i in v]
                       for k, v in answer.get("enqueued", {}).items()})
    return Settled(done, failed, enqueued=stored)


def nack_many(c: HttpCaller, queue: str, ids: Sequence[int], priority: int = 0,
              metadata: dict[str, str] | None = None, error: str = "",
              delay: int = 0, deliveries: Sequence[str] | None = None) -> Calls[Settled]:
    """Give ``ids`` back (priority 0 / metadata None: keep each message's own;
    ``deliveries`` as for ack_many)."""
    extra: dict[str, Any] = {"delay": delay} if delay else {}
    if priority:
        extra["priority"] = priority
    if metadata is not None:
        extra["metadata"] = metadata
    if error:
        extra["error"] = error
    return (yield from _settle(queue, "nack", "nacked", ids, extra, deliveries))


def _settle(queue: str, route: str, done_key: str, ids: Sequence[int],
            extra: dict[str, Any], deliveries: Sequence[str] | None = None) -> Calls[Settled]:
    done: list[int] = []
    failed: list[Failure] = []
    tokens = dict(zip(ids, deliveries)) if deliveries else {}
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), HTTP_MAX_BATCH):
        chunk = [{"id": str(i), "delivery": tokens[i]} if tokens.get(i) else str(i)
                 for i in unique[start:start + HTTP_MAX_BATCH]]
        answer = yield HttpCall("POST", queue_path(queue, f"/messages/{route}"),
                                {"ids": chunk, **extra})
        done.extend(int(i) for i in answer[done_key])
        failed.extend(_failures(answer))
    return Settled(done, failed)


def nack(c: HttpCaller, queue: str, id: int, priority: int = 0,
         metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
         delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Calls[Nacked]:
    """Give a delivered message back (``priority`` 0: it keeps its own, and the queue's
    back-off applies without a ``delay``; ``error``: kept as its last_error; ``delay``:
    seconds before it may be delivered again; ``delivery``, ``enqueue``: as for ack);
    true when it was dead-lettered instead, its deliveries used up."""
    body: dict[str, Any] = {"priority": priority}
    if enqueue:
        body["enqueue"] = _targets(enqueue)
    if delivery:
        body["delivery"] = delivery
    if delay:
        body["delay"] = delay
    if metadata is not None:
        body["metadata"] = metadata
    if error:
        body["error"] = error
    out = yield HttpCall("POST", queue_path(queue, f"/messages/{id}/nack"), body)
    return Nacked(bool(out.get("dead_lettered")), [int(i) for i in out.get("ids", ())])


def reject(c: HttpCaller, queue: str, id: int, error: str = "", delivery: str = "",
           enqueue: Sequence[dict[str, Any]] = (), reason: str = "") -> Calls[list[int]]:
    """Dead-letter a delivered message now (``reason``, its x-dead-reason: rejected (the
    default), retries_spent or unreadable; ``delivery``, ``enqueue``: as for ack; returns
    the ids stored with it)."""
    body: dict[str, Any] = {"error": error} if error else {}
    if reason:
        body["reason"] = reason
    if delivery:
        body["delivery"] = delivery
    if enqueue:
        body["enqueue"] = _targets(enqueue)
    out = yield HttpCall("POST", queue_path(queue, f"/messages/{id}/reject"), body)
    return [int(i) for i in out.get("ids", ())]


def touch(c: HttpCaller, queue: str, id: int, delivery: str = "") -> Calls[None]:
    """Extend a delivered message's lease (``delivery``: as for ack: StaleDelivery tells
    a worker at once that it lost the message)."""
    yield HttpCall("POST", queue_path(queue, f"/messages/{id}/touch") +
                   _token_query(delivery))


def update_priority(c: HttpCaller, queue: str, id: int, priority: int) -> Calls[None]:
    yield HttpCall("PUT", queue_path(queue, f"/messages/{id}/priority"),
                   {"priority": priority})


# -- operator controls -----------------------------------------------------------------------------
def purge(c: HttpCaller, queue: str, include_unacked: bool = False) -> Calls[int]:
    """Drop every waiting message (and, asked, every delivered one): how many."""
    body = {"include_unacked": True} if include_unacked else {}
    return int((yield HttpCall("POST", queue_path(queue, "/purge"), body))["purged"])


def pause(c: HttpCaller, queue: str) -> Calls[None]:
    """Stop delivery (enqueues, acks and nacks go on)."""
    yield HttpCall("POST", queue_path(queue, "/pause"), {})


def resume(c: HttpCaller, queue: str) -> Calls[None]:
    yield HttpCall("POST", queue_path(queue, "/resume"), {})


def pause_group(c: HttpCaller, queue: str, group: str) -> Calls[None]:
    """Skip ``group`` and its sub-groups (a fair queue)."""
    yield HttpCall("POST", _group_path(queue, group, "/pause"), {})


def resume_group(c: HttpCaller, queue: str, group: str) -> Calls[None]:
    yield HttpCall("POST", _group_path(queue, group, "/resume"), {})


def groups(c: HttpCaller, queue: str) -> Calls[list[GroupInfo]]:
    out = yield HttpCall("GET", queue_path(queue, "/groups"), safe=True)
    return [GroupInfo(g["group"], g["ready"], g["unacked"],
                      g.get("paused_by", g["group"]) if g["paused"] else None)
            for g in out["groups"]]


def browse(c: HttpCaller, queue: str, state: str = "all", group: str | None = None,
           after: int | None = None,
           limit: int = 100) -> Calls[tuple[list[Browsed], int | None]]:
    """A page of messages, nothing taken: (the page, the id to pass as ``after`` for the
    next one, or None at the end)."""
    query = {"browse": "true", "state": state, "limit": str(limit)}
    if group is not None:
        query["group"] = group
    if after is not None:
        query["after"] = str(after)
    out = yield HttpCall("GET", queue_path(queue, "/messages?" + urllib.parse.urlencode(
        query)), safe=True)
    return ([Browsed(message_of(m), m["state"], m.get("deadline", 0), m.get("consumer", ""),
                     m.get("delivered_at", 0))
             for m in out["messages"]],
            None if out["next"] is None else int(out["next"]))


def explain(c: HttpCaller, queue: str, id: int) -> Calls[Explanation]:
    out = yield HttpCall("GET", queue_path(queue, f"/messages/{id}/explain"), safe=True)
    held = out.get("held_by") or {}
    return Explanation(out["state"], out["reasons"], out["ahead"], held.get("consumer", ""),
                       held.get("since", 0))


def redrive(c: HttpCaller, queue: str, to: str = "", ids: Sequence[int] | None = None,
            count: int | None = None) -> Calls[Settled]:
    """Move dead-lettered messages of ``queue`` back: to ``to`` (default: each to its
    x-dead-from), the ``ids`` given or the first ``count`` (default: up to 10000)."""
    body: dict[str, Any] = {}
    if to:
        body["to"] = to
    if ids is not None:
        body["ids"] = [str(i) for i in ids]
    if count is not None:
        body["count"] = count
    out = yield HttpCall("POST", queue_path(queue, "/redrive"), body)
    failed = _failures(out)
    bad = {f.id for f in failed}
    moved = [i for i in ids if i not in bad] if ids is not None else []
    return Settled(moved, failed, out["moved"])


# -- schedules -------------------------------------------------------------------------------------
def put_schedule(c: HttpCaller, queue: str, name: str, content: str, *,
                 cron: str | None = None, every: int | None = None,
                 timezone: str | None = None, priority: int = 0, group: str = "",
                 metadata: dict[str, str] | None = None, ttl: int = 0,
                 start_at: int | None = None, end_at: int | None = None,
                 catch_up: str | None = None, grace: int | None = None,
                 paused: bool = False) -> Calls[ScheduleInfo]:
    """Create schedule ``name`` of ``queue`` (``cron`` or ``every`` seconds), or replace
    its definition; it stores a message with ``content`` at each occurrence."""
    body = definition(name, content, cron, every, timezone, priority, group, metadata,
                      ttl, start_at, end_at, catch_up, grace)
    if paused:
        body["paused"] = True
    out = yield HttpCall("POST", schedule_path(queue), body)
    return schedule_from_rest(out["schedule"], out["status"].lower())


def schedules(c: HttpCaller, queue: str) -> Calls[list[ScheduleInfo]]:
    out = yield HttpCall("GET", schedule_path(queue), safe=True)
    return [schedule_from_rest(s) for s in out["schedules"]]


def schedule(c: HttpCaller, queue: str, name: str) -> Calls[ScheduleInfo]:
    return schedule_from_rest((yield HttpCall("GET", schedule_path(queue, name), safe=True)))


def delete_schedule(c: HttpCaller, queue: str, name: str) -> Calls[None]:
    yield HttpCall("DELETE", schedule_path(queue, name))


def pause_schedule(c: HttpCaller, queue: str, name: str) -> Calls[bool]:
    """Whether it was running (and is paused now)."""
    return bool((yield HttpCall("POST", schedule_path(queue, name, "/pause"), {}))["changed"])


def resume_schedule(c: HttpCaller, queue: str, name: str) -> Calls[bool]:
    return bool((yield HttpCall("POST", schedule_path(queue, name, "/resume"), {}))["changed"])


# -- encoding and decoding -------------------------------------------------------------------------
def batch_item(item: dict[str, Any]) -> dict[str, Any]:
    """A message to store (keyword arguments of ``enqueue``) as the REST API takes it."""
    out: dict[str, Any] = {"content": item["content"], "priority": item.get("priority", 0)}
    if item.get("group"):
        out["group"] = item["group"]
    if item.get("metadata"):
        out["metadata"] = item["metadata"]
    if item.get("id"):
        out["id"] = str(item["id"])
    if item.get("dedup_key"):
        out["dedup_key"] = item["dedup_key"]
    if item.get("ttl"):
        out["ttl"] = item["ttl"]
    if item.get("delay"):
        out["delay"] = item["delay"]
    return out


def _targets(items: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages a settle stores, each with its queue."""
    return [{"queue": item["queue"], **batch_item(item)} for item in items]


def _failures(answer: dict[str, Any]) -> list[Failure]:
    return [Failure(int(f["id"]), f["code"], f["detail"]) for f in answer["failed"]]


def queue_path(name: str, tail: str = "") -> str:
    return "/API/v1/queues/" + urllib.parse.quote(name, safe="") + tail


def _group_path(name: str, group: str, tail: str) -> str:
    return queue_path(name, "/groups/" + urllib.parse.quote(group, safe="") + tail)


def _token_query(delivery: str) -> str:
    return "?delivery=" + urllib.parse.quote(delivery, safe="") if delivery else ""


def result_of(status: int, raw: bytes) -> Any:
    """The decoded answer of a request, or the server's error raised."""
    if status == 204:
        return None
    try:
        body = json.loads(raw) if raw else {}
    except ValueError:
        body = {}
    if status < 400:
        return body
    if not isinstance(body, dict):
        body = {}
    errors = body.get("errors") or []
    message = "; ".join(_error_text(e) for e in errors if isinstance(e, dict)) \
        or body.get("detail") or f"HTTP {status}"
    code = body.get("code") or ("unavailable" if status == 503 else
                                "internal" if status >= 500 else "invalid_argument")
    raise error_for_wire_code(code, str(message), bool(body.get("maybe_applied")))


def _error_text(error: dict[str, Any]) -> str:
    """One item of a problem's ``errors``, with the field it names: ``settings.ack_timeout:
    expected number >= 60`` (a body field without its ``body.``; a query or path parameter
    as ``query.ack``)."""
    text = str(error.get("message", ""))
    where = str(error.get("location") or "")
    where = where.removeprefix("body.") if where != "body" else ""
    return f"{where}: {text}" if where else text


def message_of(body: dict[str, Any]) -> Message:
    return Message(int(body["id"]), body.get("group", ""), body.get("priority", 0),
                   body.get("content", ""), body.get("metadata") or {},
                   body.get("deliveries", 0), body.get("last_error", ""),
                   expires_at=body.get("expires_at", 0), delivery=body.get("delivery", ""))


def _settings(settings: dict[str, Any]) -> QueueSettings:
    return QueueSettings(to_strategy(settings.get("strategy")), settings.get("max_unacked", 0),
                         settings.get("ack_timeout", 0),
                         **{key: settings[key] for key in LIFECYCLE_SETTINGS if key in settings})


def _queue_info(body: dict[str, Any]) -> QueueInfo:
    return QueueInfo(body["name"], QueueType(body["type"]),
                     _settings(body.get("settings") or {}),
                     body.get("ready", 0), body.get("unacked", 0), body.get("enqueue_rps", 0.0),
                     body.get("dequeue_rps", 0.0), body.get("ack_rps", 0.0),
                     body.get("nack_rps", 0.0), body.get("paused", False),
                     body.get("paused_groups", 0), body.get("dead_letter_queue_hidden", False))

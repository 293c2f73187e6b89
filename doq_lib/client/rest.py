"""The REST client (SPEC §3): :class:`HttpClient` over keep-alive connections, and
:class:`HttpConsumer`, batch consumption with long-poll."""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
import urllib.parse
from typing import IO, Any, Iterator, Sequence

from doq_lib.client.common import (
    DEFAULT_RETRY,
    HTTP_MAX_BATCH,
    NO_SECURITY,
    Browsed,
    ClientBase,
    ConsumerInfo,
    Explanation,
    Failover,
    Failure,
    Nacked,
    RetryPolicy,
    Security,
    Settled,
    default_consumer,
    nodes_of,
    settings_json,
    to_strategy,
)
from doq_lib.client.schedules import HttpSchedules
from doq_lib.client.subscriptions import PREFETCH, HttpConsumer
from doq_lib.client.transport import Transport, dropped
from doq_lib.errors import (
    DoqError,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    error_for_wire_code,
)
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


class HttpClient(ClientBase, HttpSchedules):
    """The REST API (SPEC §3) over keep-alive connections."""

    transport = "http"

    def __init__(self, urls: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = DEFAULT_RETRY, discover: bool = True,
                 security: Security = NO_SECURITY, consumer: str | None = None) -> None:
        """``consumer``: the name its dequeues give (default host:pid:program; "": none)."""
        nodes, secure = nodes_of(urls, "https")
        self.consumer = default_consumer() if consumer is None else consumer
        self.timeout = timeout
        self.security = security
        self.scheme = "https" if secure else "http"
        self.http = Transport(security.ssl_context() if secure else None,
                              headers=security.headers())
        self._failover = Failover(nodes, retry)
        self._conns: dict[str, http.client.HTTPConnection] = {}
        if discover:
            self.find_leader()

    def connection(self, node: str, timeout: float) -> http.client.HTTPConnection:
        """A new connection to ``node`` (host:port), over TLS for https://."""
        return self.http.connect(node, timeout)

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        for conn in list(self._conns.values()):      # (another thread may be using one)
            conn.close()
        self._conns.clear()

    def _send(self, node: str, method: str, path: str, body: Any,
              safe: bool = True, extra_time: float = 0.0) -> tuple[int, bytes]:
        """One request to ``node``. ``safe``: repeating it cannot change anything (a read).
        ``extra_time``: seconds the server may take beyond the usual (a long-poll)."""
        conn = self._conns.pop(node, None)
        if conn is not None and dropped(conn):
            conn.close()               # the server closed the idle connection: never reuse it
            conn = None
        if conn is None:
            conn = self.connection(node, self.timeout)
        timeout = self.timeout + extra_time
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            result = self.http.exchange(conn, method, path, body)
        except (ConnectionRefusedError, socket.gaierror, ssl.SSLError) as exc:
            conn.close()
            raise Unavailable(f"{node}: {exc}") from None           # surely not applied
        except OSError as exc:        # reset, closed, timed out: it may have been processed
            conn.close()
            raise Unavailable(f"{node}: {exc!r}", maybe_applied=not safe) from None
        except http.client.HTTPException as exc:
            conn.close()
            raise Unavailable(f"{node}: {exc!r}", maybe_applied=not safe) from None
        self._conns[node] = conn
        return result

    def _request(self, method: str, path: str, body: Any = None, safe: bool = False,
                 extra_time: float = 0.0) -> Any:
        def attempt(node: str) -> Any:
            status, raw = self._send(node, method, path, body, safe, extra_time)
            return _http_result(node, status, raw)
        return self._failover.call(attempt)

    def find_leader(self) -> str | None:
        """Ask the cluster which node leads and send requests there first."""
        try:
            servers = self.servers()
        except (Unauthenticated, PermissionDenied):
            raise                                 # no other node will answer differently
        except DoqError:
            return None
        for server in servers:
            if server.is_leader and server.http_addr:
                self._failover.prefer(server.http_addr)
                return server.http_addr
        return None

    # -- cluster -------------------------------------------------------------------------------
    def servers(self) -> list[ServerInfo]:
        body = self._request("GET", "/API/v1/cluster/servers", safe=True)
        return [ServerInfo(s["id"], s["addr"], s.get("leader_addr", ""), s["is_leader"],
                           s.get("suffrage", "Voter"), s.get("http_addr", ""),
                           s.get("grpc_addr", ""), s.get("lag"), s.get("connected"))
                for s in body.get("servers", [])]

    def ready(self, node: str | None = None) -> bool:
        """Whether ``node`` (default: the current one) answers /readyz with 200."""
        try:
            status, _ = self._send(node or self.node, "GET", "/readyz", None, True)
        except Unavailable:
            return False
        return status == 200

    def generate_ids(self, number: int) -> list[int]:
        body = self._request("POST", "/API/v1/ids", {"number": number}, safe=True)
        return [int(i) for i in body["ids"]]

    # -- backups (leader only; long transfers on a connection of their own) -------------------
    def _leader_connection(self, timeout: float) -> tuple[str, http.client.HTTPConnection]:
        leader = self.find_leader()
        if leader is None:
            raise Unavailable("no node reports a leader: backups and restores need one")
        return leader, self.connection(leader, timeout)

    def backup(self, out: IO[bytes], since: int = 0, timeout: float = 600.0) -> int:
        """Write a backup (full for ``since`` 0, else the changes from version ``since`` on)
        to ``out``; returns its last version (the next incremental starts one above)."""
        node, conn = self._leader_connection(timeout)
        try:
            response = self.http.send(conn, "POST", "/db/backup",
                                           json.dumps({"since": since}).encode())
            if response.status != 200:
                _http_result(node, response.status, response.read())
            last = int(response.getheader("X-Last-Version", "-1"))
            while block := response.read(1 << 20):
                out.write(block)
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{node}: backup interrupted: {exc!r}") from None
        finally:
            conn.close()
        return last

    def restore(self, paths: Sequence[str], timeout: float = 3600.0) -> dict[str, Any]:
        """Restore backup files, in order (a full one, then its incrementals), through the
        leader in one request: all or nothing."""
        sizes = [os.path.getsize(p) for p in paths]

        def body() -> Iterator[bytes]:
            for path in paths:
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        yield block
        node, conn = self._leader_connection(timeout)
        try:
            response = self.http.send(conn, "POST", "/db/restore", body(),
                                           "application/octet-stream",
                                           {"Content-Length": str(sum(sizes))})
            result: dict[str, Any] = _http_result(node, response.status, response.read())
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{node}: restore interrupted: {exc!r}",
                              maybe_applied=True) from None
        finally:
            conn.close()
        return result

    # -- queues --------------------------------------------------------------------------------
    def create_queue(self, name: str, qtype: str = "delayed",
                     strategy: Strategy | str | None = None, max_unacked: int = 0,
                     ack_timeout: int = 0, **lifecycle: Any) -> None:
        """``lifecycle``: max_deliveries, dead_letter_queue, max_messages, overflow."""
        self._request("POST", "/API/v1/queues", {
            "name": name, "type": qtype,
            "settings": settings_json(strategy, max_unacked, ack_timeout, lifecycle)})

    def update_queue(self, name: str, strategy: Strategy | str | None = None,
                     max_unacked: int = 0, ack_timeout: int = 0, **lifecycle: Any) -> None:
        """The lifecycle settings not given (or None) keep the queue's values."""
        self._request("PUT", _queue_path(name), {"settings": settings_json(
            strategy, max_unacked, ack_timeout, lifecycle)})

    def delete_queue(self, name: str) -> None:
        self._request("DELETE", _queue_path(name))

    def queues(self) -> list[QueueInfo]:
        return [_queue_info(q) for q in self._request("GET", "/API/v1/queues", safe=True)["queues"]]

    def queue(self, name: str) -> QueueInfo:
        return _queue_info(self._request("GET", _queue_path(name), safe=True))

    # -- messages ------------------------------------------------------------------------------
    def enqueue(self, queue: str, content: str, priority: int = 0, group: str = "",
                metadata: dict[str, str] | None = None, id: int = 0,
                dedup_key: str = "", ttl: int = 0, delay: int = 0) -> Message:
        """The stored message (``duplicate``: seen within the queue's dedup window, with the
        first message's id; nothing stored). ``ttl``: seconds it may wait to be delivered
        (0: the queue's message_ttl); ``delay``: seconds before it may be delivered (any
        queue type; at most 30 days)."""
        body = _batch_item({"content": content, "priority": priority, "group": group,
                            "metadata": metadata, "id": id, "dedup_key": dedup_key,
                            "ttl": ttl, "delay": delay})
        out = self._request("POST", _queue_path(name=queue, tail="/messages"), body)
        return Message(int(out["id"]), out.get("group", group), out.get("priority", priority),
                       out.get("content", content), out.get("metadata") or {},
                       duplicate=bool(out.get("duplicate")))

    def enqueue_batch(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Enqueue items (keyword arguments of :meth:`enqueue`); returns the ids in order.

        Consecutive items of one queue travel together, up to 1000 per request, through
        ``POST .../messages/batch``: each such request is stored all or nothing (so a batch
        for one queue of at most 1000 items is atomic, as the gRPC client's always is).
        """
        ids: list[int] = []
        start = 0
        while start < len(items):
            queue = items[start]["queue"]
            end = start
            while end < len(items) and end - start < HTTP_MAX_BATCH \
                    and items[end]["queue"] == queue:
                end += 1
            body = {"messages": [_batch_item(item) for item in items[start:end]]}
            answer = self._request("POST", _queue_path(queue, "/messages/batch"), body)
            ids.extend(int(i) for i in answer["ids"])
            start = end
        return ids

    def dequeue(self, queue: str, ack: bool = False) -> Message:
        path = _queue_path(queue, "/messages") + ("?ack=true" if ack else "?ack=false")
        return _message(self._request("GET", path + self._named()))

    def _named(self) -> str:
        """The query part that names this client's consumer."""
        return "&consumer=" + urllib.parse.quote(self.consumer, safe="") if self.consumer \
            else ""

    def consumers(self, queue: str) -> list[ConsumerInfo]:
        """The consumers the queue knows: what each holds and did."""
        out = self._request("GET", _queue_path(queue, "/consumers"), safe=True)
        return [ConsumerInfo(c["name"], c["held"], [int(i) for i in c["messages"]],
                             c["oldest_lease_ms"], c["last_seen"], c["deliveries"], c["acks"],
                             c["nacks"]) for c in out["consumers"]]

    def get(self, queue: str, id: int) -> Message:
        return _message(self._request("GET", _queue_path(queue, f"/messages/{id}"), safe=True))

    def delete(self, queue: str, id: int) -> None:
        self._request("DELETE", _queue_path(queue, f"/messages/{id}"))

    def ack(self, queue: str, id: int, delivery: str = "",
            enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """Acknowledge a delivered message; ``delivery``: the token it was delivered with
        (then StaleDelivery when that delivery is no longer current, and nothing changes);
        ``enqueue``: up to 100 messages (``queue`` and the keyword arguments of
        :meth:`enqueue` each) stored with the ack, all or nothing. Returns their ids."""
        path = _queue_path(queue, f"/messages/{id}/ack")
        if not enqueue:
            self._request("POST", path + _token_query(delivery))
            return []
        body: dict[str, Any] = {"enqueue": [{"queue": item["queue"], **_batch_item(item)}
                                            for item in enqueue]}
        if delivery:
            body["delivery"] = delivery
        return [int(i) for i in self._request("POST", path, body)["ids"]]

    def ack_batch(self, queue: str, ids: Sequence[int]) -> list[int]:
        """Acknowledge ``ids``; returns those that were not delivered and unacked."""
        return [f.id for f in self.ack_many(queue, ids).failed]

    def dequeue_many(self, queue: str, count: int, ack: bool = False,
                     wait: float = 0.0) -> list[Message]:
        """Up to ``count`` (1-1000) messages in delivery order, taken in one operation.

        ``wait`` (0-20 s): when nothing is deliverable, wait up to that long for a message
        (long-poll); [] when none came.
        """
        query = f"?count={count}&ack={'true' if ack else 'false'}" + self._named()
        if wait > 0:
            query += f"&wait={wait:.3f}"
        body = self._request("GET", _queue_path(queue, "/messages") + query, extra_time=wait)
        return [_message(m) for m in body["messages"]]

    def ack_many(self, queue: str, ids: Sequence[int],
                 deliveries: Sequence[str] | None = None,
                 enqueue: Sequence[Sequence[dict[str, Any]]] | None = None) -> Settled:
        """Acknowledge ``ids`` (1000 per request, each request one operation);
        ``deliveries``: each one's delivery token, in the same order ("": none);
        ``enqueue``: per id, the messages (as for :meth:`ack`) stored with its ack, all or
        nothing per id (``Settled.enqueued``: their ids by acked id)."""
        if enqueue and any(enqueue):
            return self._ack_and_enqueue(queue, ids, deliveries, enqueue)
        return self._settle(queue, "ack", "acked", ids, {}, deliveries)

    def _ack_and_enqueue(self, queue: str, ids: Sequence[int],
                         deliveries: Sequence[str] | None,
                         enqueue: Sequence[Sequence[dict[str, Any]]]) -> Settled:
        done: list[int] = []
        failed: list[Failure] = []
        stored: dict[int, list[int]] = {}
        chunk: list[Any] = []
        size = 0

        def send() -> None:
            answer = self._request("POST", _queue_path(queue, "/messages/ack"), {"ids": chunk})
            done.extend(int(i) for i in answer["acked"])
            failed.extend(Failure(int(f["id"]), f["code"], f["detail"])
                          for f in answer["failed"])
            stored.update({int(k): [int(i) for i in v]
                           for k, v in answer.get("enqueued", {}).items()})
        for n, mid in enumerate(ids):
            items = list(enqueue[n]) if n < len(enqueue) else []
            if chunk and (len(chunk) >= HTTP_MAX_BATCH or size + len(items) > HTTP_MAX_BATCH):
                send()
                chunk, size = [], 0
            entry: dict[str, Any] = {"id": str(mid)}
            if deliveries and n < len(deliveries) and deliveries[n]:
                entry["delivery"] = deliveries[n]
            if items:
                entry["enqueue"] = [{"queue": i["queue"], **_batch_item(i)} for i in items]
            chunk.append(entry)
            size += len(items)
        if chunk:
            send()
        return Settled(done, failed, enqueued=stored)

    def nack_many(self, queue: str, ids: Sequence[int], priority: int = 0,
                  metadata: dict[str, str] | None = None, error: str = "",
                  delay: int = 0, deliveries: Sequence[str] | None = None) -> Settled:
        """Give ``ids`` back (priority 0 / metadata None: keep each message's own;
        ``deliveries`` as for ack_many)."""
        extra: dict[str, Any] = {"delay": delay} if delay else {}
        if priority:
            extra["priority"] = priority
        if metadata is not None:
            extra["metadata"] = metadata
        if error:
            extra["error"] = error
        return self._settle(queue, "nack", "nacked", ids, extra, deliveries)

    def _settle(self, queue: str, route: str, done_key: str, ids: Sequence[int],
                extra: dict[str, Any], deliveries: Sequence[str] | None = None) -> Settled:
        done: list[int] = []
        failed: list[Failure] = []
        tokens = dict(zip(ids, deliveries)) if deliveries else {}
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), HTTP_MAX_BATCH):
            chunk = [{"id": str(i), "delivery": tokens[i]} if tokens.get(i) else str(i)
                     for i in unique[start:start + HTTP_MAX_BATCH]]
            answer = self._request("POST", _queue_path(queue, f"/messages/{route}"),
                                   {"ids": chunk, **extra})
            done.extend(int(i) for i in answer[done_key])
            failed.extend(Failure(int(f["id"]), f["code"], f["detail"])
                          for f in answer["failed"])
        return Settled(done, failed)

    def consume(self, queue: str, ack: bool = False, prefetch: int = PREFETCH,
                wait: float = 5.0) -> "HttpConsumer":
        """Consume ``queue`` in batches of up to ``prefetch``; see :class:`HttpConsumer`."""
        return HttpConsumer(self, queue, ack, prefetch, wait)

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None, error: str = "", delay: int = 0,
             delivery: str = "", enqueue: Sequence[dict[str, Any]] = ()) -> Nacked:
        """Give a delivered message back (``priority`` 0: it keeps its own, and the queue's
        back-off applies without a ``delay``; ``error``: kept as its last_error; ``delay``:
        seconds before it may be delivered again; ``delivery``, ``enqueue``: as for ack);
        true when it was dead-lettered instead, its deliveries used up."""
        body: dict[str, Any] = {"priority": priority}
        if enqueue:
            body["enqueue"] = [{"queue": i["queue"], **_batch_item(i)} for i in enqueue]
        if delivery:
            body["delivery"] = delivery
        if delay:
            body["delay"] = delay
        if metadata is not None:
            body["metadata"] = metadata
        if error:
            body["error"] = error
        out = self._request("POST", _queue_path(queue, f"/messages/{id}/nack"), body)
        return Nacked(bool(out.get("dead_lettered")), [int(i) for i in out.get("ids", ())])

    # -- operator controls (issue 18) -------------------------------------------------------
    def purge(self, queue: str, include_unacked: bool = False) -> int:
        """Drop every waiting message (and, asked, every delivered one): how many."""
        body = {"include_unacked": True} if include_unacked else {}
        return int(self._request("POST", _queue_path(queue, "/purge"), body)["purged"])

    def pause(self, queue: str) -> None:
        """Stop delivery (enqueues, acks and nacks go on)."""
        self._request("POST", _queue_path(queue, "/pause"), {})

    def resume(self, queue: str) -> None:
        self._request("POST", _queue_path(queue, "/resume"), {})

    def pause_group(self, queue: str, group: str) -> None:
        """Skip ``group`` and its sub-groups (a fair queue)."""
        self._request("POST", _group_path(queue, group, "/pause"), {})

    def resume_group(self, queue: str, group: str) -> None:
        self._request("POST", _group_path(queue, group, "/resume"), {})

    def groups(self, queue: str) -> list[GroupInfo]:
        out = self._request("GET", _queue_path(queue, "/groups"), safe=True)
        return [GroupInfo(g["group"], g["ready"], g["unacked"],
                          g.get("paused_by", g["group"]) if g["paused"] else None)
                for g in out["groups"]]

    def browse(self, queue: str, state: str = "all", group: str | None = None,
               after: int | None = None, limit: int = 100) -> tuple[list[Browsed], int | None]:
        """A page of messages, nothing taken: (the page, the id to pass as ``after`` for the
        next one, or None at the end)."""
        query = {"browse": "true", "state": state, "limit": str(limit)}
        if group is not None:
            query["group"] = group
        if after is not None:
            query["after"] = str(after)
        out = self._request("GET", _queue_path(queue, "/messages?" + urllib.parse.urlencode(
            query)), safe=True)
        return ([Browsed(_message(m), m["state"], m.get("deadline", 0), m.get("consumer", ""),
                         m.get("delivered_at", 0))
                 for m in out["messages"]],
                None if out["next"] is None else int(out["next"]))

    def explain(self, queue: str, id: int) -> Explanation:
        out = self._request("GET", _queue_path(queue, f"/messages/{id}/explain"), safe=True)
        held = out.get("held_by") or {}
        return Explanation(out["state"], out["reasons"], out["ahead"], held.get("consumer", ""),
                           held.get("since", 0))

    def redrive(self, queue: str, to: str = "", ids: Sequence[int] | None = None,
                count: int | None = None) -> Settled:
        """Move dead-lettered messages of ``queue`` back: to ``to`` (default: each to its
        x-dead-from), the ``ids`` given or the first ``count`` (default: up to 10000)."""
        body: dict[str, Any] = {}
        if to:
            body["to"] = to
        if ids is not None:
            body["ids"] = [str(i) for i in ids]
        if count is not None:
            body["count"] = count
        out = self._request("POST", _queue_path(queue, "/redrive"), body)
        failed = [Failure(int(f["id"]), f["code"], f["detail"]) for f in out["failed"]]
        bad = {f.id for f in failed}
        moved = [i for i in ids if i not in bad] if ids is not None else []
        return Settled(moved, failed, out["moved"])

    def reject(self, queue: str, id: int, error: str = "", delivery: str = "",
               enqueue: Sequence[dict[str, Any]] = ()) -> list[int]:
        """Dead-letter a delivered message now (reason ``rejected``; ``delivery``,
        ``enqueue``: as for ack; returns the ids stored with it)."""
        body: dict[str, Any] = {"error": error} if error else {}
        if delivery:
            body["delivery"] = delivery
        if enqueue:
            body["enqueue"] = [{"queue": i["queue"], **_batch_item(i)} for i in enqueue]
        out = self._request("POST", _queue_path(queue, f"/messages/{id}/reject"), body)
        return [int(i) for i in out.get("ids", ())]

    def touch(self, queue: str, id: int, delivery: str = "") -> None:
        """Extend a delivered message's lease (``delivery``: as for ack: StaleDelivery tells
        a worker at once that it lost the message)."""
        self._request("POST", _queue_path(queue, f"/messages/{id}/touch") +
                      _token_query(delivery))

    def update_priority(self, queue: str, id: int, priority: int) -> None:
        self._request("PUT", _queue_path(queue, f"/messages/{id}/priority"),
                      {"priority": priority})



def _batch_item(item: dict[str, Any]) -> dict[str, Any]:
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


def _queue_path(name: str, tail: str = "") -> str:
    return "/API/v1/queues/" + urllib.parse.quote(name, safe="") + tail


def _group_path(name: str, group: str, tail: str) -> str:
    return _queue_path(name, "/groups/" + urllib.parse.quote(group, safe="") + tail)


def _http_result(node: str, status: int, raw: bytes) -> Any:
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
    message = "; ".join(str(e.get("message", "")) for e in errors if isinstance(e, dict)) \
        or body.get("detail") or f"HTTP {status}"
    code = body.get("code") or ("unavailable" if status == 503 else
                                "internal" if status >= 500 else "invalid_argument")
    raise error_for_wire_code(code, str(message), bool(body.get("maybe_applied")))


def _message(body: dict[str, Any]) -> Message:
    return Message(int(body["id"]), body.get("group", ""), body.get("priority", 0),
                   body.get("content", ""), body.get("metadata") or {},
                   body.get("deliveries", 0), body.get("last_error", ""),
                   expires_at=body.get("expires_at", 0), delivery=body.get("delivery", ""))


def _token_query(delivery: str) -> str:
    return "?delivery=" + urllib.parse.quote(delivery, safe="") if delivery else ""


def _queue_info(body: dict[str, Any]) -> QueueInfo:
    settings = body.get("settings") or {}
    return QueueInfo(body["name"], QueueType(body["type"]),
                     QueueSettings(to_strategy(settings.get("strategy")),
                                   settings.get("max_unacked", 0),
                                   settings.get("ack_timeout", 0),
                                   **{key: settings[key] for key in LIFECYCLE_SETTINGS
                                      if key in settings}),
                     body.get("ready", 0), body.get("unacked", 0), body.get("enqueue_rps", 0.0),
                     body.get("dequeue_rps", 0.0), body.get("ack_rps", 0.0),
                     body.get("nack_rps", 0.0), body.get("paused", False),
                     body.get("paused_groups", 0), body.get("dead_letter_queue_hidden", False))



ONE_QUICK_ROUND = RetryPolicy(attempts=1, deadline=5)


def servers_via(urls: Sequence[str], timeout: float,
                 retry: RetryPolicy = ONE_QUICK_ROUND,
                 security: Security = NO_SECURITY) -> list[ServerInfo]:
    """The members, asked over HTTP; waits briefly for members that have not published their
    addresses yet (a node announces itself shortly after it starts)."""
    with HttpClient(urls, timeout, retry, discover=False, security=security) as http_client:
        servers = http_client.servers()
        for _ in range(20):
            if all(s.grpc_addr for s in servers):
                break
            time.sleep(0.1)
            servers = http_client.servers()
    return servers


# -- entry point -----------------------------------------------------------------------------------

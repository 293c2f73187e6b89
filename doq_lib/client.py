"""A synchronous Python client for DOQ over HTTP or gRPC (imports only layer 0).

    from doq_lib.client import connect
    client = connect(["http://127.0.0.1:8000", "http://127.0.0.1:8001"])      # REST
    client = connect("grpc://127.0.0.1:10000")                                 # gRPC
    client = connect("http://127.0.0.1:8000", transport="grpc")   # gRPC, found via HTTP

Consumers: ``client.consume(queue, prefetch=N)`` keeps up to N messages coming (over gRPC a
DequeueStream with credit; over HTTP batch takes with long-poll, ``GET ...?count=N&wait=S``).
``dequeue_many`` / ``ack_many`` / ``nack_many`` take and settle many messages in one request.
Producers: over gRPC, ``client.producer(window=N)`` pipelines enqueues on one EnqueueStream
(``send`` returns a future; at most N unanswered).

Both clients have the same methods and raise the server's own error classes
(:mod:`doq_lib.errors`: ``QueueNotFound``, ``QueueEmpty``, ``NotUnacked``, ``Unavailable`` ...).

Failover: a client knows several nodes. It talks to the leader when it can find it (fewer
hops) and moves to another node when one cannot be reached or answers ``Unavailable``. A
request is sent again only when it surely did not take effect: the connection was refused, or
the server said so (``Unavailable`` without ``maybe_applied``). A write whose outcome is
unknown raises ``Unavailable(maybe_applied=True)``; enqueue with your own ``id`` to make
retrying it safe (the same id never creates a second copy).

A client object is not meant to be shared by threads that call it at once (it serializes
them with a lock); use one per thread for parallel work.
"""
from __future__ import annotations

import collections
import concurrent.futures
import http.client
import json
import os
import queue as queue_module
import select
import socket
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import IO, Any, Callable, Iterator, Sequence, TypeVar

from doq_lib.errors import (
    DoqError,
    InternalError,
    InvalidArgument,
    MessageNotFound,
    NotApplied,
    NotUnacked,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
    error_for_wire_code,
)
from doq_lib.models import Message, QueueInfo, QueueSettings, QueueType, ServerInfo, Strategy

T = TypeVar("T")
RETRY_PAUSE = 0.2           # seconds between rounds over all nodes
# gRPC failures that mean the call never reached a server (so it cannot have been applied)
UNSENT_TEXTS = ("failed to connect", "Connection refused", "DNS resolution failed")


@dataclass(frozen=True)
class Failure:
    """One id of a batch ack / nack that was not settled (its state is unchanged)."""

    id: int
    code: str                   # message_not_unacked, message_not_found
    detail: str


@dataclass(frozen=True)
class Settled:
    """What a batch ack / nack did: the ids settled, and why each of the others was not."""

    done: list[int]
    failed: list[Failure]


@dataclass(frozen=True)
class RetryPolicy:
    """How long one call keeps moving over the nodes while they cannot take it."""

    attempts: int = 1000        # rounds over the known nodes, at most
    deadline: float = 15.0      # seconds, for one call including its retries


@dataclass(frozen=True)
class Security:
    """Credentials of a client: an API key (sent as ``Authorization: Bearer``), and for
    https:// and grpcs:// the CA that signs the servers' certificates (None: the system's)
    and, for mutual TLS, a client certificate and its key."""

    api_key: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.api_key}"),) if self.api_key else ()

    def ssl_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_credentials(self) -> Any:
        import grpc

        def read(path: str | None) -> bytes | None:
            if not path:
                return None
            with open(path, "rb") as f:
                return f.read()
        return grpc.ssl_channel_credentials(read(self.ca_file), read(self.key_file),
                                            read(self.cert_file))


NO_SECURITY = Security()


def _parse(url: str, default_scheme: str) -> tuple[str, str, int]:
    if "://" not in url:
        url = f"{default_scheme}://{url}"
    parts = urllib.parse.urlsplit(url)
    if not parts.hostname or not parts.port:
        raise InvalidArgument(f"bad node address {url!r}: expected scheme://host:port")
    return parts.scheme, parts.hostname, parts.port


def _settings_json(strategy: Strategy | str | None, max_unacked: int, ack_timeout: int,
                   ) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if strategy:
        name = strategy.name if isinstance(strategy, Strategy) else str(strategy).upper()
        if name != "STRATEGY_UNSPECIFIED":
            out["strategy"] = name.lower()
    if max_unacked:
        out["max_unacked"] = max_unacked
    if ack_timeout:
        out["ack_timeout"] = ack_timeout
    return out


def _strategy(value: Strategy | str | None) -> Strategy:
    if value is None or value == "":
        return Strategy.STRATEGY_UNSPECIFIED
    if isinstance(value, Strategy):
        return value
    try:
        return Strategy[str(value).upper()]
    except KeyError:
        raise InvalidArgument(f"unknown strategy {value!r}") from None


class _Failover:
    """The node list, the preferred one, and the retry loop shared by both transports."""

    def __init__(self, nodes: list[str], retry: RetryPolicy,
                 refresh: Callable[[], list[str]] | None = None) -> None:
        if not nodes:
            raise InvalidArgument("no node address given")
        self.nodes = list(dict.fromkeys(nodes))
        self.current = 0
        self.retry = retry
        self.refresh = refresh          # finds the cluster's nodes again after a failed round
        self.lock = threading.RLock()

    @property
    def node(self) -> str:
        return self.nodes[self.current]

    def prefer(self, node: str) -> None:
        if node not in self.nodes:
            self.nodes.append(node)
        self.current = self.nodes.index(node)

    def call(self, attempt: Callable[[str], T]) -> T:
        """Run ``attempt(node)``, moving over the nodes while it surely did not apply."""
        with self.lock:
            deadline = time.monotonic() + self.retry.deadline
            last: DoqError | None = None
            for _ in range(self.retry.attempts):
                for _ in range(len(self.nodes)):
                    try:
                        return attempt(self.node)
                    except Unavailable as exc:
                        if exc.maybe_applied:
                            raise
                        last = exc
                    if time.monotonic() >= deadline:
                        break
                    self.current = (self.current + 1) % len(self.nodes)
                if time.monotonic() >= deadline:
                    break
                time.sleep(RETRY_PAUSE)
                self._refresh()
            raise last or Unavailable("no node answered")

    def _refresh(self) -> None:
        if self.refresh is None:
            return
        try:
            found = self.refresh()
        except DoqError:
            return
        for node in found:
            if node not in self.nodes:
                self.nodes.append(node)


class _Closing:
    """``close()``, also when leaving a ``with`` block."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()


class _ClientBase(_Closing):
    """What both transports share: the node list and closing."""

    _failover: _Failover

    @property
    def node(self) -> str:
        """The node (host:port) calls go to first."""
        return self._failover.node

    @property
    def nodes(self) -> list[str]:
        return list(self._failover.nodes)


# -- HTTP ------------------------------------------------------------------------------------------
class HttpClient(_ClientBase):
    """The REST API (SPEC §3) over keep-alive connections."""

    transport = "http"

    def __init__(self, urls: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = RetryPolicy(), discover: bool = True,
                 security: Security = NO_SECURITY) -> None:
        nodes, schemes = [], set()
        for url in urls:
            scheme, host, port = _parse(url, "http")
            if scheme not in ("http", "https"):
                raise InvalidArgument(f"not an http:// or https:// address: {url!r}")
            schemes.add(scheme)
            nodes.append(f"{host}:{port}")
        if len(schemes) > 1:
            raise InvalidArgument("give addresses of one scheme: all http:// or all https://")
        self.timeout = timeout
        self.security = security
        self.scheme = schemes.pop() if schemes else "http"
        self._tls = security.ssl_context() if self.scheme == "https" else None
        self._headers = security.headers()
        self._failover = _Failover(nodes, retry)
        self._conns: dict[str, http.client.HTTPConnection] = {}
        if discover:
            self.find_leader()

    def connection(self, node: str, timeout: float) -> http.client.HTTPConnection:
        """A new connection to ``node`` (host:port), over TLS for https://."""
        host, port = node.rsplit(":", 1)
        if self._tls is not None:
            return http.client.HTTPSConnection(host, int(port), timeout=timeout,
                                               context=self._tls)
        return http.client.HTTPConnection(host, int(port), timeout=timeout)

    # -- plumbing ------------------------------------------------------------------------------
    def close(self) -> None:
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()

    def _send(self, node: str, method: str, path: str, body: Any,
              safe: bool = True, extra_time: float = 0.0) -> tuple[int, bytes]:
        """One request to ``node``. ``safe``: repeating it cannot change anything (a read).
        ``extra_time``: seconds the server may take beyond the usual (a long-poll)."""
        data = None if body is None else json.dumps(body).encode()
        headers = dict(self._headers)
        if data is not None:
            headers["Content-Type"] = "application/json"
        conn = self._conns.pop(node, None)
        if conn is not None and _dropped(conn):
            conn.close()               # the server closed the idle connection: never reuse it
            conn = None
        if conn is None:
            conn = self.connection(node, self.timeout)
        timeout = self.timeout + extra_time
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        try:
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            result = response.status, response.read()
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
            conn.request("POST", "/db/backup", body=json.dumps({"since": since}).encode(),
                         headers={**self._headers, "Content-Type": "application/json"})
            response = conn.getresponse()
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
            conn.request("POST", "/db/restore", body=body(), headers={
                **self._headers, "Content-Type": "application/octet-stream",
                "Content-Length": str(sum(sizes))})
            response = conn.getresponse()
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
                     ack_timeout: int = 0) -> None:
        self._request("POST", "/API/v1/queues", {
            "name": name, "type": qtype,
            "settings": _settings_json(strategy, max_unacked, ack_timeout)})

    def update_queue(self, name: str, strategy: Strategy | str | None = None,
                     max_unacked: int = 0, ack_timeout: int = 0) -> None:
        self._request("PUT", _queue_path(name),
                      {"settings": _settings_json(strategy, max_unacked, ack_timeout)})

    def delete_queue(self, name: str) -> None:
        self._request("DELETE", _queue_path(name))

    def queues(self) -> list[QueueInfo]:
        return [_queue_info(q) for q in self._request("GET", "/API/v1/queues", safe=True)["queues"]]

    def queue(self, name: str) -> QueueInfo:
        return _queue_info(self._request("GET", _queue_path(name), safe=True))

    # -- messages ------------------------------------------------------------------------------
    def enqueue(self, queue: str, content: str, priority: int = 0, group: str = "",
                metadata: dict[str, str] | None = None, id: int = 0) -> Message:
        body: dict[str, Any] = {"content": content, "priority": priority}
        if group:
            body["group"] = group
        if metadata:
            body["metadata"] = metadata
        if id:
            body["id"] = str(id)
        out = self._request("POST", _queue_path(name=queue, tail="/messages"), body)
        return Message(int(out["id"]), out.get("group", group), out.get("priority", priority),
                       out.get("content", content), out.get("metadata") or {})

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
        return _message(self._request("GET", path))

    def get(self, queue: str, id: int) -> Message:
        return _message(self._request("GET", _queue_path(queue, f"/messages/{id}"), safe=True))

    def delete(self, queue: str, id: int) -> None:
        self._request("DELETE", _queue_path(queue, f"/messages/{id}"))

    def ack(self, queue: str, id: int) -> None:
        self._request("POST", _queue_path(queue, f"/messages/{id}/ack"))

    def ack_batch(self, queue: str, ids: Sequence[int]) -> list[int]:
        """Acknowledge ``ids``; returns those that were not delivered and unacked."""
        return [f.id for f in self.ack_many(queue, ids).failed]

    def dequeue_many(self, queue: str, count: int, ack: bool = False,
                     wait: float = 0.0) -> list[Message]:
        """Up to ``count`` (1-1000) messages in delivery order, taken in one operation.

        ``wait`` (0-20 s): when nothing is deliverable, wait up to that long for a message
        (long-poll); [] when none came.
        """
        query = f"?count={count}&ack={'true' if ack else 'false'}"
        if wait > 0:
            query += f"&wait={wait:.3f}"
        body = self._request("GET", _queue_path(queue, "/messages") + query, extra_time=wait)
        return [_message(m) for m in body["messages"]]

    def ack_many(self, queue: str, ids: Sequence[int]) -> Settled:
        """Acknowledge ``ids`` (1000 per request, each request one operation)."""
        return self._settle(queue, "ack", "acked", ids, {})

    def nack_many(self, queue: str, ids: Sequence[int], priority: int = 0,
                  metadata: dict[str, str] | None = None) -> Settled:
        """Give ``ids`` back (priority 0 / metadata None: keep each message's own)."""
        extra: dict[str, Any] = {}
        if priority:
            extra["priority"] = priority
        if metadata is not None:
            extra["metadata"] = metadata
        return self._settle(queue, "nack", "nacked", ids, extra)

    def _settle(self, queue: str, route: str, done_key: str, ids: Sequence[int],
                extra: dict[str, Any]) -> Settled:
        done: list[int] = []
        failed: list[Failure] = []
        unique = list(dict.fromkeys(ids))
        for start in range(0, len(unique), HTTP_MAX_BATCH):
            chunk = [str(i) for i in unique[start:start + HTTP_MAX_BATCH]]
            answer = self._request("POST", _queue_path(queue, f"/messages/{route}"),
                                   {"ids": chunk, **extra})
            done.extend(int(i) for i in answer[done_key])
            failed.extend(Failure(int(f["id"]), f["code"], f["detail"])
                          for f in answer["failed"])
        return Settled(done, failed)

    def consume(self, queue: str, ack: bool = False, prefetch: int = 64,
                wait: float = 5.0) -> "HttpConsumer":
        """Consume ``queue`` in batches of up to ``prefetch``; see :class:`HttpConsumer`."""
        return HttpConsumer(self, queue, ack, prefetch, wait)

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None) -> None:
        body: dict[str, Any] = {"priority": priority}
        if metadata is not None:
            body["metadata"] = metadata
        self._request("POST", _queue_path(queue, f"/messages/{id}/nack"), body)

    def touch(self, queue: str, id: int) -> None:
        self._request("POST", _queue_path(queue, f"/messages/{id}/touch"))

    def update_priority(self, queue: str, id: int, priority: int) -> None:
        self._request("PUT", _queue_path(queue, f"/messages/{id}/priority"),
                      {"priority": priority})


class _Subscription(_Closing):
    """What both consumers share: iteration over :meth:`receive` and ``with`` closing."""

    def receive(self, timeout: float | None = None) -> Message | None:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        message = self.receive()
        assert message is not None
        return message


class HttpConsumer(_Subscription):
    """Batch consumption over HTTP: each fetch takes up to ``prefetch`` messages in one
    operation, long-polling up to ``wait`` seconds when the queue is empty.

    :meth:`receive` hands them out one by one. With ``ack=False``, :meth:`ack` collects ids
    and sends them as one batch ack before the next fetch, at :meth:`flush` and at
    :meth:`close`; an ack is durable once the call that sent it returns. ``close()`` (or
    leaving a ``with`` block) also gives back (nacks) the messages fetched but not received,
    so they are delivered again at once instead of after their ack timeout.
    """

    def __init__(self, client: HttpClient, queue: str, ack: bool, prefetch: int,
                 wait: float) -> None:
        if not 1 <= prefetch <= HTTP_MAX_BATCH:
            raise InvalidArgument(f"prefetch must be from 1 to {HTTP_MAX_BATCH}")
        self._client, self._queue, self._ack = client, queue, ack
        self._prefetch = prefetch
        self._wait = max(0.0, min(wait, HTTP_MAX_WAIT))
        self._buffer: collections.deque[Message] = collections.deque()
        self._acks: list[int] = []
        self.failed: list[Failure] = []       # acks the server refused (e.g. redelivered)
        self._closed = False

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds without one (None: wait)."""
        if self._closed:
            raise StopIteration
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._buffer:
            self.flush()
            left = self._wait if deadline is None else deadline - time.monotonic()
            self._buffer.extend(self._client.dequeue_many(
                self._queue, self._prefetch, self._ack, max(0.0, min(left, self._wait))))
            if not self._buffer and deadline is not None and time.monotonic() >= deadline:
                return None
        return self._buffer.popleft()

    def ack(self, id: int) -> None:
        """Acknowledge ``id`` with the next batch (see the class notes)."""
        self._acks.append(id)
        if len(self._acks) >= self._prefetch:
            self.flush()

    def flush(self) -> None:
        """Send the collected acks now."""
        if self._acks:
            ids, self._acks = self._acks, []
            self.failed.extend(self._client.ack_many(self._queue, ids).failed)

    def close(self) -> None:
        """Send the collected acks; nack what was fetched but not received (ack=False)."""
        if self._closed:
            return
        self._closed = True
        self.flush()
        left, self._buffer = list(self._buffer), collections.deque()
        if left and not self._ack:
            try:
                self._client.nack_many(self._queue, [m.id for m in left])
            except DoqError:
                pass              # they come back after their ack timeout anyway



def _dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept-alive connection was closed by the server (readable while idle)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)


HTTP_MAX_BATCH = 1000
HTTP_MAX_WAIT = 20.0


def _batch_item(item: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"content": item["content"], "priority": item.get("priority", 0)}
    if item.get("group"):
        out["group"] = item["group"]
    if item.get("metadata"):
        out["metadata"] = item["metadata"]
    if item.get("id"):
        out["id"] = str(item["id"])
    return out


def _queue_path(name: str, tail: str = "") -> str:
    return "/API/v1/queues/" + urllib.parse.quote(name, safe="") + tail


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
                   body.get("content", ""), body.get("metadata") or {})


def _queue_info(body: dict[str, Any]) -> QueueInfo:
    settings = body.get("settings") or {}
    return QueueInfo(body["name"], QueueType(body["type"]),
                     QueueSettings(_strategy(settings.get("strategy")),
                                   settings.get("max_unacked", 0),
                                   settings.get("ack_timeout", 0)),
                     body.get("ready", 0), body.get("unacked", 0), body.get("enqueue_rps", 0.0),
                     body.get("dequeue_rps", 0.0), body.get("ack_rps", 0.0),
                     body.get("nack_rps", 0.0))


# -- gRPC ------------------------------------------------------------------------------------------
class GrpcClient(_ClientBase):
    """The ``queue.DOQ`` gRPC service (SPEC §4), with the batch and credit extensions."""

    transport = "grpc"

    def __init__(self, targets: Sequence[str], timeout: float = 10.0,
                 retry: RetryPolicy = RetryPolicy(), leader: str | None = None,
                 discovery: Sequence[str] = (), security: Security = NO_SECURITY) -> None:
        """``discovery``: http(s):// URLs of nodes, asked for the members' gRPC addresses
        when none of the known ones can take a call (members added or restarted elsewhere).
        grpcs:// targets are reached over TLS."""
        import grpc  # noqa: F401 - imported lazily: the HTTP client does not need it

        from doq_lib.pb import doq_pb2, doq_pb2_grpc
        self._grpc = grpc
        self._pb = doq_pb2
        self._stub_class = doq_pb2_grpc.DOQStub
        nodes, schemes = [], set()
        for target in targets:
            scheme, host, port = _parse(target, "grpc")
            if scheme not in ("grpc", "grpcs"):
                raise InvalidArgument(f"not a grpc:// or grpcs:// address: {target!r}")
            schemes.add(scheme)
            nodes.append(f"{host}:{port}")
        if len(schemes) > 1:
            raise InvalidArgument("give addresses of one scheme: all grpc:// or all grpcs://")
        self.timeout = timeout
        self.security = security
        self.metadata = security.metadata()
        self._credentials = security.grpc_credentials() if schemes == {"grpcs"} else None
        self._discovery = list(discovery)
        self._failover = _Failover(nodes, retry, self._discover if discovery else None)
        if leader:
            self._failover.prefer(leader)
        self._channels: dict[str, Any] = {}
        self._stubs: dict[str, Any] = {}

    def _discover(self) -> list[str]:
        return [s.grpc_addr for s in _servers_via(self._discovery, self.timeout,
                                                  security=self.security) if s.grpc_addr]

    def close(self) -> None:
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()
        self._stubs.clear()

    def stub(self, node: str | None = None) -> Any:
        node = node or self.node
        stub = self._stubs.get(node)
        if stub is None:
            channel = self._grpc.insecure_channel(node) if self._credentials is None else \
                self._grpc.secure_channel(node, self._credentials)
            self._channels[node] = channel
            stub = self._stubs[node] = self._stub_class(channel)
        return stub

    def error(self, exc: Any, safe: bool = False) -> DoqError:
        """The DoqError for a failed call (``grpc.RpcError``); ``safe``: it was a read."""
        trailer = dict(exc.trailing_metadata() or ())
        code = trailer.get("doq-error-code")
        message = exc.details() or str(exc.code())
        status = exc.code().name
        if code is None:
            # Not answered by DOQ's handler: transport trouble (refused, reset, deadline).
            unsent = status == "UNAVAILABLE" and any(
                text in message for text in UNSENT_TEXTS)
            code = "unavailable" if status in ("UNAVAILABLE", "DEADLINE_EXCEEDED",
                                               "CANCELLED") else "internal"
            return error_for_wire_code(code, message, maybe_applied=not (unsent or safe))
        return error_for_wire_code(code, message, trailer.get("doq-maybe-applied") == "1")

    def _call(self, rpc: str, request: Any, safe: bool = False) -> Any:
        def attempt(node: str) -> Any:
            try:
                return getattr(self.stub(node), rpc)(request, timeout=self.timeout,
                                                     metadata=self.metadata)
            except self._grpc.RpcError as exc:
                raise self.error(exc, safe) from None
        return self._failover.call(attempt)

    # -- queues --------------------------------------------------------------------------------
    def generate_ids(self, number: int) -> list[int]:
        return list(self._call("GenerateIDs", self._pb.GenerateIDsRequest(number=number),
                               safe=True).ids)

    def _settings(self, strategy: Strategy | str | None, max_unacked: int,
                  ack_timeout: int) -> Any:
        return self._pb.QueueSettings(strategy=_strategy(strategy).name,
                                      max_unacked=max_unacked, ack_timeout=ack_timeout)

    def create_queue(self, name: str, qtype: str = "delayed",
                     strategy: Strategy | str | None = None, max_unacked: int = 0,
                     ack_timeout: int = 0) -> None:
        self._call("CreateQueue", self._pb.CreateQueueRequest(
            name=name, type=qtype, settings=self._settings(strategy, max_unacked, ack_timeout)))

    def update_queue(self, name: str, strategy: Strategy | str | None = None,
                     max_unacked: int = 0, ack_timeout: int = 0) -> None:
        self._call("UpdateQueue", self._pb.UpdateQueueRequest(
            name=name, settings=self._settings(strategy, max_unacked, ack_timeout)))

    def delete_queue(self, name: str) -> None:
        self._call("DeleteQueue", self._pb.DeleteQueueRequest(name=name))

    def queues(self) -> list[QueueInfo]:
        response = self._call("GetQueues", self._pb.GetQueuesRequest(), safe=True)
        return [_grpc_queue_info(q) for q in response.queues]

    def queue(self, name: str) -> QueueInfo:
        return _grpc_queue_info(self._call("GetQueue", self._pb.GetQueueRequest(name=name),
                                           safe=True))

    # -- messages ------------------------------------------------------------------------------
    def _enqueue_request(self, queue: str, content: str, priority: int = 0, group: str = "",
                         metadata: dict[str, str] | None = None, id: int = 0) -> Any:
        return self._pb.EnqueueRequest(queueName=queue, id=id, group=group, priority=priority,
                                       content=content, metadata=metadata or {})

    def enqueue(self, queue: str, content: str, priority: int = 0, group: str = "",
                metadata: dict[str, str] | None = None, id: int = 0) -> Message:
        request = self._enqueue_request(queue, content, priority, group, metadata, id)
        return _grpc_message(self._call("Enqueue", request))

    def enqueue_batch(self, items: Sequence[dict[str, Any]]) -> list[int]:
        """Enqueue items (keyword arguments of :meth:`enqueue`) all or nothing, in one call;
        returns the ids in order."""
        request = self._pb.EnqueueBatchRequest(
            messages=[self._enqueue_request(**item) for item in items])
        return list(self._call("EnqueueBatch", request).ids)

    def enqueue_stream(self, requests: Iterator[dict[str, Any]]) -> Iterator[Message]:
        """Stream enqueues (keyword arguments of :meth:`enqueue`); yields the stored messages
        in order. Not retried: on failure the stream raises the error."""
        stream = self.stub().EnqueueStream((self._enqueue_request(**r) for r in requests),
                                           metadata=self.metadata)
        try:
            for response in stream:
                yield _grpc_message(response)
        except self._grpc.RpcError as exc:
            raise self.error(exc) from None

    def producer(self, window: int = 64) -> "Producer":
        """A pipelined producer on one EnqueueStream: :meth:`Producer.send` returns a future
        at once and blocks only while ``window`` (1-10000) sends are unanswered; see
        :class:`Producer`."""
        if not 1 <= window <= 10_000:
            raise InvalidArgument("window must be from 1 to 10000")
        return Producer(self, window)

    def dequeue(self, queue: str, ack: bool = False) -> Message:
        request = self._pb.DequeueRequest(queueName=queue, ack=ack)
        return _grpc_message(self._call("Dequeue", request))

    def dequeue_many(self, queue: str, count: int, ack: bool = False,
                     wait: float = 0.0) -> list[Message]:
        """Up to ``count`` (1-1000) messages in delivery order, waiting up to ``wait``
        seconds (0-20) for the first; [] when none came.

        A short DequeueStream with ``count`` credit, half-closed once the first messages
        arrive (or the wait is over): the server then sends what it has taken and ends, so
        nothing taken is left behind. (A missing queue answers [] here: streams wait for
        queues to appear; the HTTP client raises QueueNotFound.)
        """
        if not 1 <= count <= HTTP_MAX_BATCH or not 0 <= wait <= HTTP_MAX_WAIT:
            raise InvalidArgument(f"count must be from 1 to {HTTP_MAX_BATCH}, wait from 0 "
                                  f"to {HTTP_MAX_WAIT:g} s")
        requests: queue_module.Queue[Any] = queue_module.Queue()
        requests.put(self._pb.DequeueRequest(queueName=queue, ack=ack, credit=count,
                                             max_batch=min(count, 256)))

        def outgoing() -> Iterator[Any]:
            while (item := requests.get()) is not None:
                yield item

        if wait <= 0:
            requests.put(None)
        timer = threading.Timer(wait, requests.put, (None,)) if wait > 0 else None
        out: list[Message] = []
        try:
            stream = self.stub().DequeueStream(outgoing(), metadata=self.metadata,
                                               timeout=self.timeout + wait)
            if timer is not None:
                timer.start()
            for response in stream:
                out.extend(_grpc_message(m) for m in response.messages or [response])
                requests.put(None)
        except self._grpc.RpcError as exc:
            if not out:
                raise self.error(exc) from None
        finally:
            if timer is not None:
                timer.cancel()
            requests.put(None)
        return out

    def nack_many(self, queue: str, ids: Sequence[int], priority: int = 0,
                  metadata: dict[str, str] | None = None) -> Settled:
        """Give ``ids`` back: one Nack call each (the gRPC API has no batch nack)."""
        done, failed = [], []
        for mid in dict.fromkeys(ids):
            try:
                self.nack(queue, mid, priority, metadata)
                done.append(mid)
            except (NotUnacked, MessageNotFound) as exc:
                failed.append(Failure(mid, exc.code, exc.message))
        return Settled(done, failed)

    def consume(self, queue: str, ack: bool = False, prefetch: int = 1) -> "Consumer":
        """Subscribe to ``queue`` with a DequeueStream; see :class:`Consumer`."""
        return Consumer(self, queue, ack, prefetch)

    def get(self, queue: str, id: int) -> Message:
        return _grpc_message(self._call("Get", self._pb.GetRequest(queueName=queue, id=id),
                                        safe=True))

    def delete(self, queue: str, id: int) -> None:
        self._call("Delete", self._pb.DeleteRequest(queueName=queue, id=id))

    def ack(self, queue: str, id: int) -> None:
        self._call("Ack", self._pb.AckRequest(queueName=queue, id=id))

    def ack_batch(self, queue: str, ids: Sequence[int]) -> list[int]:
        """Acknowledge ``ids`` in one call; returns those that were not unacked."""
        response = self._call("AckBatch", self._pb.AckBatchRequest(queueName=queue, ids=ids))
        return list(response.failed_ids)

    def ack_many(self, queue: str, ids: Sequence[int]) -> Settled:
        """Acknowledge ``ids`` in one AckBatch call (which does not say why an id failed)."""
        failed = set(self.ack_batch(queue, ids))
        return Settled([i for i in ids if i not in failed], [
            Failure(i, "message_not_unacked", f"message {i} was not acknowledged")
            for i in ids if i in failed])

    def nack(self, queue: str, id: int, priority: int = 0,
             metadata: dict[str, str] | None = None) -> None:
        self._call("Nack", self._pb.NackRequest(queueName=queue, id=id, priority=priority,
                                                metadata=metadata or {}))

    def touch(self, queue: str, id: int) -> None:
        self._call("Touch", self._pb.TouchRequest(queueName=queue, id=id))

    def update_priority(self, queue: str, id: int, priority: int) -> None:
        self._call("UpdatePriority", self._pb.UpdatePriorityRequest(queueName=queue, id=id,
                                                                    priority=priority))


class Producer(_Closing):
    """Enqueues pipelined on one EnqueueStream, answered by futures, in order.

    ``send`` puts the message on the stream and returns a ``concurrent.futures.Future``
    that resolves to the stored :class:`Message` once the cluster has committed it. Up to
    ``window`` sends may be unanswered; the next ``send`` waits for an answer (flow
    control: a producer never holds more than ``window`` messages, and the server commits
    what arrived together as one replicated operation).

    Failures: the server stops the stream at its first failed message. That message's
    future raises the server's error (``QueueNotFound``, ``InvalidArgument`` ...); every
    later one raises :class:`~doq_lib.errors.NotApplied` (not stored: safe to send again),
    unless the failure left the outcome unknown (``Unavailable(maybe_applied=True)``, or
    the connection broke), which the later futures then raise too. After a failure the
    producer is broken: ``send`` raises the error that ended the stream. A producer talks to
    one node and does not fail over; make a new one (enqueue with your own ids to make
    resending safe).

    ``flush()`` waits for every answer; ``close()`` (or leaving a ``with`` block) half-closes
    the stream once every send is answered.
    """

    def __init__(self, client: GrpcClient, window: int) -> None:
        self._client = client
        self._window = threading.BoundedSemaphore(window)
        self._lock = threading.Lock()
        self._pending: collections.deque[concurrent.futures.Future[Message]] = \
            collections.deque()
        self._requests: queue_module.Queue[Any] = queue_module.Queue()
        self._closed = False
        self._error: DoqError | None = None
        self.max_in_flight = 0          # the most sends unanswered at once (observed)
        self._stream = client.stub().EnqueueStream(self._outgoing(), metadata=client.metadata)
        self._reader = threading.Thread(target=self._read, daemon=True, name="doq-producer")
        self._reader.start()

    def _outgoing(self) -> Iterator[Any]:
        while (item := self._requests.get()) is not None:
            yield item

    def send(self, queue: str, content: str, priority: int = 0, group: str = "",
             metadata: dict[str, str] | None = None, id: int = 0,
             timeout: float | None = None) -> "concurrent.futures.Future[Message]":
        """Send one enqueue; waits at most ``timeout`` seconds (default: the client's) for
        room in the window, then raises ``Unavailable`` (that message was not sent)."""
        if self._closed:
            raise InvalidArgument("the producer is closed")
        request = self._client._enqueue_request(queue, content, priority, group, metadata, id)
        wait = self._client.timeout if timeout is None else timeout
        if not self._window.acquire(timeout=wait):
            raise Unavailable(f"no answer within {wait:g} s: {self.in_flight} sends are "
                              f"unanswered (the window is full); this one was not sent")
        future: concurrent.futures.Future[Message] = concurrent.futures.Future()
        with self._lock:
            if self._error is not None:
                self._window.release()
                raise self._error
            self._pending.append(future)
            self.max_in_flight = max(self.max_in_flight, len(self._pending))
            self._requests.put(request)
        return future

    @property
    def in_flight(self) -> int:
        """Sends not answered yet."""
        return len(self._pending)

    def _read(self) -> None:
        try:
            for response in self._stream:
                with self._lock:
                    future = self._pending.popleft()
                self._window.release()
                future.set_result(_grpc_message(response))
            self._break(Unavailable("the stream ended before every message was answered",
                                    maybe_applied=True), None)
        except self._client._grpc.RpcError as exc:
            error = self._client.error(exc)
            answered_by_doq = any(k == "doq-error-code" for k, _ in exc.trailing_metadata() or ())
            unknown = not answered_by_doq or getattr(error, "maybe_applied", False)
            later = Unavailable(f"outcome unknown: {error.message}", maybe_applied=True) \
                if unknown else NotApplied(f"not stored: an earlier message of the stream "
                                           f"failed ({error.message})")
            self._break(error, later)
        except IndexError:                              # an answer nobody asked for
            self._break(InternalError("the server answered more messages than were sent"),
                        None)

    def _break(self, first: DoqError, later: DoqError | None) -> None:
        """Fail every unanswered future: the first with ``first``, the rest with ``later``
        (``first`` too when None); later sends raise ``first``."""
        with self._lock:
            if self._error is None:
                self._error = first
            pending, self._pending = self._pending, collections.deque()
        for n, future in enumerate(pending):
            future.set_exception(first if n == 0 or later is None else later)
            self._window.release()

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every message sent so far is answered (stored or failed)."""
        with self._lock:
            waiting = list(self._pending)
        done, not_done = concurrent.futures.wait(waiting, timeout)
        if not_done:
            raise Unavailable(f"{len(not_done)} sends unanswered after {timeout} s",
                              maybe_applied=True)

    def close(self, timeout: float | None = None) -> None:
        """Half-close once every send is answered (waits at most ``timeout`` seconds,
        default the client's); what is still unanswered then fails with
        ``Unavailable(maybe_applied=True)``."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)
        self._reader.join(self._client.timeout if timeout is None else timeout)
        if self._reader.is_alive():
            self._stream.cancel()
            self._reader.join(5)
        self._break(Unavailable("the producer was closed before the answer came",
                                maybe_applied=True), None)


class Consumer(_Subscription):
    """A DequeueStream subscription: iterate (or :meth:`receive`) to get messages.

    ``prefetch`` is the credit kept granted: up to that many messages may be on their way
    before you have taken them (with ``ack=False`` each must still be acked, nacked or
    touched before its ack timeout). ``close()`` (or leaving a ``with`` block) ends the
    subscription; with ``ack=False`` it nacks the messages that arrived but were not taken,
    so they are delivered again at once instead of after their ack timeout.
    """

    def __init__(self, client: GrpcClient, queue: str, ack: bool, prefetch: int) -> None:
        self._client = client
        self._queue, self._ack = queue, ack
        self._pb = client._pb
        self._requests: queue_module.Queue[Any] = queue_module.Queue()
        self._inbox: queue_module.Queue[Any] = queue_module.Queue()
        self._prefetch = max(1, prefetch)
        self._owed = 0                  # credit to grant back, sent in chunks
        self._requests.put(self._pb.DequeueRequest(
            queueName=queue, ack=ack, credit=self._prefetch,
            max_batch=min(self._prefetch, 256) if self._prefetch > 1 else 0))
        self._stream = client.stub().DequeueStream(self._outgoing(), metadata=client.metadata)
        self._closed = False
        self._reader = threading.Thread(target=self._read, daemon=True,
                                        name=f"doq-consumer-{queue}")
        self._reader.start()

    def _outgoing(self) -> Iterator[Any]:
        while True:
            item = self._requests.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for response in self._stream:
                if response.messages:                     # a batched response
                    for message in response.messages:
                        self._inbox.put(_grpc_message(message))
                else:
                    self._inbox.put(_grpc_message(response))
            self._inbox.put(StopIteration())
        except self._client._grpc.RpcError as exc:
            self._inbox.put(StopIteration() if self._closed else self._client.error(exc))

    def receive(self, timeout: float | None = None) -> Message | None:
        """The next message; None after ``timeout`` seconds without one (None: wait).

        Raises StopIteration once the stream has ended, or the error that ended it.
        """
        try:
            item = self._inbox.get(timeout=timeout)
        except queue_module.Empty:
            return None
        if isinstance(item, BaseException):
            self._inbox.put(item)                      # every later call sees the end too
            raise item
        self._owed += 1
        if not self._closed and self._owed >= max(1, self._prefetch // 4):
            self._requests.put(self._pb.DequeueRequest(credit=self._owed))  # top the credit up
            self._owed = 0
        return item  # type: ignore[no-any-return]

    def close(self) -> None:
        """End the subscription. With ``ack=False``, messages that reached this consumer but
        were not taken are nacked, so they are delivered again at once."""
        if self._closed:
            return
        self._closed = True
        self._requests.put(None)        # half-close: the server sends what it took, then ends
        self._reader.join(timeout=5)
        if self._reader.is_alive():
            self._stream.cancel()
            self._reader.join(timeout=5)
        if self._ack:
            return
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue_module.Empty:
                break
            if isinstance(item, Message):
                try:
                    self._client.nack(self._queue, item.id)
                except DoqError:
                    pass              # e.g. already redelivered: nothing to give back



def _grpc_message(response: Any) -> Message:
    return Message(response.id, response.group, response.priority, response.content,
                   dict(response.metadata))


def _grpc_queue_info(q: Any) -> QueueInfo:
    settings = QueueSettings(Strategy(q.settings.strategy), q.settings.max_unacked,
                             q.settings.ack_timeout)
    return QueueInfo(q.name, QueueType(q.type), settings, q.ready, q.unacked,
                     q.stats.enqueueRPS, q.stats.dequeueRPS, q.stats.ackRPS, q.stats.nackRPS)


def _servers_via(urls: Sequence[str], timeout: float,
                 retry: RetryPolicy = RetryPolicy(attempts=1, deadline=5),
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
Client = HttpClient | GrpcClient


def connect(urls: str | Sequence[str], transport: str | None = None, timeout: float = 10.0,
            retry: RetryPolicy = RetryPolicy(), api_key: str | None = None,
            ca_file: str | None = None, cert_file: str | None = None,
            key_file: str | None = None) -> Client:
    """A client for the nodes at ``urls`` (``http://``, ``https://``, ``grpc://`` or
    ``grpcs://host:port``).

    ``transport="grpc"`` with http(s):// URLs finds every node's gRPC address (and the
    leader) through the HTTP API (and uses TLS for gRPC when the URLs are https://).
    ``api_key``: sent with every request; ``ca_file``: the CA of the servers' certificates
    (TLS); ``cert_file`` / ``key_file``: a client certificate for mutual TLS.
    """
    nodes = [urls] if isinstance(urls, str) else list(urls)
    security = Security(api_key, ca_file, cert_file, key_file)
    schemes = {_parse(u, "http")[0] for u in nodes}
    if len(schemes) != 1:
        raise InvalidArgument("give addresses of one scheme: all http(s):// or all grpc(s)://")
    scheme = schemes.pop()
    plain = {"https": "http", "grpcs": "grpc"}.get(scheme, scheme)
    transport = transport or plain
    if transport == plain and plain in ("http", "grpc"):
        cls: type[HttpClient] | type[GrpcClient] = HttpClient if plain == "http" else GrpcClient
        return cls(nodes, timeout, retry, security=security)
    if transport == "grpc" and plain == "http":
        servers = _servers_via(nodes, timeout, retry, security)
        prefix = "grpcs://" if scheme == "https" else "grpc://"
        targets = [prefix + s.grpc_addr for s in servers if s.grpc_addr]
        if not targets:
            raise Unavailable("the cluster serves no gRPC (grpc.address is empty)")
        leader = next((s.grpc_addr for s in servers if s.is_leader and s.grpc_addr), None)
        return GrpcClient(targets, timeout, retry, leader=leader, discovery=nodes,
                          security=security)
    raise InvalidArgument(f"unknown transport {transport!r}: use http or grpc")

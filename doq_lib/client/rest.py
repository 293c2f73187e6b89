"""The REST client: :class:`HttpClient` over keep-alive connections, and
:class:`HttpConsumer`, batch consumption with long-poll."""
from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import time
from typing import IO, Any, Iterator, Sequence

from doq_lib.client import http_calls as calls
from doq_lib.client.calls import HttpCall, blocking
from doq_lib.client.common import (
    DEFAULT_RETRY,
    NO_SECURITY,
    ClientBase,
    Failover,
    RetryPolicy,
    Security,
    Unreachable,
    default_consumer,
    nodes_of,
)
from doq_lib.client.http_calls import result_of
from doq_lib.client.subscriptions import PREFETCH, HttpConsumer
from doq_lib.client.transport import Transport, dropped
from doq_lib.errors import DoqError, PermissionDenied, Unauthenticated, Unavailable
from doq_lib.models import ServerInfo


class HttpClient(ClientBase):
    """The REST API over keep-alive connections; its calls are
    :mod:`doq_lib.client.http_calls`."""

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
            raise Unreachable(f"{node}: {exc}") from None           # surely not applied
        except OSError as exc:        # reset, closed, timed out: it may have been processed
            conn.close()
            raise Unavailable(f"{node}: {exc!r}", maybe_applied=not safe) from None
        except http.client.HTTPException as exc:
            conn.close()
            raise Unavailable(f"{node}: {exc!r}", maybe_applied=not safe) from None
        self._conns[node] = conn
        return result

    def perform(self, call: HttpCall) -> Any:
        """Send ``call`` to the first node that takes it (failover); its decoded answer."""
        def attempt(node: str) -> Any:
            status, raw = self._send(node, call.method, call.path, call.body, call.safe,
                                     call.extra_time)
            return result_of(status, raw)
        return self._failover.call(attempt)

    def find_leader(self) -> str | None:
        """Ask the cluster which node leads and send requests there first."""
        try:
            servers = self.servers()
        except (Unauthenticated, PermissionDenied):
            raise                                 # no other node will answer differently
        except DoqError:
            return None
        return self._failover.prefer_leader(servers)

    # -- cluster -------------------------------------------------------------------------------
    servers = blocking(calls.servers)
    generate_ids = blocking(calls.generate_ids)

    def ready(self, node: str | None = None) -> bool:
        """Whether ``node`` (default: the current one) answers /readyz with 200."""
        try:
            status, _ = self._send(node or self.node, "GET", "/readyz", None, True)
        except Unavailable:
            return False
        return status == 200

    # -- backups (leader only; long transfers on a connection of their own) -------------------
    def _leader_connection(self, timeout: float) -> tuple[str, http.client.HTTPConnection]:
        try:
            servers = self.servers()
        except Unreachable as exc:              # no node answered at all: say so
            raise Unavailable(f"cannot connect to any node ({exc.message})") from None
        leader = self._failover.prefer_leader(servers)
        if leader is None:
            raise Unavailable("no node reports a leader: backups and restores need one")
        # The leader's listed address first; where it cannot be reached from here (a
        # published address that does not resolve, say), a node that can: it relays.
        tried = []
        for node in [leader] + [n for n in self._failover.nodes if n != leader]:
            conn = self.connection(node, min(timeout, 10.0))     # to connect
            try:
                conn.connect()
            except OSError as exc:
                conn.close()
                tried.append(f"{node}: {exc.strerror or exc}")
                continue
            conn.timeout = timeout                                # to wait for answers
            if conn.sock is not None:
                conn.sock.settimeout(timeout)
            return node, conn
        raise Unavailable(f"cannot connect to the leader or any node ({'; '.join(tried)})")

    def backup(self, out: IO[bytes], since: int = 0, timeout: float = 600.0) -> int:
        """Write a backup (full for ``since`` 0, else the changes from version ``since`` on)
        to ``out``; returns its last version (the next incremental starts one above)."""
        node, conn = self._leader_connection(timeout)
        try:
            response = self.http.send(conn, "POST", "/db/backup",
                                           json.dumps({"since": since}).encode())
            if response.status != 200:
                result_of(response.status, response.read())
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
            result: dict[str, Any] = result_of(response.status, response.read())
        except (OSError, http.client.HTTPException) as exc:
            raise Unavailable(f"{node}: restore interrupted: {exc!r}",
                              maybe_applied=True) from None
        finally:
            conn.close()
        return result

    # -- queues -------------------------------------------------------------------------
    create_queue = blocking(calls.create_queue)
    update_queue = blocking(calls.update_queue)
    delete_queue = blocking(calls.delete_queue)
    queues = blocking(calls.queues)
    queue = blocking(calls.queue)

    # -- messages -----------------------------------------------------------------------
    enqueue = blocking(calls.enqueue)
    enqueue_batch = blocking(calls.enqueue_batch)
    dequeue = blocking(calls.dequeue)
    dequeue_many = blocking(calls.dequeue_many)
    consumers = blocking(calls.consumers)
    get = blocking(calls.get)
    delete = blocking(calls.delete)
    ack = blocking(calls.ack)
    ack_batch = blocking(calls.ack_batch)
    ack_many = blocking(calls.ack_many)
    nack = blocking(calls.nack)
    nack_many = blocking(calls.nack_many)
    reject = blocking(calls.reject)
    touch = blocking(calls.touch)
    update_priority = blocking(calls.update_priority)

    def consume(self, queue: str, ack: bool = False, prefetch: int = PREFETCH,
                wait: float = 5.0) -> "HttpConsumer":
        """Consume ``queue`` in batches of up to ``prefetch``; see :class:`HttpConsumer`."""
        return HttpConsumer(self, queue, ack, prefetch, wait)

    # -- operator controls --------------------------------------------------------------
    purge = blocking(calls.purge)
    pause = blocking(calls.pause)
    resume = blocking(calls.resume)
    pause_group = blocking(calls.pause_group)
    resume_group = blocking(calls.resume_group)
    groups = blocking(calls.groups)
    browse = blocking(calls.browse)
    explain = blocking(calls.explain)
    redrive = blocking(calls.redrive)

    # -- schedules ----------------------------------------------------------------------
    put_schedule = blocking(calls.put_schedule)
    schedules = blocking(calls.schedules)
    schedule = blocking(calls.schedule)
    delete_schedule = blocking(calls.delete_schedule)
    pause_schedule = blocking(calls.pause_schedule)
    resume_schedule = blocking(calls.resume_schedule)


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

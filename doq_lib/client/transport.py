"""How DOQ makes an HTTP request, wherever it makes one: the client's keep-alive calls, the
console's status probes, a node's calls to other nodes (joins, forwarded membership changes,
signed with the cluster secret) and the Kubernetes API calls.

A :class:`Transport` knows how to reach a server (TLS or not, from which source address) and
what every request carries (fixed headers such as ``Authorization``, a signature computed
from the method, path and body). It opens connections, sends one request on a connection and
reads the answer; :meth:`Transport.once` does both on a connection of its own.
"""
from __future__ import annotations

import http.client
import json
import select
import ssl
from typing import Any, Callable, Iterable, Mapping

#: Extra headers for a request, from its method, path and body (e.g. a signature).
Signer = Callable[[str, str, bytes], Mapping[str, str]]


class Transport:
    """Connections and requests with fixed TLS, source address, headers and signature."""

    def __init__(self, tls: ssl.SSLContext | None = None, source: str | None = None,
                 headers: Mapping[str, str] | None = None, sign: Signer | None = None) -> None:
        self.tls = tls
        self.source = source
        self.headers = dict(headers or {})
        self.sign = sign

    def connect(self, addr: str, timeout: float) -> http.client.HTTPConnection:
        """A new (not yet opened) connection to ``addr`` (host:port; an empty host is this
        machine)."""
        host, port = split_addr(addr)
        source = (self.source, 0) if self.source else None
        if self.tls is not None:
            return http.client.HTTPSConnection(host, port, timeout=timeout,
                                               source_address=source, context=self.tls)
        return http.client.HTTPConnection(host, port, timeout=timeout, source_address=source)

    def send(self, conn: http.client.HTTPConnection, method: str, path: str,
             payload: bytes | Iterable[bytes] | None = None,
             content_type: str = "application/json",
             headers: Mapping[str, str] | None = None) -> http.client.HTTPResponse:
        """Send one request on ``conn`` and return its (unread) response. A body given as an
        iterable of blocks is streamed (give its Content-Length in ``headers``; such a body
        is not signed)."""
        sent = {**self.headers, **(headers or {})}
        if payload is not None:
            sent["Content-Type"] = content_type
        if self.sign is not None:
            sent.update(self.sign(method, path, payload if isinstance(payload, bytes) else b""))
        conn.request(method, path, body=payload, headers=sent)
        return conn.getresponse()

    def exchange(self, conn: http.client.HTTPConnection, method: str, path: str,
                 body: Any = None, headers: Mapping[str, str] | None = None,
                 ) -> tuple[int, bytes]:
        """One request with ``body`` (JSON-encoded unless None) on ``conn``; the status and
        the whole answer."""
        payload = None if body is None else json.dumps(body).encode()
        response = self.send(conn, method, path, payload, headers=headers)
        return response.status, response.read()

    def once(self, addr: str, method: str, path: str, body: Any = None,
             timeout: float = 5.0, headers: Mapping[str, str] | None = None,
             ) -> tuple[int, bytes]:
        """:meth:`exchange` on a connection of its own, closed afterwards."""
        conn = self.connect(addr, timeout)
        try:
            return self.exchange(conn, method, path, body, headers)
        finally:
            conn.close()

    def once_json(self, addr: str, method: str, path: str, body: Any = None,
                  timeout: float = 5.0, headers: Mapping[str, str] | None = None,
                  ) -> tuple[int, Any]:
        """:meth:`once` with the answer decoded as JSON (None when it is empty)."""
        status, raw = self.once(addr, method, path, body, timeout, headers)
        return status, json.loads(raw) if raw else None


def split_addr(addr: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port``, ``:port``) as a host http.client takes and a port."""
    host, _, port = addr.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return host or "127.0.0.1", int(port)


def dropped(conn: http.client.HTTPConnection) -> bool:
    """Whether a kept-alive connection was closed by the server (readable while idle)."""
    sock = conn.sock
    if sock is None:
        return True
    try:
        readable, _, _ = select.select([sock], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(readable)

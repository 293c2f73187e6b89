"""The HTTP server underneath Bottle (L5): gevent.pywsgi, tuned for many small requests.

* The listener sets ``TCP_NODELAY`` (inherited by accepted sockets): pywsgi writes small
  responses and Nagle would hold them for ~40 ms on a keep-alive connection.
* Request headers are parsed by :class:`FastHeaders` instead of pywsgi's default, which goes
  through the ``email`` package (about a tenth of a node's CPU under load).
* pywsgi's own access log line is not formatted at all; the middleware in ``http_api`` logs
  requests at DEBUG level.
* A response's status line, headers and (small) body leave in one ``send``: pywsgi sends the
  headers and the body separately, two TCP segments and two wake-ups of the client. The
  ``Date`` header is formatted once per second, not per response.
"""
from __future__ import annotations

import json
import logging
import socket
import ssl
import time
from typing import Any, BinaryIO, Iterator

from gevent.pywsgi import WSGIHandler, WSGIServer, format_date_time

log = logging.getLogger(__name__)
MAX_LINE = 65536
MAX_HEADERS = 100
ONE_SEND_BODY = 64 * 1024      # bodies up to this size leave together with the headers
_date = [0, b""]                # (unix second, its Date header value)


class FastHeaders:
    """The subset of ``http.client.HTTPMessage`` that pywsgi uses, parsed in one pass."""

    __slots__ = ("_items", "_map", "status")

    def __init__(self, fp: BinaryIO, *_: Any) -> None:
        self.status = ""
        self._items: list[list[str]] = []
        self._map: dict[str, str] = {}
        while True:
            raw = fp.readline(MAX_LINE + 1)
            if len(raw) > MAX_LINE:
                self.status = "Line too long"
                return
            if raw in (b"\r\n", b"\n", b""):
                break
            if not self._add(raw.decode("latin-1")):
                return
        for key, value in self._items:
            self._map.setdefault(key.lower(), value)

    def _add(self, line: str) -> bool:
        if line[:1] in (" ", "\t") and self._items:        # obsolete line folding
            self._items[-1][1] += " " + line.strip()
            return True
        key, sep, value = line.partition(":")
        if not sep or not key or key != key.strip():
            self.status = "Invalid header line"
            return False
        if len(self._items) >= MAX_HEADERS:
            self.status = "Too many headers"
            return False
        self._items.append([key, value.strip()])
        return True

    def get(self, name: str, default: Any = None) -> Any:
        return self._map.get(name.lower(), default)

    getheader = get

    def __delitem__(self, name: str) -> None:
        lowered = name.lower()
        self._items = [item for item in self._items if item[0].lower() != lowered]
        self._map.pop(lowered, None)

    def __contains__(self, name: str) -> bool:
        return name.lower() in self._map

    @property
    def headers(self) -> Iterator[str]:
        for key, value in self._items:
            yield f"{key}: {value}\r\n"

    @property
    def typeheader(self) -> str | None:
        return self._map.get("content-type")


_TITLES = {400: "Bad Request", 414: "URI Too Long", 500: "Internal Server Error"}


def _problem(status: int, message: str) -> bytes:
    body = {"title": _TITLES.get(status, "Error"), "status": status,
            "detail": "malformed request" if status < 500 else "unexpected error occurred",
            "errors": [{"message": message}],
            "code": "invalid_argument" if status < 500 else "internal"}
    return json.dumps(body, separators=(",", ":")).encode()


def raw_problem_response(status: int, message: str) -> bytes:
    """A complete HTTP response carrying a problem body (the connection is then closed)."""
    body = _problem(status, message)
    return (f"HTTP/1.1 {status} {_TITLES.get(status, 'Error')}\r\nConnection: close\r\n"
            f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n"
            f"\r\n").encode() + body


_WHY = {"400": "the request line or headers cannot be parsed",
        "414": "the request line is longer than the limit"}


class Handler(WSGIHandler):
    """pywsgi's handler with fast header parsing; its own error answers (a malformed request
    line or headers, a request line too long, a broken body) carry problem bodies too."""

    MessageClass = FastHeaders

    def log_request(self) -> None:
        """Requests are logged (at DEBUG) by the application's middleware."""

    def finalize_headers(self) -> None:
        if self.provided_date is None:  # type: ignore[has-type]
            now = int(time.time())
            if _date[0] != now:
                _date[0], _date[1] = now, format_date_time(now)
            self.response_headers.append((b"Date", _date[1]))
            self.provided_date = _date[1]
        super().finalize_headers()

    def _write_with_headers(self, data: bytes) -> None:
        self.headers_sent = True
        self.finalize_headers()
        out = bytearray(b"HTTP/1.1 ")
        out += self.status
        out += b"\r\n"
        for header, value in self.response_headers:
            out += header
            out += b": "
            out += value
            out += b"\r\n"
        out += b"\r\n"
        if data and not self.response_use_chunked and len(data) <= ONE_SEND_BODY:
            out += data
            self._sendall(out)
            return
        self._sendall(out)
        self._write(data)

    def get_environ(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_environ()
        env["doq.socket"] = self.socket     # a long-poll watches it for the client leaving
        return env

    def handle_one_request(self) -> Any:
        result = super().handle_one_request()
        if isinstance(result, tuple) and len(result) == 2:
            status = str(result[0])
            why = _WHY.get(status, "the request was refused")
            headers = getattr(self, "headers", None)
            if status == "400" and isinstance(headers, FastHeaders) and headers.status:
                why = f"the request headers cannot be parsed ({headers.status})"
            return status, raw_problem_response(int(status), why)
        return result

    def _send_error_response_if_possible(self, error_code: int) -> None:
        if self.response_length:
            self.close_connection = True
            return
        message = {400: "the request body cannot be read (truncated, or a malformed chunk)",
                   500: "internal server error"}.get(error_code, "the request was refused")
        body = _problem(error_code, message)
        try:
            self.start_response(f"{error_code} {_TITLES.get(error_code, 'Error')}", [
                ("Content-Type", "application/problem+json"), ("Connection", "close"),
                ("Content-Length", str(len(body)))])
            self.write(body)
        except OSError:
            self.close_connection = True


def listener(host: str, port: int) -> socket.socket:
    """A listening socket whose accepted connections have Nagle disabled (DESIGN.md §3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


class TlsServer(WSGIServer):
    """HTTPS: a client whose handshake fails (no or a wrong certificate, plain HTTP) is
    logged in one line, not with gevent's traceback for every such connection."""

    def wrap_socket_and_handle(self, client_socket: Any, address: Any) -> Any:
        try:
            return super().wrap_socket_and_handle(client_socket, address)
        except (ssl.SSLError, ConnectionResetError, BrokenPipeError) as exc:
            log.info("TLS handshake with %s failed: %s", address[0] if address else "?",
                     getattr(exc, "reason", None) or exc)
            return None


def make_server(sock: socket.socket, app: Any, error_log: Any,
                ssl_context: ssl.SSLContext | None = None) -> WSGIServer:
    """The server for ``app`` on ``sock``; HTTPS with ``ssl_context`` (the handshake runs in
    the connection's greenlet)."""
    if ssl_context is None:
        return WSGIServer(sock, app, log=None, error_log=error_log, handler_class=Handler)
    return TlsServer(sock, app, log=None, error_log=error_log, handler_class=Handler,
                     ssl_context=ssl_context)

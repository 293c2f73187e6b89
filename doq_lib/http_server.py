"""The HTTP server underneath Bottle (L5): gevent.pywsgi, tuned for many small requests.

* The listener sets ``TCP_NODELAY`` (inherited by accepted sockets): pywsgi writes small
  responses and Nagle would hold them for ~40 ms on a keep-alive connection.
* Request headers are parsed by :class:`FastHeaders` instead of pywsgi's default, which goes
  through the ``email`` package (about a tenth of a node's CPU under load).
* pywsgi's own access log line is not formatted at all; the middleware in ``http_api`` logs
  requests at DEBUG level.
"""
from __future__ import annotations

import socket
from typing import Any, BinaryIO, Iterator

from gevent.pywsgi import WSGIHandler, WSGIServer

MAX_LINE = 65536
MAX_HEADERS = 100


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


class Handler(WSGIHandler):
    MessageClass = FastHeaders

    def log_request(self) -> None:
        """Requests are logged (at DEBUG) by the application's middleware."""


def listener(host: str, port: int) -> socket.socket:
    """A listening socket whose accepted connections have Nagle disabled (DESIGN.md §3)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def make_server(sock: socket.socket, app: Any, error_log: Any) -> WSGIServer:
    return WSGIServer(sock, app, log=None, error_log=error_log, handler_class=Handler)

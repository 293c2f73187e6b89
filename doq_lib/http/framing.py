"""What the HTTP server reads and refuses before a request reaches the application (L5): the
``httptools`` callbacks that collect requests (pipelined ones too) and their bodies, the
limits of a request's head, the environ key of a header, and the problem+json answer the
server sends itself (then closing the connection)."""
from __future__ import annotations

import collections
import json
import time
from typing import Callable

import httptools

from doq_lib.failures import MALFORMED, UNEXPECTED

MAX_TARGET = 8192               # bytes of the request target (414 beyond)
MAX_HEAD = 64 * 1024            # bytes of all header names and values (431 beyond)
MAX_HEADERS = 100               # header fields (431 beyond)
MAX_DISCARD = 1 << 20           # unread body bytes skipped before the next request
RECV_SIZE = 65536

REASONS = {100: "Continue", 200: "OK", 400: "Bad Request", 408: "Request Timeout",
           411: "Length Required", 413: "Content Too Large", 414: "URI Too Long",
           431: "Request Header Fields Too Large", 500: "Internal Server Error",
           501: "Not Implemented", 503: "Service Unavailable"}


#: The detail and code of the server's own refusals that are not about a malformed request.
_OWN = {501: ("not implemented", "not_implemented"), 503: ("unavailable", "unavailable")}


def problem_bytes(status: int, message: str) -> bytes:
    detail, code = _OWN.get(status) or ((MALFORMED, "invalid_argument") if status < 500
                                        else (UNEXPECTED, "internal"))
    body = {"title": REASONS.get(status, "Error"), "status": status, "detail": detail,
            "errors": [{"message": message}], "code": code}
    return json.dumps(body, separators=(",", ":")).encode()


def raw_problem_response(status: int, message: str) -> bytes:
    """A complete HTTP response carrying a problem body (the connection is then closed)."""
    body = problem_bytes(status, message)
    return (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nConnection: close\r\n"
            f"Content-Type: application/problem+json\r\nContent-Length: {len(body)}\r\n"
            f"\r\n").encode() + body


ENVIRON_KEYS: dict[bytes, str] = {}     # header name as sent -> environ key ("": dropped)


def environ_key(raw_name: bytes) -> str:
    """The WSGI environ key of a header name (remembered for the next request)."""
    name = raw_name.decode("latin-1").upper()
    if "_" in name:
        key = ""
    elif name == "CONTENT-TYPE":
        key = "CONTENT_TYPE"
    elif name == "CONTENT-LENGTH":
        key = "CONTENT_LENGTH"
    else:
        key = "HTTP_" + name.replace("-", "_")
    if len(ENVIRON_KEYS) < 4096:            # bounded: names are chosen by clients
        ENVIRON_KEYS[raw_name] = key
    return key


class Refused(Exception):
    """A request the server answers itself (status, message) and then closes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ParsedRequest:
    """One request as the parser delivers it."""

    __slots__ = ("target", "headers", "head_bytes", "method", "version", "keep_alive",
                 "complete", "body", "body_bytes", "headers_done", "started", "received",
                 "counted")

    def __init__(self) -> None:
        self.started = time.monotonic()   # its first byte arrived (the header deadline)
        self.received = 0                 # body bytes received so far (the whole deadline)
        self.target = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_bytes = 0
        self.method = "GET"
        self.version = "1.1"
        self.keep_alive = True
        self.headers_done = False
        self.complete = False
        self.body: collections.deque[bytes] = collections.deque()
        self.body_bytes = 0
        self.counted = 0                  # body bytes counted toward http.max_held_bytes


class Parser:
    """``httptools`` callbacks: requests (pipelined ones too) are queued as they complete
    their headers; body bytes go to the request they belong to."""

    def __init__(self, count: Callable[[ParsedRequest, int], None] | None = None) -> None:
        """``count(request, size)``: told of every body chunk (it may refuse: Refused)."""
        self.parser = httptools.HttpRequestParser(self)
        self.current: ParsedRequest | None = None
        self.ready: collections.deque[ParsedRequest] = collections.deque()
        self._count = count

    def on_message_begin(self) -> None:
        self.current = ParsedRequest()

    def on_url(self, url: bytes) -> None:
        request = self.current
        assert request is not None
        request.target += url
        if len(request.target) > MAX_TARGET:
            raise Refused(414, f"the request target is longer than {MAX_TARGET} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.current
        assert request is not None
        request.head_bytes += len(name) + len(value)
        if request.head_bytes > MAX_HEAD:
            raise Refused(431, f"the request headers are larger than {MAX_HEAD} bytes")
        if len(request.headers) >= MAX_HEADERS:
            raise Refused(431, f"the request has more than {MAX_HEADERS} header fields")
        request.headers.append((name, value))

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        parser = self.parser
        request.method = parser.get_method().decode("ascii", "replace")
        request.version = parser.get_http_version()
        request.keep_alive = parser.should_keep_alive()
        request.headers_done = True
        self.ready.append(request)

    def on_body(self, body: bytes) -> None:
        request = self.current
        assert request is not None
        if self._count is not None:
            self._count(request, len(body))
        request.body.append(body)
        request.body_bytes += len(body)
        request.received += len(body)

    def on_message_complete(self) -> None:
        if self.current is not None:
            self.current.complete = True

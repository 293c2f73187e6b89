"""One HTTP call as the API sees it (L5): the request (:class:`Call`, in a context variable),
problem+json answers (:class:`HttpProblem`) and how a DoqError becomes one."""
from __future__ import annotations

import contextvars
import json
import logging
import os
from typing import Any

import bottle
import gevent
import gevent.event

from doq_lib import rules
from doq_lib.errors import DoqError, PermissionDenied, Unauthenticated
from doq_lib.failures import API, http_failure

log = logging.getLogger(__name__)
access_log = logging.getLogger("doq.access")
MAX_BODY = rules.MAX_REQUEST
TRUE_VALUES = {"1", "t", "T", "TRUE", "true", "True"}
FALSE_VALUES = {"0", "f", "F", "FALSE", "false", "False"}
SECURITY_HEADERS = [
    ("X-XSS-Protection", "0"), ("X-Content-Type-Options", "nosniff"),
    ("X-Frame-Options", "SAMEORIGIN"), ("Referrer-Policy", "no-referrer"),
    ("Cross-Origin-Embedder-Policy", "require-corp"),
    ("Cross-Origin-Opener-Policy", "same-origin"),
    ("Cross-Origin-Resource-Policy", "same-origin"), ("Origin-Agent-Cluster", "?1"),
    ("X-DNS-Prefetch-Control", "off"), ("X-Download-Options", "noopen"),
    ("X-Permitted-Cross-Domain-Policies", "none"),
]
REASONS = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict",
           413: "Request Entity Too Large",
           414: "URI Too Long", 415: "Unsupported Media Type", 422: "Unprocessable Entity",
           500: "Internal Server Error", 503: "Service Unavailable"}
# op id -> (status of a business failure, detail): doq_lib/failures.py (for the OpenAPI document)
FAILURES: dict[str, tuple[int, str]] = {op: (f.http_status, f.detail) for op, f in API.items()}
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode


def _encode(payload: Any) -> bytes:
    """JSON as UTF-8. A lone surrogate (only ever in a problem that quotes bad input) is
    written as its JSON escape, so an answer can always be sent."""
    return _dumps(payload).encode("utf-8", "backslashreplace")
_RANDOM = bytearray()          # random bytes for request ids, drawn 4 KiB at a time


def new_request_id() -> str:
    """A random (version 4) UUID, like ``str(uuid.uuid4())`` without a syscall per call."""
    if len(_RANDOM) < 16:
        _RANDOM.extend(os.urandom(4096))
    raw = bytearray(_RANDOM[-16:])
    del _RANDOM[-16:]
    raw[6] = (raw[6] & 0x0F) | 0x40
    raw[8] = (raw[8] & 0x3F) | 0x80
    h = raw.hex()
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


# The "code" extension member of problem bodies: the stable DoqError code, so that clients
# (doq_lib.client) can tell failures that share a status apart.
DEFAULT_CODES = {401: "unauthenticated", 403: "permission_denied", 404: "not_found",
                 405: "method_not_allowed", 408: "request_timeout", 500: "internal",
                 503: "unavailable"}


class HttpProblem(Exception):
    def __init__(self, status: int, detail: str, errors: list[dict[str, Any]] | None = None,
                 code: str | None = None, maybe_applied: bool = False):
        super().__init__(detail)
        self.status, self.detail, self.errors = status, detail, errors or []
        self.code = code or DEFAULT_CODES.get(status, "invalid_argument")
        self.maybe_applied = maybe_applied


def problem_body(status: int, detail: str, errors: list[dict[str, Any]],
                 code: str | None = None, maybe_applied: bool = False) -> bytes:
    body: dict[str, Any] = {"title": REASONS.get(status, "Error"), "status": status,
                            "detail": detail}
    if errors:
        body["errors"] = errors
    if code:
        body["code"] = code
    if maybe_applied:           # a write whose outcome is unknown: it may still have happened
        body["maybe_applied"] = True
    return _encode(body)


class Call:
    """One API request and the status and headers of its answer: what the route handlers
    read and set. The API does not use Bottle's thread-local request and response (binding
    them, its hooks and plugins cost more than most routes); Bottle's parsing of query
    strings and forms is used on demand through :attr:`request`."""

    __slots__ = ("environ", "status", "content_type", "headers", "_request", "_body")

    def __init__(self, environ: dict[str, Any]) -> None:
        self.environ = environ
        self.status = 200
        self.content_type = "text/html; charset=UTF-8"          # Bottle's default
        self.headers: list[tuple[str, str]] = []
        self._request: bottle.BaseRequest | None = None
        self._body: bytes | None = None

    @property
    def request(self) -> bottle.BaseRequest:
        if self._request is None:
            self._request = bottle.BaseRequest(self.environ)
        return self._request

    @property
    def method(self) -> str:
        return str(self.environ.get("REQUEST_METHOD", "GET")).upper()

    def query(self, name: str) -> str | None:
        """The query parameter ``name``, decoded as UTF-8 (as browsers, urllib and curl
        percent-encode text; WSGI hands it over as latin-1); None when absent. Bytes that
        are not UTF-8 are a 400."""
        value: str | None = self.request.query.get(name)
        if value is None or value.isascii():
            return value
        try:
            return value.encode("latin-1").decode("utf-8")
        except UnicodeError:
            raise HttpProblem(400, "the query is not UTF-8", [{
                "message": "percent-encoded bytes that are not UTF-8",
                "location": f"query.{name}", "value": ascii(value)[1:-1]}]) from None

    @property
    def chunked(self) -> bool:
        return "chunked" in self.environ.get("HTTP_TRANSFER_ENCODING", "").lower()

    @property
    def content_length(self) -> int:
        return int(self.environ.get("CONTENT_LENGTH") or -1)

    @property
    def request_content_type(self) -> str:
        return str(self.environ.get("CONTENT_TYPE", "")).lower()

    def body(self) -> bytes:
        """The request body, read once: at most MAX_BODY + 1 bytes (a longer body is refused
        by the route; restores stream theirs instead)."""
        if self._body is None:
            limit = MAX_BODY + 1
            source = self.environ["wsgi.input"]
            length = self.content_length
            self._body = source.read(limit if self.chunked or length < 0 else min(length, limit))
        return self._body

    def set_header(self, name: str, value: str) -> None:
        self.headers.append((name, value))

    def response_headers(self, body: Any) -> list[tuple[str, str]]:
        """The answer's headers, as Bottle would have written them."""
        out = list(self.headers)
        if self.status not in (204, 304):
            out.insert(0, ("Content-Type", self.content_type))
            if isinstance(body, bytes):
                out.append(("Content-Length", str(len(body))))
        return out


CURRENT_CALL: contextvars.ContextVar[Call] = contextvars.ContextVar("doq_http_call")


def current() -> Call:
    """The API request being answered (per greenlet)."""
    return CURRENT_CALL.get()


def reply(status: int, payload: Any) -> bytes:
    call = CURRENT_CALL.get()
    call.status = status
    call.content_type = "application/json"
    return _encode(payload)


def relay(status: int, payload: Any) -> bytes:
    """Answer with what another node (the leader) answered."""
    call = CURRENT_CALL.get()
    call.status = status
    call.content_type = "application/json" if status < 400 else "application/problem+json"
    return _encode(payload)


def problem_answer(exc: HttpProblem) -> bytes:
    """The problem answer, in an API call or on Bottle's own pages."""
    call = CURRENT_CALL.get(None)
    target: Any = call if call is not None else bottle.response
    target.status = exc.status
    target.content_type = "application/problem+json"
    if exc.status == 401:
        target.set_header("WWW-Authenticate", 'Bearer realm="doq"')
    return problem_body(exc.status, exc.detail, exc.errors, exc.code, exc.maybe_applied)


def auth_problem(exc: Unauthenticated | PermissionDenied) -> HttpProblem:
    detail = "authentication required" if isinstance(exc, Unauthenticated) else \
        "permission denied"
    return HttpProblem(exc.http_status, detail, [{"message": exc.message,
                                                  "location": "header.Authorization"}],
                       exc.code)


def problem_for(op_id: str, exc: DoqError) -> HttpProblem:
    """The one place a DoqError becomes an HTTP answer (wording: doq_lib/failures.py)."""
    status, detail = http_failure(op_id, exc)
    return HttpProblem(status, detail, [{"message": exc.message}], exc.code,
                       getattr(exc, "maybe_applied", False))


class ClientWatch:
    """While a request waits (a long-poll) or works (a browse taken in steps): an event set
    once the client's connection turns readable, because it closed (or sent bytes a waiting
    GET does not expect). Either way the request stops: nothing more is taken or looked at."""

    def __init__(self, environ: dict[str, Any]) -> None:
        self.sock = environ.get("doq.socket")
        self.gone = gevent.event.Event()
        self.watcher: Any = None

    def __enter__(self) -> gevent.event.Event:
        fileno = self.sock.fileno() if self.sock is not None else -1
        if fileno >= 0:
            self.watcher = gevent.get_hub().loop.io(fileno, 1)
            self.watcher.start(self.gone.set)
        return self.gone

    def __exit__(self, *_: Any) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher.close()

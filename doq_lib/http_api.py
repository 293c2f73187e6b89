"""The REST API (L5): Bottle routes over :class:`doq_lib.service.Service` (SPEC §3).

Errors are turned into RFC 9457 problem details in one place (:func:`_problem_for`), from the
route's fixed failure status and ``detail`` (SPEC §3.3) and the error's own message. Consensus
failures (no leader, no quorum, timeouts) answer 503 on every route so clients can retry.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import re
import tempfile
import time
from typing import IO, Any, Callable, Iterable

import bottle
import gevent
import gevent.event
import yaml
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from doq_lib import openapi, rules
from doq_lib.cluster import Membership
from doq_lib.errors import DoqError, PermissionDenied, ResultCode, Unauthenticated
from doq_lib.failures import API, error_for_result, http_failure
from doq_lib.http_auth import METRICS_RULE, ROUTE_RULES, Authorizer
from doq_lib.http_schema import SCHEMAS, UINT64_MAX, normalized, validate
from doq_lib.metrics import Metrics
from doq_lib.models import Message, QueueInfo, QueueSettings, Strategy
from doq_lib.rules import NameProblem
from doq_lib.service import EnqueueItem, Service

log = logging.getLogger(__name__)
access_log = logging.getLogger("doq.access")

MAX_BODY = 1 << 20
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
           405: "Method Not Allowed", 409: "Conflict", 413: "Request Entity Too Large",
           414: "URI Too Long", 415: "Unsupported Media Type", 422: "Unprocessable Entity",
           500: "Internal Server Error", 503: "Service Unavailable"}

# op id -> (status of a business failure, detail): doq_lib/failures.py (for the OpenAPI document)
FAILURES: dict[str, tuple[int, str]] = {op: (f.http_status, f.detail) for op, f in API.items()}
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_RANDOM = bytearray()          # random bytes for request ids, drawn 4 KiB at a time


def _request_id() -> str:
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
                 405: "method_not_allowed", 500: "internal", 503: "unavailable"}


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
    return _dumps(body).encode()


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
        value: str | None = self.request.query.get(name)
        return value

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


_CURRENT: contextvars.ContextVar[Call] = contextvars.ContextVar("doq_http_call")


def current() -> Call:
    """The API request being answered (per greenlet)."""
    return _CURRENT.get()


def _reply(status: int, payload: Any) -> bytes:
    call = _CURRENT.get()
    call.status = status
    call.content_type = "application/json"
    return _dumps(payload).encode()


def _relay(status: int, payload: Any) -> bytes:
    """Answer with what another node (the leader) answered."""
    call = _CURRENT.get()
    call.status = status
    call.content_type = "application/json" if status < 400 else "application/problem+json"
    return _dumps(payload).encode()


def _problem(exc: HttpProblem) -> bytes:
    """The problem answer, in an API call or on Bottle's own pages."""
    call = _CURRENT.get(None)
    target: Any = call if call is not None else bottle.response
    target.status = exc.status
    target.content_type = "application/problem+json"
    if exc.status == 401:
        target.set_header("WWW-Authenticate", 'Bearer realm="doq"')
    return problem_body(exc.status, exc.detail, exc.errors, exc.code, exc.maybe_applied)


def _auth_problem(exc: Unauthenticated | PermissionDenied) -> HttpProblem:
    detail = "authentication required" if isinstance(exc, Unauthenticated) else \
        "permission denied"
    return HttpProblem(exc.http_status, detail, [{"message": exc.message,
                                                  "location": "header.Authorization"}],
                       exc.code)


def _problem_for(op_id: str, exc: DoqError) -> HttpProblem:
    """The one place a DoqError becomes an HTTP answer (wording: doq_lib/failures.py)."""
    status, detail = http_failure(op_id, exc)
    return HttpProblem(status, detail, [{"message": exc.message}], exc.code,
                       getattr(exc, "maybe_applied", False))


# -- request parsing ----------------------------------------------------------------------------
def _check_content_type() -> None:
    """A JSON body must say so: a form or text/plain post (what another site's page can
    send without asking) is not a JSON request."""
    ctype = _CURRENT.get().request_content_type.split(";")[0].strip()
    if ctype != "application/json" and not ctype.endswith("+json"):
        message = (f"unsupported content type {ctype!r}: use application/json" if ctype
                   else "the request has a body but no Content-Type: send "
                        "'Content-Type: application/json'")
        raise HttpProblem(415, "validation failed", [{
            "message": message, "location": "header.Content-Type", "value": ctype}])


def _read_body() -> bytes:
    call = _CURRENT.get()
    if call.content_length >= MAX_BODY:
        raise HttpProblem(413, f"request body is too large limit={MAX_BODY} bytes")
    try:
        # The server decodes a chunked body; a Content-Length one is read to its length.
        raw = call.body()
    except (OSError, ValueError) as exc:
        raise HttpProblem(400, "validation failed", [
            {"message": f"cannot read the request body: {exc}", "location": "body"}]) from None
    if len(raw) >= MAX_BODY:
        raise HttpProblem(413, f"request body is too large limit={MAX_BODY} bytes")
    return raw


def json_body(schema_name: str, required: bool = True) -> dict[str, Any]:
    """The validated body of a route; an optional one may be absent or empty ({})."""
    raw = _read_body()
    if not raw.strip():
        if not required:
            return {}
        raise HttpProblem(400, "request body is required")
    _check_content_type()
    try:
        # What json.loads does with these hooks, without building a decoder per request.
        value = _DECODER.decode(raw.decode(json.detect_encoding(raw), "surrogatepass"))
    except (ValueError, RecursionError) as exc:
        raise HttpProblem(400, "validation failed", [{
            "message": str(exc), "location": "body",
            "value": raw.decode("utf-8", "replace")}]) from None
    schema = SCHEMAS[schema_name]
    problems = validate(schema, value)
    if problems:
        raise HttpProblem(422, "validation failed", problems)
    return normalized(schema, value)


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"number out of range: {text}")
    return value


def _no_constant(text: str) -> float:
    raise ValueError(f"invalid JSON value: {text}")   # NaN / Infinity are not JSON


_DECODER = json.JSONDecoder(parse_float=_finite_float, parse_constant=_no_constant)


def _decimal(raw: str) -> int | None:
    """A decimal string of at most 20 digits (every uint64) as an int, else None: longer
    ones are refused before int() (which raises past 4300 digits)."""
    if raw.isascii() and raw.isdigit() and len(raw) <= 20:
        return int(raw)
    return None


def _path_id(raw: str) -> int:
    value = _decimal(raw)
    if value is not None and value <= UINT64_MAX:
        return value
    raise HttpProblem(422, "validation failed", [
        {"message": "invalid integer", "location": "path.id", "value": raw}])


def _query_ack() -> bool:
    raw = _CURRENT.get().query("ack")
    if raw is None or raw == "":
        return False
    if raw in TRUE_VALUES:
        return True
    if raw in FALSE_VALUES:
        return False
    raise HttpProblem(422, "validation failed", [
        {"message": "invalid boolean", "location": "query.ack", "value": raw}])


MAX_TAKE = 1000            # messages per GET ?count=N
MAX_WAIT = 20.0            # seconds a GET ?wait=S may wait
_DECIMAL = re.compile(r"(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\Z")


def _query_count() -> int | None:
    raw = _CURRENT.get().query("count")
    if raw is None:
        return None
    value = _decimal(raw)
    if value is not None and 1 <= value <= MAX_TAKE:
        return value
    raise HttpProblem(422, "validation failed", [{
        "message": f"expected an integer from 1 to {MAX_TAKE}", "location": "query.count",
        "value": raw}])


def _query_wait() -> float | None:
    raw = _CURRENT.get().query("wait")
    if raw is None:
        return None
    if _DECIMAL.match(raw) and float(raw) <= MAX_WAIT:
        return float(raw)
    raise HttpProblem(422, "validation failed", [{
        "message": f"expected seconds from 0 to {MAX_WAIT:g} (decimals allowed)",
        "location": "query.wait", "value": raw}])


def _batch_ids(raw_ids: list[Any]) -> list[int]:
    """The ids of a batch ack / nack body: decimal strings or integers, each once."""
    ids: list[int] = []
    first: dict[int, int] = {}
    problems = []
    for n, raw in enumerate(raw_ids):
        where = f"body.ids[{n}]"
        value: int | None = None
        if isinstance(raw, int) and not isinstance(raw, bool):
            value = raw
        elif isinstance(raw, str):
            value = _decimal(raw)
        if value is None:
            problems.append({"message": "expected a message id: a decimal string or an "
                             "integer", "location": where, "value": raw})
            continue
        if not 0 <= value <= UINT64_MAX:
            problems.append({"message": "expected a message id below 2^64", "location": where,
                             "value": raw})
        elif value in first:
            problems.append({"message": f"duplicate id (also body.ids[{first[value]}])",
                             "location": where, "value": raw})
        else:
            first[value] = n
            ids.append(value)
    if problems:
        raise HttpProblem(422, "validation failed", problems)
    return ids


def _settled(done_key: str, ids: list[int], failed: list[tuple[int, DoqError]]) -> bytes:
    bad = {mid for mid, _ in failed}
    return _reply(200, {
        done_key: [str(mid) for mid in ids if mid not in bad],
        "failed": [{"id": str(mid), "code": exc.code, "detail": exc.message}
                   for mid, exc in failed]})


class _ClientWatch:
    """While a request waits: an event set once the client's connection turns readable,
    because it closed (or sent bytes a waiting GET does not expect). Either way the wait
    stops and nothing more is taken for that request."""

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


def _check_name(name: str, location: str = "body.name") -> None:
    message = rules.name_message(name, "http")
    if message is not None:
        raise HttpProblem(422, "validation failed", [
            {"message": message, "location": location, "value": name}])


def _message_id(raw: Any, location: str = "body.id") -> int:
    """Enqueue ``id``: absent, empty or "0" means "generate one"."""
    if raw in (None, "", "0"):
        return 0
    value = _decimal(raw)
    if value is not None and value < 2 ** 63:
        return value
    raise HttpProblem(422, "validation failed", [{
        "message": "expected a decimal message id below 2^63", "location": location,
        "value": raw}])


# -- response shapes -----------------------------------------------------------------------------
def settings_echo(settings: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if settings.get("strategy"):
        out["strategy"] = settings["strategy"].upper()
    for key in ("max_unacked", "ack_timeout"):
        if settings.get(key):
            out[key] = settings[key]
    return out


def settings_out(settings: QueueSettings) -> dict[str, Any]:
    out: dict[str, Any] = {"strategy": settings.strategy.name}
    if settings.max_unacked:
        out["max_unacked"] = settings.max_unacked
    if settings.ack_timeout:
        out["ack_timeout"] = settings.ack_timeout
    return out


def queue_info_out(info: QueueInfo) -> dict[str, Any]:
    return {"name": info.name, "type": info.type.value, "settings": settings_out(info.settings),
            "enqueue_rps": info.enqueue_rps, "dequeue_rps": info.dequeue_rps,
            "ack_rps": info.ack_rps, "nack_rps": info.nack_rps, "ready": info.ready,
            "unacked": info.unacked, "total": info.total}


def message_out(status: str, msg: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"status": status, "id": str(msg.id)}
    if msg.group:
        out["group"] = msg.group
    out["priority"] = msg.priority
    out["content"] = msg.content
    if msg.metadata:
        out["metadata"] = msg.metadata
    return out


def _strategy(settings: dict[str, Any]) -> Strategy:
    name = settings.get("strategy")
    return Strategy[name.upper()] if name else Strategy.STRATEGY_UNSPECIFIED


# -- the application -------------------------------------------------------------------------------
class Api:
    """Route handlers; each returns the response body (bytes)."""

    def __init__(self, service: Service, membership: Membership, auth: Authorizer) -> None:
        self.svc = service
        self.members = membership
        self.auth = auth

    def create_queue(self) -> bytes:
        body = json_body("CreateQueueInputBody")
        _check_name(body["name"])
        self.auth.check_queue(_CURRENT.get(), ROUTE_RULES["create-queue"], body["name"])
        settings = body.get("settings") or {}
        self.svc.create_queue(body["name"], body["type"], _strategy(settings),
                              settings.get("max_unacked", 0), settings.get("ack_timeout", 0))
        return _reply(200, {"status": "CREATED", "name": body["name"], "type": body["type"],
                            "settings": settings_echo(settings)})

    def list_queues(self) -> bytes:
        key = self.auth.current(_CURRENT.get())
        return _reply(200, {"queues": [queue_info_out(q) for q in self.svc.list_queues()
                                       if key.covers(q.name)]})

    def queue_info(self, queue_name: str) -> bytes:
        return _reply(200, queue_info_out(self.svc.queue_info(queue_name)))

    def update_queue(self, queue_name: str) -> bytes:
        settings = json_body("UpdateQueueInputBody")["settings"]
        self.svc.update_queue(queue_name, _strategy(settings), settings.get("max_unacked", 0),
                              settings.get("ack_timeout", 0))
        return _reply(200, {"status": "UPDATED", "name": queue_name,
                            "settings": settings_echo(settings)})

    def delete_queue(self, queue_name: str) -> bytes:
        self.svc.delete_queue(queue_name)
        return _reply(200, {"status": "DELETED"})

    def enqueue(self, queue_name: str) -> bytes:
        body = json_body("EnqueueInputBody")
        mid = _message_id(body.get("id"))
        group, metadata = body.get("group") or "", body.get("metadata") or {}
        stored = self.svc.enqueue(queue_name, mid, group, body["priority"], body["content"],
                                  metadata)
        echo = Message(stored.id, group, body["priority"], body["content"], metadata)
        return _reply(200, message_out("ENQUEUED", echo))

    def enqueue_batch(self, queue_name: str) -> bytes:
        """Several messages in one request and one replicated operation: all or none."""
        body = json_body("EnqueueBatchInputBody")
        items = []
        for n, m in enumerate(body["messages"]):
            mid = _message_id(m.get("id"), f"body.messages[{n}].id")
            items.append(EnqueueItem(queue_name, mid, m.get("group") or "", m["priority"],
                                     m["content"], m.get("metadata") or None))
        ids = self.svc.enqueue_batch(items)
        return _reply(200, {"status": "ENQUEUED", "ids": [str(i) for i in ids]})

    def dequeue(self, queue_name: str) -> bytes:
        call = _CURRENT.get()
        if call.method == "HEAD":               # HEAD is routed to GET: never dequeue
            call.set_header("Allow", "GET")
            raise HttpProblem(405, REASONS[405])
        ack = _query_ack()
        count, wait = _query_count(), _query_wait()
        if count is None and wait is None:
            return _reply(200, message_out("DEQUEUED", self.svc.dequeue(queue_name, ack)))
        watch = _ClientWatch(call.environ) if wait else contextlib.nullcontext()
        with watch as gone:
            taken = self.svc.take(queue_name, ack, count or 1, wait or 0.0, gone)
        if count is None:
            if not taken:
                raise error_for_result("dequeue", ResultCode.QUEUE_EMPTY, queue_name)
            return _reply(200, message_out("DEQUEUED", taken[0]))
        return _reply(200, {"messages": [message_out("DEQUEUED", m) for m in taken]})

    def get(self, queue_name: str, id: str) -> bytes:
        return _reply(200, message_out("GOT", self.svc.get(queue_name, _path_id(id))))

    def delete(self, queue_name: str, id: str) -> bytes:
        self.svc.delete(queue_name, _path_id(id))
        _CURRENT.get().status = 204
        return b""

    def ack(self, queue_name: str, id: str) -> bytes:
        mid = _path_id(id)
        self.svc.ack(queue_name, mid)
        return _reply(200, {"status": "ACKNOWLEDGED", "id": str(mid)})

    def nack(self, queue_name: str, id: str) -> bytes:
        mid = _path_id(id)
        body = json_body("NackInputBody")
        metadata = body.get("metadata")
        priority, _ = self.svc.nack(queue_name, mid, body["priority"], metadata)
        out: dict[str, Any] = {"status": "UNACKNOWLEDGED", "id": str(mid), "priority": priority}
        if metadata:
            out["metadata"] = metadata
        return _reply(200, out)

    def ack_batch(self, queue_name: str) -> bytes:
        """Acknowledge up to 1000 messages in one replicated operation."""
        ids = _batch_ids(json_body("AckBatchInputBody")["ids"])
        return _settled("acked", ids, self.svc.ack_ids(queue_name, ids))

    def nack_batch(self, queue_name: str) -> bytes:
        """Give up to 1000 messages back in one replicated operation."""
        body = json_body("NackBatchInputBody")
        ids = _batch_ids(body["ids"])
        failed = self.svc.nack_ids(queue_name, ids, body.get("priority") or 0,
                                   body.get("metadata"))
        return _settled("nacked", ids, failed)

    def touch(self, queue_name: str, id: str) -> bytes:
        mid = _path_id(id)
        self.svc.touch(queue_name, mid)
        return _reply(200, {"status": "TOUCHED", "id": str(mid)})

    def update_priority(self, queue_name: str, id: str) -> bytes:
        mid = _path_id(id)
        priority = json_body("UpdatePriorityInputBody")["priority"]
        self.svc.update_priority(queue_name, mid, priority)
        return _reply(200, {"status": "UPDATED", "id": str(mid), "priority": priority})

    def generate_ids(self) -> bytes:
        count = json_body("GenerateIdsInputBody")["number"]
        return _reply(200, {"ids": [str(i) for i in self.svc.generate_ids(count)]})

    def backup(self) -> Any:
        since = int(json_body("BackupInputBody", required=False).get("since", 0))
        last, chunks = self.svc.backup(since)
        response = _CURRENT.get()
        response.status = 200
        response.content_type = "application/octet-stream"
        response.set_header("X-Last-Version", str(last))
        kind = "full" if since == 0 else f"incremental-{since}"
        response.set_header("Content-Disposition",
                            f'attachment; filename="doq-{kind}-to-{last}.bak"')
        return chunks

    def restore(self) -> bytes:
        call = _CURRENT.get()
        ctype = call.request_content_type.split(";")[0].strip()
        if ctype == "multipart/form-data":
            try:
                uploads = call.request.files.getall("file")
            except bottle.HTTPError as exc:          # bottle's multipart limits
                raise HttpProblem(400, "validation failed", [{
                    "message": f"cannot read the multipart body: {exc.body}",
                    "location": "body"}]) from None
            files = [upload.file for upload in uploads]
            if not files:
                raise HttpProblem(422, "validation failed", [{
                    "message": "expected the backup in the multipart file field 'file'",
                    "location": "body.file"}])
        elif ctype in ("application/octet-stream", ""):
            files = [_spool_body()]
        else:
            raise HttpProblem(415, "validation failed", [{
                "message": f"unsupported content type {ctype!r}: send the backup as "
                           "multipart/form-data (field 'file') or application/octet-stream",
                "location": "header.Content-Type", "value": ctype}])
        try:
            result = self.svc.restore(files)
        finally:
            for f in files:
                f.close()
        return _reply(200, {"status": "SUCCEDED", **result})

    def internal_status(self) -> bytes:
        return _reply(200, self.svc.status())

    def internal_state(self) -> bytes:
        return _reply(200, self.svc.state_digest())

    def servers(self) -> bytes:
        local = _CURRENT.get().query("local") in TRUE_VALUES
        servers = self.members.local_servers() if local else \
            self.members.servers(_credentials())
        return _reply(200, {"servers": [
            {"id": s.id, "addr": s.addr, "leader_addr": s.leader_addr, "is_leader": s.is_leader,
             "suffrage": s.suffrage, "http_addr": s.http_addr, "grpc_addr": s.grpc_addr,
             "lag": s.lag, "connected": s.connected} for s in servers]})

    def join(self) -> bytes:
        body = json_body("JoinInputBody")
        self.members.check_join(body["id"], body["addr"])
        if self.members.leader_http() is not None:       # a follower: the leader decides
            return _relay(*self.members.forward("/API/v1/cluster/join", body, _credentials()))
        self.members.join(body["id"], body["addr"], body.get("http_addr", ""),
                          body.get("grpc_addr", ""))
        return _reply(200, {"id": body["id"], "addr": body["addr"]})

    def leave(self) -> bytes:
        body = json_body("LeaveInputBody")
        if self.members.leader_http() is not None:
            return _relay(*self.members.forward("/API/v1/cluster/leave", body, _credentials()))
        self.members.leave(body["id"])
        return _reply(200, {"id": body["id"]})


ROUTES: list[tuple[str, str, str, str]] = [     # method, path, op id, handler
    ("POST", "/API/v1/ids", "generate-id", "generate_ids"),
    ("POST", "/db/backup", "db-backup", "backup"),
    ("POST", "/db/restore", "db-restore", "restore"),
    ("GET", "/API/v1/cluster/servers", "cluster-servers", "servers"),
    ("POST", "/API/v1/cluster/join", "cluster-join", "join"),
    ("POST", "/API/v1/cluster/leave", "cluster-leave", "leave"),
    ("POST", "/API/v1/queues", "create-queue", "create_queue"),
    ("GET", "/API/v1/queues", "queues", "list_queues"),
    ("GET", "/API/v1/queues/<queue_name>", "queue-info", "queue_info"),
    ("PUT", "/API/v1/queues/<queue_name>", "update-queue", "update_queue"),
    ("DELETE", "/API/v1/queues/<queue_name>", "delete-queue", "delete_queue"),
    ("POST", "/API/v1/queues/<queue_name>/messages", "enqueue", "enqueue"),
    ("POST", "/API/v1/queues/<queue_name>/messages/batch", "enqueue-batch", "enqueue_batch"),
    ("GET", "/API/v1/queues/<queue_name>/messages", "dequeue", "dequeue"),
    ("POST", "/API/v1/queues/<queue_name>/messages/ack", "ack-batch", "ack_batch"),
    ("POST", "/API/v1/queues/<queue_name>/messages/nack", "nack-batch", "nack_batch"),
    ("GET", "/API/v1/queues/<queue_name>/messages/<id>", "get", "get"),
    ("DELETE", "/API/v1/queues/<queue_name>/messages/<id>", "delete", "delete"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/ack", "ack", "ack"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/nack", "nack", "nack"),
    ("POST", "/API/v1/queues/<queue_name>/messages/<id>/touch", "touch", "touch"),
    ("PUT", "/API/v1/queues/<queue_name>/messages/<id>/priority", "update-priority",
     "update_priority"),
    # diagnostics (not part of the DOQ wire contract)
    ("GET", "/internal/status", "internal-status", "internal_status"),
    ("GET", "/internal/state", "internal-state", "internal_state"),
]


def _credentials() -> dict[str, str]:
    """The caller's Authorization header, passed on when a request is forwarded to the leader
    (which checks it again); nodes sign forwarded requests with the cluster secret too."""
    header = _CURRENT.get().environ.get("HTTP_AUTHORIZATION")
    return {"Authorization": header} if header else {}


def _spool_body() -> IO[bytes]:
    """The request body in a temporary file (any size; memory stays bounded)."""
    call = _CURRENT.get()
    source = call.environ["wsgi.input"]
    remaining = None if call.chunked else call.content_length
    spool = tempfile.TemporaryFile()
    try:
        while remaining is None or remaining > 0:
            block = source.read(1 << 20 if remaining is None else min(1 << 20, remaining))
            if not block:
                break
            spool.write(block)
            if remaining is not None:
                remaining -= len(block)
    except (OSError, ValueError) as exc:
        spool.close()
        raise HttpProblem(400, "validation failed", [
            {"message": f"cannot read the request body: {exc}", "location": "body"}]) from None
    spool.seek(0)
    return spool


def _check_path_name(kwargs: dict[str, str]) -> None:
    name = kwargs.get("queue_name")
    if name is not None and rules.name_problem(name) is NameProblem.TOO_LONG:
        _check_name(name, "path.queue_name")


def _guard(op_id: str, handler: Callable[..., bytes], auth: Authorizer) -> Callable[..., bytes]:
    rule = ROUTE_RULES[op_id]

    def guarded(**kwargs: str) -> bytes:
        try:
            auth.authorize(_CURRENT.get(), rule, kwargs.get("queue_name"))
            _check_path_name(kwargs)
            return handler(**kwargs)
        except HttpProblem as exc:
            return _problem(exc)
        except (Unauthenticated, PermissionDenied) as exc:
            return _problem(_auth_problem(exc))
        except DoqError as exc:
            return _problem(_problem_for(op_id, exc))
        except Exception:  # noqa: BLE001 - a bug: answer 500, keep serving
            log.exception("unhandled error in %s", op_id)
            return _problem(HttpProblem(500, FAILURES[op_id][1],
                                        [{"message": "internal server error"}]))
    guarded.__name__ = handler.__name__
    return guarded


def _call_api(environ: dict[str, Any], handler: Callable[..., Any],
              args: dict[str, str]) -> tuple[Call, Any]:
    """Run an API handler for ``environ``: (the call with its status and headers, body)."""
    call = Call(environ)
    token = _CURRENT.set(call)
    try:
        return call, handler(**args)
    finally:
        _CURRENT.reset(token)


def _through_bottle(handler: Callable[..., Any]) -> Callable[..., Any]:
    """The same handler as a Bottle callback (the Middleware normally calls it directly)."""
    def callback(**args: str) -> Any:
        call, body = _call_api(bottle.request.environ, handler, args)
        bottle.response.status = call.status
        bottle.response.content_type = call.content_type
        for name, value in call.headers:
            bottle.response.add_header(name, value)
        return body
    return callback


def build_app(service: Service, membership: Membership, metrics: Metrics | None,
              webui_dir: str, auth: Authorizer | None = None) -> bottle.Bottle:
    bottle.BaseRequest.MEMFILE_MAX = MAX_BODY + 1
    auth = auth or Authorizer(None, None)
    app = bottle.Bottle()
    app.config["catchall"] = False           # errors reach _guard, not Bottle's error page
    app.config["json.disable"] = True        # handlers return bytes themselves
    api = Api(service, membership, auth)
    # Bottle routes every request; the API's handlers are then called directly by the
    # Middleware (see _call_api), Bottle's own request handling only serves the rest.
    app.doq_api = {}
    for method, path, op_id, name in ROUTES:
        handler = _guard(op_id, getattr(api, name), auth)
        app.doq_api[op_id] = handler
        app.route(path, method, _through_bottle(handler), name=op_id)
    app.route("/healthz", "GET", lambda: _plain("OK"))
    if metrics is not None:
        app.route("/metrics", "GET", lambda: _metrics(metrics, auth))
    _add_docs(app, webui_dir)
    _add_static(app, webui_dir)
    for status in (400, 403, 413, 414):
        app.error(status)(_bottle_error(status))
    app.error(404)(lambda err: _problem(HttpProblem(404, REASONS[404])))
    app.error(405)(_not_allowed_or_unknown(app))
    return app


def _bottle_error(status: int) -> Callable[[Any], bytes]:
    """Bottle's own error pages (static files outside the root, multipart limits ...) as
    problem details, like every other error."""
    def handler(err: Any) -> bytes:
        body = getattr(err, "body", "") or REASONS[status]
        return _problem(HttpProblem(status, REASONS[status],
                                    [{"message": str(body)[:300]}]))
    return handler


def _not_allowed_or_unknown(app: bottle.Bottle) -> Callable[[Any], bytes]:
    """405 for a known path; 404 for a path only the GET catch-all (admin UI) matched."""
    known = bottle.Router()
    for rule in dict.fromkeys(r.rule for r in app.routes if "<path:path>" not in r.rule
                              and r.rule != "/"):
        known.add(rule, "ANY", None)

    def handler(err: Any) -> bytes:
        try:
            known.match({"PATH_INFO": bottle.request.path, "REQUEST_METHOD": "GET"})
        except bottle.HTTPError:
            bottle.response.headers.pop("Allow", None)
            return _problem(HttpProblem(404, REASONS[404]))
        return _problem(HttpProblem(405, REASONS[405]))
    return handler


def _plain(text: str) -> bytes:
    bottle.response.content_type = "text/plain; charset=utf-8"
    return text.encode()


def _metrics(metrics: Metrics, auth: Authorizer) -> bytes:
    try:
        auth.authorize(Call(bottle.request.environ), METRICS_RULE)
    except (Unauthenticated, PermissionDenied) as exc:
        return _problem(_auth_problem(exc))
    bottle.response.content_type = CONTENT_TYPE_LATEST
    return generate_latest(metrics.registry)


def _add_docs(app: bottle.Bottle, root: str) -> None:
    """/openapi.json and friends, generated once from ROUTES; /docs renders them with the
    vendored Swagger UI (no network needed)."""
    doc = openapi.document(ROUTES, SCHEMAS, FAILURES)
    older = openapi.downgrade(doc)
    bodies = {
        "/openapi.json": (json.dumps(doc, indent=1).encode(), "application/json"),
        "/openapi-3.0.json": (json.dumps(older, indent=1).encode(), "application/json"),
        "/openapi.yaml": (yaml.safe_dump(doc, sort_keys=False).encode(),
                          "application/yaml"),
        "/openapi-3.0.yaml": (yaml.safe_dump(older, sort_keys=False).encode(),
                              "application/yaml"),
    }
    for path, (body, ctype) in bodies.items():
        def serve(body: bytes = body, ctype: str = ctype) -> bytes:
            bottle.response.content_type = ctype
            return body
        app.route(path, "GET", serve)
    app.route("/docs", "GET", lambda: bottle.static_file("docs.html", root=root))


def _add_static(app: bottle.Bottle, root: str) -> None:
    index = os.path.join(root, "index.html")

    def asset(path: str) -> Any:
        return bottle.static_file(path, root=os.path.join(root, "assets"))

    def spa(path: str = "") -> Any:
        return bottle.static_file("index.html", root=root) if os.path.exists(index) \
            else _plain("DOQ")

    app.route("/assets/<path:path>", "GET", asset)
    app.route("/", "GET", spa)
    app.route("/<path:path>", "GET", spa)


class Middleware:
    """Probes first; then cross-site refusals and CORS, security headers, a request id and
    HTTP metrics on every response."""

    def __init__(self, app: bottle.Bottle, service: Service, metrics: Metrics | None,
                 auth: Authorizer | None = None) -> None:
        self.app = app
        self.service = service
        self.metrics = metrics
        self.auth = auth or Authorizer(None, None)

    def __call__(self, environ: dict[str, Any],
                 start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path == "/livez":
            return self._probe(start_response, True, "OK")
        if path == "/readyz":
            return self._probe(start_response, *self.service.readiness())
        cors = self.auth.cors_headers(environ)
        if cors and environ.get("REQUEST_METHOD") == "OPTIONS":
            start_response("204 No Content", cors + SECURITY_HEADERS)
            return [b""]
        refused = self.auth.cross_site_problem(environ)
        if refused:
            denied = problem_body(403, "cross-origin request refused",
                                  [{"message": refused, "location": "header.Origin"}],
                                  "permission_denied")
            start_response("403 Forbidden", [("Content-Type", "application/problem+json"),
                                              ("Content-Length", str(len(denied)))]
                           + SECURITY_HEADERS)
            return [denied]
        started = time.perf_counter()
        seen: list[str] = []

        def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            headers.extend(cors)
            headers.extend(SECURITY_HEADERS)
            headers.append(("X-Request-Id", _request_id()))
            seen.append(status)
            return start_response(status, headers, exc_info)

        gauge = self.metrics.in_progress(environ.get("REQUEST_METHOD", "")) \
            if self.metrics is not None and path != "/metrics" else None
        if gauge is not None:
            gauge.inc()
        try:
            body = self._dispatch(environ, start)
        finally:
            if gauge is not None:
                gauge.dec()
        if seen and path != "/metrics":
            elapsed = time.perf_counter() - started
            if self.metrics is not None:
                route = environ.get("bottle.route")
                template = route.rule if route is not None else "<unmatched>"
                self.metrics.observe_http(environ["REQUEST_METHOD"], template,
                                          int(seen[0][:3]), elapsed)
            if access_log.isEnabledFor(logging.DEBUG):
                access_log.debug("%s %s %s %.2fms", environ["REQUEST_METHOD"], path,
                                 seen[0][:3], elapsed * 1e3)
        return body

    def _dispatch(self, environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        """An API route: its handler, called directly; anything else: Bottle."""
        # Bottle routes on the path as UTF-8 (PEP 3333 hands it over as latin-1).
        path = environ.get("PATH_INFO", "") or "/"
        decoded = path.encode("latin1").decode("utf8", "ignore")
        try:
            route, args = self.app.router.match(
                {"PATH_INFO": decoded, "REQUEST_METHOD": environ.get("REQUEST_METHOD", "GET")})
        except bottle.HTTPError:
            route = None                        # Bottle answers 404 / 405 its way
        handler = self.app.doq_api.get(route.name) if route is not None else None
        if handler is None:
            return self.app(environ, start)     # type: ignore[no-any-return]
        environ["bottle.raw_path"], environ["PATH_INFO"] = path, decoded
        environ["bottle.route"] = route
        call, body = _call_api(environ, handler, args)
        status = call.status
        start(f"{status} {bottle.HTTP_CODES.get(status, 'Unknown')}",
              call.response_headers(body))
        return [body] if isinstance(body, bytes) else body  # type: ignore[no-any-return]

    @staticmethod
    def _probe(start_response: Callable[..., Any], ok: bool, text: str) -> list[bytes]:
        start_response("200 OK" if ok else "503 Service Unavailable",
                       [("Content-Type", "text/plain; charset=utf-8")])
        return [text.encode()]


"""The HTTP/1.1 server underneath Bottle (L5): gevent's StreamServer and ``httptools``.

gevent.pywsgi spent more of a node's CPU on each request than the route did (reading lines
through a file object, parsing headers, building the environ in several passes, formatting
the response). This server keeps one greenlet per connection and one ``httptools`` parser
(the C parser of Node.js) per connection, builds the WSGI environ in one pass and answers in
one ``send`` where the body is known. It serves any WSGI application; DOQ's is Bottle behind
:class:`doq_lib.http.app.Middleware`.

What it does for a request:

* **Framing** by the parser: ``Content-Length`` and chunked bodies (decoded before the
  application sees them; ``Transfer-Encoding`` stays in the environ, as pywsgi left it), and
  refusals of ambiguous framing (two ``Content-Length`` values, ``Content-Length`` with
  ``Transfer-Encoding``, a transfer coding other than chunked) before anything reaches the
  application.
* **Bodies are streamed**: ``wsgi.input`` reads from the socket as the application asks, so a
  large upload (a restore) never sits in memory; ``Expect: 100-continue`` is answered when the
  application first reads. What the application leaves unread is discarded (up to 1 MiB, then
  the connection is closed) before the next request on the connection.
* **Limits**: request target at most 8 KiB (414), headers at most 64 KiB and 100 fields (431),
  a path that is not UTF-8 once unescaped (400: Bottle would drop the bytes and route it
  elsewhere);
  a request that cannot be parsed gets 400 (501 for an unsupported transfer coding). Every
  such answer is a problem+json body, and the connection is closed after it.
* **Responses**: a body of known size leaves with the status line and headers in one
  ``send`` with a ``Content-Length``; a streamed body (backups) uses chunked encoding on
  HTTP/1.1, or ends with the connection on HTTP/1.0. ``HEAD`` answers carry no body. The
  ``Date`` header is formatted once a second.
* **Keep-alive** as HTTP/1.1 says (HTTP/1.0 only with ``Connection: keep-alive``);
  pipelined requests are answered in order.
* ``environ["doq.socket"]`` is the connection's socket: a long-poll watches it to notice a
  client that left.
* **Timeouts** (:class:`Limits`, from ``http.*``): a new connection's first byte must come
  within ``header_timeout`` of the accept (else it is closed quietly), a request's line and
  headers within ``header_timeout`` of their first byte, a body may pause at most
  ``body_timeout`` between bytes, and a whole request must arrive within
  ``request_timeout`` of its first byte plus a second per ``min_body_rate`` bytes of body
  received (all three: 408 and close; a body the application is reading raises
  ``TimeoutError`` there, which the API answers with 408), so a client trickling bytes holds
  a connection for a bounded time whatever its pace; a kept-alive connection waits at most
  ``idle_timeout`` for its next request (then closed quietly); a TLS handshake gets
  ``header_timeout``. Beyond ``max_connections`` open connections, one more is answered 503
  and closed.
* **Bodies held**: the body bytes of requests not yet answered are counted for the whole
  server, each request up to ``MAX_BODY`` (what a handler may hold in memory; an upload that
  is spooled to disk counts no more); the request whose bytes would pass
  ``http.max_held_bytes`` is answered 503 (the handler reading it gets :class:`Refused`) and
  its connection closed, so many clients holding large bodies open cannot grow the node's
  memory without bound.
* Accepted sockets have Nagle disabled (``TCP_NODELAY`` is set on the listener and
  inherited): small answers must not wait ~40 ms for an ACK.
"""
from __future__ import annotations

import logging
import socket
import ssl
import sys
import time
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any, Callable, Iterable
from urllib.parse import unquote_to_bytes

import httptools
from gevent import socket as gsocket
from gevent.server import StreamServer

from doq_lib.http.framing import (
    ENVIRON_KEYS,
    MAX_DISCARD,
    RECV_SIZE,
    ParsedRequest,
    Parser,
    Refused,
    environ_key,
    raw_problem_response,
)
from doq_lib.log import RateLimited, handshake_or_refuse
from doq_lib.rules import MAX_REQUEST as MAX_BODY
from doq_lib.sockets import linger, send_all

log = logging.getLogger(__name__)
_REFUSED_TLS = RateLimited(log)             # failed handshakes: a few lines a minute at most

_date: list[Any] = [0, b""]     # (unix second, its Date header value)
LINGER_SECONDS = 2.0            # a refused client's unread bytes: read and dropped this long
SLOW_LINGER_SECONDS = 0.5       # ... a client refused for being slow (408): this long



@dataclass(frozen=True)
class Limits:
    """How long a client may take, and how many may be connected (``http.*`` settings)."""

    header_timeout: float = 10.0      # seconds from a request's first byte to its last header
    body_timeout: float = 30.0        # seconds a body may pause between bytes
    idle_timeout: float = 120.0       # seconds a kept-alive connection waits for a request
    max_connections: int = 10000
    request_timeout: float = 60.0     # seconds for a whole request from its first byte, ...
    min_body_rate: int = 8192         # ... plus one per this many body bytes received
    max_held_bytes: int = 256 << 20   # body bytes held for requests not yet answered, all


# Response headers the server handles itself, by every spelling an application may use.
_FRAMING = {spelling: name for name in ("content-length", "date", "connection",
                                        "transfer-encoding")
            for spelling in (name, name.title(), name.upper(), name.capitalize())}
_FRAMING_LENGTHS = {len(name) for name in _FRAMING}


def _date_header() -> bytes:
    now = int(time.time())
    if _date[0] != now:
        _date[0], _date[1] = now, formatdate(now, usegmt=True).encode()
    value: bytes = _date[1]
    return value


class _Input:
    """``wsgi.input``: the body as the parser decodes it, read from the socket on demand."""

    def __init__(self, conn: "HttpConnection", request: ParsedRequest,
                 expect_continue: bool) -> None:
        self._conn = conn
        self._request = request
        self._continue = expect_continue
        self._buffer = b""

    def _more(self) -> bool:
        """Make more body bytes available; False at the end of the body."""
        request = self._request
        if request.body:
            self._buffer += b"".join(request.body)
            request.body.clear()
            return True
        if request.complete:
            return False
        if self._continue:
            self._continue = False
            self._conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
        if self._conn.receive() and self._conn.refused is None:
            return True
        refused = self._conn.refused
        if refused is not None and refused.status == 408:
            raise TimeoutError(refused.message)
        if refused is not None and refused.status == 503:
            raise refused                         # the node's body budget (_count)
        return bool(request.body)

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            while self._more():
                pass
            data, self._buffer = self._buffer, b""
            return data
        while len(self._buffer) < size and self._more():
            pass
        data, self._buffer = self._buffer[:size], self._buffer[size:]
        return data

    def readline(self, size: int | None = -1) -> bytes:
        while b"\n" not in self._buffer and (size is None or size < 0 or
                                             len(self._buffer) < size) and self._more():
            pass
        end = self._buffer.find(b"\n") + 1 or len(self._buffer)
        if size is not None and size >= 0:
            end = min(end, size)
        data, self._buffer = self._buffer[:end], self._buffer[end:]
        return data

    def readlines(self, hint: int = -1) -> list[bytes]:
        return list(iter(self.readline, b""))

    def __iter__(self) -> Any:
        return iter(self.readline, b"")


class HttpConnection:
    def __init__(self, sock: Any, address: Any, server: "HttpServer") -> None:
        self.sock = sock
        self.address = address
        self.server = server
        self.parsing = Parser(self._count)
        self.counted = 0                           # body bytes counted for its requests
        self.closed = False
        self.refused: Refused | None = None
        self.upgrade = False
        self.limits = server.limits
        self.timeout: float | None = None          # the socket's, set only when it changes
        self.accepted = time.monotonic()           # a silent new connection's deadline

    # -- socket --------------------------------------------------------------------------------
    def receive(self) -> bool:
        """Read and parse more bytes; False when no more can come (closed, or refused)."""
        if self.closed or self.refused is not None or self.upgrade:
            return False
        timeout, phase = self._wait()
        if timeout != self.timeout:
            self.sock.settimeout(timeout)
            self.timeout = timeout
        try:
            data = self.sock.recv(RECV_SIZE)
        except TimeoutError:
            return self._timed_out(phase)
        except OSError:
            data = b""
        if not data:
            self.closed = True
            return False
        try:
            self.parsing.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__ or exc.__cause__
            self.refused = cause if isinstance(cause, Refused) else \
                Refused(400, f"the request cannot be parsed ({exc})")
        except httptools.HttpParserUpgrade:
            self.upgrade = True              # served as plain HTTP, then the connection closes
        except httptools.HttpParserInvalidMethodError:
            self.refused = Refused(400, "the request line cannot be parsed (invalid method)")
        except httptools.HttpParserError as exc:
            text = str(exc)
            if "Transfer-Encoding" in text and "Content-Length" not in text:
                self.refused = Refused(501, "unsupported transfer coding: only "
                                        "'Transfer-Encoding: chunked' is supported "
                                        "(send the body as it is, or chunked)")
            else:
                self.refused = Refused(400, f"the request cannot be parsed ({text})")
        return True

    def _count(self, request: ParsedRequest, size: int) -> None:
        """(parser) ``size`` more body bytes of ``request``: counted up to MAX_BODY per
        request (what a handler holds in memory at most; a restore spools the rest to disk)
        until it is answered; past the node's budget the request is refused with 503."""
        size = min(size, MAX_BODY - request.counted)
        if size <= 0:
            return
        server = self.server
        if server.held + size > self.limits.max_held_bytes:
            raise Refused(503, f"the node holds {server.held} bytes of request bodies not yet "
                               f"answered (at most {self.limits.max_held_bytes}, "
                               "http.max_held_bytes): retry later")
        request.counted += size
        self.counted += size
        server.held += size

    def _uncount(self, request: ParsedRequest) -> None:
        self.counted -= request.counted
        self.server.held -= request.counted
        request.counted = 0

    def _wait(self) -> tuple[float, str]:
        """How long the next read may wait, and for what: a new connection's first byte
        (its header deadline runs from the accept), the next request (idle), the rest of a
        request's headers (until their deadline) or more of its body (a pause, and the
        whole request's deadline, whichever comes first)."""
        current = self.parsing.current
        limits = self.limits
        now = time.monotonic()
        if current is None:
            return max(round(self.accepted + limits.header_timeout - now, 3), 0.001), "silent"
        if current.complete:
            return limits.idle_timeout, "idle"
        whole = current.started + limits.request_timeout + \
            current.received / limits.min_body_rate - now
        if not current.headers_done:
            left = min(current.started + limits.header_timeout - now, whole)
            return max(round(left, 3), 0.001), "headers" if left < whole else "request"
        if whole < limits.body_timeout:
            return max(round(whole, 3), 0.001), "request"
        return limits.body_timeout, "body"

    def _timed_out(self, phase: str) -> bool:
        limits = self.limits
        if phase in ("idle", "silent"):
            self.closed = True                   # quietly: nothing was asked
        elif phase == "headers":
            self.refused = Refused(408, "the request line and headers did not arrive within "
                                         f"{limits.header_timeout:g} s (http.header_timeout)")
        elif phase == "request":
            self.refused = Refused(408, "the request did not arrive within "
                                         f"{limits.request_timeout:g} s plus 1 s per "
                                         f"{limits.min_body_rate} bytes of body "
                                         "(http.request_timeout, http.min_body_rate)")
        else:
            self.refused = Refused(408, "the request body paused for more than "
                                         f"{limits.body_timeout:g} s (http.body_timeout)")
        return False

    def send(self, data: bytes) -> None:
        send_all(self.sock, data)

    # -- requests ------------------------------------------------------------------------------
    def serve(self) -> None:
        try:
            self._serve()
            if self.refused is not None and not self.closed:
                # the client may still be sending a body: its answer must not be lost to a
                # reset; a slow client's (408) connection is freed sooner
                linger(self.sock, SLOW_LINGER_SECONDS if self.refused.status == 408 else
                       LINGER_SECONDS, MAX_DISCARD)
        finally:                       # requests never answered give their bytes back too
            self.server.held -= self.counted
            self.counted = 0

    def _serve(self) -> None:
        ready = self.parsing.ready
        while True:
            if not ready:
                if self.refused is not None:
                    self._refuse(self.refused)
                    return
                if not self.receive() and self.refused is None:
                    return                              # the client closed the connection
                continue
            request = ready.popleft()
            if self.refused is not None and not request.complete and \
                    self.parsing.current is request:
                self._refuse(self.refused)              # its own body cannot be parsed
                return
            if not self._answer(request):
                return

    def _refuse(self, refused: Refused) -> None:
        try:
            self.send(raw_problem_response(refused.status, refused.message))
        except OSError:
            pass

    def _environ(self, request: ParsedRequest) -> dict[str, Any]:
        target = request.target.decode("latin-1")
        path, _, query = target.partition("?")
        if path.startswith(("http://", "https://")):        # absolute form
            path = "/" + path.split("/", 3)[3] if path.count("/") >= 3 else "/"
        if "%" in path or not path.isascii():
            raw_path = unquote_to_bytes(path)
            try:
                raw_path.decode("utf-8")     # Bottle would drop what is not UTF-8, silently
            except UnicodeDecodeError:
                raise Refused(400, "the request path is not valid UTF-8 (percent-escapes "
                                    "must encode UTF-8 text)") from None
            path = raw_path.decode("latin-1")
        server = self.server
        env = {
            "REQUEST_METHOD": request.method, "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": query,
            "SERVER_NAME": server.doq_server_name, "SERVER_PORT": server.doq_server_port,
            "SERVER_PROTOCOL": "HTTP/" + request.version,
            "REMOTE_ADDR": str(self.address[0]) if self.address else "",
            "REMOTE_PORT": str(self.address[1]) if self.address else "",
            "wsgi.version": (1, 0), "wsgi.url_scheme": server.scheme,
            "wsgi.errors": sys.stderr, "wsgi.multithread": False,
            "wsgi.multiprocess": False, "wsgi.run_once": False,
            "wsgi.input_terminated": True, "doq.socket": self.sock,
        }
        keys = ENVIRON_KEYS
        for raw_name, raw_value in request.headers:
            key = keys.get(raw_name)
            if key is None:
                key = environ_key(raw_name)
            if not key:
                continue                       # never let a header pose as CONTENT_LENGTH etc.
            value = raw_value.decode("latin-1").strip()
            if key in env:
                env[key] += ("; " if key == "HTTP_COOKIE" else ",") + value
            else:
                env[key] = value
        expect = env.get("HTTP_EXPECT", "").lower() == "100-continue" and \
            request.version == "1.1"
        env["wsgi.input"] = _Input(self, request, expect and not request.complete)
        return env

    def _answer(self, request: ParsedRequest) -> bool:
        """Run the application for ``request`` and send its answer; False: close."""
        try:
            env = self._environ(request)
        except Refused as refused:
            self._refuse(refused)
            return False
        state: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            if exc_info is not None and state.get("sent"):
                raise exc_info[1].with_traceback(exc_info[2])
            state["status"], state["headers"] = status, headers
            return lambda data: state.setdefault("writes", []).append(data)

        result: Any = None
        try:
            result = self.server.application(env, start_response)
            keep_alive = self._respond(request, state, result,
                                       request.keep_alive and not self.upgrade)
        except OSError:
            return False
        except Exception:  # noqa: BLE001 - the application's own bug: 500, keep the node up
            log.exception("the application failed on %s %s", request.method, env["PATH_INFO"])
            if not state.get("sent"):
                self._refuse(Refused(500, "internal server error"))
            return False
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
            self._uncount(request)
        return keep_alive and self._finish_body(request)

    def _respond(self, request: ParsedRequest, state: dict[str, Any], result: Iterable[bytes],
                 keep_alive: bool) -> bool:
        """Send the answer; False when the connection must close after it."""
        body_parts: list[bytes] = list(state.pop("writes", []))
        known = isinstance(result, (list, tuple))
        if known:
            body_parts.extend(result)
        iterator = None if known else iter(result)
        if iterator is not None:                  # the first part decides when headers go
            for part in iterator:
                if part:
                    body_parts.append(part)
                    break
            else:
                known, iterator = True, None
        if "status" not in state:
            raise RuntimeError("the application did not call start_response")
        status: str = state["status"]
        lines = ["HTTP/1.1 ", status, "\r\n"]
        length = None
        has_date = False
        for name, value in state["headers"]:
            framing = _FRAMING.get(name)
            if framing is None and len(name) in _FRAMING_LENGTHS:
                framing = _FRAMING.get(name.lower())
            if framing is None:
                lines += (name, ": ", value, "\r\n")
                continue
            if framing == "content-length":
                length = value.strip()            # written below, once
            elif framing == "date":
                has_date = True
                lines += (name, ": ", value, "\r\n")
            elif framing == "connection" and value.strip().lower() == "close":
                keep_alive = False
            # transfer-encoding: the server decides the framing
        head = bytearray("".join(lines).encode("latin-1"))
        if not has_date:
            head += b"Date: "
            head += _date_header()
            head += b"\r\n"
        no_body = request.method == "HEAD" or status[:1] == "1" or status[:3] in ("204", "304")
        chunked = False
        if length is not None:
            head += b"Content-Length: " + length.encode("latin-1") + b"\r\n"
        elif known:
            if not no_body or request.method == "HEAD":
                head += b"Content-Length: %d\r\n" % sum(len(p) for p in body_parts)
        elif request.version == "1.1":
            chunked = True
            head += b"Transfer-Encoding: chunked\r\n"
        else:
            keep_alive = False                    # HTTP/1.0: the body ends with the connection
        if not keep_alive:
            head += b"Connection: close\r\n"
        elif request.version == "1.0":
            head += b"Connection: keep-alive\r\n"
        head += b"\r\n"
        state["sent"] = True
        if no_body:
            self.send(bytes(head))
            return keep_alive
        if not chunked:
            for part in body_parts:
                head += part
            self.send(bytes(head))
            if iterator is not None:
                for part in iterator:
                    if part:
                        self.send(part)
            return keep_alive
        for part in body_parts:
            head += b"%x\r\n" % len(part) + part + b"\r\n"
        self.send(bytes(head))
        assert iterator is not None
        for part in iterator:
            if part:
                self.send(b"%x\r\n" % len(part) + part + b"\r\n")
        self.send(b"0\r\n\r\n")
        return keep_alive

    def _finish_body(self, request: ParsedRequest) -> bool:
        """Skip what the application left of the request body; False: close instead."""
        discarded = 0
        while not request.complete:
            discarded += request.body_bytes
            request.body.clear()
            request.body_bytes = 0
            if discarded > MAX_DISCARD or not self.receive() or \
                    (self.refused is not None and self.parsing.current is request):
                return False
        request.body.clear()
        return True


class HttpServer(StreamServer):  # type: ignore[misc]  # gevent has no annotations
    """A WSGI server: one greenlet and one parser per connection."""

    def __init__(self, listener: socket.socket, application: Any,
                 ssl_context: ssl.SSLContext | None = None, limits: Limits = Limits()) -> None:
        if ssl_context is not None:
            super().__init__(listener, self._handle, ssl_context=ssl_context)
        else:
            super().__init__(listener, self._handle)
        self.application = application
        self.limits = limits
        self.connections = 0
        self.held = 0                   # body bytes held for requests not yet answered
        self.scheme = "https" if ssl_context is not None else "http"
        host, port = listener.getsockname()[:2]
        self.doq_server_name = host if host not in ("0.0.0.0", "::") else socket.gethostname()
        self.doq_server_port = str(port)

    def _handle(self, sock: Any, address: Any) -> None:
        self.connections += 1
        try:
            if self.connections > self.limits.max_connections:
                sock.settimeout(self.limits.header_timeout)
                sock.sendall(raw_problem_response(503, "too many open connections (limit "
                                                  f"{self.limits.max_connections}, "
                                                  "http.max_connections): retry later"))
                return
            HttpConnection(sock, address, self).serve()
        except OSError:
            pass
        finally:
            self.connections -= 1
            try:
                sock.close()
            except OSError:
                pass

    def wrap_socket_and_handle(self, client_socket: Any, address: Any) -> Any:
        """HTTPS: a failed handshake is one log line (:func:`doq_lib.log.handshake_or_refuse`)."""
        client_socket.settimeout(self.limits.header_timeout)      # bounds the handshake
        return handshake_or_refuse(
            lambda: super(HttpServer, self).wrap_socket_and_handle(client_socket, address),
            client_socket, address, _REFUSED_TLS, "TLS handshake")


def listener(host: str, port: int) -> socket.socket:
    """A listening socket whose accepted connections have Nagle disabled
    (docs/ARCHITECTURE.md, The HTTP server and the API)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock: socket.socket = gsocket.socket(family, socket.SOCK_STREAM)   # cooperative, always
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(1024)
    return sock


def make_server(sock: socket.socket, app: Any, error_log: Any = None,
                ssl_context: ssl.SSLContext | None = None,
                limits: Limits = Limits()) -> HttpServer:
    """The server for ``app`` on ``sock``; HTTPS with ``ssl_context`` (the handshake runs in
    the connection's greenlet)."""
    return HttpServer(sock, app, ssl_context, limits)

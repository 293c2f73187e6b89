"""The HTTP/1.1 server under Bottle (doq_lib/http/server.py, framing.py), in process:
framing, keep-alive, pipelining, streamed bodies both ways, limits, timeouts and the server's
own refusals.

The server runs in this process's gevent hub; the tests talk to it over loopback with gevent
sockets, byte for byte, so every response's framing is checked exactly."""
from __future__ import annotations

import json
from typing import Any, Callable, Iterator

import gevent
import pytest
from gevent import socket

from doq_lib.http.framing import MAX_DISCARD, MAX_HEAD, MAX_HEADERS, MAX_TARGET
from doq_lib.http.server import Limits, listener, make_server

App = Callable[[dict[str, Any], Callable[..., Any]], Any]


class Server:
    def __init__(self, app: App, limits: Limits | None = None) -> None:
        self.seen: list[dict[str, Any]] = []

        def recording(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            self.seen.append(environ)
            return app(environ, start_response)
        self.http = make_server(listener("127.0.0.1", 0), recording, limits=limits or Limits())
        self.http.start()
        self.port = self.http.server_port

    def connect(self) -> "Client":
        return Client(socket.create_connection(("127.0.0.1", self.port), timeout=5))

    def stop(self) -> None:
        self.http.stop(timeout=1)


def echo_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Answers with what it saw: method, path, query, body and a few headers."""
    body = environ["wsgi.input"].read()
    out = json.dumps({
        "method": environ["REQUEST_METHOD"], "path": environ["PATH_INFO"],
        "query": environ["QUERY_STRING"], "body": body.decode("latin-1"),
        "type": environ.get("CONTENT_TYPE"), "length": environ.get("CONTENT_LENGTH"),
        "te": environ.get("HTTP_TRANSFER_ENCODING"), "x": environ.get("HTTP_X_THING"),
    }).encode()
    start_response("200 OK", [("Content-Type", "application/json"),
                              ("Content-Length", str(len(out)))])
    return [out]


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server(echo_app)
    yield s
    s.stop()


class Client:
    """A raw connection; ``pending`` holds bytes read past the last response."""

    def __init__(self, sock: Any) -> None:
        self.sock = sock
        self.pending = b""

    def sendall(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, size: int) -> bytes:
        if self.pending:
            data, self.pending = self.pending, b""
            return data
        return bytes(self.sock.recv(size))

    def settimeout(self, seconds: float) -> None:
        self.sock.settimeout(seconds)

    def close(self) -> None:
        self.sock.close()


def read_response(sock: Client) -> tuple[int, dict[str, str], bytes, list[str]]:
    """One response off ``sock``: status, headers (lower-case names; repeated names are
    listed in the last element), body (Content-Length, chunked, or until close)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        more = sock.recv(65536)
        if not more:
            raise AssertionError(f"connection closed mid-head: {buf!r}")
        buf += more
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    names: list[str] = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        names.append(name.lower())
        headers[name.lower()] = value.strip()
    if status == 100:
        sock.pending = rest
        return status, headers, b"", names
    if "content-length" in headers:
        length = int(headers["content-length"])
        while len(rest) < length:
            rest += sock.recv(65536)
        body, sock.pending = rest[:length], rest[length:]
    elif headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            while b"\r\n" not in rest:
                rest += sock.recv(65536)
            size_line, _, rest = rest.partition(b"\r\n")
            size = int(size_line, 16)
            while len(rest) < size + 2:
                rest += sock.recv(65536)
            body += rest[:size]
            rest = rest[size + 2:]
            if size == 0:
                break
        sock.pending = rest
    else:
        body = rest
        while True:
            more = sock.recv(65536)
            if not more:
                break
            body += more
    return status, headers, body, names


def closed(sock: Client) -> bool:
    sock.settimeout(3)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_keep_alive_answers_in_order_with_exact_framing(server: Server) -> None:
    sock = server.connect()
    for n in range(3):
        body = b'{"n": %d}' % n
        sock.sendall(b"POST /API/v1/q%%20%d?x=%d HTTP/1.1\r\nHost: h\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\nX-Thing: t\r\n\r\n%s"
                     % (n, n, len(body), body))
        status, headers, raw, names = read_response(sock)
        seen = json.loads(raw)
        assert status == 200 and names.count("content-length") == 1 and "date" in headers
        assert "connection" not in headers
        assert seen == {"method": "POST", "path": f"/API/v1/q {n}", "query": f"x={n}",
                        "body": body.decode(), "type": "application/json",
                        "length": str(len(body)), "te": None, "x": "t"}
    sock.close()


def test_pipelined_requests_are_answered_in_order(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"".join(b"GET /p%d HTTP/1.1\r\nHost: h\r\n\r\n" % n for n in range(5)))
    paths = [json.loads(read_response(sock)[2])["path"] for _ in range(5)]
    assert paths == [f"/p{n}" for n in range(5)]


def test_a_chunked_body_is_decoded_for_the_application(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
    status, _, raw, _ = read_response(sock)
    seen = json.loads(raw)
    assert status == 200 and seen["body"] == "hello world" and seen["te"] == "chunked"


def test_expect_100_continue_is_answered_when_the_body_is_read(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"POST /e HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n"
                 b"Expect: 100-continue\r\n\r\n")
    status, _, _, _ = read_response(sock)
    assert status == 100
    sock.sendall(b"data")
    status, _, raw, _ = read_response(sock)
    assert status == 200 and json.loads(raw)["body"] == "data"


def test_streamed_answers_are_chunked_on_1_1_and_end_with_the_connection_on_1_0() -> None:
    def stream(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterator[bytes]:
        start_response("200 OK", [("Content-Type", "application/octet-stream")])
        yield b""
        for n in range(3):
            yield b"part%d;" % n
    s = Server(stream)
    try:
        sock = s.connect()
        sock.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, body, _ = read_response(sock)
        assert headers["transfer-encoding"] == "chunked" and body == b"part0;part1;part2;"
        sock.sendall(b"GET /s HTTP/1.1\r\nHost: h\r\n\r\n")        # still open
        assert read_response(sock)[2] == b"part0;part1;part2;"
        old = s.connect()
        old.sendall(b"GET /s HTTP/1.0\r\n\r\n")
        status, headers, body, _ = read_response(old)
        assert "transfer-encoding" not in headers and headers["connection"] == "close"
        assert body == b"part0;part1;part2;"
    finally:
        s.stop()


def test_the_server_alone_frames_the_answer_whatever_the_spelling() -> None:
    def framing(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("CONTENT-length", "2"), ("transfer-ENCODING", "chunked"),
                                  ("X-Other", "kept")])
        return [b"ok"]
    s = Server(framing)
    try:
        sock = s.connect()
        sock.sendall(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, body, names = read_response(sock)
        assert body == b"ok" and names.count("content-length") == 1
        assert "transfer-encoding" not in headers and headers["x-other"] == "kept"
    finally:
        s.stop()


def test_http_1_0_closes_unless_asked_to_keep_alive(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /a HTTP/1.0\r\n\r\n")
    assert read_response(sock)[1]["connection"] == "close"
    assert closed(sock)
    sock = server.connect()
    sock.sendall(b"GET /a HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
    assert read_response(sock)[1]["connection"] == "keep-alive"
    sock.sendall(b"GET /b HTTP/1.0\r\n\r\n")
    assert json.loads(read_response(sock)[2])["path"] == "/b"
    sock = server.connect()
    sock.sendall(b"GET /a HTTP/1.1\r\nConnection: close\r\n\r\n")
    assert read_response(sock)[1]["connection"] == "close"
    assert closed(sock)


def test_head_answers_carry_no_body(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\nGET /after HTTP/1.1\r\nHost: h\r\n\r\n")
    buf = b""
    while buf.count(b"\r\n\r\n") < 2 or not buf.endswith(b"}"):
        buf += sock.recv(65536)
    first, _, second = buf.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")
    assert b'"/after"' in second


def test_a_large_body_is_streamed_to_the_application() -> None:
    sizes: list[int] = []

    def counting(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        stream = environ["wsgi.input"]
        total = 0
        while True:
            block = stream.read(65536)
            if not block:
                break
            sizes.append(len(block))
            total += len(block)
        start_response("200 OK", [("Content-Length", str(len(str(total))))])
        return [str(total).encode()]
    s = Server(counting)
    try:
        sock = s.connect()
        size = 8 << 20
        sock.sendall(b"POST /big HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n" % size)
        block = b"x" * 65536
        sender = gevent.spawn(lambda: [sock.sendall(block) for _ in range(size // 65536)])
        status, _, body, _ = read_response(sock)
        sender.join()
        assert status == 200 and int(body) == size
        assert max(sizes) <= 65536 and len(sizes) >= size // 65536
    finally:
        s.stop()


def test_an_unread_body_is_skipped_before_the_next_request() -> None:
    def ignore(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]
    s = Server(ignore)
    try:
        sock = s.connect()
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789"
                     b"GET /y HTTP/1.1\r\nHost: h\r\n\r\n")
        assert read_response(sock)[2] == b"ok"
        assert read_response(sock)[2] == b"ok"
        assert [e["PATH_INFO"] for e in s.seen] == ["/x", "/y"]
        huge = s.connect()                       # too much left unread: closed instead
        huge.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\n"
                     % (MAX_DISCARD * 4) + b"y" * (MAX_DISCARD * 2))
        assert read_response(huge)[0] == 200
        assert closed(huge)
    finally:
        s.stop()


def test_headers_reach_the_environ_like_pywsgi_put_them(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /h HTTP/1.1\r\nHost: h\r\nX-Thing: a\r\nX-Thing: b\r\n"
                 b"Content_Length: 99\r\nX_Thing: spoof\r\n\r\n")
    read_response(sock)
    env = server.seen[-1]
    assert env["HTTP_X_THING"] == "a,b"
    assert "CONTENT_LENGTH" not in env and "HTTP_CONTENT_LENGTH" not in env
    assert env["SERVER_PROTOCOL"] == "HTTP/1.1" and env["REMOTE_ADDR"] == "127.0.0.1"
    assert env["wsgi.url_scheme"] == "http" and env["doq.socket"] is not None


@pytest.mark.parametrize(("request_bytes", "status", "words"), [
    (b"GET /" + b"a" * (MAX_TARGET + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414,
     "request target is longer"),
    (b"GET / HTTP/1.1\r\nX-Big: " + b"b" * (MAX_HEAD + 1) + b"\r\n\r\n", 431,
     "headers are larger"),
    (b"GET / HTTP/1.1\r\n" + b"".join(b"H%d: v\r\n" % i for i in range(MAX_HEADERS + 1))
     + b"\r\n", 431, "header fields"),
    (b"NOT A REQUEST\r\n\r\n", 400, "request line"),
    (b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n", 400, "cannot be parsed"),
    (b"GET / HTTP/1.1\r\nBad Name : x\r\n\r\n", 400, "cannot be parsed"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\nxx", 501, "transfer coding"),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400,
     "Duplicate Content-Length"),
    (b"POST / HTTP/1.1\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
     400, "Content-Length"),
    (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400, "chunk"),
], ids=["target-too-long", "head-too-large", "too-many-headers", "request-line",
        "header-line", "header-name", "gzip", "two-lengths", "length-and-chunked", "bad-chunk"])
def test_the_servers_own_refusals_are_problems_and_close(server: Server, request_bytes: bytes,
                                                         status: int, words: str) -> None:
    sock = server.connect()
    sock.sendall(request_bytes)
    got, headers, body, _ = read_response(sock)
    assert got == status, body
    assert headers["content-type"] == "application/problem+json"
    assert headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["status"] == status and words in problem["errors"][0]["message"]
    # a 501 said "unexpected error occurred"; it says what is not supported
    assert problem["detail"] == ("not implemented" if status == 501 else "malformed request")
    if status == 501:
        assert problem["code"] == "not_implemented"
        assert "only 'Transfer-Encoding: chunked' is supported" in \
            problem["errors"][0]["message"]
    assert closed(sock)
    assert not server.seen, "a refused request never reaches the application"


def test_a_refusal_after_good_pipelined_requests_answers_them_first(server: Server) -> None:
    sock = server.connect()
    sock.sendall(b"GET /fine HTTP/1.1\r\nHost: h\r\n\r\nNOT A REQUEST\r\n\r\n")
    assert read_response(sock)[0] == 200
    status, headers, _, _ = read_response(sock)
    assert status == 400 and headers["connection"] == "close"
    assert closed(sock)


def test_an_application_error_is_a_500_problem_and_the_node_keeps_serving() -> None:
    def broken(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
        if environ["PATH_INFO"] == "/boom":
            raise RuntimeError("a bug")
        start_response("200 OK", [("Content-Length", "2")])
        return [b"ok"]
    s = Server(broken)
    try:
        sock = s.connect()
        sock.sendall(b"GET /boom HTTP/1.1\r\nHost: h\r\n\r\n")
        status, headers, body, _ = read_response(sock)
        assert status == 500 and headers["content-type"] == "application/problem+json"
        assert "a bug" not in body.decode()
        assert closed(sock)
        sock = s.connect()
        sock.sendall(b"GET /fine HTTP/1.1\r\nHost: h\r\n\r\n")
        assert read_response(sock)[2] == b"ok"
    finally:
        s.stop()


# -- timeouts and the connection limit ----------------------------------------------
SHORT = Limits(header_timeout=0.6, body_timeout=0.6, idle_timeout=0.6, max_connections=4)


def body_app(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    """Reads the body; a stalled one is answered 408 as the API does."""
    try:
        body = environ["wsgi.input"].read()
    except TimeoutError as exc:
        out = str(exc).encode()
        start_response("408 Request Timeout", [("Content-Length", str(len(out)))])
        return [out]
    start_response("200 OK", [("Content-Length", str(len(body)))])
    return [body]


@pytest.fixture
def short() -> Iterator[Server]:
    s = Server(body_app, SHORT)
    yield s
    s.stop()


def test_an_idle_kept_alive_connection_is_closed(short: Server) -> None:
    sock = short.connect()
    sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\nok")
    assert read_response(sock)[0] == 200
    started = gevent.get_hub().loop.now()
    assert closed(sock)                                   # no request within idle_timeout
    assert gevent.get_hub().loop.now() - started < 2.5


@pytest.mark.parametrize("pieces", [
    [b"GET / HTTP/1.1\r\nHost: h\r\n"],                       # headers never finished
    [b"G", b"E", b"T", b" ", b"/", b" ", b"H", b"T", b"T", b"P", b"/", b"1", b".", b"1"],
], ids=["unfinished", "a-byte-at-a-time"])
def test_headers_that_do_not_arrive_in_time_get_408(short: Server, pieces: list[bytes]) -> None:
    """Each byte arrives well within the timeout; the deadline counts from the first."""
    sock = short.connect()
    for piece in pieces:
        try:
            sock.sendall(piece)
        except OSError:
            break                                         # already answered and closed
        gevent.sleep(0.1)
    status, headers, body, _ = read_response(sock)
    assert status == 408 and headers["content-type"] == "application/problem+json"
    assert "did not arrive within 0.6 s (http.header_timeout)" in \
        json.loads(body)["errors"][0]["message"]
    assert closed(sock)


@pytest.mark.parametrize("request_bytes", [
    b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nshort",
    b"POST /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
], ids=["shorter-than-content-length", "unfinished-chunked"])
def test_a_body_that_stalls_is_a_timeout_for_the_application(short: Server,
                                                            request_bytes: bytes) -> None:
    sock = short.connect()
    sock.sendall(request_bytes)
    status, _, body, _ = read_response(sock)
    assert status == 408
    assert body == b"the request body paused for more than 0.6 s (http.body_timeout)"
    assert closed(sock)


def test_a_stalled_body_nobody_reads_closes_the_connection(short: Server) -> None:
    """An application that answers without reading: the rest must come before the next
    request can be read; it does not, so the connection closes."""
    s = Server(echo_app_no_read, SHORT)
    try:
        sock = s.connect()
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\nabc")
        assert read_response(sock)[0] == 200
        assert closed(sock)
    finally:
        s.stop()


def echo_app_no_read(environ: dict[str, Any], start_response: Callable[..., Any]) -> list[bytes]:
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


def test_a_connection_that_never_sends_a_byte_is_closed_after_the_header_timeout(
        short: Server) -> None:
    """it was held for idle_timeout (120 s by default)."""
    sock = short.connect()
    started = gevent.get_hub().loop.now()
    assert closed(sock)
    assert gevent.get_hub().loop.now() - started < SHORT.header_timeout + 1.0


TRICKLE = Limits(header_timeout=0.6, body_timeout=0.6, idle_timeout=0.6, max_connections=4,
                 request_timeout=1.2, min_body_rate=1000)


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
def test_a_body_trickled_within_the_pause_limit_is_cut_off_by_the_whole_deadline(
        chunked: bool) -> None:
    """a byte every 1.5 s (each pause below body_timeout) held a connection as
    long as the body lasted; 20 such clients took a node to 503."""
    s = Server(body_app, TRICKLE)
    try:
        sock = s.connect()
        framing = b"Transfer-Encoding: chunked" if chunked else b"Content-Length: 1000"
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\n" + framing + b"\r\n\r\n")
        started = gevent.get_hub().loop.now()
        for _ in range(40):                               # 0.1 s apart: never a long pause
            try:
                sock.sendall(b"1\r\nx\r\n" if chunked else b"x")
            except OSError:
                break
            gevent.sleep(0.1)
        status, _, body, _ = read_response(sock)
        assert status == 408 and b"http.request_timeout" in body, body
        assert gevent.get_hub().loop.now() - started < TRICKLE.request_timeout + 1.0
        assert closed(sock)
    finally:
        s.stop()


def test_a_large_body_at_a_good_rate_takes_longer_than_the_request_timeout() -> None:
    """The deadline grows with what arrives: a restore upload is not cut off."""
    limits = Limits(header_timeout=0.6, body_timeout=0.6, idle_timeout=0.6,
                    max_connections=4, request_timeout=0.3, min_body_rate=100_000)
    s = Server(body_app, limits)
    try:
        sock = s.connect()
        sock.sendall(b"POST /x HTTP/1.1\r\nHost: h\r\nContent-Length: 100000\r\n\r\n")
        for _ in range(10):                               # 10 kB every 0.08 s: 125 kB/s
            sock.sendall(b"y" * 10_000)
            gevent.sleep(0.08)
        status, _, body, _ = read_response(sock)
        assert status == 200 and len(body) == 100_000
    finally:
        s.stop()


def test_with_the_defaults_a_byte_every_two_seconds_is_cut_off_within_a_minute() -> None:
    """The arithmetic of the defaults (a real minute is too long for the suite): a body
    trickled at half a byte a second gets 60 s plus a few milliseconds."""
    from doq_lib.http.framing import ParsedRequest
    from doq_lib.http.server import HttpConnection

    defaults = Limits()
    conn = HttpConnection.__new__(HttpConnection)
    conn.limits = defaults
    conn.parsing = type("P", (), {})()
    request = ParsedRequest()
    request.headers_done = True
    conn.parsing.current = request
    request.started -= 59.0
    request.received = 30                                 # a byte every 2 s
    wait, phase = conn._wait()
    assert phase == "request" and 0.9 < wait < 1.1 and defaults.body_timeout > 2
    assert defaults.request_timeout == 60 and defaults.header_timeout == 10


def test_one_connection_past_the_limit_is_answered_503(short: Server) -> None:
    held = [short.connect() for _ in range(SHORT.max_connections)]
    for sock in held:                                     # each one is being served
        sock.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
        assert read_response(sock)[0] == 200
    extra = short.connect()
    status, headers, body, _ = read_response(extra)
    assert status == 503 and headers["connection"] == "close"
    problem = json.loads(body)
    assert problem["code"] == "unavailable"
    assert "too many open connections (limit 4, http.max_connections)" in \
        problem["errors"][0]["message"]
    for sock in held:
        sock.close()
    gevent.sleep(0.1)
    again = short.connect()
    again.sendall(b"GET /x HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n")
    assert read_response(again)[0] == 200

"""The HTTP server's timeouts and connection limit on a real node: a client that
stalls, trickles or idles is answered (408) or closed, never held; one connection past
``http.max_connections`` is answered 503. Short limits on a node of its own."""
from __future__ import annotations

import json
import select
import socket
import time
from typing import Iterator

import pytest

from tests.harness import Cluster, NodeProc

LIMITS = {"http.header_timeout": "1", "http.body_timeout": "1", "http.idle_timeout": "1.5",
          "http.max_connections": "12", "http.request_timeout": "2",
          "http.min_body_rate": "1000"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    cluster = Cluster(str(tmp_path_factory.mktemp("timeouts")), size=1, flags=LIMITS).start()
    try:
        yield cluster.nodes[0]
    finally:
        cluster.stop()


def connect(node: NodeProc) -> socket.socket:
    return socket.create_connection(("127.0.0.1", node.http_port), timeout=10)


def answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """Everything the server sends until it closes (every answer here ends the connection)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:])}
    return int(lines[0].split()[1]), headers, body


def test_an_enqueue_whose_body_stalls_gets_408_and_nothing_is_stored(node: NodeProc) -> None:
    http = node.http()
    assert http.post("/API/v1/queues", {"name": "stall", "type": "delayed"}).status == 200
    body = json.dumps({"priority": 1, "content": "x" * 100}).encode()
    sock = connect(node)
    sock.sendall(b"POST /API/v1/queues/stall/messages HTTP/1.1\r\nHost: h\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
                 + body[:20])
    started = time.monotonic()
    status, headers, raw = answer(sock)
    assert status == 408 and headers["content-type"] == "application/problem+json"
    assert time.monotonic() - started < 5
    problem = json.loads(raw)
    assert problem["title"] == "Request Timeout" and problem["code"] == "request_timeout"
    assert problem["detail"] == "the request body paused for more than 1 s (http.body_timeout)"
    assert http.get("/API/v1/queues/stall").json()["ready"] == 0


@pytest.mark.parametrize("sent", [
    b"GET /API/v1/queues HTTP/1.1\r\nHost: h\r\n",          # headers never end
    b"POST /API/v1/queues/x/messages HTTP/1.1\r\nTransfer-Encoding: chunked\r\n",
], ids=["unfinished-headers", "unfinished-chunked-headers"])
def test_headers_that_never_end_get_408(node: NodeProc, sent: bytes) -> None:
    sock = connect(node)
    sock.sendall(sent)
    status, _, raw = answer(sock)
    assert status == 408
    assert "did not arrive within 1 s (http.header_timeout)" in \
        json.loads(raw)["errors"][0]["message"]


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(
        node: NodeProc) -> None:
    sock = connect(node)
    started = time.monotonic()
    assert sock.recv(1) == b""
    assert 0.5 < time.monotonic() - started < 5


def test_clients_trickling_bodies_at_every_connection_are_cut_off(node: NodeProc) -> None:
    """as many clients as max_connections, each sending a byte of its body every
    0.5 s (never pausing past body_timeout), held the node at 503 for as long as they
    liked. Each is answered 408 once the whole request's deadline passes, and the node
    serves again."""
    socks = []
    for _ in range(12):
        sock = connect(node)
        sock.sendall(b"POST /API/v1/queues/x/messages HTTP/1.1\r\nHost: h\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
        socks.append(sock)
    started = time.monotonic()
    answered: dict[int, int] = {}
    while len(answered) < len(socks) and time.monotonic() - started < 15:
        for n, sock in enumerate(socks):
            if n in answered:
                continue
            if select.select([sock], [], [], 0)[0]:       # answered: read it, send no more
                answered[n] = answer(sock)[0]
            else:
                sock.sendall(b"{")
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    assert sorted(set(answered.values())) == [408] and len(answered) == 12, answered
    assert elapsed < 8, elapsed
    for sock in socks:
        sock.close()
    assert node.http().get("/readyz").status == 200


def test_one_connection_past_the_limit_gets_503_and_the_node_keeps_serving(
        node: NodeProc) -> None:
    held = [connect(node) for _ in range(12)]
    try:
        time.sleep(0.3)
        extra = connect(node)
        status, headers, raw = answer(extra)
        assert status == 503 and headers["connection"] == "close"
        assert "too many open connections (limit 12, http.max_connections)" in \
            json.loads(raw)["errors"][0]["message"]
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.3)
    assert node.http().get("/readyz").status == 200

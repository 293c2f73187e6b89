"""http.max_held_bytes on a real node: request bodies the node holds for requests not yet
answered are counted across all connections; the request whose body would pass the budget is
answered 503 naming the setting (nothing of it is stored), the others go on, and every byte
is given back when requests are answered or their clients leave."""
from __future__ import annotations

import json
import socket
import time
from typing import Any

from tests.harness import Cluster, NodeProc

BUDGET = 2097162                          # the least accepted: two of the largest bodies
PART = 900_000                            # of a body of BODY bytes, sent and then held
CONTENT = "x" * 999_000


def _body() -> bytes:
    return json.dumps({"priority": 1, "content": CONTENT}).encode()


def _held(node: NodeProc, expected: float) -> None:
    deadline = time.monotonic() + 10
    while (held := node.gauge("doq_http_held_bytes")) != expected:
        assert time.monotonic() < deadline, (held, expected)
        time.sleep(0.05)


def _start(node: NodeProc, queue: str) -> socket.socket:
    """An enqueue whose first PART body bytes are sent; the rest is up to the test."""
    sock = socket.create_connection(("127.0.0.1", node.http_port), timeout=20)
    body = _body()
    sock.sendall(b"POST /API/v1/queues/%s/messages HTTP/1.1\r\nHost: h\r\n"
                 b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                 % (queue.encode(), len(body)) + body[:PART])
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, Any]]:
    """One answer: its status and JSON body (read to its Content-Length)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = int(next(v for k, _, v in (x.partition(":") for x in lines[1:])
                      if k.lower() == "content-length"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "closed before the whole answer"
        body += chunk
    return int(lines[0].split()[1]), json.loads(body)


def test_bodies_past_the_nodes_budget_are_refused_and_counted_back(tmp_path: Any) -> None:
    c = Cluster(str(tmp_path), size=1, flags={"http.max_held_bytes": str(BUDGET)}).start()
    node = c.nodes[0]
    try:
        http = node.http()
        assert http.post("/API/v1/queues", {"name": "big", "type": "delayed"}).status == 200
        first, second = _start(node, "big"), _start(node, "big")
        _held(node, 2 * PART)                              # both held, neither answered
        third = _start(node, "big")
        status, problem = _answer(third)
        assert status == 503, problem
        message = problem["errors"][0]["message"] if problem.get("errors") else \
            problem["detail"]
        assert "http.max_held_bytes" in message and str(BUDGET) in message
        third.close()
        _held(node, 2 * PART)                              # the refused body is not held
        first.sendall(_body()[PART:])                      # the first one finishes
        status, answer = _answer(first)
        assert status == 200 and answer["id"]
        first.close()
        _held(node, PART)
        second.close()                                     # the second one leaves
        _held(node, 0)
        info = http.get("/API/v1/queues/big").json()
        assert info["ready"] == 1                          # only the finished one is stored
        assert http.post("/API/v1/queues/big/messages",
                         {"priority": 1, "content": "small"}).status == 200
    finally:
        c.stop()

"""Writing to a gevent socket with one system call in the usual case, and closing after a
refusal without losing it (L0).

gevent's ``sendall`` asks the kernel for the socket's send buffer size (``getsockopt``) on
every call, to choose its chunk size, before it sends anything: two system calls for an
answer that one ``send`` takes whole. :func:`send_all` tries that one ``send`` first and hands
only what did not fit (a full send buffer: a slow reader, a large answer) to ``sendall``,
which then waits for room as it always does (under the socket's timeout).
"""
from __future__ import annotations

import socket
import time
from typing import Any


def send_all(sock: Any, data: bytes | bytearray | memoryview) -> None:
    """Everything in ``data`` to ``sock``, as ``sock.sendall(data)`` does."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])


def linger(sock: Any, seconds: float, max_bytes: int) -> None:
    """Before closing a connection whose client may still be sending (a refused request):
    stop writing, then read and drop what comes until the client closes, for ``seconds`` and
    ``max_bytes`` at most. Closing with bytes unread would reset the connection, and the
    answer already sent could be lost on its way."""
    try:
        sock.shutdown(socket.SHUT_WR)
        deadline = time.monotonic() + seconds
        dropped = 0
        while dropped <= max_bytes and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            data = sock.recv(65536)
            if not data:
                return
            dropped += len(data)
    except OSError:
        pass

"""Writing to a gevent socket with one system call in the usual case (L0).

gevent's ``sendall`` asks the kernel for the socket's send buffer size (``getsockopt``) on
every call, to choose its chunk size, before it sends anything: two system calls for an
answer that one ``send`` takes whole. :func:`send_all` tries that one ``send`` first and hands
only what did not fit (a full send buffer: a slow reader, a large answer) to ``sendall``,
which then waits for room as it always does (under the socket's timeout).
"""
from __future__ import annotations

from typing import Any


def send_all(sock: Any, data: bytes | bytearray | memoryview) -> None:
    """Everything in ``data`` to ``sock``, as ``sock.sendall(data)`` does."""
    sent = sock.send(data)
    if sent < len(data):
        sock.sendall(memoryview(data)[sent:])

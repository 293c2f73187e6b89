"""send_all (doq_lib/sockets.py): one send for what fits, the rest through sendall — every
byte arrives, in order, whether the send buffer takes it whole or not."""
from __future__ import annotations

import gevent
import gevent.socket

from doq_lib.sockets import send_all


def _received(size: int, chunks: list[bytes]) -> bytes:
    left, right = gevent.socket.socketpair()
    got = bytearray()

    def read() -> None:
        while len(got) < size:
            data = right.recv(1 << 16)
            if not data:
                return
            got.extend(data)
    reader = gevent.spawn(read)
    try:
        for chunk in chunks:
            send_all(left, chunk)
        reader.join(timeout=30)
    finally:
        left.close()
        right.close()
    return bytes(got)


def test_a_small_answer_and_an_empty_one_arrive() -> None:
    assert _received(5, [b"", b"hello", b""]) == b"hello"


def test_more_than_the_send_buffer_takes_arrives_whole_and_in_order() -> None:
    big = bytes(range(256)) * (32 * 1024)                # 8 MiB: many times a send buffer
    assert _received(len(big) + 3, [big, bytearray(b"end")]) == big + b"end"

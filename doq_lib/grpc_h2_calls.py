"""A gRPC call as the hub serves it (``grpc.serving = hub``, L5; the connection that serves
it: :mod:`grpc_h2`): the method it names, its state, the queue of a stream's requests, and
gRPC's small layer on top of HTTP/2 — the ``flag | u32 length`` message prefix, the
percent-encoded ``grpc-message`` and the call's metadata as grpcio hands it to handlers.
"""
from __future__ import annotations

import base64
import collections
import struct
import time
from typing import Any, Callable, Iterator

import gevent
import gevent.event
import grpc

from doq_lib.grpc_api import STREAMING_RPCS, DoqServicer
from doq_lib.grpc_requests import tolerant_parser
from doq_lib.grpc_thread import HubContext
from doq_lib.pb import doq_pb2 as pb

PREFIX = struct.Struct(">BI")               # a message: compressed flag, length, protobuf
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
END = object()                              # a stream's requests end here
_RESERVED = frozenset({b"content-type", b"te", b"grpc-timeout", b"grpc-encoding",
                       b"grpc-accept-encoding", b"user-agent", b"host"})


class Method:
    """A method of ``queue.DOQ``: its path, request parser and handler."""

    __slots__ = ("name", "path", "parse", "streaming", "handler", "input_name")

    def __init__(self, name: str, servicer: DoqServicer) -> None:
        spec = pb.DESCRIPTOR.services_by_name["DOQ"].methods_by_name[name]
        self.name, self.path = name, f"/queue.DOQ/{name}"
        self.parse = tolerant_parser(getattr(pb, spec.input_type.name))
        self.input_name = spec.input_type.full_name
        self.streaming = name in STREAMING_RPCS
        self.handler = getattr(servicer, name)


def grpc_message(text: str) -> bytes:
    """``grpc-message``: percent-encoded UTF-8, as the gRPC protocol asks."""
    out = bytearray()
    for byte in text.encode():
        out += bytes([byte]) if 0x20 <= byte <= 0x7E and byte != 0x25 else b"%%%02X" % byte
    return bytes(out)


def call_metadata(headers: list[tuple[bytes, bytes]]) -> tuple[tuple[str, Any], ...]:
    """The call's metadata as grpcio gives it: names and text values as str, ``-bin`` values
    decoded to bytes; pseudo-headers and gRPC's own headers left out."""
    out: list[tuple[str, Any]] = []
    for name, value in headers:
        if name.startswith(b":") or name in _RESERVED:
            continue
        key = name.decode("latin-1")
        if key.endswith("-bin"):
            try:
                out.append((key, base64.b64decode(value + b"=" * (-len(value) % 4))))
            except ValueError:                 # not base64: DOQ reads no binary metadata
                continue
        else:
            out.append((key, value.decode("latin-1")))
    return tuple(out)


class Requests:
    """A streaming call's requests, from the connection's reader to the handler."""

    def __init__(self, taken: Callable[[int], None]) -> None:
        self.items: collections.deque[Any] = collections.deque()
        self.ready = gevent.event.Event()
        self._taken = taken

    def push(self, item: Any, size: int = 0) -> None:
        """``size``: the request's bytes, uncounted when the handler takes it."""
        self.items.append((item, size))
        self.ready.set()

    def __iter__(self) -> Iterator[Any]:
        while True:
            while not self.items:
                self.ready.clear()
                self.ready.wait()
            item, size = self.items.popleft()
            if item is END:
                self.items.appendleft((END, 0))          # every later read ends too
                return
            self._taken(size)
            yield item


class Call:
    """One call's state, kept by its :class:`~doq_lib.grpc_h2.Connection`."""

    __slots__ = ("stream_id", "method", "context", "buffer", "requests", "request", "started",
                 "answered", "greenlet", "held", "counted", "outbox", "drained")

    def __init__(self, stream_id: int, method: Method, context: HubContext) -> None:
        self.stream_id, self.method, self.context = stream_id, method, context
        self.buffer = bytearray()
        self.requests: Requests | None = None
        self.request: Any = None
        self.started = time.perf_counter()
        self.answered = False            # response headers sent
        self.greenlet: gevent.Greenlet | None = None
        self.held = 0                    # received bytes not yet given back (flow control)
        self.counted = 0                 # request bytes held for it (grpc_h2's module notes)
        self.outbox = bytearray()        # a stream's answers not yet given to h2 (its writer)
        self.drained = gevent.event.Event()
        self.drained.set()


class Failed(Exception):
    """The call ends with this status before (or instead of) its handler's answer."""

    def __init__(self, code: grpc.StatusCode, message: str, error_code: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.error_code = code, message, error_code



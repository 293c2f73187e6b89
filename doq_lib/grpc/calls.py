"""A gRPC call as the node serves it (L5; the connection that serves it:
:mod:`doq_lib.grpc.connection`): the method it names, its state, the context its handler is
given, and gRPC's small layer on top of HTTP/2 — the ``flag | u32 length`` message prefix, the
percent-encoded ``grpc-message`` and the call's metadata as grpcio hands it to handlers.
"""
from __future__ import annotations

import base64
import logging
import struct
import time
from typing import Any, Callable, Iterable

import gevent
import gevent.event
import grpc

from doq_lib.grpc.api import STREAMING_RPCS, DoqServicer
from doq_lib.grpc.requests import tolerant_parser
from doq_lib.grpc.streams import Inbox
from doq_lib.pb import doq_pb2 as pb

log = logging.getLogger(__name__)

PREFIX = struct.Struct(">BI")               # a message: compressed flag, length, protobuf
RESPONSE_HEADERS = [(b":status", b"200"), (b"content-type", b"application/grpc")]
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


_TIMEOUT_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
MAX_DEADLINE = 30 * 86_400.0             # seconds: a longer grpc-timeout counts as none


def grpc_timeout(value: bytes | None) -> float | None:
    """Seconds of a ``grpc-timeout`` header (1 to 8 digits and a unit, as gRPC's protocol
    writes it); None when absent, malformed or longer than :data:`MAX_DEADLINE`."""
    if not value or not 2 <= len(value) <= 9 or not value[:-1].isdigit():
        return None
    unit = _TIMEOUT_UNITS.get(value[-1:])
    if unit is None:
        return None
    seconds = int(value[:-1]) * unit
    return seconds if seconds <= MAX_DEADLINE else None


class Aborted(Exception):
    """Raised by :meth:`HubContext.abort` (grpc's own ``abort`` raises an Exception too)."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


class HubContext:
    """What :class:`~doq_lib.grpc.api.DoqServicer`'s handlers use of
    ``grpc.ServicerContext``: the call's metadata, its trailers, ``abort``, whether it is
    still active, and callbacks run when it ends."""

    def __init__(self, metadata: tuple[tuple[str, Any], ...]) -> None:
        self._metadata = metadata
        self.trailers: tuple[tuple[str, Any], ...] = ()
        self._active = True
        self._callbacks: list[Callable[[], None]] = []
        self._code: grpc.StatusCode | None = None

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def set_trailing_metadata(self, metadata: Iterable[tuple[str, Any]]) -> None:
        self.trailers = tuple(metadata)

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self._code = code
        raise Aborted(code, details)

    def code(self) -> grpc.StatusCode | None:
        return self._code

    def is_active(self) -> bool:
        return self._active

    def add_callback(self, callback: Callable[[], None]) -> bool:
        if not self._active:
            return False
        self._callbacks.append(callback)
        return True

    def end(self) -> None:
        """The call is over: it is no longer active; run the callbacks."""
        if not self._active:
            return
        self._active = False
        callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback()
            except Exception:  # noqa: BLE001 - one bad callback must not stop the others
                log.exception("gRPC call callback failed")


class CallState:
    """One call's state, kept by its :class:`~doq_lib.grpc.connection.Connection`."""

    __slots__ = ("stream_id", "method", "context", "buffer", "requests", "request", "started",
                 "answered", "greenlet", "held", "counted", "outbox", "drained", "timer")

    def __init__(self, stream_id: int, method: Method, context: HubContext) -> None:
        self.stream_id, self.method, self.context = stream_id, method, context
        self.buffer = bytearray()
        self.requests: Inbox | None = None
        self.request: Any = None
        self.started = time.perf_counter()
        self.answered = False            # response headers sent
        self.greenlet: gevent.Greenlet | None = None
        self.held = 0                    # received bytes owed to the client's window (flow control)
        self.counted = 0                 # request bytes held for it (connection.py's module notes)
        self.outbox = bytearray()        # a stream's answers not yet given to h2 (its writer)
        self.drained = gevent.event.Event()
        self.drained.set()
        self.timer: Any = None           # the call's deadline (grpc-timeout), a loop timer

    def set_deadline(self, seconds: float, expired: Callable[[CallState], None]) -> None:
        """Run ``expired(self)`` in a greenlet of its own ``seconds`` from now (a timer of
        the loop meanwhile, no greenlet)."""
        self.timer = gevent.get_hub().loop.timer(max(seconds, 0.0), ref=False)
        self.timer.start(lambda: gevent.spawn(expired, self))

    def clear_deadline(self) -> None:
        if self.timer is not None:
            self.timer.close()
            self.timer = None


class Failed(Exception):
    """The call ends with this status before (or instead of) its handler's answer."""

    def __init__(self, code: grpc.StatusCode, message: str, error_code: str = "") -> None:
        super().__init__(message)
        self.code, self.message, self.error_code = code, message, error_code



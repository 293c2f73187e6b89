"""One gRPC connection (L5): HTTP/2 by the h2 library on a gevent socket, every call a
greenlet, no other thread (the server: :mod:`doq_lib.grpc.server`): the node's own event
loop reads and writes the connection, as its HTTP/1.1 server does, so a call crosses no thread:

* one greenlet per connection reads frames and feeds them to h2's state machine
  (``h2.connection.H2Connection``: framing, HPACK, flow control, settings, pings);
* a unary call runs its handler (:class:`~doq_lib.grpc.api.DoqServicer`'s method, with a
  :class:`~doq_lib.grpc.calls.HubContext`) in a greenlet of its own once its request is
  in; a streaming call's handler starts with the call and takes its requests from the
  call's :class:`~doq_lib.grpc.streams.Inbox` as they arrive (the reader parses them into
  it: one buffer, one hand-off);
* a unary answer leaves in one write (headers, message, trailers); a stream's answers are
  collected while its handler runs and handed to h2 by the connection's writer greenlet when
  the handler next waits, so a burst of answers is one DATA frame and one write;
* gRPC's framing on top of HTTP/2 is small (:mod:`doq_lib.grpc.calls`): a message is ``flag | u32
  length | protobuf`` in DATA frames; a call ends with trailers carrying ``grpc-status`` and
  ``grpc-message`` (and DOQ's ``doq-error-code``), or with trailers only when it fails first.

Bounds (docs/ARCHITECTURE.md, The gRPC API): requests over ``MAX_REQUEST_BYTES`` and
compressed ones end their call; ``max_concurrent`` calls per connection; a stream's requests
are read ahead up to ``READ_AHEAD`` (or ``READ_AHEAD_BYTES``), past which received bytes are
held back from the client's window until its handler takes one; bytes not yet handled count
per connection (``CONNECTION_BYTES``) and per node (``grpc.max_held_bytes``); past
``grpc.max_connections`` a new connection is refused. Answers respect the client's window.

The window a client lends is always given back: every received DATA byte of a call is owed
to it (``CallState.held``) until handed back, and whatever ends the call — its status, a
reset by either side, its deadline (``grpc-timeout``, ended DEADLINE_EXCEEDED here too), the
node refusing a message midway — gives back what it still owes (``forget``). A call that
ends while its client still sends is told to stop (RST_STREAM NO_ERROR after the status).
"""
from __future__ import annotations

import base64
import logging
import socket
import time
from typing import Any, Callable

import gevent
import gevent.event
import gevent.lock
import gevent.server
import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from doq_lib.grpc.api import MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES
from doq_lib.grpc.calls import (
    PREFIX,
    RESPONSE_HEADERS,
    Aborted,
    CallState,
    Failed,
    HubContext,
    call_metadata,
    grpc_message,
    grpc_timeout,
)
from doq_lib.grpc.requests import MalformedRequest
from doq_lib.grpc.streams import END, Inbox
from doq_lib.log import RateLimited
from doq_lib.sockets import linger, send_all

log = logging.getLogger(__name__)
_BROKEN = RateLimited(log)                  # connections that broke HTTP/2, alike

WINDOW = 65_535                     # HTTP/2's initial stream window
READ_AHEAD = 64                     # requests of one stream read but not yet taken, at most
READ_AHEAD_BYTES = MAX_REQUEST_BYTES  # ... and their bytes (one largest request always fits)
CONNECTION_BYTES = 32 << 20         # request bytes held for one connection's calls, at most
LINGER_SECONDS = 2.0                # a refused connection: reading on before the close
OUTBOX_BYTES = 256 * 1024           # a stream's answers waiting for the writer, at most
FIRST_BYTES_SECONDS = 10.0          # a new connection's TLS handshake and HTTP/2 preface
SEND_SECONDS = 30.0                 # a client that takes nothing for that long is dropped
# What arrives is checked by h2 (header names and values, pseudo-headers, framing); what this
# module sends is built here from fixed names and encoded values, and is not checked again.
_CONFIG = h2.config.H2Configuration(client_side=False, header_encoding=None,
                                    validate_outbound_headers=False,
                                    normalize_outbound_headers=False)


class Connection:
    """One client connection: its reader (this greenlet) and its calls' greenlets."""

    def __init__(self, server: Any, sock: Any) -> None:
        """``server``: the :class:`~doq_lib.grpc.server.HubServer` (its methods, auth, metrics
        and limits)."""
        self.server, self.sock = server, sock
        settings = h2.settings.Settings(client=False, initial_values={
            h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: server.max_concurrent,
            h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: 64 * 1024,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW})
        self.h2 = h2.connection.H2Connection(_CONFIG)
        self.h2.local_settings = settings
        self.lock = gevent.lock.RLock()
        self.window = gevent.event.Event()             # set on every window update
        self.calls: dict[int, CallState] = {}
        self.closed = False
        self.corked = False             # writes wait for one _flush (a unary answer)
        self.counted = 0                # request bytes held for this connection's calls
        self.refusing = ""              # past grpc.max_connections: why every call is refused
        self.refused = 0
        self.born = time.monotonic()
        self.pumping: dict[int, CallState] = {}          # streams whose outbox is not empty
        self.wake = gevent.event.Event()             # the writer has work (see _writer)

    # -- writing (any greenlet, under the lock) ----------------------------------------------
    def flush(self) -> None:
        if self.corked:
            return
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                with gevent.Timeout(SEND_SECONDS):
                    send_all(self.sock, data)
            except (OSError, gevent.Timeout):            # gone, or not reading for that long
                self.closed = True
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)  # ends the reader too
                except OSError:
                    pass

    def _headers(self, call: CallState, headers: list[tuple[bytes, bytes]], end: bool) -> None:
        with self.lock:
            try:
                self.h2.send_headers(call.stream_id, headers, end_stream=end)
            except h2.exceptions.ProtocolError:          # the stream is gone (reset)
                return
            if end:
                self._stop_sending(call.stream_id)
            self.flush()

    def _stop_sending(self, stream_id: int) -> None:
        """(under the lock) After a call's status: a client still sending its requests is
        told to stop (RST_STREAM NO_ERROR, as HTTP/2 allows once the answer is complete)."""
        stream = self.h2.streams.get(stream_id)
        if stream is not None and not stream.closed:
            try:
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.NO_ERROR)
            except h2.exceptions.ProtocolError:
                pass

    def _answering(self, call: CallState, payload: bytes) -> None:
        """Before an answer's message: its size checked, the response headers sent once."""
        if len(payload) > MAX_MESSAGE_BYTES:
            raise Failed(grpc.StatusCode.RESOURCE_EXHAUSTED,
                         f"the answer is larger than {MAX_MESSAGE_BYTES} bytes")
        if not call.answered:
            call.answered = True
            self._headers(call, RESPONSE_HEADERS, False)

    def send_message(self, call: CallState, payload: bytes) -> None:
        self._answering(call, payload)
        data = memoryview(PREFIX.pack(0, len(payload)) + payload)
        while data:
            with self.lock:
                if self.closed or not call.context.is_active():
                    return
                try:
                    room = min(self.h2.local_flow_control_window(call.stream_id),
                               self.h2.max_outbound_frame_size, len(data))
                except h2.exceptions.ProtocolError:
                    return                                 # the stream was reset
                if room > 0:
                    self.h2.send_data(call.stream_id, bytes(data[:room]))
                    data = data[room:]
                    self.flush()
                    continue
                self.window.clear()
            self.window.wait(1.0)                          # the client reads slowly

    def finish(self, call: CallState, code: grpc.StatusCode, message: str = "",
               trailers: tuple[tuple[str, Any], ...] = ()) -> None:
        """End the call with its status (trailers; headers and trailers at once when nothing
        was answered before)."""
        fields = [(b"grpc-status", str(code.value[0]).encode())]
        if message:
            fields.append((b"grpc-message", grpc_message(message)))
        for key, value in trailers:
            raw = base64.b64encode(value).rstrip(b"=") if isinstance(value, bytes) else \
                str(value).encode()
            fields.append((key.encode("latin-1"), raw))
        if not call.answered:
            call.answered = True
            fields = RESPONSE_HEADERS + fields
        self._headers(call, fields, True)
        self.forget(call)

    def forget(self, call: CallState) -> None:
        """The call is over, however it ended: it is no longer served, its bytes no longer
        count, and the flow-control window its requests took goes back to the client."""
        if self.calls.pop(call.stream_id, None) is not None:
            self.server.active -= 1
        self._uncount(call, call.counted)
        call.clear_deadline()
        if call.held:
            with self.lock:
                self._give_back(call)
                self.flush()

    def _give_back(self, call: CallState) -> None:
        """(under the lock) Hand the window ``call``'s received bytes took back to the client:
        the connection's always, the stream's while it is open (h2 knows which)."""
        held, call.held = call.held, 0
        if held and not self.closed:
            try:
                self.h2.acknowledge_received_data(held, call.stream_id)
            except h2.exceptions.ProtocolError:
                pass

    def _uncount(self, call: CallState, size: int) -> None:
        size = min(size, call.counted)
        call.counted -= size
        self.counted -= size
        self.server.held -= size

    # -- reading (this greenlet) ---------------------------------------------------------------
    def serve(self) -> None:
        writer = gevent.spawn(self._writer)
        broken = False
        try:
            with self.lock:
                self.h2.initiate_connection()
                self.flush()
            self.sock.settimeout(FIRST_BYTES_SECONDS)       # then the client may stay idle
            while not self.closed:
                try:
                    data = self.sock.recv(65536)
                except OSError:
                    break
                if not data:
                    break
                if not self.refusing:
                    self.sock.settimeout(None)
                with self.lock:
                    try:
                        for event in self.h2.receive_data(data):
                            self._event(event)
                    except h2.exceptions.ProtocolError as exc:
                        _BROKEN.log(logging.INFO, "gRPC: closing a connection that broke "
                                    "HTTP/2 (%s)", exc)
                        self.flush()                      # h2's GOAWAY
                        broken = True
                        break
                    self.flush()
                if self.refusing:                         # a short life, one refusal
                    if self.refused and not self.h2.open_inbound_streams:
                        break
                    left = self.born + FIRST_BYTES_SECONDS - time.monotonic()
                    if left <= 0:
                        break
                    self.sock.settimeout(left)
        finally:
            self.closed = True
            writer.kill(block=False)
            for call in list(self.calls.values()):
                self.forget(call)
                self._cancel(call)
            for call in list(self.pumping.values()):
                call.outbox.clear()
                call.drained.set()
            self.pumping.clear()
            if self.refusing:
                self._linger()
            elif broken:                   # the GOAWAY must not be lost to a reset
                linger(self.sock, LINGER_SECONDS, MAX_REQUEST_BYTES)
            try:
                self.sock.close()
            except OSError:
                pass

    def _linger(self) -> None:
        """A refused connection: GOAWAY, then :func:`~doq_lib.sockets.linger`."""
        try:
            with self.lock:
                self.h2.close_connection()
            send_all(self.sock, self.h2.data_to_send())
        except (OSError, h2.exceptions.ProtocolError):
            return
        linger(self.sock, LINGER_SECONDS, MAX_REQUEST_BYTES)

    def _event(self, event: Any) -> None:
        if isinstance(event, h2.events.RequestReceived):
            self._start(event.stream_id, event.headers)
        elif isinstance(event, h2.events.DataReceived):
            call = self.calls.get(event.stream_id)
            if call is None:                   # an ended call: its window comes back at once
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                return
            # From here every received byte is owed to the client until _give_back: whatever
            # ends the call (forget) gives back what it still owes.
            call.held += event.flow_controlled_length
            over = self._count(call, len(event.data))
            if over:
                self._reset(call, grpc.StatusCode.RESOURCE_EXHAUSTED, over)
                return
            call.buffer += event.data
            self._messages(call)
        elif isinstance(event, h2.events.StreamEnded):
            call = self.calls.get(event.stream_id)
            if call is not None:
                self._half_closed(call)
        elif isinstance(event, h2.events.StreamReset):
            call = self.calls.get(event.stream_id)
            if call is not None:
                self.forget(call)
                self._cancel(call)
        elif isinstance(event, (h2.events.WindowUpdated, h2.events.RemoteSettingsChanged)):
            self.window.set()
            if self.pumping:
                self.wake.set()
        # a GOAWAY from the client: it opens no more calls; those running go on until it
        # closes the connection

    def _count(self, call: CallState, size: int) -> str:
        """Count ``size`` more request bytes held for ``call``; when that would pass the
        connection's or the server's budget, nothing is counted and the answer says which."""
        if self.counted + size > self.server.connection_bytes:
            return (f"this connection's calls hold {self.counted} bytes of requests not yet "
                    f"handled (at most {self.server.connection_bytes}): send fewer large "
                    "requests at once")
        if self.server.held + size > self.server.max_held_bytes:
            return (f"the node holds {self.server.held} bytes of gRPC requests not yet "
                    f"handled (at most {self.server.max_held_bytes}, grpc.max_held_bytes): "
                    "retry later")
        call.counted += size
        self.counted += size
        self.server.held += size
        return ""

    def _start(self, stream_id: int, headers: list[tuple[bytes, bytes]]) -> None:
        fields = dict(headers)
        path = fields.get(b":path", b"").decode("latin-1")
        context = HubContext(call_metadata(headers))
        method = self.server.methods.get(path)
        if method is None or fields.get(b":method") != b"POST" or \
                not fields.get(b"content-type", b"").startswith(b"application/grpc"):
            self.h2.send_headers(stream_id, RESPONSE_HEADERS + [
                (b"grpc-status", str(grpc.StatusCode.UNIMPLEMENTED.value[0]).encode()),
                (b"grpc-message", grpc_message(f"Method not found: {path}"))],
                end_stream=True)
            return
        call = CallState(stream_id, method, context)
        if self.refusing:
            self.refused += 1
            self._fail_now(call, grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusing)
            return
        refused = self.server.auth.refusal(method.path, context.invocation_metadata())
        if refused is not None:
            status, wire_code, message = refused
            self.server.observe(method.path, status.name, call.started)
            self._fail_now(call, status, message, (("doq-error-code", wire_code),))
            return
        if self.server.active >= self.server.max_active:
            self._fail_now(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                           f"the node serves {self.server.max_active} gRPC calls at most")
            return
        self.calls[stream_id] = call
        self.server.active += 1
        timeout = grpc_timeout(fields.get(b"grpc-timeout"))
        if timeout is not None:                 # the client's deadline, kept here too
            call.set_deadline(timeout, self._expire)
        if method.streaming:
            call.requests = Inbox(lambda size: self._taken(call, size))
            call.greenlet = gevent.spawn(self._run, call, self._stream)

    def _fail_now(self, call: CallState, code: grpc.StatusCode, message: str,
                  trailers: tuple[tuple[str, Any], ...] = ()) -> None:
        """(reader, under the lock) End the call with ``code``: trailers only, or after the
        response headers when it had answered already (a stream the node ends midway)."""
        fields = [(b"grpc-status", str(code.value[0]).encode()),
                  (b"grpc-message", grpc_message(message))]
        if not call.answered:
            call.answered = True
            fields = RESPONSE_HEADERS + fields
        fields += [(k.encode(), str(v).encode()) for k, v in trailers]
        try:
            self.h2.send_headers(call.stream_id, fields, end_stream=True)
            self._stop_sending(call.stream_id)
        except h2.exceptions.ProtocolError:
            pass
        self.forget(call)
        self._cancel(call)

    def _messages(self, call: CallState) -> None:
        """Take every complete message out of the call's buffer. A reason to end the call
        returns at once: ``_reset`` forgets it, which gives its window back."""
        buffer, requests = call.buffer, call.requests
        if requests is None:                 # unary: its window comes back at once
            self._give_back(call)
        while len(buffer) >= 5:
            flag, size = PREFIX.unpack_from(buffer)
            if flag:
                self._reset(call, grpc.StatusCode.UNIMPLEMENTED,
                            "compressed messages are not accepted")
                return
            if size > MAX_REQUEST_BYTES:
                self._reset(call, grpc.StatusCode.RESOURCE_EXHAUSTED,
                            f"Received message larger than max ({size} vs. "
                            f"{MAX_REQUEST_BYTES})")
                return
            if len(buffer) < 5 + size:
                break
            request = call.method.parse(bytes(buffer[5:5 + size]))
            del buffer[:5 + size]
            if requests is None:
                if call.request is not None:
                    self._reset(call, grpc.StatusCode.UNIMPLEMENTED,
                                "a unary call sent more than one request")
                    return
                call.request = request
            else:
                requests.push(request, 5 + size)
        if requests is not None:
            # Bytes come back at once while the handler keeps up; past READ_AHEAD requests
            # (or READ_AHEAD_BYTES) not taken yet they are held until it takes one (_taken).
            if len(requests.items) < READ_AHEAD and call.counted < READ_AHEAD_BYTES:
                self._give_back(call)

    def _taken(self, call: CallState, size: int) -> None:
        """(handler greenlet) A request of ``size`` bytes was taken: it is no longer held,
        and held window goes back to the client."""
        self._uncount(call, size)
        if not call.held:
            return
        with self.lock:
            if call.stream_id in self.calls:         # else forget gave it back already
                self._give_back(call)
                self.flush()

    def _half_closed(self, call: CallState) -> None:
        cut = len(call.buffer) > 0                         # the stream ended inside a message
        if call.requests is not None:
            if cut:                                        # refused after the ones before it
                call.requests.push(MalformedRequest(call.method.input_name))
            call.requests.push(END)
            return
        if cut:
            self._reset(call, grpc.StatusCode.INVALID_ARGUMENT,
                        "the call ended inside a message")
            return
        if call.request is None:
            self._reset(call, grpc.StatusCode.UNIMPLEMENTED,
                        "a unary call ended without its request")
            return
        call.greenlet = gevent.spawn(self._run, call, self._unary)

    def _reset(self, call: CallState, code: grpc.StatusCode, message: str) -> None:
        """(reader) End a call the client broke, with ``code``."""
        if call.greenlet is not None:                     # it counts the call as it ends
            call.greenlet.kill(block=False)
        else:
            self.server.observe(call.method.path, code.name, call.started)
        self._fail_now(call, code, message)

    def _expire(self, call: CallState) -> None:
        """The call's deadline has passed: it ends DEADLINE_EXCEEDED, as a cancel would (its
        handler sees the call inactive; what it still answers is dropped)."""
        with self.lock:
            if self.closed or self.calls.get(call.stream_id) is not call:
                return
            if call.greenlet is None:                     # else it counts the call as it ends
                self.server.observe(call.method.path, "DEADLINE_EXCEEDED", call.started)
            self._fail_now(call, grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
            self.flush()

    def _cancel(self, call: CallState) -> None:
        if call.requests is not None:
            call.requests.push(END)
        gevent.get_hub().loop.run_callback(call.context.end)

    # -- handlers (a greenlet each) ------------------------------------------------------------
    def _run(self, call: CallState, answer: Callable[[CallState], str]) -> None:
        """(the call's greenlet) ``answer`` runs the handler and answers; every way out ends
        the call with a status, and counts it."""
        code = "UNKNOWN"
        try:
            code = answer(call)
        except BaseException as exc:  # noqa: BLE001 - every way out answers the call
            code = self._ended_by(call, exc)
        finally:
            call.context.end()
            self.server.observe(call.method.path, code, call.started)

    def _unary(self, call: CallState) -> str:
        if isinstance(call.request, MalformedRequest):
            raise Failed(grpc.StatusCode.INVALID_ARGUMENT, call.request.message,
                         "invalid_argument")
        payload = call.method.handler(call.request, call.context).SerializeToString()
        with self.lock:
            # Headers, message and trailers in one write when the client's window takes the
            # message whole (nothing waits then while the lock is held).
            self.corked = self._room(call) >= len(payload) + 5
            if self.corked:
                try:
                    self.send_message(call, payload)
                    return self._end(call, grpc.StatusCode.OK)
                finally:
                    self.corked = False
                    self.flush()
        self.send_message(call, payload)                   # as the client's window allows
        return self._end(call, grpc.StatusCode.OK)

    # -- a stream's answers: posted by its handler, written by the connection's writer ---------
    # A handler often yields several answers in a row (an EnqueueStream group, a burst of
    # deliveries). They are collected in the call's outbox and handed to h2 together when the
    # handler next waits: one DATA frame and one write for the lot, not one each.

    def _post(self, call: CallState, payload: bytes) -> None:
        self._answering(call, payload)
        if self.closed or not call.context.is_active():
            return
        call.outbox += PREFIX.pack(0, len(payload))
        call.outbox += payload
        if call.stream_id not in self.pumping:
            self.pumping[call.stream_id] = call
            call.drained.clear()
            self.wake.set()                    # the writer runs once this greenlet waits
        while len(call.outbox) > OUTBOX_BYTES and not self.closed and \
                call.context.is_active():
            call.drained.wait(1.0)             # the client reads slowly: the handler waits

    def _drained(self, call: CallState) -> None:
        """(the call's greenlet) Wait until the writer has handed every answer to h2."""
        while not call.drained.is_set() and not self.closed and call.context.is_active():
            call.drained.wait(1.0)

    def _writer(self) -> None:
        """(a greenlet per connection) Hand the outboxes to h2 as the client's windows allow,
        then write; woken by ``_post`` and by every window update."""
        while not self.closed:
            self.wake.wait()
            self.wake.clear()
            with self.lock:
                for call in list(self.pumping.values()):
                    self._pump(call)
                self.flush()

    def _pump(self, call: CallState) -> None:
        """(writer, under the lock) As much of ``call``'s outbox as its window takes."""
        outbox = call.outbox
        if self.closed or call.stream_id not in self.calls or not call.context.is_active():
            outbox.clear()
        while outbox:
            try:
                room = min(self.h2.local_flow_control_window(call.stream_id),
                           self.h2.max_outbound_frame_size, len(outbox))
            except h2.exceptions.ProtocolError:            # the stream was reset
                outbox.clear()
                break
            if room <= 0:
                return                                     # a window update wakes the writer
            self.h2.send_data(call.stream_id, bytes(outbox[:room]))
            del outbox[:room]
        del self.pumping[call.stream_id]
        call.drained.set()

    def _room(self, call: CallState) -> int:
        try:
            return int(self.h2.local_flow_control_window(call.stream_id))
        except h2.exceptions.ProtocolError:
            return 0

    def _stream(self, call: CallState) -> str:
        inbox = call.requests
        assert inbox is not None
        try:
            for response in call.method.handler(inbox, call.context):
                self._post(call, response.SerializeToString())
        finally:
            self._drained(call)                            # answers before the status
        if inbox.malformed is not None:                    # what came before it was answered
            raise Failed(grpc.StatusCode.INVALID_ARGUMENT, inbox.malformed.message,
                         "invalid_argument")
        return self._end(call, grpc.StatusCode.OK)

    def _end(self, call: CallState, status: grpc.StatusCode, message: str = "",
             extra: tuple[tuple[str, Any], ...] = ()) -> str:
        if call.context.is_active() and not self.closed:
            self.finish(call, status, message, call.context.trailers + extra)
            return str(status.name)
        return "CANCELLED"

    def _ended_by(self, call: CallState, exc: BaseException) -> str:
        if isinstance(exc, Aborted):
            return self._end(call, exc.code, exc.details)
        if isinstance(exc, Failed):
            extra = (("doq-error-code", exc.error_code),) if exc.error_code else ()
            return self._end(call, exc.code, exc.message, extra)
        if isinstance(exc, gevent.GreenletExit):
            return "CANCELLED"
        log.error("gRPC %s failed", call.method.name, exc_info=exc)
        return self._end(call, grpc.StatusCode.UNKNOWN,
                         f"Exception calling application: {exc}")

"""gRPC served in the event loop at the HTTP/2 level:
what no well-behaved gRPC client sends — unknown paths, compressed or oversized messages, a
unary call with no or two requests, bytes that are not HTTP/2, more streams than allowed, a
client that stops reading — gets a gRPC status or a closed connection, and the node keeps
serving. (tests/grpc/test_api.py and test_input.py run the whole API and its bad input.)"""
from __future__ import annotations

import socket
import struct
import time
from typing import Any, Iterator

import grpc
import h2.config
import h2.connection
import h2.events
import h2.settings
import h2.stream
import pytest

from doq_lib.grpc.api import MAX_REQUEST_BYTES
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import grpc_addr
from tests.harness import Cluster, NodeProc


class RawClient:
    """An HTTP/2 client by hand (h2), for what grpcio's client would never send."""

    def __init__(self, node: NodeProc) -> None:
        host, port = grpc_addr(node).rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.flush()
        self.events: list[Any] = []

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def call(self, path: str, body: bytes = b"", method: str = "POST", end: bool = True,
             content_type: str = "application/grpc") -> int:
        stream_id = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream_id, [
            (":method", method), (":scheme", "http"), (":authority", "doq"), (":path", path),
            ("content-type", content_type), ("te", "trailers")], end_stream=not body and end)
        if body:
            self.h2.send_data(stream_id, body, end_stream=end)
        self.flush()
        return stream_id

    def status(self, stream_id: int, timeout: float = 10) -> tuple[int, str]:
        """The call's grpc-status and grpc-message (RST_STREAM: (-1, its error code))."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for event in self.events:
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                if isinstance(event, h2.events.StreamReset):
                    return -1, str(event.error_code)
                headers = getattr(event, "headers", None)
                if headers is not None:
                    fields = {k.decode() if isinstance(k, bytes) else k:
                              v.decode() if isinstance(v, bytes) else v for k, v in headers}
                    if "grpc-status" in fields:
                        return int(fields["grpc-status"]), fields.get("grpc-message", "")
            self.read()
        raise AssertionError(f"no status for stream {stream_id}")

    def send(self, stream_id: int, data: bytes, end: bool = False) -> bool:
        """Send ``data`` as the node's flow-control windows allow (reading its updates);
        False when the node ended the stream first."""
        view = memoryview(data)
        deadline = time.monotonic() + 30
        while view and time.monotonic() < deadline:
            stream = self.h2.streams.get(stream_id)
            if stream is None or stream.closed or stream.state_machine.state in (
                    h2.stream.StreamState.HALF_CLOSED_REMOTE,):
                return False
            room = min(self.h2.local_flow_control_window(stream_id), len(view),
                       self.h2.max_outbound_frame_size)
            if room <= 0:
                self.read()
                continue
            self.h2.send_data(stream_id, bytes(view[:room]))
            view = view[room:]
            self.flush()
        assert not view, "the node's window stayed closed"
        if end:
            self.h2.end_stream(stream_id)
            self.flush()
        return True

    def read(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        self.events += self.h2.receive_data(data)
        self.flush()
        return True

    def close(self) -> None:
        self.sock.close()


def frame(payload: bytes, flag: int = 0, size: int | None = None) -> bytes:
    return struct.pack(">BI", flag, len(payload) if size is None else size) + payload


@pytest.fixture()
def raw(single: NodeProc) -> Iterator[RawClient]:
    client = RawClient(single)
    try:
        yield client
    finally:
        client.close()


def _still_serves(node: NodeProc) -> None:
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        queues = pb_grpc.DOQStub(channel).GetQueues(pb.GetQueuesRequest(), timeout=10)
        assert queues is not None


def test_unknown_paths_and_methods_are_unimplemented(raw: RawClient,
                                                      single: NodeProc) -> None:
    ok = frame(pb.GetQueuesRequest().SerializeToString())
    assert raw.status(raw.call("/queue.DOQ/NoSuchThing", ok))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert raw.status(raw.call("/other.Service/GetQueues", ok))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert raw.status(raw.call("/queue.DOQ/GetQueues", method="GET"))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert raw.status(raw.call("/queue.DOQ/GetQueues", ok, content_type="text/plain"))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    _still_serves(single)


def test_compressed_and_oversized_messages_are_refused(raw: RawClient,
                                                       single: NodeProc) -> None:
    ok = pb.GetQueuesRequest().SerializeToString()
    code, message = raw.status(raw.call("/queue.DOQ/GetQueues", frame(ok, flag=1)))
    assert code == grpc.StatusCode.UNIMPLEMENTED.value[0] and "compressed" in message
    # only the prefix: the size alone is refused, nothing waits for the body
    code, message = raw.status(raw.call("/queue.DOQ/Enqueue",
                                        frame(b"", size=MAX_REQUEST_BYTES + 1), end=False))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0] and "larger" in message
    _still_serves(single)


def test_a_unary_call_needs_exactly_one_request(raw: RawClient, single: NodeProc) -> None:
    ok = frame(pb.GetQueuesRequest().SerializeToString())
    assert raw.status(raw.call("/queue.DOQ/GetQueues"))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    assert raw.status(raw.call("/queue.DOQ/GetQueues", ok + ok))[0] == \
        grpc.StatusCode.UNIMPLEMENTED.value[0]
    # the call ends inside a message (its prefix cut, or after a whole one)
    for body in (ok[:-1], ok + ok[:3]):
        code, message = raw.status(raw.call("/queue.DOQ/GetQueues", body))
        assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "inside" in message
    with grpc.insecure_channel(grpc_addr(single)) as channel:
        pb_grpc.DOQStub(channel).CreateQueue(pb.CreateQueueRequest(
            name="cut", type="delayed", settings=pb.QueueSettings(ack_timeout=600)))
    stream = raw.call("/queue.DOQ/EnqueueStream", frame(pb.EnqueueRequest(
        queueName="cut", content="x").SerializeToString()) + b"\x00\x00")
    code, message = raw.status(stream)
    assert code == grpc.StatusCode.INVALID_ARGUMENT.value[0] and "EnqueueRequest" in message
    assert raw.status(raw.call("/queue.DOQ/GetQueues", ok))[0] == 0
    _still_serves(single)


def test_bytes_that_are_not_http2_close_the_connection(single: NodeProc) -> None:
    host, port = grpc_addr(single).rsplit(":", 1)
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 64, b"PRI * HTTP/2.0\r\n\r\nX"):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(junk)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if not sock.recv(65536):
                        break
                except ConnectionResetError:
                    break
            else:
                raise AssertionError(f"still open after {junk!r}")
    _still_serves(single)


def test_more_streams_than_allowed_are_refused(single: NodeProc) -> None:
    """A client that ignores SETTINGS_MAX_CONCURRENT_STREAMS: its extra streams are refused
    (RST_STREAM) or the connection ends; the node keeps serving others."""
    client = RawClient(single)
    try:
        while not client.h2.remote_settings.max_concurrent_streams or \
                client.h2.remote_settings.max_concurrent_streams > 10_000:
            client.read()
        allowed = client.h2.remote_settings.max_concurrent_streams
        unlimited = {h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 2 ** 31 - 1}
        client.h2.remote_settings = h2.settings.Settings(client=False,
                                                         initial_values=unlimited)
        request = frame(pb.DequeueRequest(queueName="none", credit=1).SerializeToString())
        streams = [client.call("/queue.DOQ/DequeueStream", request, end=False)
                   for _ in range(allowed + 5)]
        refused = 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and refused < 5:
            if not client.read():
                refused = 5                              # the whole connection was ended
                break
            if any(isinstance(e, h2.events.ConnectionTerminated) for e in client.events):
                refused = 5                              # ... with a GOAWAY first
                break
            refused = sum(1 for e in client.events if isinstance(e, h2.events.StreamReset))
        assert refused >= 5, (allowed, len(streams))
    finally:
        client.close()
    _still_serves(single)


def test_a_client_that_stops_reading_holds_only_its_own_calls(single: NodeProc) -> None:
    """A DequeueStream client that never reads its answers (its window fills up): the node
    keeps serving everyone else, and the stalled call ends when the client goes."""
    with grpc.insecure_channel(grpc_addr(single)) as channel:
        stub = pb_grpc.DOQStub(channel)
        stub.CreateQueue(pb.CreateQueueRequest(name="stall", type="delayed",
                                               settings=pb.QueueSettings(ack_timeout=600)))
        big = "y" * 60_000
        for _ in range(6):
            stub.Enqueue(pb.EnqueueRequest(queueName="stall", content=big), timeout=10)
    client = RawClient(single)
    try:
        request = frame(pb.DequeueRequest(queueName="stall", credit=6).SerializeToString())
        client.call("/queue.DOQ/DequeueStream", request, end=False)
        time.sleep(1.0)                                   # the node writes until the window
        _still_serves(single)
    finally:
        client.close()
    _still_serves(single)
    with grpc.insecure_channel(grpc_addr(single)) as channel:
        info = pb_grpc.DOQStub(channel).GetQueue(pb.GetQueueRequest(name="stall"), timeout=10)
        assert info.ready + info.unacked == 6


def _partial(client: RawClient, size: int) -> int:
    """A GetQueues call that sends the first ``size`` bytes of its :func:`_largest` request."""
    stream = client.call("/queue.DOQ/GetQueues", end=False)
    client.send(stream, _largest()[:size])
    return stream


def _held(node: NodeProc, expected: float) -> None:
    """The node's gauge of held request bytes comes to ``expected`` (it reads what was sent
    in its own time)."""
    deadline = time.monotonic() + 10
    while (held := node.gauge("doq_grpc_held_bytes")) != expected:
        assert time.monotonic() < deadline, (held, expected)
        time.sleep(0.05)


def _largest() -> bytes:
    """A valid GetQueues request of MAX_REQUEST_BYTES (an unknown field, ignored), framed."""
    padding = b"p" * (MAX_REQUEST_BYTES - 4)
    payload = bytes([(15 << 3) | 2]) + _varint(len(padding)) + padding
    assert len(payload) == MAX_REQUEST_BYTES
    return frame(payload)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_one_connection_holds_at_most_32_mib_of_unfinished_requests(single: NodeProc) -> None:
    """Unary calls whose large requests never finish: past 32 MiB held for the connection,
    the call whose bytes would pass it ends RESOURCE_EXHAUSTED (the node's memory does not
    grow with the client's patience); the bytes are counted back when the connection goes."""
    client = RawClient(single)
    try:
        held = [_partial(client, 1_000_000) for _ in range(33)]   # 33 MB: under 32 MiB
        _held(single, 33_000_000)
        code, message = client.status(_partial(client, 1_000_000))
        assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0], message
        assert "this connection's calls hold" in message and "33554432" in message
        _held(single, 33_000_000)                # the refused call's bytes are not held
        # the calls held are still alive: the first one finishes and is answered
        assert client.send(held[0], _largest()[1_000_000:], end=True)
        assert client.status(held[0])[0] == 0
        _held(single, 32_000_000)
    finally:
        client.close()
    _held(single, 0)
    _still_serves(single)


def test_the_node_holds_at_most_max_held_bytes_and_max_connections(tmp_path: Any) -> None:
    """grpc.max_held_bytes at its least (two largest requests) and grpc.max_connections = 2:
    the node-wide budget ends the call that would pass it, a third connection's calls are
    refused with a message that names the setting, and both are free again once the clients
    go."""
    flags = {"grpc.address": "127.0.0.1:0", "grpc.max_held_bytes": "2097162",
             "grpc.max_connections": "2"}
    c = Cluster(str(tmp_path), size=1, flags=flags).start()
    node = c.nodes[0]
    try:
        first, second = RawClient(node), RawClient(node)
        try:
            _partial(first, 1_000_000), _partial(first, 1_000_000)
            _held(node, 2_000_000)
            code, message = second.status(_partial(second, 1_000_000))
            assert code == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
            assert "grpc.max_held_bytes" in message and "2097162" in message
            assert node.gauge("doq_grpc_connections") == 2
            with grpc.insecure_channel(grpc_addr(node)) as channel:
                with pytest.raises(grpc.RpcError) as refused:
                    pb_grpc.DOQStub(channel).GetQueues(pb.GetQueuesRequest(), timeout=10)
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "grpc.max_connections" in str(refused.value.details())
        finally:
            first.close()
            second.close()
        deadline = time.monotonic() + 10
        while node.gauge("doq_grpc_connections") and time.monotonic() < deadline:
            time.sleep(0.05)
        _held(node, 0)
        again = RawClient(node)
        try:                     # a whole request of nearly the largest size is answered
            stream = again.call("/queue.DOQ/GetQueues", end=False)
            assert again.send(stream, _largest(), end=True)
            assert again.status(stream)[0] == 0
        finally:
            again.close()
        _still_serves(node)
    finally:
        c.stop()


def test_streams_give_back_every_byte_they_held(single: NodeProc) -> None:
    """Requests of a stream are held from their arrival until the handler takes them: after
    an EnqueueStream of 300 messages and a DequeueStream that takes them, nothing is held."""
    with grpc.insecure_channel(grpc_addr(single)) as channel:
        stub = pb_grpc.DOQStub(channel)
        stub.CreateQueue(pb.CreateQueueRequest(name="held", type="delayed",
                                               settings=pb.QueueSettings(ack_timeout=600)))
        answers = list(stub.EnqueueStream(
            (pb.EnqueueRequest(queueName="held", content="z" * 3000) for _ in range(300)),
            timeout=60))
        assert len(answers) == 300 and all(a.success for a in answers)
        taken = 0
        for answer in stub.DequeueStream(iter([pb.DequeueRequest(
                queueName="held", credit=300, ack=True)]), timeout=60):
            taken += len(answer.messages) or 1
            if taken == 300:
                break
        assert taken == 300
    _held(single, 0)

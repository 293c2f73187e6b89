"""The flow-control window a gRPC connection lends the node always comes back, whatever ends
a stream: a client that counts the DATA bytes it sends and the WINDOW_UPDATE credit the node
gives on stream 0 ends streams every way — normally, by RST_STREAM, by its deadline, and with
the node ending them for a message over the size limit, a compressed or malformed one, a key
that may not do it, a handler failure — with requests held back by the node's read-ahead or
not, on one connection, and a call on that connection is still answered after all of them.

h2 hands received bytes back in batches (a WINDOW_UPDATE once half the window has been
processed), so "back" here means at most half the initial window outstanding, never more:
a single lost DATA frame of 16 KiB repeated a few times would pass that and stall the
connection, which is what every way is repeated to show."""
from __future__ import annotations

import socket
import struct
import time
from typing import Any, Iterator

import grpc
import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.stream
import pytest

from doq_lib.grpc.api import MAX_REQUEST_BYTES
from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import grpc_addr
from tests.harness import Cluster, NodeProc, add_key

WINDOW = 65_535                  # HTTP/2's initial window, the node's for every connection
BATCH = WINDOW // 2              # what h2 may keep before it sends a WINDOW_UPDATE
FRAME = 16_384                   # one DATA frame of the default size
REPEAT = 6                       # 6 x 16 KiB lost would be past the whole window


class Keys:
    def __init__(self, admin: str, limited: str) -> None:
        self.admin, self.limited = admin, limited


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[NodeProc, Keys]]:
    root = tmp_path_factory.mktemp("window")
    path = root / "keys.yaml"
    keys = Keys(add_key(path, "admin", "admin"), add_key(path, "limited", "producer", "mine-*"))
    c = Cluster(str(root), size=1, flags={"auth.keys_file": str(path),
                                          "grpc.address": "127.0.0.1:0"})
    c.nodes[0].admin_key = keys.admin
    c.start()
    try:
        with grpc.insecure_channel(grpc_addr(c.nodes[0])) as channel:
            stub = pb_grpc.DOQStub(channel)
            auth = (("authorization", f"Bearer {keys.admin}"),)
            for name in ("mine-q", "mine-big"):
                stub.CreateQueue(pb.CreateQueueRequest(
                    name=name, type="delayed", settings=pb.QueueSettings(ack_timeout=600)),
                    metadata=auth, timeout=10)
        yield c.nodes[0], keys
    finally:
        c.stop()


class Counting:
    """An HTTP/2 client by hand that counts what it lends and what it gets back."""

    def __init__(self, node: NodeProc, key: str) -> None:
        host, port = grpc_addr(node).rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.h2.initiate_connection()
        self.key = key
        self.sent = 0                   # flow-controlled DATA bytes sent
        self.credit = 0                 # WINDOW_UPDATE increments received on stream 0
        self.stalled: set[int] = set()  # streams whose answers this client does not take
        self.events: list[Any] = []
        self.flush()

    def flush(self) -> None:
        self.sock.sendall(self.h2.data_to_send())

    def owed(self) -> int:
        """Bytes the node has not handed back to this connection's window."""
        return self.sent - self.credit

    def open(self, path: str, key: str | None = "", timeout: str = "") -> int:
        stream_id = self.h2.get_next_available_stream_id()
        headers = [(":method", "POST"), (":scheme", "http"), (":authority", "doq"),
                   (":path", path), ("content-type", "application/grpc"), ("te", "trailers")]
        if key is not None:
            headers.append(("authorization", f"Bearer {key or self.key}"))
        if timeout:
            headers.append(("grpc-timeout", timeout))
        self.h2.send_headers(stream_id, headers)
        self.flush()
        return stream_id

    def _open(self, stream_id: int) -> bool:
        stream = self.h2.streams.get(stream_id)
        return stream is not None and stream.state_machine.state in (
            h2.stream.StreamState.OPEN, h2.stream.StreamState.HALF_CLOSED_REMOTE)

    def push(self, stream_id: int, data: bytes, end: bool = False, seconds: float = 10) -> bool:
        """Send ``data`` as the windows allow; False when the node ended the stream first.
        Fails when the connection's window stays shut (the stall this module is about)."""
        view = memoryview(data)
        deadline = time.monotonic() + seconds
        while view:
            if not self._open(stream_id):
                return False
            room = min(self.h2.local_flow_control_window(stream_id), len(view),
                       self.h2.max_outbound_frame_size)
            if room <= 0:
                assert time.monotonic() < deadline, \
                    f"the window stayed shut: {self.owed()} bytes not given back"
                self.read(0.2)
                continue
            self.h2.send_data(stream_id, bytes(view[:room]))
            self.sent += room
            view = view[room:]
            self.flush()
        if end and self._open(stream_id):
            self.h2.end_stream(stream_id)
            self.flush()
        return True

    def cancel(self, stream_id: int) -> None:
        self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
        self.flush()

    def read(self, seconds: float = 1.0) -> None:
        self.sock.settimeout(seconds)
        try:
            data = self.sock.recv(1 << 20)
        except socket.timeout:
            return
        finally:
            self.sock.settimeout(10)
        assert data, "the node closed the connection"
        for event in self.h2.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                if event.stream_id in self.stalled:      # the connection's share only
                    if event.flow_controlled_length:
                        self.h2.increment_flow_control_window(event.flow_controlled_length)
                else:
                    self.h2.acknowledge_received_data(event.flow_controlled_length,
                                                      event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated) and event.stream_id == 0:
                self.credit += event.delta
            self.events.append(event)
        self.flush()

    def status(self, stream_id: int, seconds: float = 10) -> int:
        """The call's grpc-status (-1: reset before any)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            for event in self.events:
                if getattr(event, "stream_id", None) != stream_id:
                    continue
                for name, value in getattr(event, "headers", None) or ():
                    if name in (b"grpc-status", "grpc-status"):
                        return int(value)
                if isinstance(event, h2.events.StreamReset):
                    return -1
            self.read(0.2)
        raise AssertionError(f"no status for stream {stream_id}")

    def settled(self, seconds: float = 5) -> int:
        """What stays owed once the node has caught up (read until within h2's batch)."""
        deadline = time.monotonic() + seconds
        while self.owed() > BATCH and time.monotonic() < deadline:
            self.read(0.2)
        return self.owed()

    def close(self) -> None:
        self.sock.close()


def frame(payload: bytes, flag: int = 0, size: int | None = None) -> bytes:
    return struct.pack(">BI", flag, len(payload) if size is None else size) + payload


def _padded(message: Any, total: int) -> bytes:
    """``message`` with an unknown field (ignored by the node) making it ``total`` bytes."""
    body = message.SerializeToString()
    pad = total - len(body) - 4
    return body + bytes([(15 << 3) | 2]) + bytes([0x80 | (pad & 0x7F), pad >> 7]) + b"p" * pad


def _enqueue(queue: str, total: int) -> bytes:
    return frame(_padded(pb.EnqueueRequest(queueName=queue, content="x"), total - 5))


OK = grpc.StatusCode.OK.value[0]


def stream_ways(keys: Keys) -> dict[str, Any]:
    """Each way to end an EnqueueStream (or a refused call) that has received a DATA frame
    of 16 KiB: it runs on a client and answers 0 when the call ended as it should."""
    codes = grpc.StatusCode
    cut = _enqueue("mine-q", FRAME + 8)[:FRAME]             # it stops inside a message
    big = frame(b"z" * (FRAME - 5), size=MAX_REQUEST_BYTES + 1)
    # way: (method, key ("": the client's; None: none), grpc-timeout, the data, end, status;
    # None: the client cancels)
    table: dict[str, tuple[str, str | None, str, bytes, bool, Any]] = {
        "oversized": ("EnqueueStream", "", "", big, False, codes.RESOURCE_EXHAUSTED),
        "compressed": ("EnqueueStream", "", "", frame(b"z" * (FRAME - 5), flag=1), False,
                       codes.UNIMPLEMENTED),
        "malformed": ("EnqueueStream", "", "", frame(b"\xff" * (FRAME - 5)), False,
                      codes.INVALID_ARGUMENT),
        "unauthenticated": ("EnqueueStream", None, "", _enqueue("mine-q", FRAME), False,
                            codes.UNAUTHENTICATED),
        # the handler checks each request's queue against the key
        "not_allowed": ("EnqueueStream", keys.limited, "", _enqueue("other", FRAME), False,
                        codes.PERMISSION_DENIED),
        "handler_failed": ("EnqueueStream", "", "", _enqueue("mine-missing", FRAME), False,
                           codes.NOT_FOUND),
        "cancelled": ("EnqueueStream", "", "", cut, False, None),
        "deadline": ("EnqueueStream", "", "300m", cut, False, codes.DEADLINE_EXCEEDED),
        "unary_oversized": ("Enqueue", "", "", big, False, codes.RESOURCE_EXHAUSTED),
        "normal": ("EnqueueStream", "", "", _enqueue("mine-q", FRAME // 4) * 4, True,
                   codes.OK),
    }

    def way(method: str, key: str | None, timeout: str, data: bytes, end: bool,
            status: Any) -> Any:
        def run(client: Counting) -> int:
            s = client.open(f"/queue.DOQ/{method}", key=key, timeout=timeout)
            client.push(s, data, end=end)
            if status is None:
                client.cancel(s)
                return 0
            return client.status(s) - int(status.value[0])
        return run
    return {name: way(*spec) for name, spec in table.items()}


WAYS = ("oversized", "compressed", "malformed", "unauthenticated", "not_allowed",
        "handler_failed", "cancelled", "deadline", "unary_oversized", "normal")


def still_answers(client: Counting) -> None:
    """A unary call on the same connection is answered."""
    s = client.open("/queue.DOQ/GetQueues")
    client.push(s, frame(pb.GetQueuesRequest().SerializeToString()), end=True)
    assert client.status(s) == OK


@pytest.mark.parametrize("way", WAYS)
def test_the_window_comes_back_whatever_ends_a_stream(secured: tuple[NodeProc, Keys],
                                                      way: str) -> None:
    node, keys = secured
    run = stream_ways(keys)[way]
    client = Counting(node, keys.admin)
    try:
        for _ in range(REPEAT):
            assert run(client) == 0
            owed = client.settled()
            assert owed <= BATCH, f"{way}: {owed} bytes not given back"
        still_answers(client)
    finally:
        client.close()


def _held_stream(client: Counting, timeout: str = "") -> int:
    """A DequeueStream whose answers this client does not take, so its handler waits to
    send, and 230 further requests of 200 bytes: the node's read-ahead takes 64 of them and
    holds the other 33 kB back."""
    s = client.open("/queue.DOQ/DequeueStream", timeout=timeout)
    client.stalled.add(s)
    client.push(s, frame(pb.DequeueRequest(queueName="mine-big", credit=12).SerializeToString()))
    deadline = time.monotonic() + 10
    while sum(len(e.data) for e in client.events if isinstance(e, h2.events.DataReceived)
              and e.stream_id == s) < WINDOW:          # the stream's window is full
        assert time.monotonic() < deadline, "the node sent fewer answers than its window"
        client.read(0.2)
    time.sleep(0.2)                                     # ... and its handler waits
    more = frame(_padded(pb.DequeueRequest(queueName="mine-big", credit=1), 195))
    assert client.push(s, more * 230)
    client.read(0.5)
    assert client.settled(1) > 40_000, "the node held nothing back"
    return s


@pytest.fixture()
def big(secured: tuple[NodeProc, Keys]) -> None:
    """mine-big holds 12 messages of 60 kB, none delivered."""
    node, keys = secured
    auth = (("authorization", f"Bearer {keys.admin}"),)
    with grpc.insecure_channel(grpc_addr(node)) as channel:
        stub = pb_grpc.DOQStub(channel)
        stub.DeleteQueue(pb.DeleteQueueRequest(name="mine-big"), metadata=auth, timeout=10)
        stub.CreateQueue(pb.CreateQueueRequest(
            name="mine-big", type="delayed", settings=pb.QueueSettings(ack_timeout=600)),
            metadata=auth, timeout=10)
        for _ in range(12):
            stub.Enqueue(pb.EnqueueRequest(queueName="mine-big", content="y" * 60_000),
                         metadata=auth, timeout=10)


@pytest.mark.parametrize("way", ["cancelled", "deadline", "oversized", "compressed",
                                 "normal"])
def test_bytes_held_back_come_back_whatever_ends_the_stream(
        secured: tuple[NodeProc, Keys], big: None, way: str) -> None:
    node, keys = secured
    client = Counting(node, keys.admin)
    try:
        s = _held_stream(client, timeout="3S" if way == "deadline" else "")
        if way == "cancelled":
            client.cancel(s)
        elif way == "deadline":
            assert client.status(s, 15) == grpc.StatusCode.DEADLINE_EXCEEDED.value[0]
        elif way == "oversized":
            client.push(s, frame(b"", size=MAX_REQUEST_BYTES + 1))
            assert client.status(s) == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]
        elif way == "compressed":
            client.push(s, frame(b"c" * 10, flag=1))
            assert client.status(s) == grpc.StatusCode.UNIMPLEMENTED.value[0]
        else:                           # the client ends and then takes its answers
            client.push(s, b"", end=True)
            client.stalled.discard(s)
            client.h2.increment_flow_control_window(10 << 20, stream_id=s)
            client.flush()
            assert client.status(s, 20) == OK
        owed = client.settled()
        assert owed <= BATCH, f"{way}: {owed} bytes not given back"
        still_answers(client)
    finally:
        client.close()

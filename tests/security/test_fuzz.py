"""Property-based fuzzing against a running node: JSON bodies, paths and query
strings over HTTP, and protobuf requests (valid messages with arbitrary values, and arbitrary
bytes) over gRPC. Whatever comes, the node answers with a 4xx or a success, never a 5xx or
INTERNAL / UNKNOWN, and never hangs (every call has a deadline).

The suite runs a bounded number of examples (``DOQ_FUZZ_EXAMPLES``, default 150 per test);
``scripts/fuzz.py`` runs the same tests for longer.
"""
from __future__ import annotations

import json
import os
import urllib.parse
from typing import Any, Iterator

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from doq_lib.pb import doq_pb2 as pb
from tests.harness import Cluster, Http, NodeProc

EXAMPLES = int(os.environ.get("DOQ_FUZZ_EXAMPLES", "150"))
STATS = os.environ.get("DOQ_FUZZ_STATS")          # a file to count outcomes in (scripts/fuzz.py)


def record(kind: str, outcome: str) -> None:
    if STATS:
        with open(STATS, "a", encoding="utf-8") as f:
            f.write(f"{kind} {outcome}\n")
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
QUEUES = ["fz-delayed", "fz-fair"]
BAD_GRPC = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN,
            grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    cluster = Cluster(str(tmp_path_factory.mktemp("fuzz")), size=1,
                      flags={"grpc.address": "127.0.0.1:0"}).start()
    try:
        http = cluster.nodes[0].http()
        for name, qtype in zip(QUEUES, ("delayed", "fair")):
            assert http.post("/API/v1/queues", {"name": name, "type": qtype}).status == 200
        http.close()
        yield cluster.nodes[0]
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def http(node: NodeProc) -> Iterator[Http]:
    client = node.http(timeout=10)
    yield client
    client.close()


@pytest.fixture(scope="module")
def channel(node: NodeProc) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(str(node.status()["grpc_addr"]))
    yield ch
    ch.close()


# -- strategies ---------------------------------------------------------------------------------
TEXT = st.text(max_size=40) | st.sampled_from(["", ".", "..", " ", "\udfff", "a\x00b",
                                                "x" * 1100, "a/b", "ü", "\n"])
JSON_LEAF = (st.none() | st.booleans() | st.integers(min_value=-(2 ** 70), max_value=2 ** 70)
             | st.floats(allow_nan=False, allow_infinity=False) | TEXT)
JSON = st.recursive(JSON_LEAF, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(TEXT, inner, max_size=4), max_leaves=12)
NAME = st.sampled_from(QUEUES) | TEXT
ID = (st.integers(min_value=-5, max_value=2 ** 64 + 5).map(str)
      | st.sampled_from(["abc", "", "1.5", "%00", "0x10"]))
MESSAGE_FIELDS = {"priority": JSON, "content": JSON, "group": JSON, "metadata": JSON,
                  "id": JSON}
BODY = (st.fixed_dictionaries({}, optional={**MESSAGE_FIELDS, "name": JSON, "type": JSON,
                                            "settings": JSON, "ids": JSON, "number": JSON,
                                            "messages": JSON, "since": JSON})
        | st.fixed_dictionaries({"messages": st.lists(st.fixed_dictionaries(
            {}, optional=MESSAGE_FIELDS), max_size=3)})
        | JSON)


def quoted(text: str) -> str:
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


@st.composite
def requests(draw: Any) -> tuple[str, str, bytes | None]:
    """(method, path, raw JSON body) for one of the API's routes, with arbitrary parts."""
    q = quoted(draw(NAME))
    mid = quoted(draw(ID))
    method, path = draw(st.sampled_from([
        ("POST", "/API/v1/queues"), ("PUT", f"/API/v1/queues/{q}"),
        ("GET", f"/API/v1/queues/{q}"), ("DELETE", f"/API/v1/queues/{q}"),
        ("POST", f"/API/v1/queues/{q}/messages"), ("POST", f"/API/v1/queues/{q}/messages/batch"),
        ("GET", f"/API/v1/queues/{q}/messages/{mid}"),
        ("POST", f"/API/v1/queues/{q}/messages/{mid}/ack"),
        ("POST", f"/API/v1/queues/{q}/messages/{mid}/nack"),
        ("POST", f"/API/v1/queues/{q}/messages/{mid}/touch"),
        ("PUT", f"/API/v1/queues/{q}/messages/{mid}/priority"),
        ("POST", f"/API/v1/queues/{q}/messages/ack"), ("POST", f"/API/v1/queues/{q}/messages/nack"),
        ("POST", "/API/v1/ids"), ("POST", "/db/backup"),
    ]))
    body = draw(BODY)
    raw = json.dumps(body).encode() if draw(st.booleans()) or method != "GET" else None
    return method, path, raw


QUERY = st.dictionaries(st.sampled_from(["ack", "count", "wait", "x", "ACK"]),
                        TEXT | ID, max_size=3)


# -- HTTP ---------------------------------------------------------------------------------------
@FUZZ
@given(request=requests())
def test_http_bodies_and_paths_never_fail_the_server(http: Http,
                                                     request: tuple[str, str, bytes | None]
                                                     ) -> None:
    method, path, raw = request
    headers = {"Content-Type": "application/json"} if raw is not None else {}
    resp = http.request(method, path, raw=raw, headers=headers)
    record("http-body", str(resp.status))
    assert resp.status < 500, (method, path, raw[:200] if raw else None, resp.body[:300])


@FUZZ
@given(query=QUERY, queue=st.sampled_from(QUEUES))
def test_http_queries_never_fail_the_server(http: Http, query: dict[str, str],
                                            queue: str) -> None:
    if "wait" in query:                      # a valid wait would hold the call for long
        value = query["wait"][:3]
        try:
            if float(value) > 1:              # ("19" held an empty queue's call past the
                value = "1"                   # client's 15 s: a timeout, not a failure)
        except ValueError:
            pass
        query["wait"] = value
    text = urllib.parse.urlencode({k: v.encode("utf-8", "surrogatepass")
                                   for k, v in query.items()})
    resp = http.get(f"/API/v1/queues/{queue}/messages?{text}")
    record("http-query", str(resp.status))
    assert resp.status < 500, (text, resp.body[:300])


# -- gRPC ---------------------------------------------------------------------------------------
SERVICE = pb.DESCRIPTOR.services_by_name["DOQ"]
UNARY = [m for m in SERVICE.methods if not m.client_streaming and not m.server_streaming]
INT_RANGES = {"TYPE_INT32": (-(2 ** 31), 2 ** 31 - 1), "TYPE_INT64": (-(2 ** 63), 2 ** 63 - 1),
              "TYPE_UINT32": (0, 2 ** 32 - 1), "TYPE_UINT64": (0, 2 ** 64 - 1)}
TYPE_NAMES = {getattr(pb.EnqueueRequest.DESCRIPTOR.fields[0], n): n for n in (
    "TYPE_INT32", "TYPE_INT64", "TYPE_UINT32", "TYPE_UINT64", "TYPE_STRING", "TYPE_BOOL",
    "TYPE_MESSAGE", "TYPE_ENUM", "TYPE_BYTES", "TYPE_DOUBLE")}
GRPC_TEXT = st.text(max_size=40) | st.sampled_from(QUEUES + ["", ".", "a/b", "x" * 1100])


def field_values(field: Any, depth: int = 0) -> Any:
    kind = TYPE_NAMES.get(field.type)
    if kind in INT_RANGES:
        low, high = INT_RANGES[kind]
        edges = [0, 1, -1] if low else [0, 1]
        value: Any = st.integers(min_value=low, max_value=high) | st.sampled_from(edges)
    elif kind == "TYPE_STRING":
        value = GRPC_TEXT
    elif kind == "TYPE_BOOL":
        value = st.booleans()
    elif kind == "TYPE_ENUM":
        value = st.integers(min_value=-3, max_value=5)
    elif kind == "TYPE_MESSAGE" and field.message_type.GetOptions().map_entry:
        value = st.dictionaries(GRPC_TEXT, GRPC_TEXT, max_size=3)
    elif kind == "TYPE_MESSAGE" and depth < 2:
        value = message_of(field.message_type, depth + 1)
    else:
        return None
    repeated = field.is_repeated if hasattr(field, "is_repeated") else field.label == 3
    if repeated and not (kind == "TYPE_MESSAGE" and field.message_type.GetOptions().map_entry):
        value = st.lists(value, max_size=4)
    return value


def message_of(descriptor: Any, depth: int = 0) -> Any:
    cls = getattr(pb, descriptor.name)
    fields = {}
    for field in descriptor.fields:
        values = field_values(field, depth)
        if values is not None:
            fields[field.name] = values
    return st.fixed_dictionaries({}, optional=fields).map(lambda kw: cls(**kw))


@FUZZ
@given(data=st.data())
def test_grpc_requests_never_fail_the_server(channel: grpc.Channel, data: Any) -> None:
    method = data.draw(st.sampled_from(UNARY), label="method")
    if data.draw(st.booleans(), label="raw bytes"):
        frame = data.draw(st.binary(max_size=200), label="frame")
    else:
        frame = data.draw(message_of(method.input_type), label="request").SerializeToString()
    call = channel.unary_unary(f"/queue.DOQ/{method.name}")
    try:
        call(frame, timeout=10)
        record("grpc", "OK")
    except grpc.RpcError as exc:
        err: Any = exc
        record("grpc", err.code().name)
        assert err.code() not in BAD_GRPC, (method.name, frame[:200], err.code(), err.details())

"""What the gRPC tests call with: status codes, a failure check, queue and message helpers."""
from __future__ import annotations

import itertools
from typing import Any, Callable

import grpc
import pytest

from doq_lib.pb import doq_pb2 as pb
from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.harness import NodeProc

SC = grpc.StatusCode
Strategy = pb.QueueSettings.Strategy
names = itertools.count()     # one counter for the package: its nodes are shared


def grpc_addr(node: NodeProc) -> str:
    return str(node.status()["grpc_addr"])


def fails(call: Callable[[], Any], status: grpc.StatusCode, *texts: str) -> grpc.RpcError:
    """``call()`` fails with ``status`` and a message containing every one of ``texts``."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    err: Any = info.value
    assert err.code() == status, (err.code(), err.details())
    for text in texts:
        assert text in err.details(), err.details()
    return err  # type: ignore[no-any-return]


def new_queue(stub: pb_grpc.DOQStub, qtype: str = "delayed", **settings: Any) -> str:
    name = f"q{next(names)}-{qtype}"
    stub.CreateQueue(pb.CreateQueueRequest(name=name, type=qtype,
                                           settings=pb.QueueSettings(**settings)))
    return name


def enqueue(stub: pb_grpc.DOQStub, q: str, content: str, priority: int = 10,
            **kw: Any) -> pb.EnqueueResponse:
    return stub.Enqueue(pb.EnqueueRequest(queueName=q, content=content, priority=priority, **kw))

"""The nodes the gRPC tests share, for the whole package: one node and a 3-node cluster whose
follower takes calls; each module's tests run against both (``target``)."""
from __future__ import annotations

from typing import Iterator

import grpc
import pytest

from doq_lib.pb import doq_pb2_grpc as pb_grpc
from tests.grpc.calls import grpc_addr
from tests.harness import Cluster, NodeProc, running


@pytest.fixture(scope="package")
def single(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """One node that serves gRPC on a port the OS chose."""
    with running(str(tmp_path_factory.mktemp("grpc-single")),
                 flags={"grpc.address": "127.0.0.1:0"}) as c:
        yield c.nodes[0]


@pytest.fixture(scope="package")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(str(tmp_path_factory.mktemp("cluster")), size=3,
                flags={"grpc.address": "127.0.0.1:0"}).start()
    try:
        yield c
        c.assert_replicas_identical()
    finally:
        c.stop()


@pytest.fixture(scope="module", params=["single", "follower"])
def target(request: pytest.FixtureRequest) -> NodeProc:
    """Every test runs against one node and against a follower of a cluster."""
    if request.param == "single":
        return request.getfixturevalue("single")  # type: ignore[no-any-return]
    cluster: Cluster = request.getfixturevalue("cluster")
    return cluster.followers()[0]


@pytest.fixture(scope="module")
def channel(target: NodeProc) -> Iterator[grpc.Channel]:
    ch = grpc.insecure_channel(grpc_addr(target))
    try:
        yield ch
    finally:
        ch.close()


@pytest.fixture()
def stub(channel: grpc.Channel) -> pb_grpc.DOQStub:
    return pb_grpc.DOQStub(channel)

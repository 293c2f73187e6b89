"""The nodes the gRPC tests share, for the whole package: one node (gRPC served in the event
loop, the default), a 3-node cluster whose follower takes calls, one node in gevent mode and
one in thread mode; each module's tests run against all four (``target``)."""
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


def _one_node(tmp_path_factory: pytest.TempPathFactory, serving: str) -> Iterator[NodeProc]:
    c = Cluster(str(tmp_path_factory.mktemp(f"single-{serving}")), size=1,
                flags={"grpc.address": "127.0.0.1:0", "grpc.serving": serving}).start()
    try:
        yield c.nodes[0]
    finally:
        c.stop()


@pytest.fixture(scope="package")
def single_gevent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A node serving gRPC the earlier way (grpcio in gevent mode)."""
    yield from _one_node(tmp_path_factory, "gevent")


@pytest.fixture(scope="package")
def single_thread(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """A node serving gRPC from its own OS thread (grpc.serving = thread: grpc.aio)."""
    yield from _one_node(tmp_path_factory, "thread")


@pytest.fixture(scope="module",
                params=["single", "follower", "single-gevent", "single-thread"])
def target(request: pytest.FixtureRequest) -> NodeProc:
    """Every test runs against one node, a follower of a cluster (both serving gRPC in the
    event loop, the default), one node with grpc.serving = gevent and one with thread."""
    if request.param == "single":
        return request.getfixturevalue("single")  # type: ignore[no-any-return]
    if request.param == "single-gevent":
        return request.getfixturevalue("single_gevent")  # type: ignore[no-any-return]
    if request.param == "single-thread":
        return request.getfixturevalue("single_thread")  # type: ignore[no-any-return]
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

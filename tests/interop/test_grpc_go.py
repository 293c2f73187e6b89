"""DOQ's gRPC server with a client on another HTTP/2 stack: grpc-go (Debian's golang-go,
protoc-gen-go, protoc-gen-go-grpc and golang-google-grpc-dev, built in GOPATH mode with no
module proxy). tests/interop/client.go runs every step on one connection: a round trip, a
bidirectional stream of 1,000 messages, a stream cancelled midway, streams the node ends for
a message over its size limit, and then a call on that same connection, which a connection
whose flow-control window leaked would never carry."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import pytest

from tests.grpc.calls import grpc_addr
from tests.harness import REPO, Cluster, NodeProc, running

GOPATH_LIBRARIES = "/usr/share/gocode"        # where Debian's Go packages put their sources


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client, built from doq.proto and client.go."""
    root = tmp_path_factory.mktemp("grpc-go")
    package = root / "src" / "doq.local" / "pb"
    package.mkdir(parents=True)
    (root / "src" / "client").mkdir()
    shutil.copy(Path(__file__).with_name("client.go"), root / "src" / "client" / "client.go")
    mapping = "Mdoq.proto=doq.local/pb"
    subprocess.run(["protoc", "-I", str(Path(REPO) / "proto"),
                    f"--go_out={package}", "--go_opt=paths=source_relative", f"--go_opt={mapping}",
                    f"--go-grpc_out={package}", "--go-grpc_opt=paths=source_relative",
                    f"--go-grpc_opt={mapping}", "doq.proto"], check=True, timeout=120)
    env = dict(os.environ, GO111MODULE="off", GOPATH=f"{root}:{GOPATH_LIBRARIES}",
               GOCACHE=str(root / "cache"), GOPROXY="off", GOFLAGS="")
    built = subprocess.run(["go", "build", "-o", str(root / "client"), "./src/client"],
                           cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    return root / "client"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with running(str(tmp_path_factory.mktemp("interop")), size=3,
                 flags={"grpc.address": "127.0.0.1:0"}) as c:
        yield c


@pytest.mark.parametrize("role", ["leader", "follower"])
def test_a_grpc_go_client_keeps_its_connection_through_every_way_a_stream_ends(
        client: Path, cluster: Cluster, role: str) -> None:
    node: NodeProc = cluster.leader() if role == "leader" else cluster.followers()[0]
    done = subprocess.run([str(client), grpc_addr(node), f"interop-{role}", "6"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.split("\n")[:-1] == ["ok round trip", "ok stream of 1000", "ok cancel",
                                            "ok 6 oversized", "ok call after"]

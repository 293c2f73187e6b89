"""Fixtures shared by several test modules."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from doq_lib.config import Config
from doq_lib.fsm import StateMachine
from doq_lib.lmdb_store import LmdbStore
from doq_lib.raft.proposer import LocalProposer
from doq_lib.service import Service
from tests.harness import NodeProc, running


class FixedClock:
    """The time the in-process tests give the proposer (they move it by hand)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.t = now

    def now(self) -> float:
        return self.t


@dataclass
class LocalNode:
    """One node in process: the service over the in-memory proposer and a real state machine
    on LMDB (no Raft, sockets or subprocesses)."""

    cfg: Config
    store: LmdbStore
    fsm: StateMachine
    clock: FixedClock
    proposer: LocalProposer
    service: Service

    def close(self) -> None:
        self.service.stop()
        self.store.close()


def local_node(path: Path, clock: FixedClock | None = None) -> LocalNode:
    cfg = Config()
    store = LmdbStore(str(path))
    fsm = StateMachine(store)
    clock = clock or FixedClock()
    proposer = LocalProposer(fsm, clock, cfg.raft.address)
    return LocalNode(cfg, store, fsm, clock, proposer, Service(cfg, proposer, fsm, clock))


@pytest.fixture
def local(tmp_path: Path) -> Iterator[LocalNode]:
    node = local_node(tmp_path / "store")
    try:
        yield node
    finally:
        node.close()


@pytest.fixture(scope="module")
def grpc_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProc]:
    """One real node that serves gRPC too (its address: ``node.status()["grpc_addr"]``)."""
    with running(str(tmp_path_factory.mktemp("grpc-node")),
                 flags={"grpc.address": "127.0.0.1:0"}) as c:
        yield c.nodes[0]

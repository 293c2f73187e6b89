"""Three (or more) RaftNodes in this one gevent process, for the probes and
scripts/bench/raft_entry_cost.py (the caller has monkey-patched with gevent already).

doq_lib (and tests.harness) are imported from wherever ``sys.path`` finds them: a benchmark
may load this file by path and run another checkout's code with it."""
from __future__ import annotations

import os
import time
from typing import Any, Callable

import gevent


def start_nodes(root: str, count: int = 3, nodes: list[Any] | None = None,
                flags: dict[str, str] | None = None) -> list[Any]:
    """Start ``count`` nodes with their data under ``root`` (appended to ``nodes`` if given,
    with ``flags`` as more settings); returns them once one of them leads (20 s at most)."""
    from doq_lib.config import load_config
    from doq_lib.fsm import StateMachine
    from doq_lib.lmdb_store import LmdbStore
    from doq_lib.raft.node import RaftNode
    from tests.harness import free_ports

    nodes = [] if nodes is None else nodes
    peers = [f"127.0.0.1:{p}" for p in free_ports(count)]
    for i, addr in enumerate(peers):
        cfg = load_config({"cluster.node_id": f"n{i}", "raft.address": addr,
                           "cluster.peers": ",".join(peers), "storage.data_dir": root,
                           **(flags or {})},
                          {}, None, root)
        os.makedirs(cfg.node_dir, exist_ok=True)
        store = LmdbStore(os.path.join(cfg.node_dir, "store"))
        node = RaftNode(cfg, store, StateMachine(store))
        node.start()
        nodes.append(node)
    deadline = time.monotonic() + 20
    while not any(n.is_leader for n in nodes):
        if time.monotonic() > deadline:
            raise SystemExit("no leader within 20 s")
        gevent.sleep(0.05)
    return nodes


def leader_of(nodes: list[Any]) -> Any:
    return next(n for n in nodes if n.is_leader)


def create_queue(leader: Any, name: str = "q",
                 on_done: Callable[[Any, int], None] | None = None) -> None:
    """Create a delayed queue through the log and wait for its commit."""
    from doq_lib import commands as C

    done: list[int] = []

    def committed(result: Any, error: int) -> None:
        done.append(error)
        if on_done is not None:
            on_done(result, error)
    leader.propose([(C.CREATE_QUEUE, name, "delayed", 0, 0, 60)], int(time.time() * 1000),
                   committed)
    while not done:
        gevent.sleep(0.01)

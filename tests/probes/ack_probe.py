"""Runs three Raft nodes in one gevent process and watches every follower ack on the wire.

Usage: ack_probe.py DIR MODE ENTRIES   (MODE: durable | plain)

For every successful ``next_node_idx`` a node sends (a follower's ack), records the acknowledged
index and the sender's synced journal index at that moment. Prints one JSON line: acks sent,
acks for entries not yet synced (must be 0 in durable mode), and syncs per node. ``plain`` mode
turns the ack hold-back off, to show that the probe does catch unsynced acks.
"""
from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import gevent  # noqa: E402
from pysyncobj.transport import TCPTransport  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from doq_lib import commands as C  # noqa: E402
from doq_lib.config import load_config  # noqa: E402
from doq_lib.fsm import StateMachine  # noqa: E402
from doq_lib.lmdb_store import LmdbStore  # noqa: E402
from doq_lib.raft.durability import DurableTransport  # noqa: E402
from doq_lib.raft.node import RaftNode  # noqa: E402
from tests.harness import free_ports  # noqa: E402

RECORDS: list[tuple[str, int, int]] = []
_base_send = TCPTransport.send


def recording_send(self: TCPTransport, node: object, message: dict) -> bool:
    if isinstance(self, DurableTransport) and message.get("type") == "next_node_idx" \
            and message.get("success"):
        RECORDS.append((self.journal.path, message["next_node_idx"] - 1,
                        self.journal.synced_index))
    return _base_send(self, node, message)


def main() -> None:
    root, mode, entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    TCPTransport.send = recording_send                     # type: ignore[method-assign]
    if mode == "plain":
        DurableTransport.send = recording_send             # type: ignore[method-assign]
    peers = [f"127.0.0.1:{p}" for p in free_ports(3)]
    nodes = []
    for i, addr in enumerate(peers):
        cfg = load_config({"cluster.node_id": f"n{i}", "raft.address": addr,
                           "cluster.peers": ",".join(peers), "storage.data_dir": root},
                          {}, None, root)
        os.makedirs(cfg.node_dir, exist_ok=True)
        store = LmdbStore(os.path.join(cfg.node_dir, "store"))
        node = RaftNode(cfg, store, StateMachine(store))
        node.start()
        nodes.append(node)
    deadline = time.time() + 20
    while not any(n.is_leader for n in nodes) and time.time() < deadline:
        gevent.sleep(0.05)
    leader = next(n for n in nodes if n.is_leader)
    done = []
    leader.propose([(C.CREATE_QUEUE, "q", "delayed", 0, 0, 60)], int(time.time() * 1000),
                   lambda res, err: done.append(err))
    for k in range(entries):
        ops = [(C.ENQUEUE, "q", 0, "", 1, f"m{k}-{j}", None) for j in range(3)]
        leader.propose(ops, int(time.time() * 1000), lambda res, err: done.append(err))
        if k % 5 == 0:
            gevent.sleep(0.002)
    while len(done) < entries + 1 and time.time() < deadline + 20:
        gevent.sleep(0.05)
    gevent.sleep(0.3)
    followers = [n for n in nodes if n is not leader]
    print(json.dumps({
        "committed": sum(1 for e in done if e == 0),
        "acks": len(RECORDS),
        "unsynced_acks": sum(1 for _, acked, synced in RECORDS if acked > synced),
        "follower_syncs": [n.doq_journal.stats.syncs for n in followers],
        "follower_log_entries": [len(n.doq_journal) for n in followers],
        "applied": [n.fsm.applied_index for n in nodes],
    }))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

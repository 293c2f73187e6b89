"""Runs three Raft nodes in one gevent process and watches every follower ack on the wire and
every commit index the leader computes.

Usage: ack_probe.py DIR MODE ENTRIES   (MODE: durable | plain | leader-plain)

For every successful ``next_node_idx`` a node sends (a follower's ack), records the acknowledged
index and the sender's synced journal index at that moment. For every commit index the leader
computes, records how many nodes have that index on disk at that moment (the leader if its
journal is synced past it, each follower if its synced index is). Prints one JSON line: acks
sent, acks for entries not yet synced (must be 0 in durable mode), commits not on a durable
majority (must be 0), and syncs per node. ``plain`` turns the followers' ack hold-back off and
``leader-plain`` makes the leader count itself as if its log were synced, to show that the
probe catches both.
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
from doq_lib.raft.durability import DurableTransport  # noqa: E402
from doq_lib.raft.node import RaftNode  # noqa: E402
from tests.probes.local_raft import create_queue, leader_of, start_nodes  # noqa: E402

RECORDS: list[tuple[str, int, int]] = []
COMMITS: list[tuple[int, int]] = []            # (commit index, nodes holding it on disk)
_base_send = TCPTransport.send
_base_commit = RaftNode.doq_commit_index


def recording_send(self: TCPTransport, node: object, message: dict) -> bool:
    if isinstance(self, DurableTransport) and message.get("type") == "next_node_idx" \
            and message.get("success"):
        RECORDS.append((self.journal.path, message["next_node_idx"] - 1,
                        self.journal.synced_index))
    return _base_send(self, node, message)


def watch_commits(nodes: list[RaftNode], leader_plain: bool) -> None:
    def computed(self: RaftNode, synced_index: int) -> int:
        if leader_plain:
            synced_index = self._SyncObj__getCurrentLogIndex()     # type: ignore[attr-defined]
        commit = _base_commit(self, synced_index)
        if commit > self.raftCommitIndex:
            durable = sum(1 for n in nodes if n.doq_journal.synced_index >= commit)
            COMMITS.append((commit, durable))
        return commit
    RaftNode.doq_commit_index = computed                   # type: ignore[method-assign]


def main() -> None:
    root, mode, entries = sys.argv[1], sys.argv[2], int(sys.argv[3])
    TCPTransport.send = recording_send                     # type: ignore[method-assign]
    if mode == "plain":
        DurableTransport.send = recording_send             # type: ignore[method-assign]
    nodes: list[RaftNode] = []
    watch_commits(nodes, mode == "leader-plain")
    start_nodes(root, 3, nodes)
    leader = leader_of(nodes)
    # The leader's fsyncs start 20 ms late: the followers' acks arrive first, so commits come
    # from the two followers alone, and a leader that counted its unsynced entries would be
    # caught every time.
    background = leader.doq_journal._background
    assert background is not None
    leader.doq_journal._background = lambda fn, args, done: gevent.spawn_later(
        0.02, background, fn, args, done)
    done: list[int] = []
    create_queue(leader, "q", lambda res, err: done.append(err))
    for k in range(entries):
        ops = [(C.ENQUEUE, "q", 0, "", 1, f"m{k}-{j}", None) for j in range(3)]
        leader.propose(ops, int(time.time() * 1000), lambda res, err: done.append(err))
        if k % 5 == 0:
            gevent.sleep(0.002)
    deadline = time.time() + 40
    while len(done) < entries + 1 and time.time() < deadline:
        gevent.sleep(0.05)
    gevent.sleep(0.3)
    followers = [n for n in nodes if n is not leader]
    print(json.dumps({
        "committed": sum(1 for e in done if e == 0),
        "acks": len(RECORDS),
        "unsynced_acks": sum(1 for _, acked, synced in RECORDS if acked > synced),
        "commits": len(COMMITS),
        "commits_not_on_durable_majority": sum(1 for _, durable in COMMITS if durable < 2),
        "follower_syncs": [n.doq_journal.stats.syncs for n in followers],
        "follower_log_entries": [len(n.doq_journal) for n in followers],
        "applied": [n.fsm.applied_index for n in nodes],
    }))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
